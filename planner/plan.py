"""One parallel plan for every model family: how the devices are split and the batch is cut.

    devices      = nodes x devices_per_node = tp x cp x pp x dp
    global batch = dp x micro_batch x accumulation

A CNN data-parallel plan is the same type with tp = pp = 1 (dp = devices, micro-batch = local
batch, accumulation 1). The plan checks itself when built and its errors spell out the
arithmetic with the values given; the checks that need a model (tp divides the heads, pp at most
the layers) are in `check_for_model`, the only place that knows the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner import rules, switches
from planner.errors import SpecError
from planner.vocabulary import (  # noqa: F401 (the plan's vocabulary, re-exported)
    TRANSFORMER_OPTIMIZERS,
    Collective,
    Kernels,
    Recompute,
    Schedule,
)


def choice(cls, value, key: str):
    """`value` as a member of the enum `cls`, or a one-line error naming `key` and the allowed
    values."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise SpecError(f"{key}: unknown value {value!r} (allowed: {allowed})") from None


def _positive(key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{key}: must be a positive integer, got {value!r}")


@dataclass(frozen=True)
@switches.add_fields
class Plan:
    """The split and the batch; then the recompute, ZeRO and schedule choices; then every
    switch of `planner.switches` as a field of its own name."""

    nodes: int
    devices_per_node: int  # devices used per node
    tp: int
    pp: int
    dp: int
    micro_batch: int  # samples (sequences) per micro-batch per data-parallel replica
    global_batch: int
    interleave: int = 1  # virtual pipeline stages per device
    recompute: Recompute = Recompute.none
    sequence_parallel: bool = False
    zero: int = 0  # ZeRO / FSDP sharding stage
    schedule: Schedule = Schedule.one_f_one_b
    collective: Collective | None = None  # the gradient allreduce, where the family chooses it
    cp: int = 1  # context parallel: ranks sharing each sequence (Megatron-LM's CP)
    ep: int = 1  # expert parallel: ranks sharing one MoE layer's experts
    etp: int | None = None  # expert tensor parallel: ranks sharing each expert (None: = tp)
    # with full recompute, only the first N layers of each pipeline chunk (None: every layer)
    recompute_layers: int | None = None

    def __post_init__(self):
        for key in ("nodes", "devices_per_node", "tp", "pp", "dp", "micro_batch",
                    "global_batch", "interleave", "cp", "ep"):
            _positive(key, getattr(self, key))
        set_ = object.__setattr__
        if self.etp is None:  # Megatron-LM: --expert-tensor-parallel-size defaults to tp
            set_(self, "etp", self.tp)
        _positive("etp", self.etp)
        switches.checked(self)
        set_(self, "recompute", choice(Recompute, self.recompute, "recompute"))
        set_(self, "schedule", choice(Schedule, self.schedule, "schedule"))
        if self.collective is not None:
            set_(self, "collective", choice(Collective, self.collective, "collective"))
        check_recompute_layers(self.recompute_layers, self.recompute.value,
                               self.offload_activations)
        check_fp8_weight_gather(self.fp8_weight_gather, self.zero)
        switches.check_exclusions(self)
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise SpecError(f"zero: must be 0, 1, 2 or 3, got {self.zero!r}")
        # every device holds one (tp, cp, pp, dp) coordinate (Megatron-LM's world size)
        split = self.tp * self.cp * self.pp * self.dp
        if split != self.devices:
            cp = f" x cp({self.cp})" if self.cp > 1 else ""
            raise SpecError(f"devices: tp({self.tp}){cp} x pp({self.pp}) x dp({self.dp}) = "
                            f"{split} != {self.devices} devices ({self.nodes} nodes x "
                            f"{self.devices_per_node})")
        # Megatron-LM folds the expert grid (etp x ep x expert-dp) over the same ranks as the
        # dense one (tp x cp x dp): parallel_state.py, world % (etp x ep x pp) == 0
        dense, expert = self.tp * self.cp * self.dp, self.etp * self.ep
        if dense % expert:
            raise SpecError(f"ep: etp({self.etp}) x ep({self.ep}) = {expert} does not divide "
                            f"tp({self.tp}) x cp({self.cp}) x dp({self.dp}) = {dense} (the "
                            f"expert grid is folded over the same ranks)")
        if self.dp_shard == 0:  # ZeRO over all the replicas: no hybrid sharding
            set_(self, "dp_shard", None)
        if self.dp_shard is not None:
            check_dp_shard(self.dp_shard, self.zero)
            if not hsdp_fits_experts(self.tp, self.cp, self.dp_shard, self.ep, self.etp):
                expert_dp = dense // expert
                raise SpecError(f"dp_shard: the {self.dp // self.dp_shard} replicating groups "
                                f"do not divide the expert data-parallel size {expert_dp}")
        # each replica runs whole micro-batches, `accumulation` of them per iteration
        per_step = self.dp * self.micro_batch
        if self.global_batch % per_step:
            raise SpecError(f"global_batch: global batch {self.global_batch} is not divisible "
                            f"by dp({self.dp}) x micro-batch({self.micro_batch}) = {per_step}")
        if self.interleave > 1:
            # Megatron-LM's interleaved 1F1B: virtual stages need a pipeline, the 1F1B
            # schedule, and a multiple of pp micro-batches per iteration
            if self.pp == 1:
                raise SpecError(f"interleave: {self.interleave} virtual stages need pp > 1")
            if self.schedule is not Schedule.one_f_one_b:
                raise SpecError("interleave: virtual stages need --schedule 1f1b")
        rules.check(None, self)  # the rules tying the split to the choices (planner.rules)

    # --- derived sizes ---------------------------------------------------------------------

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def accumulation(self) -> int:
        """Micro-batches per replica per iteration (gradient accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def local_batch(self) -> int:
        """Samples per data-parallel replica per iteration (= micro-batch for a CNN)."""
        return self.global_batch // self.dp

    # --- constructors ------------------------------------------------------------------------

    @classmethod
    def data_parallel(cls, nodes: int, devices_per_node: int, global_batch: int,
                      collective: Collective | str, overlap: bool = True,
                      softsync: int | None = None, optimizer: str | None = None) -> Plan:
        """Pure data parallelism: every device holds a replica and a local batch (with
        `softsync`, a learner of the asynchronous parameter server); `optimizer` the one it
        was priced with."""
        for key, value in (("nodes", nodes), ("devices_per_node", devices_per_node),
                           ("global_batch", global_batch)):
            _positive(key, value)
        devices = nodes * devices_per_node
        if global_batch % devices:
            raise SpecError(f"global_batch: {global_batch} is not divisible by {devices} devices "
                            f"({nodes} nodes x {devices_per_node})")
        check_softsync(softsync, collective, devices)
        return cls(nodes, devices_per_node, 1, 1, devices, global_batch // devices, global_batch,
                   collective=collective, overlap=overlap, softsync=softsync,
                   optimizer=optimizer)

    @classmethod
    def split(cls, tp: int, pp: int, dp: int, micro_batch: int, global_batch: int, *,
              node_size: int, **choices) -> Plan:
        """A tp x pp x dp plan on whole nodes of `node_size` devices (or part of one node)."""
        for key, value in (("tp", tp), ("pp", pp), ("dp", dp)):
            _positive(key, value)
        cp = choices.get("cp", 1)
        devices = tp * pp * dp * cp
        if devices > node_size and devices % node_size:
            raise SpecError(f"devices: tp({tp}) x pp({pp}) x dp({dp})"
                            f"{f' x cp({cp})' if cp > 1 else ''} = {devices} is more than "
                            f"one node and not a multiple of {node_size} devices per node")
        nodes, per_node = (devices // node_size, node_size) if devices > node_size else (1, devices)
        return cls(nodes, per_node, tp, pp, dp, micro_batch, global_batch, **choices)

    def replace(self, **changes) -> Plan:
        return dataclasses.replace(self, **changes)

    # --- output -------------------------------------------------------------------------------

    def to_json(self) -> dict:
        """The `config` document: the same keys for every family (collective where chosen)."""
        out = {"nodes": self.nodes, "devices_per_node": self.devices_per_node,
               "devices": self.devices, "tp": self.tp, "cp": self.cp, "ep": self.ep,
               "etp": self.etp, "pp": self.pp,
               "dp": self.dp,
               "micro_batch": self.micro_batch, "global_batch": self.global_batch,
               "gradient_accumulation": self.accumulation, "local_batch": self.local_batch,
               "interleave": self.interleave, "recompute": self.recompute.value,
               "recompute_layers": self.recompute_layers,
               "sequence_parallel": self.sequence_parallel, "zero": self.zero,
               "schedule": self.schedule.value,
               **{s.name: s.json(getattr(self, s.name)) for s in switches.SWITCHES}}
        if self.collective is not None:
            out["collective"] = self.collective.value
        return out


def check_recompute_layers(n: int | None, recompute: str, offload: bool) -> None:
    """Partial recomputation (Megatron-LM's block method: the first N layers of each pipeline
    chunk recomputed, the rest keeping their activations) refines full recomputation; the
    activation offload is priced per layer for whole-model recompute choices only."""
    if n is None:
        return
    _positive("recompute_layers", n)
    if recompute != Recompute.full.value:
        raise SpecError(f"recompute_layers: recomputing {n} layers of each chunk is a form of "
                        f"full recomputation (--recompute full), got --recompute {recompute}")
    if offload:
        raise SpecError("recompute_layers: partial recomputation with activation offload is "
                        "not modelled; use one of them")


def check_fp8_weight_gather(on: bool, zero: int | None) -> None:
    """The fp8 weight all-gather is ZeRO's / FSDP's (Megatron-LM's --fp8-param-gather needs the
    distributed optimizer or FSDP): refuse it at ZeRO 0."""
    if on and zero == 0:
        raise SpecError("fp8_weight_gather: the fp8 weight all-gather is ZeRO's / FSDP's "
                        "(Megatron-LM needs the distributed optimizer or FSDP); got --zero 0")


def check_softsync(softsync: int | None, collective, devices: int | None = None) -> None:
    """n-softsync is a parameter server's protocol, with at most one update per gradient."""
    if softsync is None:
        return
    if str(getattr(collective, "value", collective)) != "parameter-server":
        raise SpecError(f"softsync: the asynchronous protocol is a parameter server's "
                        f"(--collective parameter-server); got {getattr(collective, 'value', collective)}")
    if devices is not None and softsync > devices:
        raise SpecError(f"softsync: {softsync}-softsync updates after every {devices} / "
                        f"{softsync} gradients: at most {devices}, one per learner")


def hsdp_fits_experts(tp, cp, dp_shard, ep, etp):
    """Whether the expert data-parallel group (tp cp dp / (etp ep) ranks) splits into the
    dp / dp_shard instances the dense one does (Megatron-LM parallel_state.py): that is,
    whether etp x ep divides tp x cp x dp_shard. Numbers or numpy arrays (the search masks
    with it)."""
    return (tp * cp * dp_shard) % (ep * etp) == 0


def check_dp_shard(n: int, zero: int) -> None:
    """Hybrid sharding (HSDP): ZeRO shards over groups of n data-parallel replicas, which
    need a ZeRO stage to shard (that the groups tile the replicas is a rule of
    `planner.rules`)."""
    _positive("dp_shard", n)
    if zero == 0:
        raise SpecError(f"dp_shard: sharding over groups of {n} replicas needs ZeRO 1, 2 or 3 "
                        "(got --zero 0)")


def check_lora(model, rank: int) -> None:
    """LoRA as priced here: adapters of rank r <= hidden on the fused QKV and output
    projections of standard attention, in a dense model (a MoE model's frozen experts and
    MLA's low-rank projections are not priced apart)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= model.hidden:
        raise SpecError(f"lora_rank: must be an integer in [1, {model.hidden}] (the hidden "
                        f"size), got {rank!r}")
    why = ("is a mixture-of-experts model" if model.experts > 1 else
           "has multi-latent attention" if model.mla else
           "has no attention layers" if not model.lora_params(rank) else None)
    if why:
        raise SpecError(f"lora_rank: LoRA is priced on the attention projections of dense "
                        f"models; '{model.name}' {why}")


def check_for_model(model, plan: Plan) -> None:
    """The checks that need the model: a pin that fails here can never be valid for it (bad
    input, exit 2), whatever the hardware."""
    from planner.spec.transformer import Transformer

    if not isinstance(model, Transformer):
        if plan.tp > 1 or plan.pp > 1:
            raise SpecError(f"tp: tp({plan.tp}) x pp({plan.pp}): CNN plans here are data "
                            "parallel (use solve --strategy hybrid or pipeline for splits)")
        return
    check_pins(model, tp=plan.tp, pp=plan.pp, interleave=plan.interleave, cp=plan.cp,
               ep=plan.ep, first=plan.first_stage_layers, last=plan.last_stage_layers)
    if model.experts <= 1 and plan.etp != plan.tp:
        raise SpecError(f"etp: '{model.name}' is a dense model (no experts)")
    check_moe_buffers(model, plan)
    rules.check(model, plan)  # and those that need the model (planner.rules)
    if plan.lora_rank is not None:
        check_lora(model, plan.lora_rank)
    check_recompute_modules(model, plan)


def recompute_modules_for(model) -> tuple[str, ...]:
    """The recompute-module switches (`planner.switches.RECOMPUTE_MODULES`) `model` has."""
    needs = switches.RECOMPUTE_MODULE_NEEDS
    return tuple(name for name in switches.RECOMPUTE_MODULES
                 if name not in needs or needs[name][0](model))


def check_moe_buffers(model, x) -> None:
    """The MoE token-buffer switches a plan or search request `x` sets, one line where
    Megatron-LM (transformer_config.py at d98e8a6) or the cost model refuses them: a dense
    model has none; the paged stash needs the rank capacity (its pages hold what the
    rank's budget routes); each factor, where set, at least the balanced count (1); the
    rank budget is not priced with per-expert padding (`capacity_factor`)."""
    set_ = [k for k in ("capacity_factor", "rank_capacity", "paged_stash")
            if getattr(x, k) != switches.BY_NAME[k].default]
    if set_ and model.experts <= 1:
        raise SpecError(f"{set_[0]}: '{model.name}' is a dense model (no experts)")
    for k in ("rank_capacity", "paged_stash"):
        if 0 < getattr(x, k) < 1:
            raise SpecError(f"{k}: must be 0 (off) or at least 1 (the balanced token count), "
                            f"got {getattr(x, k):g}")
    if x.paged_stash and not x.rank_capacity:
        raise SpecError("paged_stash: the paged stash needs --rank-capacity (Megatron-LM: "
                        "moe_paged_stash requires moe_expert_rank_capacity_factor)")
    if x.rank_capacity and x.capacity_factor != 1:
        raise SpecError("rank_capacity: --rank-capacity (a dropless budget per rank) is not "
                        "priced with --capacity-factor (each expert padded); drop one of the "
                        "two")


def check_recompute_modules(model, x) -> None:
    """A recompute module the model does not have (`switches.RECOMPUTE_MODULE_NEEDS`), one
    line. `x`: a Plan or a search request."""
    for name, (has, why) in switches.RECOMPUTE_MODULE_NEEDS.items():
        if getattr(x, name, False) and not has(model):
            raise SpecError(f"{name}: '{model.name}' {why}; plan without --"
                            f"{name.replace('_', '-')}")


def check_pins(m, tp: int | None = None, pp: int | None = None,
               interleave: int | None = None, cp: int | None = None,
               ep: int | None = None, first: int | None = None,
               last: int | None = None) -> None:
    """Transformer pins that no plan can meet for this model (each rule with its source)."""
    if first or last:
        _check_uneven(m, pp, interleave, first, last)
    # each expert-parallel rank holds a whole number of experts
    if ep is not None and ep > 1 and m.experts % ep:
        if m.experts <= 1:
            raise SpecError(f"ep: '{m.name}' is a dense model (no experts): ep must be 1, "
                            f"got {ep}")
        raise SpecError(f"ep: {ep} does not divide the {m.experts} experts of '{m.name}'")
    # Megatron-LM's load-balanced context parallelism cuts the sequence into 2 cp chunks
    if cp is not None and cp > 1 and m.seq_len % (2 * cp):
        raise SpecError(f"cp: {cp} needs the sequence ({m.seq_len}) divisible by 2 x cp = "
                        f"{2 * cp} (load-balanced causal chunks)")
    # Megatron-LM splits attention heads (and key/value groups) over the tensor-parallel ranks
    if tp is not None and (m.heads % tp or m.kv_heads % tp):
        what = " and ".join(f"{k} {n}" for k, n in (("heads", m.heads), ("kv_heads", m.kv_heads))
                            if n % tp)
        raise SpecError(f"tp: {tp} does not divide {what} of '{m.name}' (tp must divide both)")
    # a pipeline stage holds at least one layer
    if pp is not None and pp > m.layers:
        raise SpecError(f"pp: {pp} stages for {m.layers} layers of '{m.name}'")
    if interleave is not None and interleave > 1 and not (first or last):
        # the pp x interleave virtual stages hold the layers as evenly as they divide (Megatron
        # -LM's --pipeline-model-parallel-layout places the rest): every chunk of the fullest
        # stage holds a layer, and there are at least two stages
        most = -(-m.layers // pp) if pp is not None else m.layers // 2
        if (pp is not None and pp < 2) or interleave > most:
            raise SpecError(f"interleave: {interleave} virtual stages per device need pp > 1 "
                            f"and at most ceil(layers / pp) = {most} of them ({m.layers} layers "
                            f"of '{m.name}'{f', pp {pp}' if pp is not None else ''})")


def _check_uneven(m, pp: int | None, v: int | None, first: int | None,
                  last: int | None) -> None:
    """Megatron-LM's rules for pinned first / last pipeline stages (TransformerConfig,
    "Uneven PP"): the other stages split the rest evenly and there are middle layers exactly
    when there are middle stages; with v chunks a stage, no more chunks than the busiest
    stage has layers (its layers need not divide into them: the layout flag places any
    count)."""
    pinned = [x for x in (first, last) if x]
    rest = m.layers - sum(pinned)
    if rest < 0:
        raise SpecError(f"first_stage_layers: the pinned stages hold {sum(pinned)} layers; "
                        f"'{m.name}' has {m.layers}")
    if pp is None:  # the search: only the structures that meet the rules below are offered
        return
    least = max(2, 1 + len(pinned) - (rest == 0))
    if pp < least:
        raise SpecError(f"pp: pinning the first / last stage layers needs pp >= {least} "
                        f"(got {pp})")
    others = pp - len(pinned)
    if others and not rest:
        raise SpecError(f"pp: the pinned first / last stages hold all {m.layers} layers of "
                        f"'{m.name}', none left for the {others} other stages")
    if rest and not others:
        raise SpecError(f"pp: the pinned first / last stages leave {rest} of the {m.layers} "
                        f"layers of '{m.name}' and no other stage to hold them")
    if others and rest % others:
        raise SpecError(f"pp: the {rest} layers left of '{m.name}' ({m.layers} minus the pinned "
                        f"first / last stages) do not split evenly over the {others} other "
                        f"stages")
    # with interleaving, a stage's layers need not divide into its v chunks: Megatron-LM's
    # --pipeline-model-parallel-layout places any count per chunk (the launcher writes it;
    # `stage_chunks` gives the split the cost model prices), but a chunk of the busiest stage
    # holds a layer at least
    v = v or 1
    busiest = max(stage_layers(m.layers, pp, v, first, last))
    if v > busiest:
        raise SpecError(f"interleave: {v} virtual stages per device for pinned stages of at "
                        f"most {busiest} layers ('{m.name}')")


def chunk_layers(layers: int, pp: int, v: int) -> list[int]:
    """Layers of each of the pp v pipeline chunks in model order (chunk k on stage k mod pp):
    floor(L / (pp v)) each and the L mod (pp v) left over one each on chunks 1, 2, ... (the
    layout Megatron-LM's --pipeline-model-parallel-layout is written in, and the cost model
    prices)."""
    base, left = divmod(layers, pp * v)
    return [base + (1 <= k <= left) for k in range(pp * v)]


def stage_chunks(n: int, v: int) -> list[int]:
    """A pinned layout's split of one stage's n layers into its v chunks: as even as they
    divide, the larger chunks first (ceil(n / v) the largest)."""
    base, left = divmod(n, v)
    return [base + (k < left) for k in range(v)]


def largest_chunk(layers: int, pp: int, v: int = 1, first: int | None = None,
                  last: int | None = None) -> int:
    """Layers of the largest pipeline chunk: the even layout's, or the largest stage's over
    its v chunks when stages are pinned (`stage_chunks`)."""
    if first or last:
        return stage_chunks(max(stage_layers(layers, pp, v, first, last)), v)[0]
    return max(chunk_layers(layers, pp, v)) if pp * v <= layers else 1


def stage_layers(layers: int, pp: int, v: int = 1, first: int | None = None,
                 last: int | None = None) -> list[int]:
    """Layers on each pipeline stage: the pinned first / last stages and the rest split evenly
    over the others (`check_pins` asks that they divide), or the even chunk layout's."""
    if not (first or last):
        chunks = chunk_layers(layers, pp, v)
        return [sum(chunks[k::pp]) for k in range(pp)]
    others = pp - bool(first) - bool(last)
    middle = (layers - (first or 0) - (last or 0)) // others if others else 0
    return ([first] if first else []) + [middle] * others + ([last] if last else [])
