"""The placement of a recommendation model's embedding tables on D devices, by CP-SAT: each
table table-wise on one device, column-wise in c shards on devices of their own choosing,
row-wise over every device, or copied to every device (data parallel); each device's memory
within its capacity; the busiest device's embedding time (its lookups and the forward and
backward all-to-alls, `planner.cost.recommendation`) minimised. TorchRec's sharding planner and
HugeCTR's (MLPerf Training v3.0) reach their plans with enumerators and greedy proposers.

Three models, one time limit:
- every shard on a device of its own, within the device count: a small model over the options
  alone, whose optimum is a placement (an upper bound, beside a greedy local search's);
- the same without the device count: a relaxation (a device holding more only takes longer),
  whose optimum, with the devices' total work, bounds every placement;
- the full model: a one-hot option per table, a one-hot device per shard (the k-th shard,
  heaviest first, offered only the first k + 1 devices: devices are alike, so any placement
  can be relabelled that way), per device its bytes out, its time and its memory; options
  that alone make a device slower than the upper bound are not offered.
Two bounds beside CP-SAT's own: every table is held somewhere (`_lower_bound`), and the
isolation bound (`_isolation_bound`): in a placement faster than the incumbent, a shard too
heavy to share a device sits alone, and the rest must share the devices left, whose average
time bounds the busiest. The answer is proven when CP-SAT closes it or a bound meets it on the
integer-nanosecond grid its times are rounded to; otherwise `status` is "feasible" and
`bound_s` says how far it can be from the best.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from planner.cost.recommendation import Costs, Placed, Priced, price
from planner.errors import InfeasibleError
from planner.search.rows import cp_solver

NS = 1e9
GRID_S = 64 / NS  # integer-ns rounding: at most a nanosecond for each of a device's terms
EVERYWHERE = ("row", "data")  # the modes that put a part of the table on every device


@dataclass(frozen=True)
class Placement:
    status: str  # "optimal" or "feasible" (the time limit stopped the proof)
    placed: tuple[Placed, ...]  # per table
    priced: Priced
    solve_time_s: float
    bound_s: float  # CP-SAT's lower bound of the busiest device's embedding time
    # what it was solved for (set by `planner.api.place_tables`)
    model: object = None
    system: object = None
    global_batch: int = 0
    precision: object = None


def _ns(x: float) -> int:
    return int(math.ceil(x * NS))


def _b(x: float) -> int:
    return int(math.ceil(x))


def check_fits(c: Costs, names: list[str]) -> None:
    """Exit 1 naming the first table no option can hold beside the dense part."""
    room = c.capacity_bytes - c.dense_memory_bytes
    for i, name in enumerate(names):
        least = min(o.memory_bytes for o in c.of(i))
        if least > room:
            raise InfeasibleError(
                f"infeasible: memory: table '{name}' needs {least / 2**30:.4g} GiB per device "
                f"even at its most divided, and {room / 2**30:.4g} GiB is left beside the "
                f"dense layers", ("memory",))


def place(c: Costs, names: list[str], time_limit_s: float = 10.0,
          workers: int = 1) -> Placement:
    check_fits(c, names)
    t0 = time.perf_counter()
    n, tables = c.devices, range(len(names))
    # a first placement (greedy) bounds the answer: an option that alone makes some device
    # slower than it cannot be in a better one, so it is not offered
    first, upper = None, math.inf
    # the time limit covers every model: a quarter for each of the two small ones
    alone, _ = _one_per_device(c, tables, time_limit_s / 4, workers, True)
    for found in (_greedy(c, tables), alone):
        value = price(c, found).embedding_time_s if found else math.inf
        if value < upper:
            first, upper = found, value
    options = _offered(c, tables, upper)
    # every shard on a device of its own, as many devices as that takes: a relaxation (a
    # device holding more only takes longer), so its optimum bounds every placement
    _, relaxed = _one_per_device(c, tables, time_limit_s / 4, workers, False)
    lower = max(_lower_bound(c, options, tables), relaxed,
                _isolation_bound(c, options, tables, upper))
    if first and upper - lower <= GRID_S:  # the first placement meets the bound: done
        return Placement("optimal", tuple(first), price(c, first),
                         time.perf_counter() - t0, lower)
    model = cp_model.CpModel()
    pick = {o: model.new_bool_var(f"m{o.table}_{o.mode}{o.shards}") for o in options}
    for i in tables:
        model.add_exactly_one(pick[o] for o in options if o.table == i)
    # a shard's device (table-wise: one shard; column-wise: c shards)
    # Devices are alike, so any placement can be relabelled so that the k-th shard (heaviest
    # first) sits on one of the first k + 1 devices (devices numbered in the order their
    # first shard appears): only those are offered, which breaks the devices' symmetry.
    slots = sorted(((o, s) for o in options if o.mode in ("table", "column")
                    for s in range(o.shards)), key=lambda x: (-x[0].time_s, x[0].table,
                                                              x[0].shards, x[1]))
    at = {}
    for k, (o, s) in enumerate(slots):
        lits = [model.new_bool_var(f"x{o.table}_{o.shards}_{s}_{d}") if d <= k
                else model.new_constant(0) for d in range(n)]
        model.add(sum(lits) == pick[o])
        at[o, s] = lits
    everywhere = [o for o in options if o.mode in ("row", "data")]
    recv = sum(_b(o.recv_bytes) * pick[o] for o in options)
    # upper bounds of every device's bytes out and time (a device holding everything)
    most_bytes = sum(max(_b(o.send_bytes) * o.shards + _b(o.recv_bytes) for o in c.of(i))
                     for i in tables)
    per_byte = round(2 * NS / c.links.alltoall_Bps * 1_000_000) if n > 1 else 0  # ns / 1e6
    most_time = (_ns(sum(max(o.time_s * o.shards for o in c.of(i)) for i in tables))
                 + most_bytes * per_byte // 1_000_000 + 1 + _ns(2 * n * 1e-3))
    a2a = _ns(2 * (n - 1) * c.links.alltoall_latency_s) if n > 1 else 0
    busy = []
    for d in range(n):
        mine = [(o, at[o, s][d]) for (o, s) in at]
        out = model.new_int_var(0, most_bytes, f"send{d}")
        model.add(out == sum(_b(o.send_bytes) * x for o, x in mine)
                  + sum(_b(o.send_bytes) * pick[o] for o in everywhere))
        larger = model.new_int_var(0, most_bytes, f"a2a{d}")
        model.add_max_equality(larger, [out, recv])
        t = model.new_int_var(0, most_time, f"t{d}")
        # the two all-to-alls' bytes in ns, rounded up (CP-SAT works in integers)
        wire = model.new_int_var(0, most_time, f"w{d}")
        model.add(wire * 1_000_000 >= larger * per_byte)
        model.add(t == sum(_ns(o.time_s) * x for o, x in mine)
                  + sum(_ns(o.time_s) * pick[o] for o in everywhere) + a2a + wire)
        memory = (sum(_b(o.memory_bytes) * x for o, x in mine)
                  + sum(_b(o.memory_bytes) * pick[o] for o in everywhere))
        model.add(memory <= int(c.capacity_bytes - c.dense_memory_bytes))
        busy.append(t)
    slowest = model.new_int_var(0, most_time, "slowest")
    for t in busy:
        model.add(slowest >= t)
    # cuts: a device holds each table (or a shard of it), so the busiest takes at least that
    # shard's lookups, the all-to-alls' latency and the bytes every device receives
    inbound = model.new_int_var(0, most_time, "inbound")
    model.add(inbound * 1_000_000 >= recv * per_byte)
    for i in tables:
        model.add(slowest >= sum(_ns(o.time_s) * pick[o] for o in options if o.table == i)
                  + a2a + inbound)
    if first:
        _hint(model, first, pick, at, slots)
    model.minimize(slowest)
    solver = cp_solver(max(time_limit_s - (time.perf_counter() - t0), 0.1), workers)
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        raise InfeasibleError("infeasible: memory: no placement of the tables fits the "
                              "devices' memory beside the dense layers", ("memory",))
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if first is None:
            raise InfeasibleError(f"infeasible: no placement found within the time limit "
                                  f"({time_limit_s:g} s; --time-limit raises it)",
                                  ("time_limit",))
        placed = first
    else:
        placed = []
        for i in tables:
            o = next(o for o in options if o.table == i and solver.value(pick[o]))
            devices = tuple(range(n)) if o.mode in ("row", "data") else tuple(
                next(d for d in range(n) if solver.value(at[o, s][d]))
                for s in range(o.shards))
            placed.append(Placed(o, devices))
        if first is not None and price(c, first).embedding_time_s < price(
                c, placed).embedding_time_s:
            placed = first
    priced = price(c, placed)
    bound = max(lower, solver.best_objective_bound / NS,
                _isolation_bound(c, options, tables, priced.embedding_time_s))
    # proven: CP-SAT says so, or its bound (or the relaxation's) meets the placement to the
    # integer-nanosecond grid its times are rounded to (a nanosecond per term at most)
    proven = status == cp_model.OPTIMAL or priced.embedding_time_s - bound <= GRID_S
    return Placement("optimal" if proven else "feasible", tuple(placed), priced,
                     time.perf_counter() - t0, bound)


def _one_per_device(c: Costs, tables, time_limit_s: float, workers: int,
                    count: bool) -> tuple[list[Placed] | None, float]:
    """(the best placement with at most one table-wise or column shard per device, a lower
    bound in seconds of its busiest device): a small CP-SAT model over the options alone
    (with a device each, a shard's device takes its lookups, what every device takes of the
    row-wise and data-parallel tables, and the all-to-alls). With `count` the shards are at
    most the devices: the placement is one of the problem's, an upper bound; without, as many
    devices as the shards take: a relaxation, whose bound bounds every placement."""
    n = c.devices
    model = cp_model.CpModel()
    pick = {o: model.new_bool_var(f"p{o.table}_{o.mode}{o.shards}") for o in c.options}
    for i in tables:
        model.add_exactly_one(pick[o] for o in c.of(i))
    placed = [o for o in c.options if o.mode in ("table", "column")]
    spread = [o for o in c.options if o.mode in ("row", "data")]
    if count:
        model.add(sum(o.shards * pick[o] for o in placed) <= n)
    room = int(c.capacity_bytes - c.dense_memory_bytes)
    common_memory = sum(_b(o.memory_bytes) * pick[o] for o in spread)
    model.add(common_memory <= room)
    per_byte = round(2 * NS / c.links.alltoall_Bps * 1_000_000) if n > 1 else 0
    a2a = _ns(2 * (n - 1) * c.links.alltoall_latency_s) if n > 1 else 0
    top_bytes = sum(max(_b(o.send_bytes) + _b(o.recv_bytes) for o in c.of(i)) for i in tables)
    top = (_ns(sum(max(o.time_s for o in c.of(i)) for i in tables)) + a2a
           + top_bytes * per_byte // 1_000_000 + 1)
    common = sum(_ns(o.time_s) * pick[o] for o in spread) + a2a
    sent = sum(_b(o.send_bytes) * pick[o] for o in spread)
    recv = sum(_b(o.recv_bytes) * pick[o] for o in c.options)
    slowest = model.new_int_var(0, top, "slowest")
    inbound = model.new_int_var(0, top, "inbound")
    model.add(inbound * 1_000_000 >= recv * per_byte)
    model.add(slowest >= common + inbound)
    out = model.new_int_var(0, top, "out")
    model.add(out * 1_000_000 >= sent * per_byte)
    model.add(slowest >= common + out)
    # the devices' time in all: each takes the common part and the bytes in, and the shards'
    # lookups add up (a device's time is at least its share of them)
    model.add(n * slowest >= n * (common + inbound)
              + sum(_ns(o.time_s) * o.shards * pick[o] for o in placed))
    for o in placed:
        model.add(common_memory + _b(o.memory_bytes) <= room).only_enforce_if(pick[o])
        wire = model.new_int_var(0, top, f"w{o.table}_{o.shards}")
        model.add(wire * 1_000_000 >= (sent + _b(o.send_bytes)) * per_byte)
        model.add(slowest >= common + _ns(o.time_s) + inbound).only_enforce_if(pick[o])
        model.add(slowest >= common + _ns(o.time_s) + wire).only_enforce_if(pick[o])
    model.minimize(slowest)
    solver = cp_solver(time_limit_s, workers)
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        return None, math.inf
    bound = solver.best_objective_bound / NS if status in (cp_model.OPTIMAL,
                                                           cp_model.FEASIBLE) else 0.0
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE) or not count:
        return None, bound
    chosen = [next(o for o in c.of(i) if solver.value(pick[o])) for i in tables]
    device, out_placed = 0, []
    for o in chosen:
        if o.mode in ("row", "data"):
            out_placed.append(Placed(o, tuple(range(n))))
        else:
            out_placed.append(Placed(o, tuple(range(device, device + o.shards))))
            device += o.shards
    return out_placed, bound


class _Device:
    """Lower bounds of one device's embedding time given some options chosen, over the
    offered `options`: a device's time is its lookups and two all-to-alls, each (D - 1)
    latencies and the larger of its bytes out and in, so it is at least its lookups, the
    latencies and either direction. Each table not named adds, at the least over its
    options, what it surely puts on every device: a row-wise or data-parallel option its
    part (and its bytes out), any option its pooled vectors into every device."""

    def __init__(self, c: Costs, options, tables):
        n = c.devices
        self.per_byte = 2 / c.links.alltoall_Bps if n > 1 else 0.0
        self.latency = 2 * (n - 1) * c.links.alltoall_latency_s if n > 1 else 0.0
        self.of = {i: [o for o in options if o.table == i] for i in tables}
        self.out = {i: min(self.everywhere(o, True) for o in opts)
                    for i, opts in self.of.items()}
        self.into = {i: min(self.everywhere(o, False) for o in opts)
                     for i, opts in self.of.items()}

    def everywhere(self, o, out: bool) -> float:
        """What option `o` surely puts on every device: its bytes in (`out` False), and, row-
        wise or data parallel, its part and (`out`) its bytes out."""
        spread = o.mode in EVERYWHERE
        if not out:
            return (o.time_s if spread else 0.0) + o.recv_bytes * self.per_byte
        return o.time_s + o.send_bytes * self.per_byte if spread else 0.0

    def holding(self, *held) -> float:
        """A device holding (a shard of) each option in `held` (one table's option twice:
        two of its shards)."""
        named = {o.table for o in held}
        rest_out = sum(v for i, v in self.out.items() if i not in named)
        rest_in = sum(v for i, v in self.into.items() if i not in named)
        mine = {o.table: o for o in held}.values()  # bytes in count once per table
        return (sum(o.time_s for o in held) + self.latency
                + max(sum(o.send_bytes for o in held) * self.per_byte + rest_out,
                      sum(o.recv_bytes for o in mine) * self.per_byte + rest_in))


def _lower_bound(c: Costs, options, tables) -> float:
    """No placement's busiest device is faster than this: every table is held somewhere, by
    one of its options, and the device holding it takes at least `_Device.holding`."""
    dev = _Device(c, options, tables)
    return max(min(dev.holding(o) for o in dev.of[i]) for i in tables)


def _offered(c: Costs, tables, upper: float) -> list:
    """The options that can be in a placement no slower than `upper`: those whose device
    (`_Device.holding`) stays within it, and, for a row-wise or data-parallel option (on
    every device), beside some option of every other table; repeated until nothing more
    drops (an option dropped can raise what the others surely add)."""
    options = list(c.options)
    while True:
        dev = _Device(c, options, tables)
        kept = [o for o in options
                if dev.holding(o) <= upper * (1 + 1e-9)
                and (o.mode not in EVERYWHERE or all(
                    min(dev.holding(o, p) for p in dev.of[j]) <= upper * (1 + 1e-9)
                    for j in tables if j != o.table))]
        if len(kept) == len(options):
            return options
        options = kept


def _isolation_bound(c: Costs, options, tables, upper: float) -> float:
    """No placement faster than `upper` (by more than the grid) has a busiest device faster
    than this. In such a placement a shard so heavy that it and any other shard together make
    a device at least `upper` (`isolated`) sits alone on its device, so the other shards
    share the n - k devices left, k the isolated shards: their average time bounds the
    busiest (the left devices' lookups, latencies and either their bytes out or the bytes
    every device receives, summed). For each k, each term is minimised over the tables'
    options whose isolated shards number k (a knapsack over the tables, one term at a time:
    a bound, not a placement), and the least over k bounds every such placement."""
    n = c.devices
    if n == 1:
        return 0.0
    dev = _Device(c, options, tables)
    target = upper - GRID_S / 2
    sharded = [o for o in options if o.mode not in EVERYWHERE]

    def isolated(o) -> bool:
        partners = [p for p in sharded if p.table != o.table] + ([o] if o.shards > 1 else [])
        return o.mode not in EVERYWHERE and all(dev.holding(o, p) >= target
                                                for p in partners)

    # per term, the least over the tables' options with k isolated shards in all (k = 0..n):
    # spread_* what a device left surely takes, work_* what the left devices share, alone
    # the busiest isolated device (least of the most)
    inf = np.full(n + 1, np.inf)
    terms = ("spread_out", "work_out", "spread_in", "work_in")
    least = {t: np.where(np.arange(n + 1) == 0, 0.0, np.inf) for t in terms}
    alone = np.where(np.arange(n + 1) == 0, 0.0, np.inf)
    for i in tables:
        step = {t: inf.copy() for t in terms}
        step_alone = inf.copy()
        for o in dev.of[i]:
            spread, single = o.mode in EVERYWHERE, isolated(o)
            k = o.shards if single else 0
            if k > n:
                continue
            out = o.time_s + o.send_bytes * dev.per_byte
            value = {"spread_out": out if spread else 0.0,
                     "work_out": 0.0 if spread or single else o.shards * out,
                     "spread_in": o.recv_bytes * dev.per_byte + (o.time_s if spread else 0),
                     "work_in": 0.0 if spread or single else o.shards * o.time_s}
            for t in terms:
                shifted = np.concatenate([inf[:k], least[t][:n + 1 - k]])
                step[t] = np.minimum(step[t], shifted + value[t])
            shifted = np.concatenate([inf[:k], alone[:n + 1 - k]])
            step_alone = np.minimum(step_alone, np.maximum(
                shifted, dev.holding(o) if single else 0.0))
        least, alone = step, step_alone
    left = n - np.arange(n + 1)
    # the left devices' average (none left: only a placement if nothing is left to share)
    per = {d: least[f"spread_{d}"] + np.where(
        left > 0, least[f"work_{d}"] / np.maximum(left, 1),
        np.where(least[f"work_{d}"] > 0, np.inf, 0.0)) for d in ("out", "in")}
    bound = np.maximum(alone, np.maximum(per["out"], per["in"]) + dev.latency)
    return min(float(bound.min()), target)


def _greedy(c: Costs, tables) -> list[Placed] | None:
    """A good first placement: each table in the option of the least `_Device.holding`, then, table by
    table, the option whose placement (`_pack`) is fastest, while that improves it (a few
    passes of local search); None when nothing fits."""
    alone = _Device(c, c.options, tables)
    chosen = [min(c.of(i), key=alone.holding) for i in tables]
    best = _pack(c, chosen)
    value = price(c, best).embedding_time_s if best else math.inf
    for _ in range(3):
        better = False
        for i in tables:
            for o in c.of(i):
                if o is chosen[i]:
                    continue
                trial = [*chosen[:i], o, *chosen[i + 1:]]
                got = _pack(c, trial)
                t = price(c, got).embedding_time_s if got else math.inf
                if t < value * (1 - 1e-12):
                    chosen, best, value, better = trial, got, t, True
        if not better:
            break
    return best


def _pack(c: Costs, chosen) -> list[Placed] | None:
    """The shards of `chosen` (an option per table), the slowest first, each onto the device
    where it ends soonest and fits (longest processing time first); None when one does not
    fit."""
    n = c.devices
    busy, send = np.zeros(n), np.zeros(n)
    memory = np.full(n, c.dense_memory_bytes)
    recv = sum(o.recv_bytes for o in chosen)
    for o in chosen:
        if o.mode in ("row", "data"):
            busy += o.time_s
            send += o.send_bytes
            memory += o.memory_bytes
    latency = 2 * (n - 1) * c.links.alltoall_latency_s if n > 1 else 0.0
    per_byte = 2 / c.links.alltoall_Bps if n > 1 else 0.0
    where: dict[int, list[int]] = {}
    shards = sorted(((o, s) for o in chosen if o.mode in ("table", "column")
                     for s in range(o.shards)), key=lambda x: -x[0].time_s)
    for o, _ in shards:
        ends = busy + o.time_s + latency + np.maximum(send + o.send_bytes, recv) * per_byte
        ends[memory + o.memory_bytes > c.capacity_bytes] = np.inf
        d = int(np.argmin(ends))
        if not np.isfinite(ends[d]):
            return None
        busy[d] += o.time_s
        send[d] += o.send_bytes
        memory[d] += o.memory_bytes
        where.setdefault(o.table, []).append(d)
    return [Placed(o, tuple(range(n)) if o.mode in ("row", "data")
                   else tuple(sorted(where[o.table]))) for o in chosen]


def _hint(model, first: list[Placed], pick, at, slots) -> None:
    """The greedy placement as the search's start, its shards relabelled onto the devices the
    slots may use (devices in the order their first shard appears)."""
    chosen = {p.option for p in first}
    for o in pick:
        model.add_hint(pick[o], o in chosen)
    label: dict[int, int] = {}
    left = {p.option: list(p.devices) for p in first}
    for k, (o, s) in enumerate(slots):
        if o in chosen:
            d = left[o].pop(0)
            label.setdefault(d, len(label))
        for j, x in enumerate(at[o, s][:k + 1]):  # beyond k: the constant 0
            model.add_hint(x, o in chosen and j == label[d])
