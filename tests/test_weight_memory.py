"""What low-precision training holds beside its 16-bit weights, and what frozen weights save:
Transformer Engine's cached quantized copies (`weight_cache`), weights held in the recipe's
format (`fp8_weight_gather`, nvfp4 too), LoRA's frozen FFN keeping no GEMM inputs, and the
FFN activation's input held in fp8 (`fp8_activation_input`). Each is checked against a count
by hand, and every MLPerf submission's own plan must fit the memory its device has."""

from fractions import Fraction

import pytest

from planner import api, mlperf
from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware
from planner.search.hybrid import predict
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len
from tests.test_launch import MEGATRON_FLAGS, megatron_flags

# Llama-3-8B, data parallel on one 8-GPU node: every device holds all 32 layers
BASE = dict(devices=8, global_batch=32, micro_batch=1, zero=1, overlap=False)


def _eval(hardware="dgx-h100", **over):
    return api.evaluate("llama3-8b", hardware, **(BASE | over)).prediction


def _layer_weights() -> int:
    m = load_model("llama3-8b")
    return m.layers * m.layer_params()


@pytest.mark.parametrize("fmt, any_layout, copy, held", [
    ("fp8", False, Fraction(2), Fraction(1)),  # Hopper: the data and its transpose
    ("fp8", True, Fraction(1), Fraction(1)),  # Blackwell: one copy serves every GEMM
    ("mxfp8", True, Fraction(33, 16), Fraction(33, 32)),  # rowwise + columnwise, E8M0 / 32
    ("nvfp4", True, Fraction(9, 8), Fraction(9, 16)),  # half a byte + E4M3 / 16, each way
    ("bf16", False, Fraction(0), Fraction(0)),
])
def test_bytes_of_a_quantized_weight(fmt, any_layout, copy, held):
    p = Precision(fmt)
    assert p.weight_copy_bytes(any_layout) == copy and p.held_weight_bytes == held


@pytest.mark.parametrize("hardware, precision, copy", [
    ("dgx-h100", "fp8", 2), ("dgx-b200", "fp8", 1), ("dgx-b200", "mxfp8", 2 + 1 / 16),
    ("dgx-b200", "nvfp4", 1 + 1 / 8)])
def test_the_cache_holds_one_copy_of_every_layer_weight(hardware, precision, copy):
    """Cached, the device holds each layer weight's quantized copy beside its 16-bit one:
    exactly the layers' parameters x the format's copy bytes more than uncached (the
    embedding and output layer stay outside TE's quantized modules)."""
    on = _eval(hardware, precision=precision)
    off = _eval(hardware, precision=precision, weight_cache=False)
    assert (on.memory_breakdown["weights"] - off.memory_breakdown["weights"]
            == pytest.approx(_layer_weights() * copy, rel=1e-12))
    assert on.memory_bytes_per_device - off.memory_bytes_per_device == pytest.approx(
        _layer_weights() * copy, rel=1e-12)


def test_uncached_weights_are_cast_in_every_micro_batch():
    """Off, every micro-batch casts every layer weight (read at 16 bits, written in both
    layouts: 4 bytes a weight on Hopper): 4 micro-batches x 32 layers of the 8B's layer
    weights through HBM, each cast longer than the host's issue time; the evaluation step
    (no backward, `forward`) is untouched."""
    on = _eval(precision="fp8")
    off = _eval(precision="fp8", weight_cache=False)
    hw = Hardware.of(load_system("dgx-h100"), Precision.fp8)
    assert hw.quantize_bytes == 4
    cast = 4 * _layer_weights() * 4 / hw.mem_bw  # m = 32 / 8 replicas, 4 bytes a weight
    assert off.compute_time_s - on.compute_time_s == pytest.approx(cast, rel=1e-9)
    assert off.forward_time_s == pytest.approx(on.forward_time_s, rel=1e-12)


def test_bf16_and_zero3_hold_no_copies():
    """A 16-bit run casts nothing; under ZeRO 3 a weight is whole only while its layer runs
    (TE caches nothing for FSDP), so the cache holds nothing either way."""
    for over in ({"precision": "bf16"}, {"precision": "fp8", "zero": 3}):
        on, off = _eval(**over), _eval(**over, weight_cache=False)
        assert on.memory_bytes_per_device == off.memory_bytes_per_device


def test_weights_held_in_fp8_keep_only_the_other_layout():
    """Held in fp8 (the fp8 gather) on Hopper, a layer weight is its 1-byte data and, cached,
    its 1-byte transpose: the 16-bit weights' 2 bytes and their 2-byte copy become 2 bytes,
    the embedding and output layer still 16-bit; on Blackwell the held data is all."""
    plain, held = _eval(precision="fp8"), _eval(precision="fp8", fp8_weight_gather=True)
    assert (plain.memory_breakdown["weights"] - held.memory_breakdown["weights"]
            == pytest.approx(2 * _layer_weights(), rel=1e-12))
    b200 = _eval("dgx-b200", precision="fp8", fp8_weight_gather=True)
    off = _eval("dgx-b200", precision="fp8", fp8_weight_gather=True, weight_cache=False)
    assert b200.memory_bytes_per_device == off.memory_bytes_per_device


def test_nvfp4_weights_are_held_at_nine_sixteenths_of_a_byte(run):
    """Held in nvfp4 (--fp4-param-gather): half a byte and an E4M3 scale per 16 values, the
    columnwise copy beside it when cached; Megatron-LM is told --fp4-param-gather."""
    plain = _eval("dgx-b200", precision="nvfp4", weight_cache=False)
    held = _eval("dgx-b200", precision="nvfp4", weight_cache=False, fp8_weight_gather=True)
    assert (plain.memory_breakdown["weights"] - held.memory_breakdown["weights"]
            == pytest.approx(_layer_weights() * (2 - Fraction(9, 16)), rel=1e-12))
    cached = _eval("dgx-b200", precision="nvfp4", fp8_weight_gather=True)
    assert (cached.memory_breakdown["weights"] - held.memory_breakdown["weights"]
            == pytest.approx(_layer_weights() * Fraction(9, 16), rel=1e-12))
    code, out, err = run("evaluate", "-m", "llama3-8b", "-H", "dgx-b200", "--devices", "8",
                         "--global-batch", "32", "--precision", "nvfp4", "--zero", "1",
                         "--fp8-weight-gather", "--format", "megatron")
    assert code == 0, err
    flags = set(megatron_flags(out))
    assert "--fp4-param-gather" in flags and "--fp8-param-gather" not in flags
    assert flags <= MEGATRON_FLAGS


def test_lora_keeps_no_inputs_of_its_frozen_ffn():
    """With frozen base weights the FFN's GEMMs keep no inputs for weight gradients: per layer
    the FFN norm's output (h values) and fc2's input (ffn values), 2 bytes each, per token of
    the micro-batch (Llama-3-8B: h 4,096, ffn 14,336, 32 layers, sequence 8,192)."""
    m = load_model("llama3-8b")
    full = _eval(precision="bf16")
    lora = _eval(precision="bf16", lora_rank=16)
    saved = m.layers * m.seq_len * 2 * (m.hidden + m.ffn_hidden)
    assert (full.memory_breakdown["activations"] - lora.memory_breakdown["activations"]
            == pytest.approx(saved, rel=1e-12))


def test_the_activation_input_in_fp8_halves_fc1s_output():
    """SwiGLU's input, fc1's 2 x ffn values a token, held at 1 byte instead of 2; with LoRA
    and fp8 saved GEMM inputs beside it, the frozen projections save nothing more."""
    m = load_model("llama3-8b")
    plain = _eval(precision="fp8")
    fp8 = _eval(precision="fp8", fp8_activation_input=True)
    saved = m.layers * m.seq_len * 2 * m.ffn_hidden
    assert (plain.memory_breakdown["activations"] - fp8.memory_breakdown["activations"]
            == pytest.approx(saved, rel=1e-12))
    lora = _eval(precision="fp8", lora_rank=16)
    both = _eval(precision="fp8", lora_rank=16, fp8_activations=True)
    assert both.memory_breakdown["activations"] == lora.memory_breakdown["activations"]


def test_mtp_depths_hold_copies_but_not_their_embedding():
    """DeepSeek-V3's multi-token prediction depth sits on the last stage (here the one that
    holds the most) beside the output layer and an embedding copy, neither of which TE
    quantizes: the cached copies, 2 bytes a weight on Hopper, are that stage's weights less
    the output layer (with its final norm) and the embedding copy, each split over tp 2."""
    m = load_model("deepseek-v3")
    args = dict(devices=256, tp=2, pp=16, ep=8, etp=1, global_batch=256, micro_batch=1,
                zero=1, precision="fp8", sequence_parallel=True, recompute="full",
                seq_len=4096)
    on = api.evaluate("deepseek-v3", "dgx-h100", **args).prediction
    off = api.evaluate("deepseek-v3", "dgx-h100", weight_cache=False, **args).prediction
    diff = on.memory_breakdown["weights"] - off.memory_breakdown["weights"]
    stage = off.memory_breakdown["weights"] / 2  # its weights, 16-bit, whole at ZeRO 1
    assert not m.tied_embeddings and m.mtp_layers == 1
    outside = (m.head_params() + m.vocab * m.hidden) / 2
    assert m.head_params() == m.vocab * m.hidden + m.hidden
    assert diff == pytest.approx(2 * (stage - outside), rel=1e-9)
    assert on.memory_bytes_per_device - off.memory_bytes_per_device == pytest.approx(diff)


def test_the_fp8_output_projection_caches_the_heads_copy_too():
    """With --fp8-output-proj the LM head is a Transformer Engine linear, so its MXFP8
    copies (rowwise and columnwise, 33/16 bytes a weight) are cached beside the layers':
    Llama-3-8B (untied) at pp 1 holds vocab x h more quantized weights."""
    m = load_model("llama3-8b")
    on = _eval("dgx-b200", precision="mxfp8", fp8_output_proj=True)
    off = _eval("dgx-b200", precision="mxfp8")
    assert not m.tied_embeddings
    assert (on.memory_breakdown["weights"] - off.memory_breakdown["weights"]
            == pytest.approx(m.vocab * m.hidden * 33 / 16, rel=1e-12))


def test_every_mlperf_submission_fits_its_device():
    """Each submission ran: its own plan, priced as its recipe sets it, fits the device's
    memory (66 of the first 169 did not before the weight copies, the LoRA recipes' fp8 base
    weights, frozen FFN inputs, fp8 activation input and recomputation were priced; v6.0's
    MoE rows included)."""
    over = []
    for run in mlperf.read():
        if run.why_not:
            continue
        m = mlperf.benchmark_model(run)
        seq = run.row["seq_len"] or mlperf.LORA.get(run.row["benchmark"], (0, None))[1]
        if seq:
            m = with_seq_len(m, int(seq))
        r = predict(m, load_system(run.system), run.precision, mlperf.plan_of(run))
        if not r.fits_memory:
            over.append((run.row["submitter"], run.row["system"], run.row["benchmark"]))
    assert not over


def test_an_offloaded_fp8_activation_input_is_saved_once():
    """Mixtral's routed experts' fc1 output is both what activation offload moves to the host
    and what `fp8_activation_input` holds at 1 byte: halved, it is moved at 1 byte too, so
    what stays on the device (saved less moved) does not change and the move shrinks by the
    halved part (2 x ffn x top_k values a token, 1 byte less each)."""
    from planner.expr.layer import LayerCosts
    from planner.expr.transformer import Choices
    from planner.expr.vocab import b, c_p, e_p, e_t, t

    m = load_model("mixtral-8x7b")
    hw = Hardware.of(load_system("gb200-nvl72"), Precision.fp8)
    at = {t: 2, b: 1, c_p: 1, e_p: 8, e_t: 1}
    parts = {}
    for on in (False, True):
        costs = LayerCosts(m, hw, Choices(flash_attention=True, offload_activations=True,
                                          sequence_parallel=True, fp8_activation_input=on))
        parts[on] = (float(costs.activation_bytes_per_layer("none").subs(at)),
                     float(costs.offloaded_bytes_per_layer("none").subs(at)))
    (saved0, moved0), (saved1, moved1) = parts[False], parts[True]
    assert saved1 - moved1 == pytest.approx(saved0 - moved0, rel=1e-12)
    assert m.shared_experts == 0 and m.gated_ffn
    assert moved0 - moved1 == pytest.approx(
        m.seq_len * 2 * m.ffn_hidden * m.top_k / 2, rel=1e-12)  # over tp 2, capacity 1
