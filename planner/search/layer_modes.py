"""CP-SAT over per-segment modes (data, or model parallel over k devices) for one point, in the
order of the OR-Tools samples: variables, constraints, objective, solve, values.

Times are integer nanoseconds and memory whole bytes (CP-SAT is integral); the plan it returns
is then priced in float by `LayerModes.evaluate`, which is what the user sees. The rounding
moves any objective by at most half a nanosecond per term.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from planner.cost.layer_modes import LayerModes
from planner.search.rows import cp_solver

NS = 1e9
# The work one inner solve may do, in CP-SAT's deterministic time units (about a second of
# search on a laptop core): the same on every machine and load, so the answer is too. The
# wall-clock limit the caller passes only guards against runaways.
INNER_DETERMINISTIC_TIME = 1.0


def _ns(x: float) -> int:
    return int(round(x * NS))


@dataclass(frozen=True)
class Inner:
    """What one inner solve found: the plan (None: no plan fits in memory, or none found),
    whether that is proven (optimal plan, or proven infeasible), and what stopped it early:
    None, "budget" (the deterministic limit) or "time-limit" (the wall-clock guard)."""

    plan: list[int] | None
    proven: bool
    stopped: str | None = None


def run_inner(model: cp_model.CpModel, time_limit_s: float, workers: int,
              deterministic_time: float) -> tuple[cp_model.CpSolver, int, str | None]:
    """Solve an inner model under a deterministic work limit, with the wall-clock limit as a
    guard; return the solver, its status and what stopped it early (if anything)."""
    solver = cp_solver(time_limit_s, workers)
    solver.parameters.max_deterministic_time = deterministic_time
    status = solver.solve(model)
    stopped = None
    if status not in (cp_model.OPTIMAL, cp_model.INFEASIBLE):
        stopped = "time-limit" if solver.wall_time >= 0.99 * time_limit_s else "budget"
    return solver, status, stopped


def best_modes(lm: LayerModes, capacity_bytes: float, time_limit_s: float,
               workers: int = 1) -> tuple[list[int], bool] | None:
    """(degree index per segment, proven optimal) minimising the iteration time with the
    memory per device within `capacity_bytes`; None when no assignment fits."""
    got = solve_modes(lm, capacity_bytes, time_limit_s, workers)
    return None if got.plan is None else (got.plan, got.proven)


def solve_modes(lm: LayerModes, capacity_bytes: float, time_limit_s: float, workers: int = 1,
                deterministic_time: float = INNER_DETERMINISTIC_TIME) -> Inner:
    """CP-SAT over the modes of one point (see `best_modes`), with what stopped it."""
    S, K = lm.shape
    model = cp_model.CpModel()
    # Variables: x[s][j] = segment s runs in mode j (a mode that cannot run there is 0).
    x = [[model.new_bool_var(f"x_{s}_{j}") for j in range(K)] for s in range(S)]
    for s in range(S):
        model.add_exactly_one(x[s])
        for j in range(K):
            if not lm.valid[s, j]:
                model.add(x[s][j] == 0)
    # Leaving model k (to another mode, or at the end of the network) costs the all-to-all.
    z = {}
    for s in range(S):
        for j in range(1, K):
            z[s, j] = model.new_bool_var(f"exit_{s}_{j}")
            nxt = x[s + 1][j] if s + 1 < S else 0
            model.add(z[s, j] >= x[s][j] - nxt)
    # Entering a spatial mode from another (after the first segment) re-partitions its input.
    e = {}
    for s in range(1, S):
        for j in range(K):
            if lm.entry[s, j] > 0:
                e[s, j] = model.new_bool_var(f"entry_{s}_{j}")
                model.add(e[s, j] >= x[s][j] - x[s - 1][j])
    # Gradient allreduce per replica group (data and spatial modes share all N devices):
    # ceil(bytes / bucket) calls, at least one if used.
    grad_terms = []
    groups = sorted(set(lm.group.tolist()))
    for grp in groups:
        if lm.latency[grp] == 0 and lm.per_byte[grp] == 0:
            continue
        modes = [j for j in range(K) if lm.group[j] == grp]
        used = [(x[s][j], int(lm.grad_bytes[s, j])) for s in range(S) for j in modes
                if lm.grad_bytes[s, j] > 0 and lm.valid[s, j]]
        if not used:
            continue
        total = sum(int(lm.grad_bytes[s, modes].max()) for s in range(S))
        calls = model.new_int_var(0, lm.calls(total), f"calls_{grp}")
        model.add(calls * int(lm.bucket) >= sum(v * b for v, b in used))
        for v, _ in used:
            model.add(calls >= v)
        grad_terms.append(calls * _ns(lm.latency[grp]))
        grad_terms += [v * _ns(b * lm.per_byte[grp]) for v, b in used]
    lin = lambda table: sum(x[s][j] * _ns(table[s, j]) for s in range(S) for j in range(K)  # noqa: E731
                            if lm.valid[s, j])
    horizon = _ns(lm.compute.max(axis=1).sum() + lm.act.max(axis=1).sum()
                  + lm.exit.max(axis=1).sum() + lm.entry.max(axis=1).sum()
                  + lm.optimizer.max(axis=1).sum()) + 1
    grad_hi = sum(_ns(lm.latency[j]) * lm.calls(lm.grad_bytes[:, j].sum())
                  + _ns(lm.grad_bytes[:, j].sum() * lm.per_byte[j]) for j in range(K)) + 1
    grad = model.new_int_var(0, grad_hi, "gradient_comm")
    model.add(grad == sum(grad_terms))
    exposed = model.new_int_var(0, grad_hi, "exposed_gradient_comm")
    if lm.overlap:
        model.add(exposed >= grad - lin(lm.hide))  # max(0, comm - hidden) with exposed >= 0
    else:
        model.add(exposed == grad)
    # Constraint: memory per device.
    room = int(capacity_bytes - lm.memory_fixed)
    model.add(sum(x[s][j] * int(np.ceil(lm.memory[s, j])) for s in range(S) for j in range(K))
              <= room)
    # Objective: the iteration time.
    iteration = model.new_int_var(0, horizon + grad_hi, "iteration_ns")
    model.add(iteration == lin(lm.compute + lm.act + lm.optimizer)
              + sum(z[s, j] * _ns(lm.exit[s, j]) for s in range(S) for j in range(1, K))
              + sum(v * _ns(lm.entry[s, j]) for (s, j), v in e.items())
              + exposed)
    model.minimize(iteration)
    solver, status, stopped = run_inner(model, time_limit_s, workers, deterministic_time)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Inner(None, status == cp_model.INFEASIBLE, stopped)
    assign = [next(j for j in range(K) if solver.value(x[s][j])) for s in range(S)]
    return Inner(assign, status == cp_model.OPTIMAL, stopped)
