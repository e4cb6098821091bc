"""The priced-table solver every model family shares.

A family prices every candidate plan of its space once (a row: the objective, the other
objective, devices, nodes, and the named constraint masks it must pass). This module sorts
the rows by the objective and hands CP-SAT one variable, the row index (`rows.py`): CP-SAT
takes the minimum of a priced table, exactly, and names the conflicting constraints when no row
passes them all. (The CNN layer-mode and pipeline-stage searches are real CP-SAT models:
`layer_modes.py`, `stages.py`.)

On top of the minimum, the same table gives:
- ties broken toward the other objective: rows whose objectives agree to ~1e-13 (a 42-bit
  mantissa) are ordered by the other objective (equal time -> the cheaper; equal cost -> the
  faster), then by fewer devices, then by the family's generation order;
- `--within`: the fewest nodes whose objective is within a fraction of the best;
- `--top`: runners-up that differ in the split, devices or batch (the family's groups), the
  best row of each group;
- `--pareto`: the non-dominated (time-to-train, cost) rows, with the same tie rules, so the
  plan chosen by either of those objectives is on its front.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from planner.errors import InfeasibleError, SpecError
from planner.search.rows import RowModel, cp_solver

TIE_BITS = 42  # objectives equal in their first 42 mantissa bits are a tie
# the solve first orders only the rows at least as good as the PREFIX-th best (every row left
# out is strictly worse than every row kept); it orders the whole table only when the gates
# or the runners-up reach past them
PREFIX = 4096


def snapped(x: np.ndarray) -> np.ndarray:
    """`x` rounded to TIE_BITS mantissa bits: the key that makes near-equal values equal."""
    m, e = np.frexp(np.asarray(x, dtype=float))
    return np.ldexp(np.round(m * 2.0**TIE_BITS), e - TIE_BITS)


def sorted_by(keys: list[np.ndarray]) -> np.ndarray:
    """Indices sorted by the keys (most significant first), then by index: `np.lexsort`'s
    order, with one stable sort by the first key and a lexsort of the tied rows only (ties are
    few in a priced table, and a full lexsort of a million rows takes seconds)."""
    first = keys[0]
    o = np.argsort(first, kind="stable")
    s = first[o]
    same = s[1:] == s[:-1]
    if len(keys) == 1 or not same.any():
        return o
    tied = np.zeros(len(s), dtype=bool)
    tied[:-1] |= same
    tied[1:] |= same
    at = np.flatnonzero(tied)  # positions of the tied runs (each run contiguous)
    run = np.cumsum(np.concatenate([[True], ~same]))[at]
    rows = o[at]
    o[at] = rows[np.lexsort((rows, *(k[rows] for k in reversed(keys[1:])), run))]
    return o


@dataclass(frozen=True)
class Gate:
    name: str  # the constraint family, as the user knows it (memory, deadline, nodes_max, ...)
    why: str  # what it demands, with the numbers
    allowed: np.ndarray  # per row


@dataclass
class Table:
    """Every candidate of one search, in the family's generation order."""

    objective: np.ndarray  # minimised
    other: np.ndarray  # ties in the objective go to the lower value of this
    devices: np.ndarray
    nodes: np.ndarray
    gates: list[Gate]
    group: np.ndarray | None = None  # runners-up: one per group (None: every row its own)

    def __len__(self) -> int:
        return len(self.objective)

    def order(self, first: np.ndarray | None = None, limit: int | None = None) -> np.ndarray:
        """Row indices sorted by (first,) objective, other objective, devices, generation;
        with `limit`, only the prefix of that order holding every row whose first key is at
        most the limit-th smallest (ties included, so the prefix is exact)."""
        keys = [snapped(self.objective), snapped(self.other), self.devices]
        keys = keys if first is None else [first, *keys]
        if limit is None or limit >= len(self):
            return sorted_by(keys)
        cut = np.partition(keys[0], limit - 1)[limit - 1]
        rows = np.flatnonzero(keys[0] <= cut)
        return rows[sorted_by([k[rows] for k in keys])]

    def allowed(self) -> np.ndarray:
        ok = np.ones(len(self), dtype=bool)
        for g in self.gates:
            ok &= g.allowed
        return ok


@dataclass(frozen=True)
class Found:
    status: str  # optimal | feasible
    best: int  # row of the chosen plan
    value: float  # its objective
    gap: float
    alternatives: tuple[int, ...]  # rows of the runners-up, best first
    solve_time_s: float
    branches: int


class _Sorted:
    """One CP-SAT model over the table in one order."""

    def __init__(self, table: Table, order: np.ndarray):
        self.order = order
        self.obj = table.objective[order]
        self.rm = RowModel(len(order))
        for g in table.gates:
            self.rm.gate(g.name, g.why, g.allowed[order])
        self.rm.enforce_gates()

    def run(self, time_limit_s: float, workers: int):
        solver = cp_solver(time_limit_s, workers)
        return solver, solver.solve(self.rm.model)


def smallest_conflict(gates: list[Gate]) -> tuple[str, ...]:
    """The smallest set of gates that no row passes together (exact: each gate is a mask)."""
    for size in range(1, len(gates) + 1):
        for combo in itertools.combinations(gates, size):
            if not np.logical_and.reduce([g.allowed for g in combo]).any():
                return tuple(g.name for g in combo)
    return ()


def conflict_error(table: Table, note: Callable[[tuple[str, ...]], str] | None = None
                   ) -> InfeasibleError:
    """The one infeasibility explainer: the smallest conflicting set of gates, with what each
    demands (`note(core)` may add context)."""
    core = smallest_conflict(table.gates)
    if not core:
        return InfeasibleError("infeasible (the conflict could not be isolated)")
    whys = {g.name: g.why for g in table.gates}
    why = "; ".join(whys[k] for k in core) + (note(core) if note else "")
    return InfeasibleError(f"infeasible: {why}" if len(core) == 1 else
                           f"infeasible: these constraints conflict: {why}", core)


def solve(table: Table, *, top: int = 0, within: float | None = None,
          time_limit_s: float = 10.0, workers: int = 1,
          explain: Callable[[], Table] | None = None,
          note: Callable[[tuple[str, ...]], str] | None = None) -> Found:
    """The best row, proven by CP-SAT over the sorted table; runners-up and the fewest-nodes
    phase as asked. When no row passes every gate the error names the smallest conflicting set
    of gates, found on `explain()`'s table (a wider space) when given. CP-SAT first sees the
    best PREFIX rows (the rest are worse than all of them), and the whole table when the gates
    or the runners-up asked for need more."""
    try:
        return _solve(table, table.order(limit=PREFIX), top, within, time_limit_s, workers,
                      explain, note)
    except _Exhausted:
        return _solve(table, table.order(), top, within, time_limit_s, workers, explain, note)


class _Exhausted(Exception):
    """The ordered prefix ran out before the answer was found."""


def _solve(table: Table, order: np.ndarray, top, within, time_limit_s, workers, explain,
           note) -> Found:
    partial = len(order) < len(table)
    main = _Sorted(table, order)
    solver, status = main.run(time_limit_s, workers)
    if status == cp_model.INFEASIBLE and partial:
        raise _Exhausted
    if status == cp_model.INFEASIBLE:
        raise conflict_error(explain() if explain else table, note)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise InfeasibleError(f"no configuration found within --time-limit {time_limit_s:g} s")
    optimal = status == cp_model.OPTIMAL
    k = solver.value(main.rm.point)
    value = float(main.obj[k])
    # the bound on the row index is a bound on the objective (rows are sorted)
    bound = float(main.obj[max(0, min(int(solver.best_objective_bound), len(main.obj) - 1))])
    gap = abs(value - bound) / abs(value) if value else 0.0
    best = int(main.order[k])
    wall, branches = solver.wall_time, solver.num_branches

    if within is not None:
        # lexicographic: the fewest nodes within the tolerance of the best, then the best there
        fewest = _Sorted(table, table.order(first=table.nodes))
        fewest.rm.restrict(fewest.obj <= value * (1 + within))
        s2, st = fewest.run(time_limit_s, workers)
        optimal = optimal and st == cp_model.OPTIMAL
        k2 = s2.value(fewest.rm.point)
        best, value = int(fewest.order[k2]), float(fewest.obj[k2])
        wall, branches = wall + s2.wall_time, branches + s2.num_branches

    alternatives: list[int] = []
    if top:
        position = np.full(len(table), -1, dtype=np.int64)
        position[main.order] = np.arange(len(main.order))
        group = table.group if table.group is not None else np.arange(len(table))
        taken = best
        for _ in range(top):
            # no runner-up repeats a plan already returned (its whole group is excluded)
            same = position[np.flatnonzero(group == group[taken])]
            main.rm.exclude(same[same >= 0])
            s3, st = main.run(time_limit_s, workers)
            wall, branches = wall + s3.wall_time, branches + s3.num_branches
            if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                if partial:
                    raise _Exhausted
                break
            taken = int(main.order[s3.value(main.rm.point)])
            alternatives.append(taken)
    return Found("optimal" if optimal else "feasible", best, value, gap, tuple(alternatives),
                 wall, branches)


def pareto_front(time_s: np.ndarray, cost: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated (time, cost) rows, fastest first, with the tie rules of
    `Table.order`: sorted by time (then cost, devices, index), a row joins the front when it is
    cheaper than every row before it. Time and cost are compared at TIE_BITS, so the plan the
    time-to-train or the cost objective chooses from these arrays is on the front."""
    t, c = snapped(time_s), snapped(cost)
    order = np.lexsort((np.arange(len(t)), devices, c, t))
    cs = c[order]
    before = np.concatenate([[np.inf], np.minimum.accumulate(cs)[:-1]])
    return order[cs < before]


DEFAULT_KNEE_TOLERANCE = 0.10  # the knee: the fewest devices within 10 % of the best time


def knee(time_s: np.ndarray, devices: np.ndarray, allowed: np.ndarray, chosen: int,
         tolerance: float = DEFAULT_KNEE_TOLERANCE, measure: str = "time per sample"
         ) -> dict | None:
    """Where scaling stops, read from a priced table: per device count D the best time T(D)
    of the rows every gate allows (`time_s`: the time `measure` names, in seconds), then

    - the knee: the fewest devices with T(D) <= (1 + tolerance) x min T;
    - the last doubling's speed-up: T(at most half the best plan's devices) / T(best), the
      gain the second half of the devices buys (2.0 = linear; near 1: scaling has stopped);
    - the scaling efficiency of the chosen row: T(D0) D0 / (T(chosen) D), D0 the fewest
      devices of any allowed row (1.0 = linear scaling from there; the sweep's definition).

    None when no row is allowed."""
    ok = np.flatnonzero(allowed)
    if ok.size == 0:
        return None
    d = devices[ok]
    counts = np.unique(d)  # few distinct counts: hashed, then located, not a sort of every row
    best_at = np.full(len(counts), np.inf)
    np.minimum.at(best_at, np.searchsorted(counts, d), time_s[ok])
    s = snapped(best_at)
    k_best = int(np.flatnonzero(s == s.min())[0])  # ties: the fewest devices
    t_best, d_best = float(best_at[k_best]), int(counts[k_best])
    k_knee = int(np.flatnonzero(best_at <= t_best * (1 + tolerance))[0])
    half = np.flatnonzero(counts <= d_best / 2)
    if half.size:
        j = int(half[np.argmin(best_at[half])])
        speedup, from_devices = float(best_at[j] / t_best), int(counts[j])
    else:
        speedup = from_devices = None
    d0, t0 = int(counts[0]), float(best_at[0])
    d_chosen, t_chosen = int(devices[chosen]), float(time_s[chosen])
    return {"devices": int(counts[k_knee]), "time_s": float(best_at[k_knee]),
            "tolerance": float(tolerance), "measure": measure,
            "best_devices": d_best, "best_time_s": t_best,
            "last_doubling_speedup": speedup, "last_doubling_from_devices": from_devices,
            "scaling_efficiency": t0 * d0 / (t_chosen * d_chosen), "base_devices": d0}


def check_knee_tolerance(tolerance: float) -> None:
    if not (isinstance(tolerance, int | float) and 0 <= tolerance <= 10):
        raise SpecError(f"knee_tolerance: must be a fraction in [0, 10], got {tolerance!r}")


KNEE_MEASURES = {"throughput": "time per sample", "iteration-time": "iteration time",
                 "time-to-train": "time to train", "cost": "time to train",
                 "token-budget": "time for the token budget", "efficiency": "iteration time"}
