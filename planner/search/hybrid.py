"""Hybrid (tensor x pipeline x data) parallel plans for transformers: one plan's prediction, and
the search over all of them.

The search is the priced-table solver of `search/table.py`, as the CNN's data-parallel search
is: every structurally valid plan at each offered global batch is a row, priced by
`cost.transformer.iteration` (vectorised, one batch at a time), and CP-SAT takes the minimum of
the table. Rows over the device memory are dropped while pricing; the deadline and budget are
gates, and pins that leave no structure are named by `_explain_empty`.

Two choices are pruned by dominance, exactly: with t > 1 sequence parallelism moves the same
bytes as plain tensor parallelism and stores less, and 1F1B runs as fast as GPipe with fewer
micro-batches in flight, so the unpinned search only considers sp on and 1F1B. ZeRO stages 0-2
move the same gradient volume, so stage 2 (least memory, the sharded optimizer step) dominates
0 and 1 unless a stage is pinned; stage 3 (1.5x the traffic) stays a choice. Hybrid sharding
is tried with stage 3 only: at stages 1 and 2 it moves at least the flat ring's bytes over
the NICs (an allreduce of each rank's gradient shard across the groups against half a ring of
gradients and weights), adds its in-group phase and holds more.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from types import SimpleNamespace

import numpy as np

from planner import bands, rules, switches
from planner.cost.transformer import (
    PARTIAL,
    RECOMPUTE,
    SCHEDULES,
    Hardware,
    hardware_flops_per_sequence,
    iteration,
)
from planner.errors import InfeasibleError, SpecError
from planner.inputs import devices_of
from planner.plan import (
    Plan,
    Recompute,
    Schedule,
    check_dp_shard,
    check_for_model,
    check_fp8_weight_gather,
    check_lora,
    check_moe_buffers,
    check_pins,
    check_recompute_layers,
    check_recompute_modules,
    hsdp_fits_experts,
    largest_chunk,
    recompute_modules_for,
    stage_layers,
)
from planner.prediction import Prediction
from planner.search import driver
from planner.search import table as core
from planner.search.hybrid_space import (
    CP_TRIED,
    Search,
    candidate_batches,
    choices,
    structures,
)
from planner.search.memory_fit import DEFAULT_MEMORY_HEADROOM, filled, usable_bytes
from planner.search.objective import Objective, objective_for
from planner.search.priced_rows import CHOICE, COLUMNS, STRUCTURE, Block, PricedRows
from planner.search.solution import Solution
from planner.search.training import Training, check_training
from planner.spec.hardware import Precision, System
from planner.spec.transformer import Transformer

MAX_ROWS = 20_000_000
assert all(switches.BY_NAME[n].applies for n in switches.SEARCHED), \
    "a searched switch needs its `applies` rule"


# what the search prices per row: the memory with the gradients whole tells which ZeRO 2 rows
# have a covered ZeRO 1 twin
MEMORIES = ("memory", "memory_zero1")
PRICED = ("time", *MEMORIES)
OBJECTIVES = tuple(o.value for o in Objective if o is not Objective.efficiency)
UNITS = {o.value: o.unit for o in Objective}
HybridSolution = Solution  # the former name of a transformer search's answer

__all__ = ["HybridSolution", "HybridSolver", "OBJECTIVES", "Plan", "RECOMPUTE", "Search",
           "candidate_batches", "predict"]


def _cfg(plan: Plan) -> dict:
    """The cost model's arrays for one plan."""
    one = lambda x: np.array([x])  # noqa: E731
    return {"t": one(plan.tp), "p": one(plan.pp), "d": one(plan.dp), "mb": one(plan.micro_batch),
            "acc": one(plan.accumulation), "v": one(plan.interleave), "cp": one(plan.cp),
            "ep": one(plan.ep), "etp": one(plan.etp), "rl": one(plan.recompute_layers or 1),
            "recompute": one(PARTIAL if plan.recompute_layers else plan.recompute.code),
            "sp": one(plan.sequence_parallel),
            "zero": one(plan.zero), "gpipe": one(plan.schedule is Schedule.gpipe),
            **switches.values(plan)}


def _check_system(system: System, precision: Precision, x) -> None:
    """The choices of a Plan or a Search that the system or the precision rule out."""
    if x.offload_activations and system.host_link is None:
        raise SpecError(f"offload_activations: '{system.name}' has no host link to offload "
                        f"over (a system's host_offload, as on gb200-nvl72)")
    switches.check_precision(x, precision.value)  # each switch's own precisions


def predict(m: Transformer, system: System, precision: Precision, plan: Plan,
            memory_headroom: float = DEFAULT_MEMORY_HEADROOM) -> Prediction:
    """The prediction of one plan (times in s, memory in bytes)."""
    check_for_model(m, plan)
    _check_system(system, precision, plan)
    g = system.devices_per_node
    if plan.devices_per_node != min(g, plan.devices):
        raise SpecError(f"devices_per_node: a transformer plan fills nodes of {g} devices "
                        f"('{system.name}'); got {plan.nodes} nodes x {plan.devices_per_node}")
    hw = Hardware.of(system, precision)
    r = {k: float(v[0]) if np.ndim(v) else float(v)
         for k, v in iteration(m, hw, _cfg(plan)).items()}
    t_iter = r["time"]
    peak = system.device.peak_flops(precision)
    rank = plan.lora_rank or 0
    model_flops = (m.lora_model_flops(rank) if rank else m.model_flops()) * plan.global_batch
    partial = None  # layers recomputed: N of each stage's v chunks (as the cost model prices)
    if plan.recompute_layers is not None:
        partial = sum(min(plan.recompute_layers * plan.interleave, n) for n in stage_layers(
            m.layers, plan.pp, plan.interleave, plan.first_stage_layers, plan.last_stage_layers))
    hw_flops = hardware_flops_per_sequence(m, plan.recompute.value, partial, lora_rank=rank,
                                           mla_up=plan.recompute_mla_up) * plan.global_batch
    per_dev = plan.devices * t_iter
    return Prediction(
        iteration_time_s=t_iter,
        samples_per_s=plan.global_batch / t_iter,
        tokens_per_s=plan.global_batch * m.seq_len / t_iter,
        compute_time_s=r["compute"],
        exposed_communication_time_s=(r["tp_comm"] + r["cp_comm"] + r["ep_comm"] + r["pp_comm"]
                                      + r["dp_comm_exposed"]),
        optimizer_time_s=r["optimizer"],
        forward_time_s=r["forward"],
        time_breakdown={k: r[k] for k in ("compute", "tp_comm", "cp_comm", "ep_comm", "offload",
                                          "pp_bubble", "pp_comm", "dp_comm_exposed",
                                          "optimizer", "host_sync")},
        memory_bytes_per_device=r["memory"],
        memory_breakdown={"weights": r["weights"], "gradients": r["gradients"],
                          "optimizer": r["optimizer_state"], "activations": r["activations"]},
        memory_capacity_bytes=(cap := usable_bytes(system.device.usable_memory_bytes,
                                                   memory_headroom)),
        fits_memory=r["memory"] <= cap,
        model_flops_per_iteration=model_flops,
        hardware_flops_per_iteration=hw_flops,
        tflops_per_device_model=model_flops / per_dev / 1e12,
        tflops_per_device_hardware=hw_flops / per_dev / 1e12,
        mfu=model_flops / (per_dev * peak),
        hfu=hw_flops / (per_dev * peak),
        # (judged on the device's usable memory, whatever headroom the request keeps)
        time_band=bands.band(bands.plan_features(
            m, system.device.name, precision, plan,
            full=filled(r["memory"], system.device))).to_json(t_iter),
    )


# --- the search ---------------------------------------------------------------------------------


class HybridSolver:
    def __init__(self, m: Transformer, system: System, precision: Precision, q: Search):
        g = system.devices_per_node
        if (q.global_batch is None) == (q.global_batch_range is None):
            raise SpecError("global_batch: give --global-batch or --global-batch-range for "
                            "transformer models")
        lo, hi = q.global_batch_range or (q.global_batch, q.global_batch)
        if not 1 <= lo <= hi:
            got = f"{lo}:{hi}" if q.global_batch_range else str(lo)
            raise SpecError(f"global_batch: need a positive batch (a range A:B with A <= B), "
                            f"got {got}")
        objective = objective_for(q.objective, "transformer")
        if objective is Objective.token_budget and not q.token_budget:
            raise SpecError("token_budget: --objective token-budget needs --tokens")
        if q.fewest_nodes_within is not None and not 0 <= q.fewest_nodes_within <= 10:
            raise SpecError(f"within: must be in [0, 10], got {q.fewest_nodes_within}")
        core.check_knee_tolerance(q.knee_tolerance)
        check_training(q.training, objective, q.pareto)
        # pins no plan of this model can meet are bad input, not infeasibility
        check_pins(m, tp=q.tp, pp=q.pp, interleave=q.interleave, cp=q.cp, ep=q.ep,
                   first=q.first_stage_layers, last=q.last_stage_layers)
        if q.cp_max is not None:
            if not 1 <= q.cp_max <= CP_TRIED[-1]:
                raise SpecError(f"cp_max: must be 1 to {CP_TRIED[-1]} (the degrees the search "
                                f"tries), got {q.cp_max}")
            if q.cp is not None and q.cp > q.cp_max:
                raise SpecError(f"cp: the pinned cp {q.cp} is above cp_max {q.cp_max}")
        if q.ep_max is not None:
            if (isinstance(q.ep_max, bool) or not isinstance(q.ep_max, int | float | np.integer)
                    or not float(q.ep_max).is_integer() or q.ep_max < 1):
                raise SpecError(f"ep_max: must be a whole number of at least 1, got {q.ep_max!r}")
            if q.ep is not None and q.ep > q.ep_max:
                raise SpecError(f"ep: the pinned ep {q.ep} is above ep_max {q.ep_max}")
        if q.lora_rank is not None:
            check_lora(m, q.lora_rank)
        check_recompute_modules(m, q)
        _check_system(system, precision, q)
        if m.experts <= 1 and q.etp is not None:
            raise SpecError(f"etp: '{m.name}' is a dense model (no experts)")
        check_moe_buffers(m, q)
        for key, value, cls in (("recompute", q.recompute, Recompute),
                                ("schedule", q.schedule, Schedule)):
            if value is not None and value not in {c.value for c in cls}:
                raise SpecError(f"{key}: unknown value {value!r} (allowed: "
                                f"{', '.join(c.value for c in cls)})")
        if q.zero is not None and q.zero not in (0, 1, 2, 3):
            raise SpecError(f"zero: must be 0, 1, 2 or 3, got {q.zero}")
        check_recompute_layers(q.recompute_layers, q.recompute or "full",
                               q.offload_activations)
        if q.dp_shard:
            check_dp_shard(q.dp_shard, 1 if q.zero is None else q.zero)
        check_fp8_weight_gather(q.fp8_weight_gather, q.zero)
        switches.check_exclusions(q)
        choices(q)  # pins the rules leave no choice of are refused here
        rules.refuse_pins(m, q)  # and pins that break a rule whatever the search chooses
        # nodes are whole nodes of g devices: pins and budgets in nodes are device counts
        devices, devices_max = devices_of(q.devices, q.nodes, g), q.devices_max
        if q.nodes_max is not None:
            devices_max = min(devices_max or q.nodes_max * g, q.nodes_max * g)
        if devices is not None and devices_max is not None and devices > devices_max:
            given = (f"nodes {q.nodes} ({devices} devices)" if q.nodes is not None
                     else f"devices {devices}")
            cap = (f"nodes_max {q.nodes_max}" if q.nodes_max is not None
                   and q.nodes_max * g == devices_max else f"devices_max {devices_max}")
            raise SpecError(f"{'nodes' if q.nodes is not None else 'devices'}: {given} is "
                            f"over {cap}; give one of them")
        # a searched switch the precision cannot run stays off (`Switch.precisions`), and
        # so does one for another kind of model or a request where it does nothing
        # (`Switch.tried_for`) or one a pinned switch excludes (`Switch.excluded_by`)
        searched = tuple(n for n in q.searched if (switches.BY_NAME[n].precisions is None
                         or precision.value in switches.BY_NAME[n].precisions)
                         and (switches.BY_NAME[n].tried_for is None
                              or switches.BY_NAME[n].tried_for(m, q))
                         and not any(getattr(q, x) for x in switches.BY_NAME[n].excluded_by))
        q = dataclasses.replace(q, objective=objective, devices=devices, devices_max=devices_max,
                                nodes=None, nodes_max=None, searched=searched)
        self.m, self.system, self.precision, self.q = m, system, precision, q
        self.hw = Hardware.of(system, precision)
        # the programs price hybrid sharding's form wherever it is pinned or tried: a plan
        # without it is that form over one group of all d replicas (`_price`)
        self._hsdp_form = bool(q.dp_shard) or "dp_shard" in q.searched
        self.batches = candidate_batches(lo, hi)

    def _rows(self) -> tuple[PricedRows, np.ndarray, int]:
        """The plans that fit in memory: (rows, a `PricedRows` table of the fields of `ROW`;
        iteration time per row; plans priced). Priced one global batch at a time, with the
        structural terms computed once per structure and broadcast over the choices; memory
        is the one constraint every plan must meet, so rows over it are dropped here."""
        ch = np.array(choices(self.q), dtype=np.int64)
        whole, part = ch[ch[:, 0] != PARTIAL], ch[ch[:, 0] == PARTIAL]
        cap, smallest, priced = usable_bytes(self.hw.memory_bytes, self.q.memory_headroom), \
            math.inf, 0
        rows, times = [], []
        # ZeRO 2 partial choices whose ZeRO 1 rows `covered` prices (once) when it asks
        self._pending, self._zero1_rows = [], None

        def keep(*args, **kwargs):
            out, time_s = self._kept(*args, cap=cap, **kwargs)
            rows.append(out)
            times.append(time_s)

        zero = CHOICE.index("zero")

        def price(st, B, ds=None):
            """Keep the rows of structures `st` that fit (with `ds` replicas per shard group
            each: hybrid sharding, tried with ZeRO 3); the rows priced."""
            nonlocal smallest
            w, pt = (whole, part) if ds is None else (whole[whole[:, zero] == 3],
                                                      part[part[:, zero] == 3])
            mem = mem1 = None
            if len(w):
                time_s, mem, mem1 = self._price(st, B, w, outputs=PRICED, ds=ds)
                smallest = min(smallest, float(mem.min()))
                keep(st, B, w, mem <= cap, time_s, mem1=mem1, ds=ds)
            for one in pt[:, None, :]:
                sel, n = self._fewest_recomputed(st, B, one, w, mem, cap, ds=ds)
                sub = None if ds is None else ds[sel]
                time_s, pmem, pmem1 = self._price(st[sel], B, one, n[:, None], PRICED, ds=sub)
                smallest = min(smallest, float(pmem.min(initial=math.inf)))
                keep(st[sel], B, one, pmem <= cap, time_s, n, pmem1, ds=sub)
                if ds is None and one[0, zero] == 2 and self.q.recompute_layers is None:
                    self._pending.append((st, B, one, w, mem1, sel, n))
            return len(st) * (len(w) + len(pt))

        for B in self.batches:
            st = structures(self.m, self.hw.g, self.q, B)
            priced += len(st) * len(ch)
            if priced > MAX_ROWS:
                raise SpecError(f"the search space has over {MAX_ROWS:,} rows; pin --tp or "
                                "--pp, narrow the batch range or lower --devices-max")
            if len(st) == 0:
                continue
            price(st, B)
            if (hsdp := self._hsdp_rows(st)) is not None:
                sel, z = hsdp
                priced += price(st[sel], B, z)
        if priced == 0:
            raise self._explain_empty()
        if not any(len(x) for x in rows):
            raise InfeasibleError(
                f"infeasible: memory: the smallest plan within the devices and pins needs "
                f"{smallest / 2**30:.3g} GiB per device; '{self.system.device.name}' has "
                f"{cap / 2**30:.3g} GiB{self._modules_hint()}", ("memory",))
        return PricedRows(rows), np.concatenate(times), priced

    def _modules_hint(self) -> str:
        """The recompute modules the model has that the request leaves off, where it pins no
        or selective recomputation: the search does not try them (they are pinned only), so an
        out-of-memory answer names them (with full recomputation free they would not help:
        it frees more than all of them)."""
        if self.q.offload_activations or self.q.recompute not in ("none", "selective"):
            return ""
        off = [switches.BY_NAME[n].flag for n in recompute_modules_for(self.m)
               if not getattr(self.q, n)]
        return (f" (the search does not try Megatron-LM's recompute modules: {', '.join(off)} "
                "free more)") if off else ""

    def _kept(self, st, B, chosen, fits, time_s, rl=None, mem1=None, *, cap, ds=None) -> tuple:
        """(the rows of structures `st` x choices `chosen` that `fits` keeps, as a `Block`;
        their times). A searched switch on where it does nothing prices as off: kept off there;
        and on only where its rules hold (`planner.rules`, as a pinned one is refused). A ZeRO
        2 row without HSDP whose memory with the gradients whole (`mem1`) fits covers its ZeRO
        1 twin. `ds`: each structure's replicas per shard group (HSDP), else as pinned."""
        col = lambda k: chosen[:, CHOICE.index(k)][None, :]  # noqa: E731
        part = lambda k: st[:, STRUCTURE.index(k)][:, None]  # noqa: E731
        row = SimpleNamespace(**{k: part(k) for k in STRUCTURE},
                              acc=B // (part("d") * part("mb")),
                              rec=col("rec"), sp=col("sp"), zero=col("zero"))
        fits = fits & rules.mask_across(self.m, self.q, row)  # split x choice rules
        for name in switches.PER_ROW:
            sw = switches.BY_NAME[name]
            on_ok = sw.applies(part, col)
            if name in self.q.searched:
                if sw.required_for is not None and sw.required_for(self.m):
                    fits = fits & ((col(name) == 1) | ~on_ok)  # on wherever it applies
                on_ok = on_ok & rules.hold(name, row, self.q, self.m)
            fits = fits & ((col(name) == 0) | on_ok)
        si, ci = np.nonzero(fits)
        ds_all = self.q.dp_shard or 0
        hsdp = (ds_all if ds is None else ds[si]) != 0
        cover = (np.zeros(len(si), dtype=bool) if mem1 is None else
                 (chosen[ci, CHOICE.index("zero")] == 2) & (mem1[si, ci] <= cap) & ~hsdp)
        return Block(st, B, chosen, si, ci, rl, ds, ds_all, cover), time_s[si, ci]

    def _hsdp_rows(self, st) -> tuple | None:
        """(structures, each one's replicas per shard group) of the hybrid-sharded rows the
        search tries beside each plan with ZeRO 3: shard groups that stay inside one
        scale-up domain (ranks run tp, cp, pp, then dp, so z consecutive replicas span z t cp
        p ranks: z at most its replicas there), of every power of two up to that and that
        count itself, dividing d, 1 < z < d (and, for MoE, with the expert grid folding over
        it: `hsdp_fits_experts`). A structure appears once per such z. None where the request
        pins or excludes HSDP."""
        if "dp_shard" not in self.q.searched or self.q.zero not in (None, 3):
            return None
        t, p, d, cp, ep, etp = (st[:, STRUCTURE.index(k)] for k in ("t", "p", "d", "cp", "ep",
                                                                     "etp"))
        most = np.maximum(1, self.hw.scale_up // (t * cp * p))
        tries = {int(k) for k in np.unique(most)} | {
            2**j for j in range(1, int(most.max()).bit_length())}
        picked = [(np.flatnonzero((k <= most) & (d % k == 0) & (k < d)
                                  & hsdp_fits_experts(t, cp, k, ep, etp)), k)
                  for k in sorted(tries) if k > 1]
        sel = np.concatenate([i for i, _ in picked] or [np.empty(0, dtype=np.int64)])
        if not len(sel):
            return None
        return sel, np.concatenate([np.full(len(i), k, dtype=np.int64) for i, k in picked])

    def _zero1_partial_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, times) a partially recomputed structure needs at ZeRO 1 beyond the search's
        table: at ZeRO 1 it may need more layers recomputed than at stage 2, and its own
        fewest is then a ZeRO 2 row the table does not hold (slower there than the one it
        does) whose ZeRO 1 twin is covered. Priced when `covered` first asks."""
        if self._zero1_rows is not None:
            return self._zero1_rows
        cap = usable_bytes(self.hw.memory_bytes, self.q.memory_headroom)
        rows, times = [], [np.empty(0)]
        for st, B, one, whole, mem1, sel, n in self._pending:
            sel1, n1 = self._fewest_recomputed(st, B, one, whole, mem1, cap, 1)
            at2 = np.full(len(st), -1)
            at2[sel] = n
            new = at2[sel1] != n1
            sel1, n1 = sel1[new], n1[new]
            time_s, pmem, pmem1 = self._price(st[sel1], B, one, n1[:, None], PRICED)
            out, t = self._kept(st[sel1], B, one, pmem1 <= cap, time_s, n1, pmem1, cap=cap)
            rows.append(out)
            times.append(t)
        self._zero1_rows = PricedRows(rows), np.concatenate(times)
        return self._zero1_rows

    def _price(self, st, B, chosen, rl=None, outputs=("time", "memory"), ds=None) -> tuple:
        """`outputs` of structures x choices `chosen` (`rl`: recomputed layers of each chunk
        for PARTIAL choices, one per structure; `ds`: replicas per shard group, one per
        structure, else as pinned or all d)."""
        t, p, v, d, mb, cp, ep, etp = (col[:, None] for col in st.T)
        cfg = {"t": t, "p": p, "v": v, "d": d, "mb": mb, "cp": cp, "ep": ep, "etp": etp,
               "acc": B // (d * mb), **switches.values(self.q),
               **{k: col[None, :] for k, col in zip(("recompute", "sp", "zero", "gpipe",
                                                     *switches.PER_ROW), chosen.T,
                                                    strict=True)}}
        if rl is not None:
            cfg["rl"] = rl
        if self._hsdp_form:  # one group of all d replicas prices exactly as no HSDP
            cfg["dp_shard"] = 1
            cfg["ds"] = (ds[:, None] if ds is not None
                         else self.q.dp_shard if self.q.dp_shard else d)
        r = iteration(self.m, self.hw, cfg, outputs)
        return tuple(np.broadcast_to(r[k], (len(st), len(chosen))) for k in outputs)

    def _fewest_recomputed(self, st, B, one, whole, mem, cap, zero1=0, ds=None):
        """(structures, layers of each chunk) for a PARTIAL choice: the pinned count on every
        structure, or, where no recomputation does not fit and full recomputation does (only
        there can partial win), the fewest layers that fit: memory falls and time grows with
        each layer recomputed, so that count is the row's best. Memory is convex in the count
        (a max of lines falling in min(N v, stage layers)), so the chord between 1 and the
        largest chunk less one (a whole chunk is full recomputation) bounds it from above:
        where the chord's crossing fits and one layer fewer does not, that is the count
        (always, where memory is linear); bisection settles the rest. `zero1`: the memory
        with the gradients whole (`mem` then the whole choices' `memory_zero1`); `ds`: each
        structure's replicas per shard group (HSDP)."""
        q = self.q
        if q.recompute_layers is not None:
            return np.arange(len(st)), np.full(len(st), q.recompute_layers, dtype=np.int64)
        at = lambda rec: int(np.flatnonzero((whole == [rec, *one[0, 1:]]).all(axis=1))[0])  # noqa: E731
        sel = np.flatnonzero((mem[:, at(0)] > cap) & (mem[:, at(2)] <= cap))
        hi = self._largest_chunk(st[sel]) - 1
        sel, hi = sel[hi >= 1], hi[hi >= 1]

        def memory(counts):  # memory of the sel structures at each column of counts
            k = counts.shape[1]
            out = self._price(np.repeat(st[sel], k, axis=0), B, one, counts.reshape(-1, 1),
                              MEMORIES, None if ds is None else np.repeat(ds[sel], k))[zero1]
            return out.reshape(len(sel), k)

        ends = memory(np.column_stack([np.ones_like(hi), hi]))
        f1, fh = ends[:, 0], ends[:, 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            cross = 1 + (f1 - cap) * (hi - 1) / (f1 - fh)
        guess = np.clip(np.ceil(np.nan_to_num(cross, nan=1.0)), 2, np.maximum(hi, 2)).astype(
            np.int64)
        near = memory(np.column_stack([guess - 1, np.minimum(guess, hi)]))
        lo = np.where(f1 <= cap, 1, np.where(fh > cap, hi, guess))
        top = lo.copy()
        unsettled = (f1 > cap) & (fh <= cap) & ~((near[:, 0] > cap) & (near[:, 1] <= cap))
        # the chord missed (a kink): N lies between 2 and hi; bisect there
        lo, top = np.where(unsettled, 2, lo), np.where(unsettled, hi, top)
        while np.any(lo < top):
            mid = (lo + top) // 2
            fits, open_ = memory(mid[:, None])[:, 0] <= cap, lo < top  # settled rows stay
            top, lo = np.where(open_ & fits, mid, top), np.where(open_ & ~fits, mid + 1, lo)
        return sel, lo

    def _largest_chunk(self, st: np.ndarray) -> np.ndarray:
        """`largest_chunk` of each structure, computed once per (p, v)."""
        q, width = self.q, self.m.layers + 1  # v <= layers: (p, v) as one integer key
        keys, inverse = np.unique(st[:, 1] * width + st[:, 2], return_inverse=True)
        sizes = np.array([largest_chunk(self.m.layers, int(k // width), int(k % width),
                                        q.first_stage_layers, q.last_stage_layers)
                          for k in keys], dtype=np.int64)
        return sizes[inverse.ravel()]

    def _explain_empty(self) -> InfeasibleError:
        """No structure meets the pins: name the smallest set of pins no split meets together
        (with the batch, the model's shape and the device budget; every other pin freed)."""
        pins = [k for k in ("devices", "tp", "cp", "ep", "etp", "pp", "dp", "micro_batch",
                            "interleave", "dp_shard", "framework")
                if getattr(self.q, k)]
        batch = (f"global_batch = {self.q.global_batch}" if self.q.global_batch else
                 f"the global batches {', '.join(map(str, self.batches))}")

        def feasible(kept) -> bool:
            free = dataclasses.replace(self.q, **{k: None for k in pins if k not in kept})
            return any(len(structures(self.m, self.hw.g, free, B)) for B in self.batches)

        for size in range(1, len(pins) + 1) if feasible(()) else ():
            for combo in itertools.combinations(pins, size):
                if not feasible(combo):
                    what = ", ".join(f"{k} = {getattr(self.q, k)}" for k in combo)
                    grid = ""
                    if self.m.experts > 1 and (self.q.ep or self.q.etp):
                        grid = (f" (the expert grid etp x ep = {self.q.etp or self.q.tp or 1} x "
                                f"{self.q.ep or 1} must divide tp x cp x dp)")
                    return InfeasibleError(
                        f"infeasible: these pins conflict with {batch}, {self.m.layers} "
                        f"layers, {self.m.heads} heads and the device budget: {what}{grid}",
                        combo)
        return InfeasibleError(
            f"infeasible: no tp x cp x pp x dp split of at most "
            f"{self.q.devices or self.q.devices_max} devices divides {batch} (whole nodes of "
            f"{self.hw.g} beyond one node)", ("global_batch",))

    # --- the family the driver searches (planner.search.driver) -------------------------------

    def rows(self, explain: bool = False) -> driver.Rows:
        """The plans that fit, priced (pins that leave no plan and memory no plan meets are
        named while pricing: `_rows`)."""
        self.plans, self.time_s, self.priced = self._rows()
        return self._driver_rows(lambda k: self.plans[k], self.time_s, self.priced)

    def _driver_rows(self, col, time_s, priced) -> driver.Rows:
        """The driver's view of priced rows: `col(name)` gives a column, `time_s` the times."""
        devices = col("t") * col("p") * col("d") * col("cp")
        group = None
        if self.q.top:  # runners-up differ in the split (tp, pp, dp, cp, ep, etp) or the batch
            split = np.column_stack([col(k) for k in ("t", "p", "d", "B", "cp", "ep", "etp")])
            group = np.unique(split, axis=0, return_inverse=True)[1].ravel()
        return driver.Rows(time_s, devices, np.maximum(1, devices // self.hw.g),
                           col("B"), group=group, points=priced)

    def plan(self, row: int) -> Plan:
        return self._plan(self.plans.row(row))

    def covered(self) -> Solution:
        """The best plan with its gradients and weights whole (ZeRO 1) over the table this
        search priced: its ZeRO 2 rows whose memory at ZeRO 1 fits, each as its ZeRO 1 twin
        (the same time: stage 1 moves what stage 2 moves). Every ZeRO 1 plan that fits is such
        a twin (it fits at stage 2 too; a partially recomputed one has its own row with the
        layers ZeRO 1 needs), so this is the search with ZeRO 1 pinned without pricing again
        (`planner.search.support`)."""
        if not hasattr(self, "plans"):
            self.rows()
        return driver.solve(_Covered(self), self._ask(), training_report=self._report)

    def predict(self, plan: Plan) -> Prediction:
        return predict(self.m, self.system, self.precision, plan, self.q.memory_headroom)

    def solve(self) -> Solution:
        return driver.solve(self, self._ask(), training_report=self._report)

    def _ask(self) -> driver.Ask:
        q = self.q
        budget = (None if q.token_budget is None
                  else Training(None, target_samples=q.token_budget / self.m.seq_len))
        return driver.Ask(q.objective, q.training, token_budget=budget, top=q.top,
                          fewest_nodes_within=q.fewest_nodes_within,
                          time_limit_s=q.time_limit_s, workers=q.workers, pareto=q.pareto,
                          knee_tolerance=q.knee_tolerance)

    def _report(self, plan: Plan, iteration_s: float) -> dict | None:
        out = self.q.training.report(plan.global_batch, plan.devices, iteration_s)
        return {**out, "tokens": out["samples"] * self.m.seq_len}

    def _plan(self, row) -> Plan:
        r = {k: int(row[k]) for k in COLUMNS}  # a `PricedRows.row` or a `ROW` record
        rec, t = r["rec"], r["t"]
        # with one replica ZeRO shards nothing: stages 2 and 3 price as stage 1 (the
        # distributed optimizer, which the calibration runs hold), so a free stage says 1
        zero = 1 if self.q.zero is None and r["d"] * r["cp"] == 1 and r["zero"] > 1 \
            else r["zero"]
        return Plan.split(t, r["p"], r["d"], r["mb"], r["B"], node_size=self.hw.g,
                          interleave=r["v"], cp=r["cp"], ep=r["ep"], etp=r["etp"],
                          recompute="full" if rec == PARTIAL else RECOMPUTE[rec],
                          sequence_parallel=bool(r["sp"] and t > 1), zero=zero,
                          schedule=SCHEDULES[r["gpipe"]],
                          recompute_layers=r["rl"] if rec == PARTIAL else None,
                          **{**switches.values(self.q),
                             **{k: bool(r[k]) for k in switches.PER_ROW},
                             "dp_shard": r["ds"] or None})


class _Covered:
    """The family `HybridSolver.covered` searches: the solver's ZeRO 2 rows with a covered
    ZeRO 1 twin (and the partially recomputed rows ZeRO 1 needs), each row that twin."""

    def __init__(self, solver: HybridSolver):
        self.solver = solver
        self.index = np.flatnonzero(solver.plans["cover"])
        self.extra, self.extra_s = solver._zero1_partial_rows()

    def rows(self, explain: bool = False) -> driver.Rows:
        s, n = self.solver, len(self.index) + len(self.extra)
        if not n:
            raise InfeasibleError("infeasible: memory: no plan fits with its gradients whole "
                                  "(ZeRO 1)", ("memory",))
        col = lambda k: np.concatenate([s.plans[k][self.index], self.extra[k]])  # noqa: E731
        return s._driver_rows(col, np.concatenate([s.time_s[self.index], self.extra_s]), n)

    def plan(self, row: int) -> Plan:
        s, n = self.solver, len(self.index)
        plan = s.plan(int(self.index[row])) if row < n else s._plan(self.extra.row(row - n))
        return dataclasses.replace(plan, zero=1)

    def predict(self, plan: Plan) -> Prediction:
        return self.solver.predict(plan)
