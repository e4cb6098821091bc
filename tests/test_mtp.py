"""Multi-token prediction depths (DeepSeek-V3 sec. 2.2; Megatron-LM --mtp-num-layers): what a
depth adds to the time and the memory, against the same model written with one more layer;
the launchers' forms."""

import dataclasses

import pytest
import sympy as sp

from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.errors import SpecError
from planner.expr.layer import Choices, LayerCosts
from planner.expr.transformer import TransformerExpressions
from planner.expr.vocab import b, c_p, e_p, e_t, t
from planner.spec.hardware import Precision
from planner.spec.transformer import build_transformer

SPEC = {"kind": "transformer", "name": "toy", "layers": 4, "hidden": 1024, "heads": 8,
        "seq_len": 2048, "vocab": 32000, "ffn_kind": "swiglu", "ffn_hidden": 2816,
        "norm": "rmsnorm", "position_embedding": "rotary", "tied_embeddings": False}
HW = Hardware.of(load_system("dgx-h100"), Precision.bf16)
CFG = {"t": 1, "p": 1, "d": 1, "mb": 1, "acc": 1, "v": 1, "recompute": 0, "sp": 0,
       "zero": 0, "gpipe": 0, "overlap": True, "flash_attention": True}


def _toy(**keys):
    return build_transformer({**SPEC, **keys}, "test")


def test_a_depth_costs_a_layer_the_head_again_and_its_projection():
    """At p = 1 a depth adds exactly one layer's compute (the model with one more layer), the
    LM head's three GEMMs once more and its 2h -> h projection's three."""
    base, more, mtp = _toy(), _toy(layers=5), _toy(mtp_layers=1)
    compute = {name: float(iteration(m, HW, CFG)["compute"])
               for name, m in (("base", base), ("more", more), ("mtp", mtp))}
    at = {t: 1, b: 1, c_p: 1, e_p: 1, e_t: 1}
    head = float(TransformerExpressions(base, HW, Choices(flash_attention=True))
                 .terms["logit_time"].subs(at))
    lc = LayerCosts(base, HW, Choices(flash_attention=True))
    proj = float(sp.sympify(3 * lc._matmul(2048 * b, 2048, 1024 / t)).subs(at))
    assert compute["mtp"] - compute["base"] == pytest.approx(
        compute["more"] - compute["base"] + head + proj, rel=1e-12)


def test_a_depth_sits_on_the_last_stage_with_its_weights_and_an_embedding_copy():
    """p = 1: the weights grow by the depth's parameters. p = 2: the last stage holds the
    depth, the output layer and (untied) a copy of the embedding the depth reads, which makes
    it the larger stage; its step is longer than without the depth."""
    base, mtp = _toy(), _toy(mtp_layers=1)
    one = {m.mtp_layers: iteration(m, HW, CFG) for m in (base, mtp)}
    assert float(one[1]["weights"] - one[0]["weights"]) == pytest.approx(
        2 * mtp.mtp_params(), rel=1e-12)
    two = {m.mtp_layers: iteration(m, HW, {**CFG, "p": 2, "acc": 4}) for m in (base, mtp)}
    last = (2 * base.layer_params() + base.head_params() + mtp.mtp_params()
            + base.vocab * base.hidden)
    assert float(two[1]["weights"]) == pytest.approx(2 * last, rel=1e-12)
    # five layers over two stages: three and the embedding on the first, two, the head, the
    # depth and the embedding copy on the last, which holds more
    five = _toy(layers=5, mtp_layers=1)
    first = 3 * five.layer_params() + five.embedding_params()
    last = (2 * five.layer_params() + five.head_params() + five.mtp_params()
            + five.vocab * five.hidden)
    assert last > first
    got = float(iteration(five, HW, {**CFG, "p": 2, "acc": 4})["weights"])
    assert got == pytest.approx(2 * last, rel=1e-12)


def test_a_depth_is_the_last_layers_kind():
    """DeepSeek-V3's depth is a MoE block: its compute is more than a dense layer's."""
    m = load_model("deepseek-v3")
    assert m.mtp_kinds()[-1].ffn == "moe" and m.mtp_layers == 1
    dense = dataclasses.replace(m, mtp_layers=0)
    assert m.forward_flops() - dense.forward_flops() == m.mtp_depth_flops()


@pytest.mark.parametrize("keys, message", [
    ({"mtp_layers": 1, "position_embedding": "learned"}, "rotary or no position"),
    ({"mtp_layers": -1}, "mtp_layers"),
])
def test_bad_mtp_keys_are_spec_errors(keys, message):
    with pytest.raises(SpecError, match=message):
        _toy(**keys)
