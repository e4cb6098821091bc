"""The data-parallel CNN search: the structurally possible (nodes n, devices per node g, local
batch b, collective) points are rows of a priced table (`search/table.py`), each priced by the
SymPy expressions compiled to numpy; CP-SAT takes the minimum of that table (its one variable
is the row index of the table sorted by the objective, so the minimum is exact, with no
rounding of objective values into integers).

Every user-facing constraint family (memory, batch, node and device pins and budgets, deadline,
budget) is a named gate over the rows; when none passes them all, the wider space of
`table(explain=True)` names the smallest conflicting set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy as sp

from planner.errors import InfeasibleError, SpecError
from planner.expr.cnn import DataParallelModel
from planner.expr.collectives import Collective
from planner.expr.symbols import b, g, n
from planner.plan import Plan, check_softsync
from planner.prediction import Config, Prediction, predict  # noqa: F401  (Config: old name)
from planner.search import driver
from planner.search import table as core
from planner.search.memory_fit import usable_bytes, within
from planner.search.objective import Objective, objective_for
from planner.search.requests import Problem  # noqa: F401 (its home before)
from planner.search.solution import Solution
from planner.search.training import Training, check_training

DEFAULT_NODES_MAX = 4096
MAX_POINTS = 3_000_000

__all__ = ["DEFAULT_NODES_MAX", "DataParallelSolver", "Objective", "Problem", "Solution",
           "Training"]


# a priced row of the CNN data-parallel search: nodes, devices per node, local batch and the
# collective's index in the problem's collectives
ROW = np.dtype([(k, np.int64) for k in ("n", "g", "b", "c")])


@dataclass
class Priced:
    """The table and what its rows are (`ROW`: n, g, b, collective index)."""

    table: core.Table
    rows: np.ndarray
    collectives: list[Collective]
    points: int  # (n, g, b) points (rows = points x collectives)


class DataParallelSolver:
    def __init__(self, model: DataParallelModel, problem: Problem):
        self.m = model
        self.p = problem
        self._check()

    # --- input checks (bad flags are exit code 2, not infeasibility) ---------------------------

    def _predict(self, plan: Plan) -> Prediction:
        """The prediction with the usable memory (the headroom taken off) as its capacity."""
        return within(predict(self.m, plan), self.m.system.device.usable_memory_bytes,
                      self.p.memory_headroom)

    def _check(self):
        p = self.p
        objective_for(p.objective, "cnn")
        if p.global_batch is None and p.global_batch_range is None and p.local_batch is None:
            raise SpecError("global_batch: give --global-batch, --global-batch-range or "
                            "--local-batch")
        if p.global_batch_range is not None:
            lo, hi = p.global_batch_range
            if not 1 <= lo <= hi:
                raise SpecError(f"global_batch_range: need 1 <= A <= B, got {lo}:{hi}")
        if p.fewest_nodes_within is not None and not 0 <= p.fewest_nodes_within <= 10:
            raise SpecError(f"within: must be in [0, 10], got {p.fewest_nodes_within}")
        core.check_knee_tolerance(p.knee_tolerance)
        if not p.collectives:
            raise SpecError("collective: no collective allowed")
        for c in p.collectives if p.softsync is not None else ():
            check_softsync(p.softsync, c)
        if (p.softsync or None) != self.m.options.softsync:
            raise SpecError(f"softsync: the request's {p.softsync} is not the model's "
                            f"{self.m.options.softsync} (build it with softsync=)")
        if p.objective is Objective.efficiency and p.global_batch is None:
            raise SpecError("objective: efficiency needs a fixed --global-batch")
        check_training(p.training, p.objective, p.pareto)

    # --- the space ---------------------------------------------------------------------------

    def _batch_bounds(self) -> tuple[int, int]:
        p = self.p
        if p.global_batch is not None:
            return p.global_batch, p.global_batch
        if p.global_batch_range is not None:
            return p.global_batch_range
        return 1, 2**62  # weak scaling: B follows from N b

    def _nodes_hi(self, explain: bool = False) -> int:
        """Largest node count in the space. User caps shrink it for speed; when explaining an
        infeasible problem the space is wide, so the caps become gates that can be blamed."""
        p = self.p
        caps = [x for x in (p.nodes, p.nodes_max, p.devices, p.devices_max) if x is not None]
        hi = max(caps) if caps and not explain else max([DEFAULT_NODES_MAX, *caps])
        if p.local_batch is None:
            hi = min(hi, self._batch_bounds()[1])  # at least one sample per device
        return max(1, min(hi, 2**20))

    def _points(self, explain: bool = False) -> np.ndarray:
        """Every (n, g, b) whose global batch N b can meet the batch bounds, as int64 rows
        (n-major, then g, then b). User limits (memory, node budget, pins) are *not* applied
        here: they are gates, so an infeasible problem can say which of them conflict."""
        dpn = self.m.system.devices_per_node
        lo, hi = self._batch_bounds()
        n_flat = np.repeat(np.arange(1, self._nodes_hi(explain) + 1, dtype=np.int64), dpn)
        g_flat = np.tile(np.arange(1, dpn + 1, dtype=np.int64), len(n_flat) // dpn)
        N = n_flat * g_flat
        if self.p.local_batch is not None:
            b_lo = np.full_like(N, self.p.local_batch)
            b_hi = np.where((N * self.p.local_batch >= lo) & (N * self.p.local_batch <= hi),
                            b_lo, b_lo - 1)
        else:
            b_lo, b_hi = -(-lo // N), hi // N
        count = np.maximum(0, b_hi - b_lo + 1)
        total = int(count.sum())
        if total > MAX_POINTS:
            raise SpecError(f"the search space has {total:,} points (limit {MAX_POINTS:,}); "
                            "bound it with --nodes-max or a narrower batch range")
        start = np.cumsum(count) - count
        offset = np.arange(total, dtype=np.int64) - np.repeat(start, count)
        return np.column_stack([np.repeat(n_flat, count), np.repeat(g_flat, count),
                                np.repeat(b_lo, count) + offset])

    # --- the priced table --------------------------------------------------------------------

    def rows(self, explain: bool = False) -> driver.Rows:
        """One row per (n, g, b, collective), its iteration time from the expressions, with
        memory and every pin as a gate (so an infeasible problem names the ones that
        conflict); `plan` reads them back."""
        p, m, sysm = self.p, self.m, self.m.system
        base = self._points(explain)
        if len(base) == 0:
            raise InfeasibleError("infeasible: global_batch: no whole local batch on any "
                                  "allowed device count gives the global batch", ("global_batch",))
        cols = list(p.collectives)
        rows = np.concatenate([np.column_stack([base, np.full(len(base), k)])
                               for k in range(len(cols))]).view(ROW).ravel()
        self._built = (rows, cols)
        N = rows["n"] * rows["g"]
        Bcol = N * rows["b"]
        gates = []
        mem = m.numeric("memory")(1, 1, rows["b"].astype(float))
        cap = usable_bytes(sysm.device.usable_memory_bytes, p.memory_headroom)
        fits = rows["b"][mem <= cap]
        b_small = int(rows["b"].min())
        need = float(m.numeric("memory")(1, 1, float(b_small)))
        gates.append(core.Gate(
            "memory", f"memory: local batch <= {int(fits.max())} fits in the "
            f"{cap / 2**30:.3g} GiB of '{sysm.device.name}'" if fits.size else
            f"memory: even the smallest local batch here, {b_small}, needs {need / 2**30:.3g} "
            f"GiB; '{sysm.device.name}' has {cap / 2**30:.3g} GiB", mem <= cap))
        lo, hi = self._batch_bounds()
        if p.global_batch is not None:
            gates.append(core.Gate("global_batch", f"global_batch = {lo}", Bcol == lo))
        if p.global_batch_range is not None:
            gates.append(core.Gate("global_batch_range", f"global_batch in [{lo}, {hi}]",
                                   (Bcol >= lo) & (Bcol <= hi)))
        if p.softsync is not None:  # n-softsync: at most one update per learner's gradient
            gates.append(core.Gate("softsync", f"softsync {p.softsync} <= devices",
                                   p.softsync <= N))
        pins = [("nodes", rows["n"], "==", p.nodes), ("nodes_max", rows["n"], "<=", p.nodes_max),
                ("devices", N, "==", p.devices), ("devices_max", N, "<=", p.devices_max),
                ("devices_per_node", rows["g"], "==", p.devices_per_node),
                ("local_batch_min", rows["b"], ">=", p.local_batch_min)]
        for name, col, op, val in pins:
            if val is None:
                continue
            allowed = {"==": col == val, "<=": col <= val, ">=": col >= val}[op]
            extra = f" (system has {sysm.devices_per_node})" if name == "devices_per_node" else ""
            gates.append(core.Gate(
                name, f"{name.removesuffix('_max').removesuffix('_min')} {op} {val}{extra}",
                allowed))
        single = None
        if p.objective is Objective.efficiency:  # one device's time for the whole batch
            single = self.m.numeric_expr(self.m.single_device_time())(
                np.ones(len(rows)), np.ones(len(rows)), Bcol.astype(float))
        # runners-up differ in (n, g, b): the collectives of one point are one group
        group = np.tile(np.arange(len(base)), len(cols))
        return driver.Rows(self._iteration_times(rows, cols), N, rows["n"], Bcol, gates,
                           group, len(base), single)

    def table(self, explain: bool = False) -> Priced:
        """The priced table (the driver's objective and training gates over `rows`)."""
        priced = driver.price(self._ask(), self.rows(explain))
        rows, cols = self._built
        return Priced(priced.table, rows, cols, priced.rows.points)

    def _ask(self) -> driver.Ask:
        p = self.p
        return driver.Ask(p.objective, p.training, top=p.top,
                          fewest_nodes_within=p.fewest_nodes_within,
                          time_limit_s=p.time_limit_s, workers=p.workers, pareto=p.pareto,
                          knee_tolerance=p.knee_tolerance)

    def _iteration_times(self, rows: np.ndarray, cols: list[Collective]) -> np.ndarray:
        """The iteration time of every row, from the expressions."""
        times = np.empty(len(rows))
        for k, c in enumerate(cols):
            sel = rows["c"] == k
            fn = self.m.numeric_expr(self.m.iteration_time(c, self.p.overlap))
            times[sel] = fn(*(rows[sel][f].astype(float) for f in ("n", "g", "b")))
        return times

    # --- the objective as an expression --------------------------------------------------------

    def objective_factor(self, devices, batch):
        """objective = iteration time x this factor, at fixed devices N and global batch B
        (`search/objective.py`). Every objective is increasing in the iteration time at a
        fixed (N, B), which is what lets the layer-split searches minimise the iteration time
        per point."""
        obj = self.p.objective
        if obj in (Objective.time_to_train, Objective.cost):
            steps = self.p.training.steps(batch)
            if obj is Objective.cost:
                return steps * devices * self.p.training.price_per_device_hour / 3600
            return steps
        if obj is Objective.iteration_time:
            return sp.Integer(1)
        if obj is Objective.throughput:
            return 1 / batch
        return devices / self.m.single_device_time().subs(b, batch)

    def objective_expr(self, c: Collective):
        """The objective: the iteration time times `objective_factor`."""
        return self.m.iteration_time(c, self.p.overlap) * self.objective_factor(n * g, n * g * b)

    def factor_values(self, devices: np.ndarray, batch: np.ndarray) -> np.ndarray:
        fn = self.m.numeric_expr(self.objective_factor(n * g, n * g * b))
        dev = np.asarray(devices, dtype=float)
        return np.broadcast_to(fn(np.ones_like(dev), dev, np.asarray(batch) / dev), dev.shape)

    def objective_value(self, plan: Plan) -> float:
        """The objective expression evaluated at `plan`."""
        fn = self.m.numeric_expr(self.objective_expr(plan.collective))
        return float(fn(plan.nodes, plan.devices_per_node, plan.local_batch))

    # --- solve -------------------------------------------------------------------------------

    def solve(self) -> Solution:
        return driver.solve(self, self._ask(), note=self._note)

    def plan(self, row: int) -> Plan:
        rows, cols = self._built
        n_val, g_val, b_val, c_idx = (int(rows[row][f]) for f in ("n", "g", "b", "c"))
        return Plan.data_parallel(n_val, g_val, n_val * g_val * b_val, cols[c_idx],
                                  self.p.overlap, self.p.softsync,
                                  self.m.options.optimizer.value)

    predict = _predict

    def explain(self) -> InfeasibleError:
        """The error naming the smallest set of constraints that conflict."""
        return core.conflict_error(self.table(explain=True).table, self._note)

    def _note(self, core_names: tuple[str, ...]) -> str:
        if self.p.global_batch is not None and "global_batch" not in core_names:
            return (f" (given global_batch = {self.p.global_batch}, which must split into whole "
                    "local batches over the devices)")
        return ""
