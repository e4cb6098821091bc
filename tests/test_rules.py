"""The plan rules (planner.rules) are written once and read twice: a Plan that breaks one is
refused with its message, and the search masks its rows with the same predicate. So every
row the search offers builds a valid plan, and every row a switch's rules take out of the
search is a plan that switch refuses."""

from __future__ import annotations

import pytest

from planner import rules
from planner.catalog import load_model
from planner.cost.transformer import PARTIAL, RECOMPUTE
from planner.errors import SpecError
from planner.plan import Plan, check_for_model
from planner.search.hybrid_space import Search, choices, structures

G = 8


def _plan(m, row, choice, B, **switches):
    t, p, v, d, mb, cp, ep, etp = (int(x) for x in row)
    rec, sp, zero, gpipe, *_searched = choice  # the searched switches: those passed say them
    plan = Plan.split(t, p, d, mb, B, node_size=G, interleave=v, cp=cp, ep=ep, etp=etp,
                      recompute="full" if rec == PARTIAL else RECOMPUTE[rec],
                      recompute_layers=1 if rec == PARTIAL else None,
                      sequence_parallel=bool(sp and t > 1), zero=zero,
                      schedule="gpipe" if gpipe else "1f1b", **switches)
    check_for_model(m, plan)
    return plan


@pytest.mark.parametrize("model, B, switches, key", [
    ("mixtral-8x7b", 32, {"ep_overlap": True}, "ep_overlap"),
    ("llama3-8b", 32, {"tp_overlap": True, "sequence_parallel": False}, "tp_overlap"),
    ("mixtral-8x7b", 32, {"sequence_parallel": False}, "sequence_parallel"),
    ("llama3-8b", 24, {"dp_shard": 4, "zero": 1}, "dp_shard"),
])
def test_the_search_offers_exactly_the_rows_the_rules_allow(model, B, switches, key):
    m = load_model(model)
    base = {"global_batch": B, "devices_max": 16, "cp": 1}
    plan_switches = {k: v for k, v in switches.items() if k not in ("sequence_parallel", "zero")}
    on = Search(**base, **switches)
    off = Search(**base, **{k: v for k, v in switches.items() if k in ("zero",)})
    kept = {tuple(r) for r in structures(m, G, on, B)}
    every = {tuple(r) for r in structures(m, G, off, B)}
    assert kept and kept < every
    choice = choices(on)[0]
    for row in kept:  # every row offered builds a plan the rules accept
        _plan(m, row, choice, B, **plan_switches)
    for row in every - kept:  # every row taken out breaks the switch's rule
        with pytest.raises(SpecError, match=f"^{key}: "):
            _plan(m, row, choice, B, **plan_switches)


def test_a_pinned_choice_the_rules_forbid_is_refused_with_the_rule():
    with pytest.raises(SpecError, match="^ep_overlap: overlapping the all-to-alls needs no "
                                        "full recompute"):
        choices(Search(global_batch=8, ep_overlap=True, recompute="full"))
    assert {c[0] for c in choices(Search(global_batch=8, ep_overlap=True))} == {0, 1}


def test_each_rule_reads_only_the_fields_it_names():
    fields = rules.SPLIT | rules.CHOICE
    for rule in rules.RULES:
        assert rule.reads <= fields, rule.key
