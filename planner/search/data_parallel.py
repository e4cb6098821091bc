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

import time
from dataclasses import dataclass

import numpy as np
import sympy as sp

from planner.errors import InfeasibleError, SpecError
from planner.expr.cnn import DataParallelModel
from planner.expr.collectives import Collective
from planner.expr.symbols import b, g, n
from planner.plan import Plan
from planner.prediction import Config, Prediction, predict  # noqa: F401  (Config: old name)
from planner.search import table as core
from planner.search.memory_fit import usable_bytes, within
from planner.search.objective import Objective, objective_for, other_objective
from planner.search.requests import Problem  # noqa: F401 (its home before)
from planner.search.solution import Solution, front_entry
from planner.search.training import Training, check_training

DEFAULT_NODES_MAX = 4096
MAX_POINTS = 3_000_000

__all__ = ["DEFAULT_NODES_MAX", "DataParallelSolver", "Objective", "Problem", "Solution",
           "Training"]


@dataclass
class Priced:
    """The table and what its rows are: (n, g, b, collective index) per row."""

    table: core.Table
    rows: np.ndarray
    collectives: list[Collective]
    points: int  # (n, g, b) points (rows = points x collectives)
    time_to_train: np.ndarray | None = None  # per row, with a Training
    cost: np.ndarray | None = None


class DataParallelSolver:
    def __init__(self, model: DataParallelModel, problem: Problem):
        self.m = model
        self.p = problem
        self._check()

    # --- input checks (bad flags are exit code 2, not infeasibility) ---------------------------

    def _predict(self, plan: Plan) -> Prediction:
        """The prediction with the usable memory (the headroom taken off) as its capacity."""
        return within(predict(self.m, plan), self.m.system.device.memory_bytes,
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

    def table(self, explain: bool = False) -> Priced:
        """One row per (n, g, b, collective), priced by the expressions, with every constraint
        family as a gate."""
        p, m, sysm = self.p, self.m, self.m.system
        base = self._points(explain)
        if len(base) == 0:
            raise InfeasibleError("infeasible: global_batch: no whole local batch on any "
                                  "allowed device count gives the global batch", ("global_batch",))
        cols = list(p.collectives)
        rows = np.concatenate([np.column_stack([base, np.full(len(base), k)])
                               for k in range(len(cols))])
        N = rows[:, 0] * rows[:, 1]
        Bcol = N * rows[:, 2]
        tr = p.training
        ttt = cost = None
        if tr is not None and (p.objective.needs_training or p.pareto
                               or tr.deadline_s is not None or tr.budget_usd is not None):
            ttt, cost = self._train_arrays(rows, cols)
        if p.objective is Objective.time_to_train:
            obj = ttt
            other = cost if tr.price_per_device_hour else ttt * N
        elif p.objective is Objective.cost:
            obj, other = cost, ttt
        else:
            obj = np.concatenate([self._objective_values(c, base) for c in cols])
            other = other_objective(p.objective, obj, N, Bcol)
        if not np.all(np.isfinite(obj)):
            raise SpecError("the cost model gave a non-finite value; check the hardware numbers")

        gates = []
        mem = m.numeric("memory")(1, 1, rows[:, 2].astype(float))
        cap = usable_bytes(sysm.device.memory_bytes, p.memory_headroom)
        fits = rows[mem <= cap, 2]
        b_small = int(rows[:, 2].min())
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
        pins = [("nodes", rows[:, 0], "==", p.nodes), ("nodes_max", rows[:, 0], "<=", p.nodes_max),
                ("devices", N, "==", p.devices), ("devices_max", N, "<=", p.devices_max),
                ("devices_per_node", rows[:, 1], "==", p.devices_per_node),
                ("local_batch_min", rows[:, 2], ">=", p.local_batch_min)]
        for name, col, op, val in pins:
            if val is None:
                continue
            allowed = {"==": col == val, "<=": col <= val, ">=": col >= val}[op]
            extra = f" (system has {sysm.devices_per_node})" if name == "devices_per_node" else ""
            gates.append(core.Gate(
                name, f"{name.removesuffix('_max').removesuffix('_min')} {op} {val}{extra}",
                allowed))
        if tr is not None and tr.deadline_s is not None:
            gates.append(core.Gate("deadline", f"time to train <= {tr.deadline_s:g} s",
                                   ttt <= tr.deadline_s))
        if tr is not None and tr.budget_usd is not None:
            gates.append(core.Gate("budget", f"cost to train <= {tr.budget_usd:g} USD",
                                   cost <= tr.budget_usd))
        # runners-up differ in (n, g, b): the collectives of one point are one group
        group = np.tile(np.arange(len(base)), len(cols))
        table = core.Table(obj, other, N, rows[:, 0], gates, group)
        return Priced(table, rows, cols, len(base), ttt, cost)

    def _iteration_times(self, rows: np.ndarray, cols: list[Collective]) -> np.ndarray:
        """The iteration time of every row, from the expressions."""
        times = np.empty(len(rows))
        for k, c in enumerate(cols):
            sel = rows[:, 3] == k
            fn = self.m.numeric_expr(self.m.iteration_time(c, self.p.overlap))
            times[sel] = fn(*(rows[sel][:, i].astype(float) for i in range(3)))
        return times

    def _train_arrays(self, rows: np.ndarray, cols: list[Collective]):
        """(time to train, cost) per row: iteration time from the expressions x S(B)."""
        tr = self.p.training
        times = self._iteration_times(rows, cols)
        N = (rows[:, 0] * rows[:, 1]).astype(float)
        ttt = times * tr.steps(N * rows[:, 2])
        price = tr.price_per_device_hour or 0.0
        return ttt, ttt / 3600 * N * price

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

    def _objective_values(self, c: Collective, pts: np.ndarray) -> np.ndarray:
        fn = self.m.numeric_expr(self.objective_expr(c))
        return fn(*(pts[:, i].astype(float) for i in range(3)))

    def objective_value(self, plan: Plan) -> float:
        """The objective expression evaluated at `plan`."""
        fn = self.m.numeric_expr(self.objective_expr(plan.collective))
        return float(fn(plan.nodes, plan.devices_per_node, plan.local_batch))

    # --- solve -------------------------------------------------------------------------------

    def solve(self) -> Solution:
        t0 = time.perf_counter()
        priced = self.table()
        build_time = time.perf_counter() - t0
        p = self.p
        found = core.solve(priced.table, top=p.top, within=p.fewest_nodes_within,
                           time_limit_s=p.time_limit_s, workers=p.workers,
                           explain=lambda: self.table(explain=True).table, note=self._note)
        best = self._plan(priced, found.best)
        prediction = self._predict(best)
        alternatives = [(alt, self._predict(alt))
                        for alt in (self._plan(priced, i) for i in found.alternatives)]
        return Solution(
            status=found.status, plan=best, prediction=prediction,
            objective={"name": p.objective.value, "value": self.objective_value(best),
                       "solver_value": found.value, "unit": p.objective.unit},
            alternatives=alternatives, solve_time_s=found.solve_time_s,
            build_time_s=build_time, branches=found.branches, points=priced.points,
            rows=len(priced.table), gap=found.gap,
            training=self._training(best, prediction.iteration_time_s),
            pareto=self._pareto(priced) if p.pareto else None,
            knee=self._knee(priced, found.best))

    def _knee(self, priced: Priced, chosen: int) -> dict | None:
        """Where scaling stops, from this priced table (`search.table.knee`): the objective
        when it is a time, the time to train for cost, the iteration time for efficiency."""
        obj = self.p.objective
        if obj is Objective.cost:
            time_s = priced.time_to_train
        elif obj is Objective.efficiency:
            time_s = self._iteration_times(priced.rows, priced.collectives)
        else:
            time_s = priced.table.objective
        return core.knee(time_s, priced.table.devices, priced.table.allowed(), chosen,
                         self.p.knee_tolerance, core.KNEE_MEASURES[obj.value])

    def explain(self) -> InfeasibleError:
        """The error naming the smallest set of constraints that conflict."""
        return core.conflict_error(self.table(explain=True).table, self._note)

    def _note(self, core_names: tuple[str, ...]) -> str:
        if self.p.global_batch is not None and "global_batch" not in core_names:
            return (f" (given global_batch = {self.p.global_batch}, which must split into whole "
                    "local batches over the devices)")
        return ""

    def _training(self, plan: Plan, iteration_s: float) -> dict | None:
        tr = self.p.training
        return None if tr is None else tr.report(plan.global_batch, plan.devices, iteration_s)

    def _pareto(self, priced: Priced) -> list[dict]:
        """The non-dominated (time-to-train, cost) plans among the rows every gate allows."""
        ok = np.flatnonzero(priced.table.allowed())
        ttt, cost, N = priced.time_to_train[ok], priced.cost[ok], priced.table.devices[ok]
        front = []
        for i in core.pareto_front(ttt, cost, N):
            plan = self._plan(priced, int(ok[i]))
            front.append(front_entry(plan, ttt[i], cost[i],
                                     self.p.training.steps(plan.global_batch)))
        return front

    def _plan(self, priced: Priced, i: int) -> Plan:
        n_val, g_val, b_val, c_idx = (int(x) for x in priced.rows[i])
        return Plan.data_parallel(n_val, g_val, n_val * g_val * b_val,
                                  priced.collectives[c_idx], self.p.overlap)

