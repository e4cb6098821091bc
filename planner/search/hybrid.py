"""Hybrid (tensor x pipeline x data) parallel plans for transformers: one configuration's
prediction, and the exact search over all of them.

The search uses the row-index CP-SAT model of `search/rows.py`, as the data-parallel search
does. Every structurally valid configuration at each offered global batch is a row, priced by
`cost.transformer.iteration` (vectorised, one batch at a time) and sorted by the objective.
Rows over the device memory are dropped while pricing; the deadline and budget are gated
constraints, and pins that leave no structure are named by `_explain_empty`.

Two choices are pruned by dominance, exactly: with t > 1 sequence parallelism moves the same
bytes as plain tensor parallelism and stores less, and 1F1B runs as fast as GPipe with fewer
micro-batches in flight, so the unpinned search only considers sp on and 1F1B. ZeRO stages 0-2
move the same gradient volume, so stage 2 (least memory, the sharded optimizer step) dominates
0 and 1 unless a stage is pinned; stage 3 (1.5x the traffic) stays a choice.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
from ortools.sat.python import cp_model

from planner.cost.transformer import RECOMPUTE, SCHEDULES, Hardware, hardware_flops_per_sequence, iteration
from planner.errors import InfeasibleError, SpecError
from planner.search.rows import RowModel, cp_solver
from planner.search.training import Training, check_training, pareto_front
from planner.spec.hardware import Precision, System
from planner.spec.transformer import Transformer

MAX_ROWS = 20_000_000
OBJECTIVES = ("throughput", "iteration-time", "token-budget", "time-to-train", "cost")
UNITS = {"throughput": "s/sample", "iteration-time": "s", "token-budget": "s",
         "time-to-train": "s", "cost": "USD"}


@dataclass(frozen=True)
class Plan:
    """One hybrid configuration. devices = tp x pp x dp; global batch = dp x micro x accum."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    interleave: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    schedule: str = "1f1b"
    overlap: bool = True
    flash_attention: bool = True

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def accumulation(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    def to_json(self, g: int) -> dict:
        return {"devices": self.devices, "nodes": math.ceil(self.devices / g),
                "devices_per_node": min(g, self.devices), **asdict(self),
                "gradient_accumulation": self.accumulation}


def check_plan(m: Transformer, system: System, plan: Plan) -> None:
    """Structural validity; each failure is a one-line SpecError naming the key and value."""
    g = system.devices_per_node
    if m.heads % plan.tp or m.kv_heads % plan.tp:
        raise SpecError(f"tp: {plan.tp} does not divide heads {m.heads} and kv_heads "
                        f"{m.kv_heads} of '{m.name}'")
    if plan.pp > m.layers:
        raise SpecError(f"pp: {plan.pp} stages for {m.layers} layers")
    if plan.interleave > 1 and (plan.pp == 1 or m.layers % (plan.pp * plan.interleave)):
        raise SpecError(f"interleave: {plan.interleave} virtual stages need pp > 1 and layers "
                        f"{m.layers} divisible by pp x interleave = {plan.pp * plan.interleave}")
    if plan.interleave > 1 and plan.accumulation % plan.pp:
        raise SpecError(f"interleave: the interleaved schedule needs the {plan.accumulation} "
                        f"micro-batches per iteration to be a multiple of pp {plan.pp}")
    if plan.interleave > 1 and plan.schedule != "1f1b":
        raise SpecError("interleave: virtual stages need --schedule 1f1b")
    if plan.global_batch % (plan.dp * plan.micro_batch):
        raise SpecError(f"global_batch: {plan.global_batch} is not divisible by dp {plan.dp} x "
                        f"micro_batch {plan.micro_batch}")
    if plan.devices > g and plan.devices % g:
        raise SpecError(f"devices: {plan.devices} = tp x pp x dp is more than one node and not a "
                        f"multiple of {g} devices per node")
    if plan.recompute not in RECOMPUTE:
        raise SpecError(f"recompute: unknown value {plan.recompute!r} (allowed: "
                        f"{', '.join(RECOMPUTE)})")
    if plan.schedule not in SCHEDULES:
        raise SpecError(f"schedule: unknown value {plan.schedule!r} (allowed: "
                        f"{', '.join(SCHEDULES)})")
    if plan.zero not in (0, 1, 2, 3):
        raise SpecError(f"zero: must be 0, 1, 2 or 3, got {plan.zero}")


def _cfg(plans: list[Plan]) -> dict:
    col = {k: np.array([getattr(p, k) for p in plans]) for k in
           ("tp", "pp", "dp", "micro_batch", "interleave", "zero")}
    return {"t": col["tp"], "p": col["pp"], "d": col["dp"], "mb": col["micro_batch"],
            "acc": np.array([p.accumulation for p in plans]), "v": col["interleave"],
            "recompute": np.array([RECOMPUTE.index(p.recompute) for p in plans]),
            "sp": np.array([p.sequence_parallel for p in plans]), "zero": col["zero"],
            "gpipe": np.array([p.schedule == "gpipe" for p in plans]),
            "overlap": plans[0].overlap, "flash": plans[0].flash_attention}


def predict(m: Transformer, system: System, precision: Precision, plan: Plan) -> dict:
    """The prediction document of one plan (times in s, memory in bytes)."""
    check_plan(m, system, plan)
    hw = Hardware.of(system, precision)
    r = {k: float(v[0]) if np.ndim(v) else float(v)
         for k, v in iteration(m, hw, _cfg([plan])).items()}
    t_iter = r["time"]
    peak = system.device.peak_flops(precision)
    model_flops = m.model_flops() * plan.global_batch
    hw_flops = hardware_flops_per_sequence(m, plan.recompute) * plan.global_batch
    per_dev = plan.devices * t_iter
    return {
        "iteration_time_s": t_iter,
        "samples_per_s": plan.global_batch / t_iter,
        "tokens_per_s": plan.global_batch * m.seq_len / t_iter,
        "model_flops_per_iteration": model_flops,
        "hardware_flops_per_iteration": hw_flops,
        "tflops_per_device_model": model_flops / per_dev / 1e12,
        "tflops_per_device_hardware": hw_flops / per_dev / 1e12,
        "mfu": model_flops / (per_dev * peak),
        "hfu": hw_flops / (per_dev * peak),
        "time_breakdown": {k: r[k] for k in ("compute", "tp_comm", "pp_bubble", "pp_comm",
                                              "dp_comm_exposed", "optimizer")},
        "memory_bytes_per_device": r["memory"],
        "memory_breakdown": {"weights": r["weights"], "gradients": r["gradients"],
                             "optimizer": r["optimizer_state"], "activations": r["activations"]},
        "memory_capacity_bytes": system.device.memory_bytes,
        "fits_in_memory": r["memory"] <= system.device.memory_bytes,
    }


# --- the search ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Search:
    """What the user pinned or bounded; None means free. Give global_batch or
    global_batch_range (the search then picks among `candidate_batches`)."""

    global_batch: int | None = None
    global_batch_range: tuple[int, int] | None = None
    devices: int | None = None
    devices_max: int | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    interleave: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    zero: int | None = None
    schedule: str | None = None
    overlap: bool = True
    flash_attention: bool = True
    objective: str = "throughput"
    token_budget: float | None = None
    training: Training | None = None
    pareto: bool = False
    time_limit_s: float = 10.0


def _divisors(x: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(x) + 1) if x % d == 0]
    return sorted(set(small + [x // d for d in small]))


def candidate_batches(lo: int, hi: int) -> list[int]:
    """The global batches a batch range offers: its ends and every 2^k and 3 x 2^k between
    (1024, 1536, 2048, ...: the batches transformer runs use, a grid no coarser than 1.5x).
    Each one is searched exactly; every integer would multiply the rows by the range width."""
    out = {lo, hi}
    k = 1
    while k <= hi:
        out.update(x for x in (k, 3 * k) if lo <= x <= hi)
        k *= 2
    return sorted(out)


def _structures(m: Transformer, g: int, q: Search, B: int) -> np.ndarray:
    """(t, p, v, d, mb) rows at global batch B that satisfy divisibility and the pins (the
    device budget is a gate)."""
    cap = q.devices or q.devices_max or 1 << 20
    ts = [t for t in _divisors(math.gcd(m.heads, m.kv_heads)) if q.tp in (None, t) and t <= cap]
    ps = [p for p in range(1, m.layers + 1) if q.pp in (None, p)]
    ds = [d for d in _divisors(B) if q.dp in (None, d)]
    out = []
    for t in ts:
        for p in ps:
            if t * p > cap:
                break
            vs = [1] + [v for v in _divisors(m.layers // p) if v > 1 and m.layers % (p * v) == 0
                        and p > 1] if m.layers % p == 0 else [1]
            vs = [v for v in vs if q.interleave in (None, v)]
            for d in ds:
                n = t * p * d
                if n > cap or (n > g and n % g) or (q.devices is not None and n != q.devices):
                    continue
                for mb in _divisors(B // d):
                    if q.micro_batch in (None, mb):
                        # interleaving needs a multiple of p micro-batches (Megatron-LM)
                        acc = B // (d * mb)
                        out.extend((t, p, v, d, mb) for v in vs if v == 1 or acc % p == 0)
    return np.array(out, dtype=np.int64).reshape(-1, 5)


def _choices(q: Search) -> list[tuple[int, int, int, int]]:
    """(recompute, sp, zero, gpipe) combinations the search prices (see the module docstring)."""
    recs = [RECOMPUTE.index(q.recompute)] if q.recompute else [0, 1, 2]
    sps = [int(q.sequence_parallel)] if q.sequence_parallel is not None else [1]
    zeros = [q.zero] if q.zero is not None else [2, 3]
    gp = [int(q.schedule == "gpipe")] if q.schedule else [0]
    return [(r, s, z, k) for r in recs for s in sps for z in zeros for k in gp]


@dataclass(frozen=True)
class HybridSolution:
    status: str
    plan: Plan
    prediction: dict
    objective: dict
    rows: int
    build_time_s: float
    solve_time_s: float
    gap: float
    training: dict | None = None  # steps, samples, tokens, time_to_train_s, cost_usd
    pareto: list[dict] | None = None  # non-dominated (time-to-train, cost) plans


class HybridSolver:
    def __init__(self, m: Transformer, system: System, precision: Precision, q: Search):
        if (q.global_batch is None) == (q.global_batch_range is None):
            raise SpecError("global_batch: give --global-batch or --global-batch-range for "
                            "transformer models")
        lo, hi = q.global_batch_range or (q.global_batch, q.global_batch)
        if not 1 <= lo <= hi:
            got = f"{lo}:{hi}" if q.global_batch_range else str(lo)
            raise SpecError(f"global_batch: need a positive batch (a range A:B with A <= B), "
                            f"got {got}")
        if q.objective not in OBJECTIVES:
            raise SpecError(f"objective: {q.objective!r} is not one of {', '.join(OBJECTIVES)} "
                            "for transformer models")
        if q.objective == "token-budget" and not q.token_budget:
            raise SpecError("token_budget: --objective token-budget needs --tokens")
        check_training(q.training, q.objective, q.pareto)
        self.m, self.system, self.precision, self.q = m, system, precision, q
        self.hw = Hardware.of(system, precision)
        self.batches = candidate_batches(lo, hi)

    def _rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The plans that fit in memory: (rows R x 10: t, p, v, d, mb, B, recompute, sp, zero,
        gpipe; iteration time per row). Priced one global batch at a time, with the structural
        terms computed once per structure and broadcast over the choices; memory is the one
        constraint every plan must meet, so rows over it are dropped here."""
        ch = np.array(_choices(self.q), dtype=np.int64)
        rec, sp, zero, gpipe = (col[None, :] for col in ch.T)
        cap, smallest, priced = self.hw.memory_bytes, math.inf, 0
        rows, times = [], []
        for B in self.batches:
            st = _structures(self.m, self.hw.g, self.q, B)
            priced += len(st) * len(ch)
            if priced > MAX_ROWS:
                raise SpecError(f"the search space has over {MAX_ROWS:,} rows; pin --tp or "
                                "--pp, narrow the batch range or lower --devices-max")
            if len(st) == 0:
                continue
            t, p, v, d, mb = (col[:, None] for col in st.T)
            cfg = {"t": t, "p": p, "v": v, "d": d, "mb": mb, "acc": B // (d * mb),
                   "recompute": rec, "sp": sp, "zero": zero, "gpipe": gpipe,
                   "overlap": self.q.overlap, "flash": self.q.flash_attention}
            r = iteration(self.m, self.hw, cfg)
            shape = (len(st), len(ch))
            time_s, mem = (np.broadcast_to(r[k], shape) for k in ("time", "memory"))
            smallest = min(smallest, float(mem.min()))
            si, ci = np.nonzero(mem <= cap)
            rows.append(np.column_stack([st[si], np.full(len(si), B), ch[ci]]))
            times.append(time_s[si, ci])
        if priced == 0:
            raise self._explain_empty()
        if not any(len(x) for x in rows):
            raise InfeasibleError(
                f"infeasible: memory: the smallest plan within the devices and pins needs "
                f"{smallest / 2**30:.3g} GiB per device; '{self.system.device.name}' has "
                f"{cap / 2**30:.3g} GiB", ("memory",))
        return np.concatenate(rows), np.concatenate(times)

    def _explain_empty(self) -> InfeasibleError:
        """No structure meets the pins: name the smallest set of pins whose removal helps."""
        pins = [k for k in ("devices", "tp", "pp", "dp", "micro_batch", "interleave")
                if getattr(self.q, k) is not None]
        batch = (f"global_batch = {self.q.global_batch}" if self.q.global_batch else
                 f"the global batches {', '.join(map(str, self.batches))}")
        for size in range(1, len(pins) + 1):
            for combo in itertools.combinations(pins, size):
                free = dataclasses.replace(self.q, **{k: None for k in combo})
                if any(len(_structures(self.m, self.hw.g, free, B)) for B in self.batches):
                    what = ", ".join(f"{k} = {getattr(self.q, k)}" for k in combo)
                    return InfeasibleError(
                        f"infeasible: these pins conflict with {batch}, {self.m.layers} "
                        f"layers, {self.m.heads} heads and the device budget: {what}", combo)
        return InfeasibleError(
            f"infeasible: no tp x pp x dp split of at most "
            f"{self.q.devices or self.q.devices_max} devices divides {batch} (whole nodes of "
            f"{self.hw.g} beyond one node)", ("global_batch",))

    def _objective(self, time_s: np.ndarray, devices: np.ndarray, B: np.ndarray) -> np.ndarray:
        """What the rows are ranked by; each is the iteration time x a factor of (devices, B)."""
        q = self.q
        if q.objective == "token-budget":
            return time_s * q.token_budget / (B * self.m.seq_len)
        if q.objective == "throughput":
            return time_s / B  # seconds per sample: 1 / throughput
        if q.objective in ("time-to-train", "cost"):
            return self._train(time_s, devices, B)[0 if q.objective == "time-to-train" else 1]
        return time_s

    def _train(self, time_s, devices, B) -> tuple[np.ndarray, np.ndarray]:
        """(time to train, cost to train) per row (McCandlish et al. 2018: S(B) steps)."""
        tr = self.q.training
        ttt = time_s * tr.steps(B.astype(float))
        return ttt, ttt / 3600 * devices * (tr.price_per_device_hour or 0.0)

    def solve(self) -> HybridSolution:
        t0 = time.perf_counter()
        rows, time_s = self._rows()
        devices, B = rows[:, 0] * rows[:, 1] * rows[:, 3], rows[:, 5]
        obj = self._objective(time_s, devices, B)
        if not np.all(np.isfinite(obj)):
            raise SpecError("the cost model gave a non-finite value; check the hardware numbers")
        # sorted by objective, ties by fewer devices, then by generation order (deterministic)
        order = np.lexsort((np.arange(len(obj)), devices, obj))
        rows, obj, time_s, devices, B = rows[order], obj[order], time_s[order], devices[order], \
            B[order]

        # The device budget and the pins bound the rows (`_structures`), memory drops rows
        # (`_rows`); the deadline and budget are gated, so an empty model names the conflict.
        rm = RowModel(len(obj))
        tr = self.q.training
        if tr is not None and (tr.deadline_s is not None or tr.budget_usd is not None):
            ttt, cost = self._train(time_s, devices, B)
            if tr.deadline_s is not None:
                rm.gate("deadline", f"time to train <= {tr.deadline_s:g} s (the fastest plan "
                        f"that fits takes {ttt.min():.4g} s)", ttt <= tr.deadline_s)
            if tr.budget_usd is not None:
                rm.gate("budget", f"cost to train <= {tr.budget_usd:g} USD (the cheapest plan "
                        f"that fits costs {cost.min():.4g} USD)", cost <= tr.budget_usd)
        build = time.perf_counter() - t0

        solver = cp_solver(self.q.time_limit_s)
        rm.enforce_gates()
        status = solver.Solve(rm.model)
        if status == cp_model.INFEASIBLE:
            core = rm.conflict()
            why = "; ".join(rm.gates[k][1] for k in core)
            raise InfeasibleError(f"infeasible: {why}" if len(core) == 1 else
                                  f"infeasible: these constraints conflict: {why}", core)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise InfeasibleError(f"no configuration found within --time-limit "
                                  f"{self.q.time_limit_s:g} s")
        i = solver.Value(rm.point)
        bound = float(obj[max(0, min(int(solver.BestObjectiveBound()), len(obj) - 1))])
        plan = self._plan(rows[i])
        pred = predict(self.m, self.system, self.precision, plan)
        return HybridSolution(
            status="optimal" if status == cp_model.OPTIMAL else "feasible",
            plan=plan, prediction=pred,
            objective={"name": self.q.objective, "value": float(obj[i]),
                       "unit": UNITS[self.q.objective]},
            rows=len(obj), build_time_s=build, solve_time_s=solver.WallTime(),
            gap=abs(float(obj[i]) - bound) / float(obj[i]),
            training=self._report(plan, pred["iteration_time_s"]),
            pareto=self._pareto(rows, rm.allowed, time_s, devices, B) if self.q.pareto else None)

    def _report(self, plan: Plan, iteration_s: float) -> dict | None:
        tr = self.q.training
        if tr is None:
            return None
        out = tr.report(plan.global_batch, plan.devices, iteration_s)
        return {**out, "tokens": out["samples"] * self.m.seq_len}

    def _pareto(self, rows, allowed, time_s, devices, B) -> list[dict]:
        """The non-dominated (time-to-train, cost) plans among the rows every gate allows."""
        ok = np.flatnonzero(allowed)
        ttt, cost = self._train(time_s[ok], devices[ok], B[ok])
        front = []
        for j in pareto_front(ttt, cost):
            plan = self._plan(rows[ok[j]])
            front.append({"config": plan.to_json(self.hw.g), "time_to_train_s": float(ttt[j]),
                          "cost_usd": float(cost[j]),
                          "steps": float(self.q.training.steps(plan.global_batch))})
        return front

    def _plan(self, row) -> Plan:
        t, p, v, d, mb, B, rec, sp, zero, gpipe = (int(x) for x in row)
        return Plan(tp=t, pp=p, dp=d, micro_batch=mb, global_batch=B, interleave=v,
                    recompute=RECOMPUTE[rec], sequence_parallel=bool(sp and t > 1), zero=zero,
                    schedule=SCHEDULES[gpipe], overlap=self.q.overlap,
                    flash_attention=self.q.flash_attention)
