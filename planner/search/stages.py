"""CP-SAT over the cut points of a pipeline for one point (nodes, devices per node, stages p,
micro-batch): which contiguous units each stage gets, minimising (m + p - 1) x the slowest
stage + the slowest stage's allreduce and optimizer step, with each stage's memory within the
device.

Stage j holds units [q_{j-1}, q_j) with 0 = q_{-1} < q_0 < ... < q_{p-1} = U, so a stage's
sums are differences of prefix sums read with element constraints: p - 1 integer variables
instead of a unit x stage matrix. Integer nanoseconds and whole bytes, as in
`search/layer_modes.py`; the plan is priced in float by `Stages.evaluate`.
"""

from __future__ import annotations

import numpy as np
from ortools.sat.python import cp_model

from planner.cost.stages import Stages
from planner.search.layer_modes import INNER_DETERMINISTIC_TIME, Inner, _ns, run_inner


def _prefix(values) -> list[int]:
    """[0, v0, v0 + v1, ...] as integers (the sums are rounded once, not per unit)."""
    return [0, *(int(x) for x in np.cumsum(values))]


def best_cut(st: Stages, capacity_bytes: float, time_limit_s: float,
             workers: int = 1) -> tuple[list[int], bool] | None:
    """(stage index per unit, proven optimal), or None when no cut fits in memory."""
    got = solve_cut(st, capacity_bytes, time_limit_s, workers)
    return None if got.plan is None else (got.plan, got.proven)


def solve_cut(st: Stages, capacity_bytes: float, time_limit_s: float, workers: int = 1,
              deterministic_time: float = INNER_DETERMINISTIC_TIME) -> Inner:
    """CP-SAT over the cuts of one point (see `best_cut`), with what stopped it."""
    U, p = len(st.units), st.p
    if p > U:
        return Inner(None, True)
    model = cp_model.CpModel()
    # Variables: q[j] = first unit after stage j (q[-1] = 0 and q[p-1] = U are fixed).
    q = [model.new_constant(0)] + [model.new_int_var(1, U - 1, f"q_{j}") for j in range(p - 1)] \
        + [model.new_constant(U)]
    for j in range(p):
        model.add(q[j + 1] >= q[j] + 1)  # every stage holds at least one unit
    time_ns = _prefix(np.array([_ns(t) for t in st.time]))
    send_at = [0] + [_ns(s) for s in st.send[:-1]] + [0]  # the send across boundary q
    weights = _prefix(st.grad_bytes)
    opt_ns = _prefix(np.array([_ns(t) for t in st.optimizer]))
    grad_ns = _prefix(np.array([_ns(b * st.per_byte) for b in st.grad_bytes]))

    def at(table: list[int], index, name: str) -> cp_model.IntVar:
        var = model.new_int_var(min(table), max(table), name)
        model.add_element(index, table, var)
        return var

    lookups = {name: [at(table, q[i], f"{name}_{i}") for i in range(p + 1)]
               for name, table in (("time", time_ns), ("send", send_at), ("weights", weights),
                                   ("opt", opt_ns), ("grad", grad_ns))}
    slowest = model.new_int_var(0, time_ns[-1] + 2 * max(send_at) + 1, "slowest_stage_ns")
    tail_hi = _ns(st.latency) * st.calls(weights[-1]) + grad_ns[-1] + opt_ns[-1] + 1
    tail = model.new_int_var(0, tail_hi, "tail_ns")
    static = sum(st.memory_static.values())
    for j in range(p):
        lo, hi = j, j + 1
        # Stage time per micro-batch: its units plus the sends on both of its boundaries.
        model.add(slowest >= lookups["time"][hi] - lookups["time"][lo]
                  + lookups["send"][hi] + lookups["send"][lo])
        # Memory: weights, gradients, optimizer state and min(m, p - j) micro-batches in flight.
        mem = _prefix(np.ceil(static + st.in_flight(j) * st.memory_activation))
        model.add(at(mem, q[hi], f"mem_hi_{j}") - at(mem, q[lo], f"mem_lo_{j}")
                  <= int(capacity_bytes))
        # Gradient allreduce: ceil(bytes / bucket) calls (none for a stage without weights).
        w = lookups["weights"][hi] - lookups["weights"][lo]
        grad = 0
        if weights[-1] and (st.latency or st.per_byte):
            calls = model.new_int_var(0, st.calls(weights[-1]), f"calls_{j}")
            has = model.new_bool_var(f"has_weights_{j}")
            model.add(calls * int(st.bucket) >= w)
            model.add(w <= weights[-1] * has)
            model.add(calls >= has)
            grad = calls * _ns(st.latency) + lookups["grad"][hi] - lookups["grad"][lo]
        model.add(tail >= grad + lookups["opt"][hi] - lookups["opt"][lo])
    # Objective: (m + p - 1) slots of the slowest stage, then the slowest gradient tail.
    model.minimize((st.m + p - 1) * slowest + tail)
    solver, status, stopped = run_inner(model, time_limit_s, workers, deterministic_time)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Inner(None, status == cp_model.INFEASIBLE, stopped)
    bounds = [int(solver.value(v)) for v in q]
    stage_of = [next(j for j in range(p) if bounds[j] <= u < bounds[j + 1]) for u in range(U)]
    return Inner(stage_of, status == cp_model.OPTIMAL, stopped)
