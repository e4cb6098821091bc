"""The data-parallel search as a CP-SAT model, in the order of the OR-Tools samples:
variables, constraints, objective, solve, status, values.

The structurally possible (nodes n, devices per node g, local batch b, collective) points are
rows, sorted by the objective evaluated from the SymPy expressions; CP-SAT's one variable is the
row index, so minimising the index minimises the objective exactly, with no rounding of
objective values into integers (the index is below MAX_POINTS x collectives, far inside int64).
Every user-facing constraint family restricts the index domain and is gated by a named literal;
when the model is infeasible it is solved again with those literals as assumptions and the
sufficient subset is read back, so the message names what conflicts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from enum import Enum

import numpy as np
import sympy as sp
from ortools.sat.python import cp_model

from planner.cost.collectives import Collective
from planner.cost.data_parallel import DataParallelModel
from planner.cost.symbols import b, g, n
from planner.errors import InfeasibleError, SpecError
from planner.prediction import Config, Prediction, predict
from planner.search.rows import RowModel, cp_solver
from planner.search.training import Training, check_training, pareto_front

DEFAULT_NODES_MAX = 4096
MAX_POINTS = 3_000_000


class Objective(str, Enum):
    throughput = "throughput"
    iteration_time = "iteration-time"
    efficiency = "efficiency"
    time_to_train = "time-to-train"
    cost = "cost"


@dataclass(frozen=True)
class Problem:
    """What the user fixed and bounded. None means free (within the defaults)."""

    nodes: int | None = None
    nodes_max: int | None = None
    devices: int | None = None
    devices_max: int | None = None
    devices_per_node: int | None = None
    global_batch: int | None = None
    global_batch_range: tuple[int, int] | None = None
    local_batch: int | None = None
    local_batch_min: int | None = None
    collectives: tuple[Collective, ...] = tuple(Collective)
    overlap: bool = True
    objective: Objective = Objective.throughput
    fewest_nodes_within: float | None = None  # 0.05: the fewest nodes within 5% of the best
    top: int = 0
    time_limit_s: float = 10.0
    workers: int = 1  # one worker: a deterministic search
    training: Training | None = None
    pareto: bool = False


@dataclass(frozen=True)
class Solution:
    status: str  # optimal | feasible
    config: Config
    prediction: Prediction
    objective: dict
    alternatives: list[tuple[Config, Prediction]]
    solve_time_s: float
    build_time_s: float
    branches: int
    points: int
    gap: float
    training: dict | None = None  # steps, time_to_train_s, cost_usd of the chosen plan
    pareto: list[dict] | None = None  # non-dominated (time-to-train, cost) plans


@dataclass
class _Built:
    rm: RowModel  # CP-SAT over the row index (planner/search/rows.py)
    rows: np.ndarray  # (n, g, b, collective index) per point, sorted by objective
    obj: np.ndarray  # the objective per row (float, from the expressions)
    collectives: list[Collective]
    points: int

    @property
    def model(self) -> cp_model.CpModel:
        return self.rm.model

    @property
    def point(self) -> cp_model.IntVar:
        return self.rm.point

    @property
    def gates(self) -> dict[str, tuple[cp_model.IntVar, str]]:
        return self.rm.gates

    @property
    def allowed(self) -> np.ndarray:
        return self.rm.allowed


def _divisors(x: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(x) + 1) if x % d == 0]
    return sorted(set(small + [x // d for d in small]))


class DataParallelSolver:
    def __init__(self, model: DataParallelModel, problem: Problem):
        self.m = model
        self.p = problem
        self._check()

    # --- input checks (bad flags are exit code 2, not infeasibility) ---------------------------

    def _check(self):
        p = self.p
        if p.global_batch is None and p.global_batch_range is None and p.local_batch is None:
            raise SpecError("global_batch: give --global-batch, --global-batch-range or "
                            "--local-batch")
        if p.global_batch_range is not None:
            lo, hi = p.global_batch_range
            if not 1 <= lo <= hi:
                raise SpecError(f"global_batch_range: need 1 <= A <= B, got {lo}:{hi}")
        if p.fewest_nodes_within is not None and not 0 <= p.fewest_nodes_within <= 10:
            raise SpecError(f"within: must be in [0, 10], got {p.fewest_nodes_within}")
        if not p.collectives:
            raise SpecError("collective: no collective allowed")
        if p.objective is Objective.efficiency and p.global_batch is None:
            raise SpecError("objective: efficiency needs a fixed --global-batch")
        check_training(p.training, p.objective.value, p.pareto)

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
        here: they are gated constraints in the model, so an infeasible problem can say which
        of them conflict. Vectorised: a fixed batch over 2^20 nodes is a few array passes."""
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

    # --- model -------------------------------------------------------------------------------

    def build(self, nodes_first_within: float | None = None, explain: bool = False) -> _Built:
        """The model. Rows are sorted by objective, so minimising the row index minimises the
        objective exactly. With `nodes_first_within` (an objective limit) rows are
        sorted by nodes first and those above the limit are excluded: the fewest-nodes phase."""
        p, m, sysm = self.p, self.m, self.m.system
        base = self._points(explain)
        if len(base) == 0:
            raise InfeasibleError("infeasible: global_batch: no whole local batch on any "
                                  "allowed device count gives the global batch", ("global_batch",))
        # One row per (n, g, b, collective); the objective of each row from the expressions.
        cols = list(p.collectives)
        rows = np.concatenate([np.column_stack([base, np.full(len(base), k)])
                               for k in range(len(cols))])
        obj = np.concatenate([self._objective_values(c, base) for c in cols])
        if not np.all(np.isfinite(obj)):
            raise SpecError("the cost model gave a non-finite value; check the hardware numbers")
        # Sorted by objective (ties by n, g, b, collective): the objective is monotone in the
        # row index, so CP-SAT minimises the index itself, with no table to propagate.
        keys = (rows[:, 3], rows[:, 2], rows[:, 1], rows[:, 0], obj)
        if nodes_first_within is not None:
            keys = (*keys, rows[:, 0])
        order = np.lexsort(keys)
        rows, obj = rows[order], obj[order]

        rm = RowModel(len(rows))
        if nodes_first_within is not None:
            rm.restrict(obj <= nodes_first_within)

        # Constraints: each family restricts the index to the rows it allows, gated by a literal.
        gate = rm.gate
        N = rows[:, 0] * rows[:, 1]
        Bcol = N * rows[:, 2]

        mem = m.numeric("memory")(1, 1, rows[:, 2].astype(float))
        cap = sysm.device.memory_bytes
        fits = rows[mem <= cap, 2]
        b_small = int(rows[:, 2].min())
        need = float(m.numeric("memory")(1, 1, float(b_small)))
        gate("memory", f"memory: local batch <= {int(fits.max())} fits in the "
             f"{cap / 2**30:.3g} GiB of '{sysm.device.name}'" if fits.size else
             f"memory: even the smallest local batch here, {b_small}, needs {need / 2**30:.3g} "
             f"GiB; '{sysm.device.name}' has {cap / 2**30:.3g} GiB", mem <= cap)
        lo, hi = self._batch_bounds()
        if p.global_batch is not None:
            gate("global_batch", f"global_batch = {lo}", Bcol == lo)
        if p.global_batch_range is not None:
            gate("global_batch_range", f"global_batch in [{lo}, {hi}]", (Bcol >= lo) & (Bcol <= hi))
        pins = [("nodes", rows[:, 0], "==", p.nodes), ("nodes_max", rows[:, 0], "<=", p.nodes_max),
                ("devices", N, "==", p.devices), ("devices_max", N, "<=", p.devices_max),
                ("devices_per_node", rows[:, 1], "==", p.devices_per_node),
                ("local_batch_min", rows[:, 2], ">=", p.local_batch_min)]
        for name, col, op, val in pins:
            if val is None:
                continue
            allowed = {"==": col == val, "<=": col <= val, ">=": col >= val}[op]
            extra = f" (system has {sysm.devices_per_node})" if name == "devices_per_node" else ""
            gate(name, f"{name.removesuffix('_max').removesuffix('_min')} {op} {val}{extra}",
                 allowed)

        tr = p.training
        if tr is not None and (tr.deadline_s is not None or tr.budget_usd is not None):
            ttt, cost = self._train_arrays(rows, cols)
            if tr.deadline_s is not None:
                gate("deadline", f"time to train <= {tr.deadline_s:g} s", ttt <= tr.deadline_s)
            if tr.budget_usd is not None:
                gate("budget", f"cost to train <= {tr.budget_usd:g} USD", cost <= tr.budget_usd)
        return _Built(rm, rows, obj, cols, len(base))

    def _train_arrays(self, rows: np.ndarray, cols: list[Collective]):
        """(time to train, cost) per row: iteration time from the expressions x S(B)."""
        tr = self.p.training
        times = np.empty(len(rows))
        for k, c in enumerate(cols):
            sel = rows[:, 3] == k
            fn = self.m.numeric_expr(self.m.iteration_time(c, self.p.overlap))
            times[sel] = fn(*(rows[sel][:, i].astype(float) for i in range(3)))
        N = (rows[:, 0] * rows[:, 1]).astype(float)
        ttt = times * tr.steps(N * rows[:, 2])
        price = tr.price_per_device_hour or 0.0
        return ttt, ttt / 3600 * N * price

    def objective_factor(self, devices, batch):
        """objective = iteration time x this factor, at fixed devices N and global batch B:
        1 (iteration time), 1 / B (time per sample = 1 / throughput), N / T_1(B) (devices x
        time over one device's time: 1 / efficiency), S(B) (time to train) or S(B) N price
        (cost). Every objective is increasing in the iteration time at a fixed (N, B), which
        is what lets the layer-split searches minimise the iteration time per point."""
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
        """What CP-SAT minimises: the iteration time times `objective_factor`."""
        return self.m.iteration_time(c, self.p.overlap) * self.objective_factor(n * g, n * g * b)

    def factor_values(self, devices: np.ndarray, batch: np.ndarray) -> np.ndarray:
        fn = self.m.numeric_expr(self.objective_factor(n * g, n * g * b))
        dev = np.asarray(devices, dtype=float)
        return np.broadcast_to(fn(np.ones_like(dev), dev, np.asarray(batch) / dev), dev.shape)

    def _objective_values(self, c: Collective, pts: np.ndarray) -> np.ndarray:
        fn = self.m.numeric_expr(self.objective_expr(c))
        return fn(*(pts[:, i].astype(float) for i in range(3)))

    def objective_value(self, cfg: Config) -> float:
        """The objective expression evaluated at `cfg` (what the solver ranked its rows by)."""
        fn = self.m.numeric_expr(self.objective_expr(cfg.collective))
        return float(fn(cfg.nodes, cfg.devices_per_node, cfg.local_batch))

    # --- solve -------------------------------------------------------------------------------

    def _solver(self) -> cp_model.CpSolver:
        return cp_solver(self.p.time_limit_s, self.p.workers)

    def _run(self, built: _Built, solver: cp_model.CpSolver) -> int:
        built.rm.enforce_gates()
        return solver.Solve(built.model)

    def solve(self) -> Solution:
        t0 = time.perf_counter()
        built = first = self.build()
        build_time = time.perf_counter() - t0
        solver = self._solver()
        status = self._run(built, solver)
        if status == cp_model.INFEASIBLE:
            raise self._explain()
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise InfeasibleError(f"no configuration found within --time-limit "
                                  f"{self.p.time_limit_s:g} s")
        optimal = status == cp_model.OPTIMAL
        best_val = self._objective_at(solver, built)
        # The bound on the row index maps to a bound on the objective (rows are sorted).
        bound = float(built.obj[max(0, min(int(solver.BestObjectiveBound()), len(built.obj) - 1))])
        gap = abs(best_val - bound) / abs(best_val) if best_val else 0.0
        best = self._read(solver, built)
        total_time, branches = solver.WallTime(), solver.NumBranches()

        if self.p.fewest_nodes_within is not None:
            # Lexicographic: fewest nodes within the tolerance of the best, then the best there.
            limit = best_val * (1 + self.p.fewest_nodes_within)
            built = self.build(nodes_first_within=limit)
            s2 = self._solver()
            st = self._run(built, s2)
            optimal = optimal and st == cp_model.OPTIMAL
            total_time, branches = total_time + s2.WallTime(), branches + s2.NumBranches()
            best, best_val = self._read(s2, built), self._objective_at(s2, built)

        alternatives: list[tuple[Config, Prediction]] = []
        seen = [best]
        for _ in range(self.p.top):
            alt_built = self.build()
            for cfg in seen:
                self._exclude(alt_built, cfg)
            s3 = self._solver()
            st = self._run(alt_built, s3)
            total_time, branches = total_time + s3.WallTime(), branches + s3.NumBranches()
            if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                break
            alt = self._read(s3, alt_built)
            seen.append(alt)
            alternatives.append((alt, predict(self.m, alt)))

        prediction = predict(self.m, best)
        return Solution(
            status="optimal" if optimal else "feasible",
            config=best,
            prediction=prediction,
            objective={
                "name": self.p.objective.value,
                "value": self.objective_value(best),
                "solver_value": best_val,
                "unit": {"throughput": "s/sample", "iteration-time": "s",
                         "efficiency": "1/efficiency", "time-to-train": "s",
                         "cost": "USD"}[self.p.objective.value],
            },
            training=self._training(best, prediction.iteration_time_s),
            pareto=self._pareto(first) if self.p.pareto else None,
            alternatives=alternatives,
            solve_time_s=total_time,
            build_time_s=build_time,
            branches=branches,
            points=built.points,
            gap=gap,
        )

    def _training(self, cfg: Config, iteration_s: float) -> dict | None:
        tr = self.p.training
        return None if tr is None else tr.report(cfg.global_batch, cfg.devices, iteration_s)

    def _pareto(self, built: _Built) -> list[dict]:
        """The non-dominated (time-to-train, cost) plans among all feasible rows: sorted by
        time, a row joins the front when it is cheaper than every faster one."""
        tr, rows = self.p.training, built.rows
        ok = np.flatnonzero(built.allowed)
        ttt, cost = self._train_arrays(rows[ok], built.collectives)
        B = rows[ok, 0] * rows[ok, 1] * rows[ok, 2]
        front = []
        for i in pareto_front(ttt, cost):
            n_, g_, b_, c_ = (int(x) for x in rows[ok[i]])
            cfg = Config(n_, g_, n_ * g_ * b_, built.collectives[c_], self.p.overlap)
            front.append({"config": cfg.to_json(), "time_to_train_s": float(ttt[i]),
                          "cost_usd": float(cost[i]), "steps": float(tr.steps(B[i]))})
        return front

    @staticmethod
    def _objective_at(solver, built: _Built) -> float:
        return float(built.obj[solver.Value(built.point)])

    def _exclude(self, built: _Built, cfg: Config):
        """Forbid one configuration (for runners-up)."""
        r = built.rows
        same = ((r[:, 0] == cfg.nodes) & (r[:, 1] == cfg.devices_per_node)
                & (r[:, 2] == cfg.local_batch)
                & (r[:, 3] == built.collectives.index(cfg.collective)))
        for i in np.flatnonzero(same):
            built.model.Add(built.point != int(i))

    def _read(self, solver, built: _Built) -> Config:
        n_val, g_val, b_val, c_idx = (int(x) for x in built.rows[solver.Value(built.point)])
        return Config(nodes=n_val, devices_per_node=g_val, global_batch=n_val * g_val * b_val,
                      collective=built.collectives[c_idx], overlap=self.p.overlap)

    def _explain(self) -> InfeasibleError:
        built = self.build(explain=True)
        names = list(built.gates)
        built.model.AddAssumptions([built.gates[k][0] for k in names])
        solver = self._solver()
        if solver.Solve(built.model) != cp_model.INFEASIBLE:
            return InfeasibleError("infeasible (the conflict could not be isolated)")
        index = {built.gates[k][0].Index(): k for k in names}
        core = [index[i] for i in solver.SufficientAssumptionsForInfeasibility() if i in index]
        core = self._minimise_core(built, core)
        why = "; ".join(built.gates[k][1] for k in core)
        if self.p.global_batch is not None and "global_batch" not in core:
            why += (f" (given global_batch = {self.p.global_batch}, which must split into whole "
                    "local batches over the devices)")
        return InfeasibleError(f"infeasible: these constraints conflict: {why}", tuple(core))

    def _minimise_core(self, built: _Built, core: list[str]) -> list[str]:
        """Drop gates from the core while the rest stays infeasible (a few gates: cheap)."""
        keep = list(core)
        for name in list(core):
            trial = [k for k in keep if k != name]
            probe = self.build(explain=True)
            probe.model.AddAssumptions([probe.gates[k][0] for k in trial])
            if self._solver().Solve(probe.model) == cp_model.INFEASIBLE:
                keep = trial
        return sorted(keep)
