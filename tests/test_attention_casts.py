"""The casts around fp8 dot-product attention (`LayerCosts._attention_casts`): Transformer
Engine quantizes Q, K, V before the kernel and dO before its backward, and under delayed
scaling dequantizes the kernel's fp8 outputs. Each recipe's extra HBM traffic, exactly, as the
difference fp8 attention makes to the layer's elementwise time (memory-bound, far above the
kernel floors at this size)."""

import pytest

from planner.catalog import load_system
from planner.cost.transformer import Hardware
from planner.expr.layer import Choices, LayerCosts
from planner.expr.vocab import b, c_p, e_p, e_t, t
from planner.spec.hardware import Precision
from planner.spec.transformer import build_transformer

BATCH, SEQ = 32, 4096  # micro-batch 32: each cast above the 56 us issue floor on any device
AT = {t: 1, b: BATCH, c_p: 1, e_p: 1, e_t: 1}


def _model():
    """Grouped-query attention (32 heads of 128, 8 key-value heads), so Q, K, V and O have
    different widths: q 4,096, k and v 1,024 each, o 4,096 values a token."""
    return build_transformer({"kind": "transformer", "name": "gqa", "layers": 1,
                              "hidden": 4096, "heads": 32, "kv_heads": 8, "seq_len": SEQ,
                              "vocab": 128, "causal": True}, "test")


def _extra(system: str, precision: Precision, **choices) -> tuple[float, float, Hardware]:
    """(forward, backward) elementwise seconds fp8 attention adds, and the hardware."""
    hw = Hardware.of(load_system(system), precision)
    base = dict(flash_attention=True, **choices)
    on = LayerCosts(_model(), hw, Choices(fp8_attention=True, **base)).parts()
    off = LayerCosts(_model(), hw, Choices(**base)).parts()
    return (float((on.elem - off.elem).subs(AT)), float((on.elem_bwd - off.elem_bwd).subs(AT)),
            hw)


TOKENS = BATCH * SEQ
QKV, OUT = TOKENS * (4096 + 1024 + 1024), TOKENS * 4096


def test_delayed_scaling_concatenates_casts_and_dequantizes_the_outputs():
    """Per-tensor fp8, delayed scaling (TE's default): forward Q, K, V concatenated (read and
    write 2 bytes) and cast (read 2, write 1), the fp8 O dequantized (read 1, write 2);
    backward dO cast (read 2, write 1) and the fp8 dQ, dK, dV dequantized (read 1, write 2)."""
    fwd, bwd, hw = _extra("dgx-h100", Precision.fp8)
    assert fwd == pytest.approx((QKV * 7 + OUT * 3) / hw.mem_bw, rel=1e-12)
    assert bwd == pytest.approx((OUT * 3 + QKV * 3) / hw.mem_bw, rel=1e-12)


def test_current_scaling_reads_for_the_amax_and_keeps_the_outputs_in_16_bits():
    """Per-tensor fp8, current scaling: an amax read before each cast (concatenate 4, amax 2,
    cast 3 bytes a Q, K, V value; amax 2, cast 3 a dO value); the kernel writes O and dQ, dK,
    dV in bf16 (NVTE_DPA_FP8CS_O_in_F16=1), nothing to dequantize."""
    fwd, bwd, hw = _extra("dgx-h100", Precision.fp8, fp8_current_scaling=True)
    assert fwd == pytest.approx(QKV * 9 / hw.mem_bw, rel=1e-12)
    assert bwd == pytest.approx(OUT * 5 / hw.mem_bw, rel=1e-12)


def test_mxfp8_quantizes_q_k_v_and_do_in_both_layouts_with_their_block_scales():
    """MXFP8: each of Q, K, V (forward) and dO (backward) read at 2 bytes and written rowwise
    and columnwise with one E8M0 scale per 32 values: 2 + 2 x 33 / 32 bytes a value."""
    fwd, bwd, hw = _extra("gb300-nvl72", Precision.mxfp8)
    per_value = 2 + 2 * 33 / 32
    assert float(hw.quantize_bytes) == pytest.approx(per_value)
    assert fwd == pytest.approx(QKV * per_value / hw.mem_bw, rel=1e-12)
    assert bwd == pytest.approx(OUT * per_value / hw.mem_bw, rel=1e-12)


@pytest.mark.parametrize("precision", [Precision.bf16, Precision.fp16])
def test_a_sixteen_bit_recipe_has_nothing_to_cast(precision):
    """fp8 attention is a switch of the fp8 / fp4 recipes: in 16 bits it adds nothing."""
    fwd, bwd, _ = _extra("dgx-h100", precision)
    assert fwd == 0 and bwd == 0
