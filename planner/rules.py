"""The plan rules that tie a transformer plan's split to its choices and switches, each
written once as a predicate over a row of scalars or numpy arrays: `check` refuses a `Plan`
that breaks one (with the rule's message), and the search masks its candidate rows with the
same predicate (`planner.search.hybrid_space`: a rule reading only the split masks the
structures, one reading only the per-row choices filters those).

A row's fields: t, p, v (virtual stages), d, mb, acc (micro-batches per replica), cp, ep, etp;
rec (0 none, 1 selective, 2 full, 3 full on the first layers of each chunk), sp, zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from planner.errors import SpecError

SPLIT = frozenset({"t", "p", "v", "d", "mb", "acc", "cp", "ep", "etp"})
CHOICE = frozenset({"rec", "sp", "zero"})
FULL = 2  # recompute codes from here up recompute whole layers (full, partial)


@dataclass(frozen=True)
class Rule:
    key: str  # the field its error names
    reads: frozenset[str]  # the row fields the predicate reads
    active: Callable[[Any, Any], bool]  # (model, plan or search): whether it applies
    holds: Callable[[Any, Any], Any]  # (row, plan or search) -> bool or bool array
    message: Callable[[Any, Any], str]  # (row, plan or search) -> why it breaks


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
    # HSDP's shard groups tile the data-parallel replicas
    Rule("dp_shard", frozenset({"d"}), lambda m, x: bool(x.dp_shard),
         lambda r, x: r.d % x.dp_shard == 0,
         lambda r, x: f"{x.dp_shard} replicas per shard group do not divide dp({r.d})"),
)


def active(model, x, reads: frozenset[str] | None = None) -> list[Rule]:
    """The rules that apply to `x` (a Plan or a Search) for `model`, those reading only the
    fields in `reads` when given."""
    return [r for r in RULES if r.active(model, x) and (reads is None or r.reads <= reads)]


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


def hold(key: str, row: SimpleNamespace, x):
    """Where the rows of arrays `row` keep every rule keyed `key`, whether or not `x` sets
    it (the search tries a switch it left unset on and off: its rules bound where it is on)."""
    ok = True
    for rule in RULES:
        if rule.key == key:
            ok = ok & rule.holds(row, x)
    return ok


def refuse(x, row: SimpleNamespace, reads: frozenset[str]) -> None:
    """Refuse pins whose every row breaks a rule reading only `reads` (its message)."""
    for rule in active(None, x, reads):
        if not rule.holds(row, x):
            raise SpecError(f"{rule.key}: {rule.message(row, x)}")
