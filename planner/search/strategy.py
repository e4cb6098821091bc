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
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from planner.cost.cnn_layout import LayerArrays, data_layer_times, rates, units
from planner.cost.data_parallel import DataParallelModel
from planner.cost.layer_modes import LayerModes
from planner.cost.stages import Stages
from planner.errors import InfeasibleError, SpecError
from planner.prediction import Prediction
from planner.search.data_parallel import DataParallelSolver, Problem, Solution
from planner.search.layer_modes import best_modes
from planner.search.stages import best_cut

MAX_INNER_SOLVES = 4000


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
        self.capacity = model.system.device.memory_bytes

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
        self.smallest_local_batch = int(rows[:, 2].min())
        N = rows[:, 0] * rows[:, 1]
        factor = self.dp_solver.factor_values(N, N * rows[:, 2])
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
        """candidates: (lower bound on the objective, key) pairs. build(key) -> a priced point
        (`LayerModes` or `Stages`: `lower_bound()`, `evaluate(plan)`); solve_point(point,
        capacity, time limit, workers) -> (plan, optimal) or None (CP-SAT). Returns the best
        (objective, key, point, plan), whether that is proven, and counts."""
        heap = list(candidates)
        heapq.heapify(heap)
        best = None
        solves, proven, t0 = 0, True, time.perf_counter()
        while heap:
            lb, key = heapq.heappop(heap)
            if lb >= incumbent * (1 - 1e-12):
                break
            if solves >= MAX_INNER_SOLVES or time.perf_counter() - t0 > self.p.time_limit_s:
                proven = False
                break
            point = build(key)
            factor = key[-1]
            if point.lower_bound() * factor >= incumbent * (1 - 1e-12):
                continue
            solves += 1
            got = solve_point(point, self.capacity, self.p.time_limit_s, self.p.workers)
            if got is None:
                continue
            plan, optimal = got
            t_iter = point.evaluate(plan).iteration_time_s
            proven &= optimal
            obj = t_iter * factor
            if obj < incumbent and self._within_limits(t_iter, key[0] * key[1], self._batch(key)):
                incumbent, best = obj, (obj, key, point, plan)
        stats = {"inner_solves": solves, "candidates": len(candidates),
                 "pruned": len(candidates) - solves, "time_s": time.perf_counter() - t0}
        return best, proven, stats

    @staticmethod
    def _batch(key) -> int:
        return key[0] * key[1] * key[2] if len(key) == 5 else key[2]

    # --- hybrid ----------------------------------------------------------------------------------

    def hybrid(self, dp_sol: Solution | None) -> SplitSolution | None:
        rows, factor = self._points()
        a = LayerArrays.of(self.m.cnn)
        # Lower bound per point: weighted layers at their FLOP time (no mode beats it),
        # weightless ones as in data parallelism, all communication hidden.
        weighted = a.params > 0
        flop_time = ((1 + a.bwd_factor) * a.flops)[weighted].sum() / rates(self.m)[0]
        rest = data_layer_times(self.m, a, rows[:, 2][:, None])
        lb = (flop_time * rows[:, 2] + (rest * ~weighted).sum(axis=1)) * factor
        cands = [(float(lb[i]), (*(int(x) for x in rows[i, :4]), float(factor[i])))
                 for i in range(len(rows))]
        incumbent = dp_sol.objective["value"] if dp_sol else float("inf")
        # The data-parallel optimum is the all-data plan; let the search find it again (the
        # incumbent only prunes), so start just above it.
        incumbent *= 1 + 1e-9

        def build(key):
            n, g, b_, c, _ = key
            return LayerModes(self.m, n, g, b_, self.collectives[c], self.p.overlap)

        best, proven, stats = self._branch_and_bound(cands, incumbent, build, best_modes)
        if best is None:
            return None
        _, key, lm, assign = best
        br = lm.evaluate(assign)
        n, g, b_, c, _ = key
        config = {"nodes": n, "devices_per_node": g, "devices": n * g,
                  "global_batch": n * g * b_, "local_batch": b_,
                  "collective": self.collectives[c].value, "overlap": self.p.overlap}
        pred = self._prediction(br.iteration_time_s, n * g, n * g * b_, br.compute_time_s,
                                br.activation_comm_s + br.gradient_comm_s,
                                br.activation_comm_s + br.exposed_gradient_comm_s,
                                br.optimizer_time_s, br.memory_bytes, br.memory_breakdown,
                                activation_communication_time_s=br.activation_comm_s)
        return self._solution("hybrid", proven, config, {"layers": br.layers}, pred, best[0],
                              dp_sol, stats)

    # --- pipeline --------------------------------------------------------------------------------

    def pipeline(self, dp_sol: Solution | None) -> SplitSolution | None:
        if self.p.local_batch is not None or self.p.local_batch_min is not None:
            raise SpecError("local_batch: --local-batch / --local-batch-min apply to --strategy "
                            "data and hybrid (a pipeline is sized by its micro-batch)")
        rows, factor = self._points()
        n_units = len(units(self.m.cnn))
        sums = self.m.compute_sum  # forward + backward roofline of the whole network
        unit_max: dict[int, float] = {}
        cands = []
        for i in range(len(rows)):
            n, g, b_, c = (int(x) for x in rows[i, :4])
            N, B = n * g, n * g * b_
            for p in _divisors(N):
                if not 2 <= p <= n_units or self.stages not in (None, p):
                    continue
                per_copy = B // (N // p)
                for mu in _divisors(per_copy):
                    m = per_copy // mu
                    if mu not in unit_max:
                        unit_max[mu] = self._largest_unit(mu)
                    slowest = max(float(sums(mu)) / p, unit_max[mu])
                    cands.append(((m + p - 1) * slowest * float(factor[i]),
                                  (n, g, B, c, p, mu, float(factor[i]))))
        if not cands:
            want = f"{self.stages}" if self.stages else "2 or more"
            raise InfeasibleError(f"infeasible: pipeline: no device count here splits into {want} "
                                  f"stages (the network has {n_units} units to cut between) "
                                  "with the global batch in whole micro-batches", ("pipeline",))
        incumbent = float("inf")

        def build(key):
            n, g, B, c, p, mu, _ = key
            return Stages(self.m, n, g, p, mu, B // (n * g // p) // mu, self.collectives[c])

        best, proven, stats = self._branch_and_bound(cands, incumbent, build, best_cut)
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
                              dp_sol, stats)

    def _largest_unit(self, mu: int) -> float:
        t = data_layer_times(self.m, LayerArrays.of(self.m.cnn), mu)
        return max(float(t[list(u.layers)].sum()) for u in units(self.m.cnn))

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

    def _solution(self, strategy, proven, config, plan, pred, value, dp_sol, stats):
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
                             baseline, stats, training)

    # --- entry -----------------------------------------------------------------------------------

    def solve(self, strategy: Strategy) -> SplitSolution | Solution:
        if self.stages is not None and strategy is not Strategy.pipeline:
            raise SpecError("stages: --stages pins the pipeline depth; use it with --strategy "
                            "pipeline")
        dp_sol = self._data_parallel()
        if strategy is Strategy.data:
            return dp_sol if dp_sol is not None else self.dp_solver.solve()
        found = []
        if strategy in (Strategy.hybrid, Strategy.auto):
            found.append(self.hybrid(dp_sol))
        if strategy in (Strategy.pipeline, Strategy.auto):
            found.append(self.pipeline(dp_sol))
        found = [f for f in found if f is not None]
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

