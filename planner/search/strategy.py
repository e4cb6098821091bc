"""Which split of a CNN: pure data parallelism, per-layer data/model modes (`hybrid`), pipeline
stages (`pipeline`), or the best of them (`auto`).

Every strategy searches the same points as the data-parallel solve (nodes, devices per node,
global batch, collective, with the same pins and budgets), plus, for a pipeline, the stage count
and micro-batch. At a fixed point every objective is the iteration time times a factor of
(devices, global batch) (`DataParallelSolver.objective_factor`), so an inner CP-SAT model
minimises the iteration time over the layer split (`search/layer_modes.py`,
`search/stages.py`) and an exact branch and bound runs over the points: points are taken in
order of a lower bound on their objective, and the search stops when the bound reaches the
best plan found. The pure data-parallel optimum (which the hybrid space contains: every
segment in data mode) starts as that best plan.

Each point first gets an exact bound of its own (`Stages.bound_and_cuts`,
`LayerModes.bound_and_plans`) and the plans that bound suggests are priced; when one of them
fits and meets the bound the point is solved without CP-SAT, which then runs only where a gap
remains. The search stops on a deterministic budget (points priced, CP-SAT solves, and each
solve's deterministic work), so the same question gets the same answer on any machine under any
load. The wall-clock `time_limit_s` only guards against runaways: a search it stops is marked
`feasible` with `stopped_by = "time-limit"`, and the CLI says so.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction

import numpy as np

from planner.cost.cnn_layout import (
    LayerArrays,
    allreduce_terms,
    data_layer_times,
    link,
    units,
    weighted_layer_floor,
)
from planner.cost.layer_modes import LayerModes, modes_at
from planner.cost.stages import Stages, slowest_stage_floor
from planner.errors import InfeasibleError, SpecError
from planner.expr.cnn import DataParallelModel
from planner.expr.collectives import Collective
from planner.prediction import Prediction
from planner.search.data_parallel import ROW, DataParallelSolver, Problem, Solution
from planner.search.layer_modes import Inner, solve_modes
from planner.search.memory_fit import usable_bytes
from planner.search.solution import ObjectiveValue, TrainingReport, record
from planner.search.stages import solve_cut

# The deterministic budget of one split search (see the module docstring), sized to end in a
# few seconds on a laptop core: a point costs a few milliseconds to bound, a solve tens.
MAX_POINTS = 1000  # points whose own bound is computed
# devices the hybrid search tries with fewer samples than devices, unless pins or budgets say
DEFAULT_SHARED_DEVICES = 4096
MAX_INNER_SOLVES = 100  # CP-SAT solves, each within INNER_DETERMINISTIC_TIME
_TIE = 1e-9  # relative: a plan this close to its point's bound is optimal there


class Strategy(str, Enum):
    data = "data"
    hybrid = "hybrid"
    pipeline = "pipeline"
    auto = "auto"


@dataclass
class SplitSolution:
    """A hybrid or pipeline plan: config, the per-layer or per-stage plan, the prediction, and
    the best pure data-parallel plan it was measured against."""

    strategy: str
    status: str  # optimal | feasible (time or solve limit reached before the bound closed)
    config: dict
    plan: dict  # {"layers": [...]} or {"stages": [...]}
    prediction: Prediction
    objective: dict
    data_parallel: dict | None  # {config, iteration_time_s, objective} of the best DP plan
    search: dict = field(default_factory=dict)
    training: dict | None = None
    # What ended the search before the bound closed: None (it closed: proven), "budget" (the
    # deterministic budget: the same on every run) or "time-limit" (the wall-clock guard: this
    # answer may differ between runs).
    stopped_by: str | None = None
    # hybrid plans: the volume side above which splitting a sample over k devices beats one
    # device per sample, for each k a node allows (`planner.analysis.spatial.crossover`)
    spatial: list | None = None

    def __post_init__(self):
        """Every dict field reads as attributes (`planner.search.solution.Record`)."""
        self.config, self.plan = record(self.config), record(self.plan)
        self.objective = record(self.objective, ObjectiveValue)
        self.data_parallel, self.search = record(self.data_parallel), record(self.search)
        self.training = record(self.training, TrainingReport)
        self.spatial = record(self.spatial)


def _divisors(x: int) -> list[int]:
    return [d for d in range(1, x + 1) if x % d == 0]


class SplitSearch:
    def __init__(self, model: DataParallelModel, problem: Problem, stages: int | None = None):
        self.m, self.p, self.stages = model, problem, stages
        self.dp_solver = DataParallelSolver(model, problem)
        unsupported = [k for k, v in (("fewest_nodes_within", problem.fewest_nodes_within),
                                      ("top", problem.top or None), ("pareto", problem.pareto or None))
                       if v is not None]
        if unsupported:
            key = unsupported[0].replace("fewest_nodes_within", "within")
            raise SpecError(f"{key}: --{key} applies to --strategy data only")
        self.capacity = usable_bytes(model.system.device.usable_memory_bytes, problem.memory_headroom)

    # --- the points both strategies share ------------------------------------------------------

    def _points(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows (n, g, b, collective index), objective factor per row) allowed by every
        constraint except memory, which the split changes."""
        built = self.dp_solver.table()
        mask = np.ones(len(built.rows), dtype=bool)
        for gate in built.table.gates:
            if gate.name != "memory":
                mask &= gate.allowed
        if not mask.any():
            raise self.dp_solver.explain()
        rows = built.rows[mask]
        self.smallest_local_batch = int(rows["b"].min())
        N = rows["n"] * rows["g"]
        factor = self.dp_solver.factor_values(N, N * rows["b"])
        self.collectives = built.collectives
        return rows, factor

    def _data_parallel(self) -> Solution | None:
        try:
            return self.dp_solver.solve()
        except InfeasibleError:
            return None

    def _within_limits(self, t_iter: float, devices: int, batch: int) -> bool:
        tr = self.p.training
        if tr is None:
            return True
        ttt = t_iter * tr.steps(batch)
        if tr.deadline_s is not None and ttt > tr.deadline_s:
            return False
        price = tr.price_per_device_hour or 0.0
        return not (tr.budget_usd is not None and ttt / 3600 * devices * price > tr.budget_usd)

    # --- branch and bound ------------------------------------------------------------------------

    def _branch_and_bound(self, candidates, incumbent: float, build, solve_point):
        """candidates: (lower bound on the objective, key) pairs. build(key) -> (share, point):
        a priced point (`LayerModes` or `Stages`: `bound_and_plans()` or `bound_and_cuts()`,
        `evaluate(plan)`) and a hashable `share`, equal for keys that price alike (they are
        bounded and solved once); solve_point(point, capacity, wall-clock guard, workers) ->
        `Inner` (CP-SAT). Returns the best (objective, key, point, plan), whether that is
        proven, what stopped the search early (None, "budget" or "time-limit"), and counts."""
        heap = list(candidates)
        heapq.heapify(heap)
        best = None
        bounds: dict = {}  # share -> (its own bound, the plans it suggests)
        solved: dict = {}  # share -> (plan or None, iteration time, proven)
        points = solves = 0
        proven, stopped, t0 = True, None, time.perf_counter()
        while heap:
            lb, key = heapq.heappop(heap)
            if lb >= incumbent * (1 - 1e-12):
                break
            if points >= MAX_POINTS or solves >= MAX_INNER_SOLVES:
                proven, stopped = False, stopped or "budget"
                break
            left = self.p.time_limit_s - (time.perf_counter() - t0)
            if left <= 0:
                proven, stopped = False, "time-limit"
                break
            share, point = build(key)
            factor = key[-1]
            if share not in bounds:
                points += 1
                bounds[share] = (point.bound_and_cuts() if hasattr(point, "bound_and_cuts")
                                 else point.bound_and_plans())
            if bounds[share][0] * factor >= incumbent * (1 - 1e-12):
                continue
            if share not in solved:
                got, ran = self._solve_point(point, bounds[share], left, solve_point)
                solves += ran
                if got[3] is not None:
                    stopped = "time-limit" if "time-limit" in (stopped, got[3]) else got[3]
                solved[share] = got[:3]
            plan, t_iter, optimal = solved[share]
            proven &= optimal
            if plan is None:
                continue
            obj = t_iter * factor
            if obj < incumbent and self._within_limits(t_iter, key[0] * key[1], self._batch(key)):
                incumbent, best = obj, (obj, key, point, plan)
        stats = {"inner_solves": solves, "candidates": len(candidates),
                 "pruned": len(candidates) - solves, "time_s": time.perf_counter() - t0}
        return best, proven, (None if proven else stopped or "budget"), stats

    def _solve_point(self, point, bound_and_guesses, guard_s: float, solve_point):
        """(plan, iteration time, proven, stopped) of one point, and how many CP-SAT solves
        it took (0 when a plan its bound suggests meets the bound)."""
        bound, guesses = bound_and_guesses
        plan, t_best = None, float("inf")
        for guess in guesses:
            ev = point.evaluate(guess)
            if ev.memory_bytes <= self.capacity and ev.iteration_time_s < t_best:
                plan, t_best = guess, float(ev.iteration_time_s)
        if plan is not None and t_best <= bound * (1 + _TIE):
            return (plan, t_best, True, None), 0
        got: Inner = solve_point(point, self.capacity, guard_s, self.p.workers)
        if got.plan is not None:
            t = float(point.evaluate(got.plan).iteration_time_s)
            if t < t_best:
                plan, t_best = got.plan, t
        return (plan, t_best, got.proven, got.stopped), 1

    @staticmethod
    def _batch(key) -> int:
        return int(key[0] * key[1] * key[2]) if len(key) == 5 else key[2]

    # --- hybrid ----------------------------------------------------------------------------------

    def _shared_points(self) -> list[tuple]:
        """(n, g, b, collective index, objective factor) with fewer samples than devices (b a
        fraction B / N, N a multiple of B): only groups of devices sharing whole samples (spatial
        or model modes) run there. For a fixed global batch, within the node and device pins
        and budgets, up to as many devices per sample as any mode's degree can use."""
        p, dpn = self.p, self.m.system.devices_per_node
        B = p.global_batch
        if B is None or p.local_batch is not None or p.local_batch_min is not None:
            return []
        cnn = self.m.cnn
        deepest = max((l.output_shape[1] for l in cnn.layers if len(l.output_shape) >= 3),
                      default=1)
        widest = min((l.output_shape[0] for l in cnn.layers if l.params), default=1)
        most = B * max(deepest, widest)  # more devices than this leave a mode without rows
        caps = [x for x in (p.devices, p.devices_max) if x is not None]
        caps += [x * dpn for x in (p.nodes, p.nodes_max) if x is not None]
        top = min([most, *caps]) if caps else min(most, DEFAULT_SHARED_DEVICES)
        out = []
        for n in range(1, top + 1):
            for g in range(1, dpn + 1):
                N = n * g
                if top < N or N <= B or N % B:
                    continue
                if (p.nodes not in (None, n) or p.devices not in (None, N)
                        or p.devices_per_node not in (None, g)
                        or (p.nodes_max is not None and n > p.nodes_max)
                        or (p.devices_max is not None and p.devices_max < N)):
                    continue
                b = Fraction(B, N)
                if not modes_at(cnn, n, g, b).valid.any(axis=1).all():
                    continue  # a segment no group holding whole samples can take
                factor = float(self.dp_solver.factor_values(np.array([N]), np.array([B]))[0])
                out += [(n, g, b, c, factor) for c in range(len(self.p.collectives))]
        return out

    def hybrid(self, dp_sol: Solution | None) -> SplitSolution | None:
        try:
            rows, factor = self._points()
        except InfeasibleError:
            shared = self._shared_points()
            if not shared:
                raise
            rows, factor = np.zeros(0, dtype=ROW), np.zeros(0)
            self.collectives = list(self.p.collectives)
        a = LayerArrays.of(self.m.cnn)
        # Lower bound per point: weighted layers at the least roofline any mode allows,
        # weightless ones as in data parallelism (the same in every mode), and the least
        # communication any assignment of modes has.
        weighted = a.params > 0
        keys = [(*(int(rows[i][f]) for f in ("n", "g", "b", "c")), float(factor[i]))
                for i in range(len(rows))] + self._shared_points()
        b_col = np.array([float(k[2]) for k in keys])[:, None]
        n_col = np.array([k[0] * k[1] for k in keys], dtype=float)[:, None]
        floor = weighted_layer_floor(self.m, a, b_col, n_col)
        rest = data_layer_times(self.m, a, b_col)
        comm = np.array([self._least_hybrid_comm(k[0], k[1], k[3]) for k in keys])
        lb = (floor + (rest * ~weighted).sum(axis=1) + comm) * np.array([k[4] for k in keys])
        cands = [(float(lb[i]), keys[i]) for i in range(len(keys))]
        incumbent = dp_sol.objective["value"] if dp_sol else float("inf")
        # The data-parallel optimum is the all-data plan; let the search find it again (the
        # incumbent only prunes), so start just above it.
        incumbent *= 1 + 1e-9

        def build(key):
            n, g, b_, c, _ = key
            return key[:4], LayerModes(self.m, n, g, b_, self.collectives[c], self.p.overlap)

        best, proven, stopped, stats = self._branch_and_bound(cands, incumbent, build,
                                                              solve_modes)
        if best is None and stopped and dp_sol is not None:
            # Stopped before meeting the data-parallel plan again: that plan (every segment
            # in data mode) is still the best known, not an infeasible search.
            cfg = dp_sol.config
            key = (cfg.nodes, cfg.devices_per_node, cfg.local_batch,
                   self.collectives.index(Collective(cfg.collective)), 0.0)
            lm = build(key)[1]
            best = (dp_sol.objective["value"], key, lm, [0] * lm.shape[0])
        if best is None:
            return None
        _, key, lm, assign = best
        br = lm.evaluate(assign)
        n, g, b_, c, _ = key
        batch = int(n * g * b_)
        config = {"nodes": n, "devices_per_node": g, "devices": n * g, "global_batch": batch,
                  "collective": self.collectives[c].value, "overlap": self.p.overlap}
        if Fraction(b_).denominator == 1:
            config["local_batch"] = int(b_)
        else:  # several devices share each sample
            config["devices_per_sample"] = Fraction(b_).denominator
        pred = self._prediction(br.iteration_time_s, n * g, batch, br.compute_time_s,
                                br.activation_comm_s + br.gradient_comm_s,
                                br.activation_comm_s + br.exposed_gradient_comm_s,
                                br.optimizer_time_s, br.memory_bytes, br.memory_breakdown,
                                activation_communication_time_s=br.activation_comm_s)
        from planner.analysis.spatial import crossovers

        sol = self._solution("hybrid", proven, config, {"layers": br.layers}, pred, best[0],
                             dp_sol, stats, stopped)
        return dataclasses.replace(sol, spatial=crossovers(self.m, self.collectives[c]) or None)

    def _least_hybrid_comm(self, n: int, g: int, c: int) -> float:
        """A floor on the communication of every mode assignment at one point, when none of it
        can hide (no overlap, or no backward work after the first gradient bucket): a weighted
        segment in model k < N joins an allreduce over N / k replicas (at least one call's
        latency), and one in model N all-gathers its input over N devices ((N - 1) latencies).
        0 when communication may hide, or there is nothing to exchange."""
        N = n * g
        hides = self.p.overlap and self.m.roofline["T_hide"].works
        if N == 1 or hides or not self.m.cnn.params:
            return 0.0
        memo = self.__dict__.setdefault("_comm_floor", {})
        if (n, g, c) not in memo:
            widest = min(l.output_shape[0] for l in self.m.cnn.layers if l.params)
            degrees = [k for k in range(1, N + 1) if N % k == 0 and (g % k == 0 or k % g == 0)
                       and (k == 1 or k <= widest)]  # as `LayerModes` allows them
            options = [allreduce_terms(self.m, self.collectives[c], N // k,
                                       g // k if k <= g else 1)[0] for k in degrees if k < N]
            if N in degrees:
                options.append((N - 1) * link(self.m, g < N).alpha)
            memo[n, g, c] = min(options)
        return memo[n, g, c]

    # --- pipeline --------------------------------------------------------------------------------

    def pipeline(self, dp_sol: Solution | None) -> SplitSolution | None:
        if self.p.local_batch is not None or self.p.local_batch_min is not None:
            raise SpecError("local_batch: --local-batch / --local-batch-min apply to --strategy "
                            "data and hybrid (a pipeline is sized by its micro-batch)")
        n_units = len(units(self.m.cnn))
        if self.stages is not None and self.stages > n_units:
            # A pin no hardware can satisfy: bad input, not an infeasible problem.
            raise SpecError(f"stages: --stages {self.stages} exceeds the {n_units} units of "
                            f"'{self.m.cnn.name}' (stages are cut between its top-level "
                            "entries)")
        rows, factor = self._points()
        floors: dict[tuple[int, int, bool], float] = {}
        tails: dict[tuple[int, int, int, bool, int], float] = {}
        opt_total = float(self.m.t_opt)  # every stage's optimizer step together
        grad_total = self.m.grad_bytes  # every stage's gradients together
        cands = []
        for i in range(len(rows)):
            n, g, b_, c = (int(rows[i][f]) for f in ("n", "g", "b", "c"))
            N, B = n * g, n * g * b_
            for p in _divisors(N):
                if not 2 <= p <= n_units or self.stages not in (None, p):
                    continue
                per_copy = B // (N // p)
                inside = p <= g and g % p == 0  # as `Stages` decides the link
                for mu in _divisors(per_copy):
                    m = per_copy // mu
                    if (p, mu, inside) not in floors:
                        # The smallest slowest stage of any cut (exact, by dynamic
                        # programming): it depends on the point only through p, mu and the link.
                        floors[p, mu, inside] = slowest_stage_floor(self.m, p, mu, inside)
                    slowest = floors[p, mu, inside]
                    # The slowest tail is at least the mean one and, with replicas to
                    # allreduce over, one call's latency (a stage with weights makes one).
                    if (c, p, N // p, inside, g // p) not in tails:
                        per_node = max(1, min(g // p if inside else 1, N // p))
                        lat, per_byte = allreduce_terms(self.m, self.collectives[c], N // p,
                                                        per_node)
                        tails[c, p, N // p, inside, g // p] = max(
                            lat if grad_total else 0.0, (grad_total * per_byte + opt_total) / p)
                    tail = tails[c, p, N // p, inside, g // p]
                    cands.append((((m + p - 1) * slowest + tail) * float(factor[i]),
                                  (n, g, B, c, p, mu, float(factor[i]))))
        if not cands:
            want = f"{self.stages}" if self.stages else "2 or more"
            raise InfeasibleError(f"infeasible: pipeline: no device count here splits into {want} "
                                  f"stages (the network has {n_units} units to cut between) "
                                  "with the global batch in whole micro-batches", ("pipeline",))
        incumbent = float("inf")
        built: dict[tuple, Stages] = {}

        def build(key):
            # Points that differ only in where their devices sit but price alike share one
            # `Stages` (and so one inner solve): it depends on n and g only through the
            # replicas, whether a copy fits in a node, and the replicas per node.
            n, g, B, c, p, mu, _ = key
            inside = p <= g and g % p == 0
            same = (n * g // p, inside, g // p if inside else 1, p, mu, B // (n * g // p) // mu, c)
            if same not in built:
                built[same] = Stages(self.m, n, g, p, mu, B // (n * g // p) // mu,
                                     self.collectives[c])
            return same, built[same]

        best, proven, stopped, stats = self._branch_and_bound(cands, incumbent, build,
                                                              solve_cut)
        if best is None:
            return None
        _, key, st, cut = best
        sp = st.evaluate(cut)
        n, g, B, c, p, mu, _ = key
        config = {"nodes": n, "devices_per_node": g, "devices": n * g, "global_batch": B,
                  "stages": p, "replicas": st.replicas, "micro_batch": mu,
                  "micro_batches": st.m, "collective": self.collectives[c].value,
                  "overlap": False}
        comm = sp.p2p_time_s + sp.gradient_comm_s
        pred = self._prediction(sp.iteration_time_s, n * g, B, sp.compute_time_s, comm, comm,
                                sp.optimizer_time_s, sp.memory_bytes, sp.memory_breakdown,
                                bubble_fraction=sp.bubble_fraction, stage_time_s=sp.stage_time_s,
                                p2p_time_s=sp.p2p_time_s)
        return self._solution("pipeline", proven, config, {"stages": sp.stages}, pred, best[0],
                              dp_sol, stats, stopped)

    # --- results ---------------------------------------------------------------------------------

    def _prediction(self, t_iter, devices, batch, compute, comm, exposed, opt, mem_total,
                    mem, **split) -> Prediction:
        one = float(self.m.numeric("compute")(1, 1, float(batch))) + float(self.m.t_opt)
        return Prediction(
            iteration_time_s=t_iter, samples_per_s=batch / t_iter, compute_time_s=compute,
            communication_time_s=comm, exposed_communication_time_s=exposed,
            optimizer_time_s=opt, time_breakdown={"compute": compute, "comm_exposed": exposed,
                                                  "optimizer": opt},
            memory_bytes_per_device=mem_total, memory_breakdown=mem,
            memory_capacity_bytes=self.capacity, fits_memory=mem_total <= self.capacity,
            speedup=one / t_iter, efficiency=one / t_iter / devices, **split)

    def _solution(self, strategy, proven, config, plan, pred, value, dp_sol, stats, stopped):
        tr = self.p.training
        training = None
        if tr is not None:
            steps = tr.steps(config["global_batch"])
            training = {"steps": steps, "samples": steps * config["global_batch"],
                        "time_to_train_s": steps * pred.iteration_time_s}
            if tr.price_per_device_hour is not None:
                training["cost_usd"] = training["time_to_train_s"] / 3600 * config["devices"] \
                    * tr.price_per_device_hour
        unit = self.p.objective.unit
        baseline = None
        if dp_sol is not None:
            baseline = {"config": dp_sol.config.to_json(),
                        "iteration_time_s": dp_sol.prediction.iteration_time_s,
                        "objective_value": dp_sol.objective["value"]}
        return SplitSolution(strategy, "optimal" if proven else "feasible", config, plan, pred,
                             {"name": self.p.objective.value, "value": value, "unit": unit},
                             baseline, stats, training, stopped)

    # --- entry -----------------------------------------------------------------------------------

    def solve(self, strategy: Strategy) -> SplitSolution | Solution:
        if self.stages is not None and strategy is not Strategy.pipeline:
            raise SpecError("stages: --stages pins the pipeline depth; use it with --strategy "
                            "pipeline")
        dp_sol = self._data_parallel()
        if strategy is Strategy.data:
            return dp_sol if dp_sol is not None else self.dp_solver.solve()
        found, why = [], []
        for kind, search in ((Strategy.hybrid, self.hybrid), (Strategy.pipeline, self.pipeline)):
            if strategy not in (kind, Strategy.auto):
                continue
            try:
                found.append(search(dp_sol))
            except InfeasibleError as exc:
                if strategy is not Strategy.auto:
                    raise
                why.append(exc)  # auto: the other strategies may still have a plan
        found = [f for f in found if f is not None]
        if strategy is Strategy.auto and not found and dp_sol is None and why:
            raise why[0]
        if strategy is Strategy.auto and dp_sol is not None:
            best_split = min(found, key=lambda f: f.objective["value"], default=None)
            if best_split is None or dp_sol.objective["value"] <= best_split.objective["value"]:
                return dp_sol
        if not found:
            if dp_sol is not None:
                raise InfeasibleError(f"infeasible: {strategy.value}: no plan meets the "
                                      "constraints", (strategy.value,))
            b_min = getattr(self, "smallest_local_batch", 1)
            need = float(self.m.numeric("memory")(1, 1, float(b_min))) / 2**30
            raise InfeasibleError(
                f"infeasible: memory: no {strategy.value} plan fits in the "
                f"{self.capacity / 2**30:.3g} GiB of '{self.m.system.device.name}' (pure data "
                f"parallelism needs {need:.3g} GiB at the smallest local batch allowed, "
                f"{b_min})", ("memory",))
        return min(found, key=lambda f: f.objective["value"])

