"""The plan rules that tie a transformer plan's split to its choices and switches, each
written once as a predicate over a row of scalars or numpy arrays: `check` refuses a `Plan`
that breaks one (with the rule's message), and the search masks its candidate rows with the
same predicate (`planner.search.hybrid_space`: a rule reading only the split masks the
structures, one reading only the per-row choices filters those).

A row's fields: t, p, v (virtual stages), d, mb, acc (micro-batches per replica), cp, ep, etp;
rec (0 none, 1 selective, 2 full, 3 full on the first layers of each chunk), sp, zero.

`FORM_RULES` are the same for a framework's launcher form: what its form cannot write. A
search for that framework (`Search.framework`: `solve --format` / `--framework`) masks its
rows with them, so it picks the fastest plan the form writes, and the form refuses a plan
that breaks one (`check_form`), with the rule's message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from planner import switches
from planner.errors import SpecError

SPLIT = frozenset({"t", "p", "v", "d", "mb", "acc", "cp", "ep", "etp"})
CHOICE = frozenset({"rec", "sp", "zero"})
FULL = 2  # recompute codes from here up recompute whole layers (full, partial)


@dataclass(frozen=True)
class Rule:
    key: str  # the field its error names
    reads: frozenset[str]  # the row fields the predicate reads
    active: Callable[[Any, Any], bool]  # (model, plan or search): whether it applies
    holds: Callable[..., Any]  # (row, plan or search[, model]) -> bool or bool array
    message: Callable[..., str]  # (row, plan or search[, model]) -> why it breaks
    # `holds` and `message` take the model too (a rule on its heads): `active` binds it
    with_model: bool = False

    def bound(self, model) -> Rule:
        """The rule with `model` bound into a `with_model` rule's predicate and message."""
        if not self.with_model:
            return self
        return dataclasses.replace(
            self, with_model=False, holds=lambda r, x, f=self.holds: f(r, x, model),
            message=lambda r, x, f=self.message: f(r, x, model))


def _ep_overlap_why(r, x) -> str:
    return (f"overlapping the all-to-alls needs ep > 1 (got {r.ep}), 2 or more micro-batches "
            f"(got {r.acc}), no full recompute and, with a pipeline, virtual stages "
            "(Megatron-LM)")


RULES: tuple[Rule, ...] = (
    # moe_layer.py refuses MoE with tensor parallelism but no sequence parallelism in training
    Rule("sequence_parallel", frozenset({"t", "sp"}), lambda m, x: m is not None and m.experts > 1,
         lambda r, x: (r.t == 1) | (r.sp != 0),
         lambda r, x: f"Megatron-LM trains MoE layers with tp({r.t}) > 1 only with sequence "
                   "parallelism"),
    # Transformer Engine's tp communication overlap runs on sequence-parallel shards
    Rule("tp_overlap", frozenset({"t", "sp"}), lambda m, x: x.tp_overlap,
         lambda r, x: (r.t == 1) | (r.sp != 0),
         lambda r, x: "tensor-parallel communication overlap needs sequence parallelism "
                   "(Megatron-LM)"),
    # Megatron-LM (TransformerConfig): the all-to-all overlap needs expert parallelism, two
    # micro-batches to overlap, virtual stages with a pipeline, and no full recomputation
    Rule("ep_overlap", frozenset({"ep", "acc", "p", "v"}), lambda m, x: x.ep_overlap,
         lambda r, x: (r.ep > 1) & (r.acc >= 2) & ((r.p == 1) | (r.v > 1)), _ep_overlap_why),
    Rule("ep_overlap", frozenset({"rec"}), lambda m, x: x.ep_overlap,
         lambda r, x: r.rec < FULL,
         lambda r, x: "overlapping the all-to-alls needs no full recompute (Megatron-LM); "
                   "--recompute-layers recomputes whole layers"),
    # Megatron-LM's interleaved 1F1B runs a multiple of pp micro-batches per iteration
    Rule("interleave", frozenset({"v", "acc", "p"}), lambda m, x: True,
         lambda r, x: (r.v == 1) | (r.acc % r.p == 0),
         lambda r, x: f"the interleaved schedule needs the {r.acc} micro-batches per iteration "
                   f"to be a multiple of pp({r.p})"),
    # Transformer Engine's all-to-all context parallelism splits the heads of this rank's
    # tensor-parallel share over c_p: "cp_comm_type='a2a' requires num_heads % cp_size == 0
    # for Q, K, V" (AttnFuncWithCPAndQKVOA2A, context_parallel.py at d0067d0)
    Rule("cp_a2a", frozenset({"t", "cp"}), lambda m, x: m is not None and bool(x.cp_a2a),
         lambda r, x, m: (m.heads % (r.t * r.cp) == 0) & (m.kv_heads % (r.t * r.cp) == 0),
         lambda r, x, m: f"all-to-all context parallelism splits each tensor-parallel rank's "
                         f"heads over cp: {m.heads} query and {m.kv_heads} key-value heads "
                         f"over tp {r.t} x cp {r.cp} do not divide (Transformer Engine); "
                         "lower tp or cp, or plan without --cp-a2a (the ring)",
         with_model=True),
    # (keyed "cp", not "cp_a2a": `hold` bounds where the search turns the switch on with
    # the rules keyed by its name, and this one binds where it is off)
    Rule("cp", frozenset({"cp"}),
         lambda m, x: (m is not None and switches.BY_NAME["cp_a2a"].required_for(m)
                       and not x.cp_a2a and "cp_a2a" not in getattr(x, "searched", ())),
         lambda r, x: r.cp == 1,
         lambda r, x: f"Transformer Engine runs context parallelism with attention sinks by "
                   f"all-to-all only (cp_comm_type a2a); this plan has cp {r.cp}: plan with "
                   "--cp-a2a, or cp 1"),
    # Megatron-LM's recompute modules are a selective granularity (transformer_config.py at
    # d98e8a6: one --recompute-granularity); full recomputation already runs every module again
    *(Rule(name, frozenset({"rec"}), lambda m, x, name=name: bool(getattr(x, name)),
           lambda r, x: r.rec < FULL,
           lambda r, x, name=name: f"--{name.replace('_', '-')} is a selective recomputation "
                                   "(Megatron-LM --recompute-granularity selective); full "
                                   "recomputation already runs every module again: plan with "
                                   "--recompute none or selective")
      for name in switches.RECOMPUTE_MODULES),
    # HSDP's shard groups tile the data-parallel replicas
    Rule("dp_shard", frozenset({"d"}), lambda m, x: bool(x.dp_shard),
         lambda r, x: r.d % x.dp_shard == 0,
         lambda r, x: f"{x.dp_shard} replicas per shard group do not divide dp({r.d})"),
)


def _form(name: str) -> Callable[[Any, Any], bool]:
    return lambda m, x: getattr(x, "framework", None) == name


_DS = "DeepSpeed"
FORM_RULES: tuple[Rule, ...] = (
    # DeepSpeed at the commit planner.launch.deepspeed_config names: no ring attention, MoE
    # experts placed by the model code, a pipeline engine without interleaving that runs ZeRO
    # 0 / 1 only, and AutoTP without a pipeline or sequence parallelism
    Rule("cp", frozenset({"cp"}), _form("deepspeed"), lambda r, x: r.cp == 1,
         lambda r, x: f"{_DS} has no ring-attention context parallelism (its Ulysses sequence "
                   f"parallelism is all-to-all); this plan has cp {r.cp}: use --format "
                   "megatron or torchtitan"),
    Rule("ep", frozenset({"ep"}), _form("deepspeed"), lambda r, x: r.ep == 1,
         lambda r, x: f"this ds_config has no MoE expert-parallel block ({_DS} sets ep in the "
                   f"model code); this plan has ep {r.ep}: use --format megatron or "
                   "torchtitan"),
    Rule("zero", frozenset({"p", "zero"}), _form("deepspeed"),
         lambda r, x: (r.p == 1) | (r.zero <= 1),
         lambda r, x: f"{_DS}'s pipeline engine runs ZeRO stage 0 or 1 only (this plan: pp "
                   f"{r.p}, ZeRO {r.zero})"),
    Rule("interleave", frozenset({"p", "v"}), _form("deepspeed"),
         lambda r, x: (r.p == 1) | (r.v == 1),
         lambda r, x: f"{_DS}'s pipeline engine has no interleaved schedule (this plan: {r.v} "
                   "chunks per stage); use --format megatron or torchtitan"),
    Rule("tp", frozenset({"t", "p"}), _form("deepspeed"), lambda r, x: (r.t == 1) | (r.p == 1),
         lambda r, x: f"{_DS}'s AutoTP (tensor_parallel.autotp_size) does not run under its "
                   f"pipeline engine (this plan: tp {r.t} x pp {r.p}); use --format megatron "
                   "or torchtitan"),
    # activation checkpointing is the model code's call (deepspeed.checkpointing.checkpoint,
    # or Hugging Face's gradient_checkpointing_enable): a ds_config's activation_checkpointing
    # block only configures it (runtime/activation_checkpointing/config.py)
    Rule("recompute", frozenset({"rec"}), _form("deepspeed"), lambda r, x: r.rec == 0,
         lambda r, x: "a ds_config cannot turn on activation recomputation (the model code "
                   "calls deepspeed.checkpointing.checkpoint); this plan recomputes "
                   f"{('', 'selectively', 'every layer', 'some layers of each chunk')[r.rec]}:"
                   " plan with --recompute none, or use --format megatron or torchtitan"),
    Rule("sequence_parallel", frozenset({"t", "sp"}), _form("deepspeed"),
         lambda r, x: (r.t == 1) | (r.sp == 0),
         lambda r, x: f"{_DS}'s AutoTP has no sequence parallelism as the plan prices it; use "
                   "--format megatron or torchtitan"),
    # torchtitan at the commit planner.launch.torchtitan_config names: activation
    # checkpointing per layer (FullAC) or per op, FSDP over dp_shard x cp
    # (torchtitan/distributed/fsdp.py resolve_fsdp_mesh), experts at etp 1 with expert
    # parallelism and at etp = tp without (moe_sharding.py: with ep the routed experts are
    # Shard(0) over ep, borrowing the tp ranks)
    Rule("recompute_layers", frozenset({"rec"}), _form("torchtitan"), lambda r, x: r.rec < 3,
         lambda r, x: "torchtitan checkpoints every layer (FullAC) or per op (SelectiveAC); "
                   "recomputing some layers of each chunk needs --format megatron"),
    Rule("zero", frozenset({"cp", "zero"}), _form("torchtitan"),
         lambda r, x: (r.cp == 1) | (r.zero >= 1),
         lambda r, x: f"torchtitan shards the weights, gradients and optimizer state over the "
                   f"context-parallel ranks (FSDP over dp_shard x cp); this plan has cp "
                   f"{r.cp} with ZeRO 0, priced without that traffic: plan with --zero 1 or "
                   "more, or use --format megatron"),
    Rule("etp", frozenset({"t", "ep", "etp"}), _form("torchtitan"),
         lambda r, x: ((r.ep > 1) & (r.etp == 1)) | ((r.ep == 1) & (r.etp == r.t)),
         lambda r, x: f"torchtitan runs the experts at etp 1 with expert parallelism and at "
                   f"etp = tp without; this plan has etp {r.etp} with tp {r.t}, ep {r.ep}: "
                   "use --format megatron"),
    # deepseek_v3/MTP.md at the same commit: multi-token prediction without pipeline or
    # context parallelism (model-dependent: the form checks a plan itself, with the model)
    Rule("pp", frozenset({"p", "cp"}),
         lambda m, x: _form("torchtitan")(m, x) and m is not None and bool(m.mtp_layers),
         lambda r, x: (r.p == 1) & (r.cp == 1),
         lambda r, x: "torchtitan runs multi-token prediction without pipeline or context "
                   "parallelism only; plan with --pp 1 --cp 1, or use --format megatron"),
    # torchtitan captures no CUDA graphs with pipeline or expert parallelism
    Rule("cuda_graphs", frozenset({"p", "ep"}),
         lambda m, x: _form("torchtitan")(m, x) and bool(getattr(x, "cuda_graphs", False)),
         lambda r, x: (r.p == 1) & (r.ep == 1),
         lambda r, x: "torchtitan captures no CUDA graphs with pipeline or expert "
                   "parallelism; plan without --cuda-graphs, or use --format megatron"),
    # Megatron-LM at the commit planner.launch.megatron_lm names: the fp8 output projection
    # (TELMHeadColumnParallelLinear) needs its own weight, which a tied head on the
    # embedding's stage shares (skip_weight_param_allocation refused)
    Rule("fp8_output_proj", frozenset({"p"}),
         lambda m, x: (_form("megatron")(m, x) and bool(getattr(x, "fp8_output_proj", False))
                       and m is not None and m.tied_embeddings),
         lambda r, x: r.p > 1,
         lambda r, x: "Megatron-LM runs the fp8 output projection only with its own weight "
                   "(untied embeddings, or the head on another stage than the embedding); "
                   "plan without --fp8-output-proj or with pp > 1"),
    # parallel_dims.py: the expert-parallel ranks come from dp_shard x cp x tp (cp x tp at
    # ZeRO 0); an HSDP plan's shard group, which no row field holds, the form checks itself
    Rule("ep", frozenset({"t", "cp", "d", "ep", "zero"}), _form("torchtitan"),
         lambda r, x: (r.t * r.cp * ((r.zero == 0) + (r.zero != 0) * r.d)) % r.ep == 0,
         lambda r, x: f"torchtitan takes the expert-parallel ranks from dp_shard x cp x tp, "
                   f"which ep {r.ep} does not divide; use --format megatron"),
)


def active(model, x, reads: frozenset[str] | None = None) -> list[Rule]:
    """The rules that apply to `x` (a Plan or a Search) for `model`, a framework's form rules
    among them (`FORM_RULES`), those reading only the fields in `reads` when given."""
    return [r.bound(model) for r in (*RULES, *FORM_RULES)
            if r.active(model, x) and (reads is None or r.reads <= reads)]


# the launcher forms that write each kind of plan across several pools (a pipeline of unequal
# stages on different node kinds: Megatron-LM's --pipeline-model-parallel-layout, torchtitan's
# pipeline and a heterogeneous Slurm job; replicas with different micro-batches per step:
# none, every framework gives each replica the same), and so what `--framework` may pick
# (`planner.search.pools` reads the two kinds from its keys)
MIXED_FORMS: dict[str, tuple[str, ...]] = {
    "pipeline across pools": ("megatron", "torchtitan", "slurm"),
    "replicas across pools": ()}

# what a framework's search pins where the request leaves it unset: DeepSpeed's AutoTP runs
# tensor parallelism without sequence parallelism (the search's default is with it)
FORM_PINS: dict[str, dict[str, Any]] = {"deepspeed": {"sequence_parallel": False}}


def check_form(form: str, plan, skip: tuple[str, ...] = (), model=None) -> None:
    """Refuse a plan (a `Plan`, or its JSON config) the launcher form `form` cannot write:
    the first of its `FORM_RULES` (less those keyed in `skip`, which the form decides with
    more than a row holds) the plan breaks, as `format: <why>`; with `model` (and the plan
    as its JSON config, whose switches the rules read), the model's rules too."""
    row = row_of(plan) if not isinstance(plan, dict) else _row_of_config(plan)
    x = SimpleNamespace(**(plan if model is not None else {}), framework=form)
    for rule in FORM_RULES:
        if rule.key not in skip and rule.active(model, x) and not rule.holds(row, x):
            raise SpecError(f"format: {rule.message(row, x)}")


def _row_of_config(c: dict) -> SimpleNamespace:
    """A plan's JSON config as a row of scalars."""
    rec = 3 if c.get("recompute_layers") else ("none", "selective", "full").index(c["recompute"])
    return SimpleNamespace(t=c["tp"], p=c["pp"], v=c.get("interleave", 1), d=c["dp"],
                           mb=c["micro_batch"], acc=c["gradient_accumulation"],
                           cp=c.get("cp", 1), ep=c.get("ep", 1), etp=c.get("etp", c["tp"]),
                           rec=rec, sp=int(bool(c.get("sequence_parallel"))), zero=c["zero"])


def row_of(plan) -> SimpleNamespace:
    """A plan as a row of scalars."""
    rec = 3 if plan.recompute_layers else plan.recompute.code
    return SimpleNamespace(t=plan.tp, p=plan.pp, v=plan.interleave, d=plan.dp,
                           mb=plan.micro_batch, acc=plan.accumulation, cp=plan.cp, ep=plan.ep,
                           etp=plan.etp, rec=rec, sp=int(plan.sequence_parallel),
                           zero=plan.zero)


def check(model, plan) -> None:
    """Refuse a plan that breaks a rule (the first, with its message); `model` None: the
    rules that need no model."""
    row = row_of(plan)
    for rule in active(model, plan):
        if not rule.holds(row, plan):
            raise SpecError(f"{rule.key}: {rule.message(row, plan)}")


def mask(model, x, row: SimpleNamespace, reads: frozenset[str]):
    """Where the rows of arrays `row` keep every rule reading only `reads` (True: none)."""
    ok = True
    for rule in active(model, x, reads):
        ok = ok & rule.holds(row, x)
    return ok


def mask_across(model, x, row: SimpleNamespace):
    """Where the rows of arrays `row` keep the rules reading both the split and the choices
    beyond sequence parallelism (recompute, ZeRO: the structures' mask cannot apply them, the
    choices' cannot either), True where none applies (a framework's form rules only, today)."""
    ok = True
    for rule in active(model, x):
        if rule.reads & SPLIT and rule.reads & {"rec", "zero"}:
            ok = ok & rule.holds(row, x)
    return ok


def hold(key: str, row: SimpleNamespace, x, model=None):
    """Where the rows of arrays `row` keep every rule keyed `key` (for `model`), whether or
    not `x` sets it (the search tries a switch it left unset on and off: its rules bound
    where it is on)."""
    ok = True
    for rule in RULES:
        if rule.key == key and (model is not None or not rule.with_model):
            ok = ok & rule.bound(model).holds(row, x)
    return ok


# a row field -> the search request's field that pins it (acc has none: it follows the batch)
_PINNED = {"t": "tp", "p": "pp", "v": "interleave", "d": "dp", "mb": "micro_batch", "cp": "cp",
           "ep": "ep", "etp": "etp", "sp": "sequence_parallel", "zero": "zero"}


def refuse_pins(model, q) -> None:
    """Refuse a search request whose pins alone break a rule (every field it reads pinned):
    no plan the search could choose keeps it, so the answer is the rule's one line, not an
    empty search."""
    pinned = {f: getattr(q, k) for f, k in _PINNED.items() if getattr(q, k) is not None}
    if q.recompute is not None:
        pinned["rec"] = 3 if q.recompute_layers else ("none", "selective", "full").index(
            q.recompute)
    if "sp" in pinned:
        pinned["sp"] = int(pinned["sp"])
    row = SimpleNamespace(**pinned)
    for rule in active(model, q, frozenset(pinned)):
        if not rule.holds(row, q):
            raise SpecError(f"{'format' if rule in FORM_RULES else rule.key}: "
                            f"{rule.message(row, q)}")


def refuse(x, row: SimpleNamespace, reads: frozenset[str]) -> None:
    """Refuse pins whose every row breaks a rule reading only `reads` (its message)."""
    for rule in active(None, x, reads):
        if not rule.holds(row, x):
            raise SpecError(f"{rule.key}: {rule.message(row, x)}")
