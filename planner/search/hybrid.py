"""Hybrid (tensor x pipeline x data) parallel plans for transformers: one configuration's
prediction, and the exact search over all of them.

The search uses the row-index CP-SAT model of `search/rows.py`, as the data-parallel search
does. Every structurally valid configuration is a row, priced by `cost.transformer.iteration`
in one vectorised pass and sorted by the objective. Memory is a gated constraint; pins that
leave no structure are named by `_explain_empty`.

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
from planner.spec.hardware import Precision, System
from planner.spec.transformer import Transformer

MAX_ROWS = 5_000_000
OBJECTIVES = ("throughput", "iteration-time", "token-budget")


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
    """What the user pinned or bounded; None means free."""

    global_batch: int
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
    time_limit_s: float = 10.0


def _divisors(x: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(x) + 1) if x % d == 0]
    return sorted(set(small + [x // d for d in small]))


def _structures(m: Transformer, g: int, q: Search) -> np.ndarray:
    """(t, p, v, d, mb) rows that satisfy divisibility and the pins (device budget is a gate)."""
    B = q.global_batch
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


class HybridSolver:
    def __init__(self, m: Transformer, system: System, precision: Precision, q: Search):
        if q.global_batch < 1:
            raise SpecError(f"global_batch: must be a positive integer, got {q.global_batch}")
        if q.objective not in OBJECTIVES:
            raise SpecError(f"objective: {q.objective!r} is not one of {', '.join(OBJECTIVES)} "
                            "for transformer models")
        if q.objective == "token-budget" and not q.token_budget:
            raise SpecError("token_budget: --objective token-budget needs --tokens")
        self.m, self.system, self.precision, self.q = m, system, precision, q
        self.hw = Hardware.of(system, precision)

    def _rows(self) -> tuple[np.ndarray, np.ndarray, dict]:
        """(structures S x 5, choices C x 4, priced terms as S x C arrays): the structural
        terms are computed once per structure and broadcast over the choices."""
        st = _structures(self.m, self.hw.g, self.q)
        ch = np.array(_choices(self.q), dtype=np.int64)
        if len(st) * len(ch) > MAX_ROWS:
            raise SpecError(f"the search space has {len(st) * len(ch):,} rows (limit "
                            f"{MAX_ROWS:,}); pin --tp or --pp, or lower --devices-max")
        if len(st) == 0:
            raise self._explain_empty()
        t, p, v, d, mb = (col[:, None] for col in st.T)
        rec, sp, zero, gpipe = (col[None, :] for col in ch.T)
        cfg = {"t": t, "p": p, "v": v, "d": d, "mb": mb, "acc": self.q.global_batch // (d * mb),
               "recompute": rec, "sp": sp, "zero": zero, "gpipe": gpipe,
               "overlap": self.q.overlap, "flash": self.q.flash_attention}
        shape = (len(st), len(ch))
        priced = {k: np.broadcast_to(val, shape).ravel()
                  for k, val in iteration(self.m, self.hw, cfg).items() if k in ("time", "memory")}
        return st, ch, priced

    def _explain_empty(self) -> InfeasibleError:
        """No structure meets the pins: name the smallest set of pins whose removal helps."""
        pins = [k for k in ("devices", "tp", "pp", "dp", "micro_batch", "interleave")
                if getattr(self.q, k) is not None]
        for size in range(1, len(pins) + 1):
            for combo in itertools.combinations(pins, size):
                free = dataclasses.replace(self.q, **{k: None for k in combo})
                if len(_structures(self.m, self.hw.g, free)):
                    what = ", ".join(f"{k} = {getattr(self.q, k)}" for k in combo)
                    return InfeasibleError(
                        f"infeasible: these pins conflict with global_batch = "
                        f"{self.q.global_batch}, {self.m.layers} layers, {self.m.heads} heads "
                        f"and the device budget: {what}", combo)
        return InfeasibleError(
            f"infeasible: no tp x pp x dp split of at most "
            f"{self.q.devices or self.q.devices_max} devices divides global_batch = "
            f"{self.q.global_batch} (whole nodes of {self.hw.g} beyond one node)",
            ("global_batch",))

    def _objective(self, time_s: np.ndarray) -> np.ndarray:
        if self.q.objective == "token-budget":
            tokens = self.q.global_batch * self.m.seq_len
            return time_s * self.q.token_budget / tokens
        return time_s  # the global batch is fixed: throughput and iteration time coincide

    def solve(self) -> HybridSolution:
        t0 = time.perf_counter()
        st, ch, r = self._rows()
        obj = self._objective(r["time"])
        if not np.all(np.isfinite(obj)):
            raise SpecError("the cost model gave a non-finite value; check the hardware numbers")
        # sorted by objective, ties by fewer devices, then by generation order (deterministic)
        devices = np.repeat(st[:, 0] * st[:, 1] * st[:, 3], len(ch))
        order = np.lexsort((np.arange(len(obj)), devices, obj))
        obj, mem = obj[order], r["memory"][order]
        cap = self.hw.memory_bytes

        # The device budget and the pins already bound the rows (`_structures`); memory is the
        # one constraint left for CP-SAT, gated so that an empty model names it.
        rm = RowModel(len(obj))
        rm.gate("memory", f"memory: the smallest plan within the devices and pins needs "
                f"{float(mem.min()) / 2**30:.3g} GiB per device; '{self.system.device.name}' "
                f"has {cap / 2**30:.3g} GiB", mem <= cap)
        build = time.perf_counter() - t0

        solver = cp_solver(self.q.time_limit_s)
        rm.enforce_gates()
        status = solver.Solve(rm.model)
        if status == cp_model.INFEASIBLE:
            raise InfeasibleError(f"infeasible: {rm.gates['memory'][1]}", ("memory",))
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise InfeasibleError(f"no configuration found within --time-limit "
                                  f"{self.q.time_limit_s:g} s")
        i = solver.Value(rm.point)
        bound = float(obj[max(0, min(int(solver.BestObjectiveBound()), len(obj) - 1))])
        k = int(order[i])
        plan = self._plan(np.concatenate([st[k // len(ch)], ch[k % len(ch)]]))
        pred = predict(self.m, self.system, self.precision, plan)
        return HybridSolution(
            status="optimal" if status == cp_model.OPTIMAL else "feasible",
            plan=plan, prediction=pred,
            objective={"name": self.q.objective, "value": float(obj[i]),
                       "unit": "s" if self.q.objective != "throughput" else "s/iteration"},
            rows=len(obj), build_time_s=build, solve_time_s=solver.WallTime(),
            gap=abs(float(obj[i]) - bound) / float(obj[i]))

    def _plan(self, row) -> Plan:
        t, p, v, d, mb, rec, sp, zero, gpipe = (int(x) for x in row)
        sp = sp and t > 1
        return Plan(tp=t, pp=p, dp=d, micro_batch=mb, global_batch=self.q.global_batch,
                    interleave=v, recompute=RECOMPUTE[rec], sequence_parallel=bool(sp),
                    zero=zero, schedule=SCHEDULES[gpipe], overlap=self.q.overlap,
                    flash_attention=self.q.flash_attention)

