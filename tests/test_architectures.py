"""Today's architecture keys of the transformer spec, each itemised by hand on a small model
and cross-checked against the per-kind sums: head_dim apart from hidden / heads, QK-norm,
multi-head latent attention, shared experts and leading dense layers, router and expert biases,
sliding windows with sinks, hybrid Mamba-2 layer patterns and the SSD scan count."""

from __future__ import annotations

import dataclasses

import pytest

from planner.catalog import load_model, load_system
from planner.errors import SpecError
from planner.spec.transformer import LayerKind, build_transformer, with_seq_len

BASE = {"kind": "transformer", "name": "toy", "layers": 4, "hidden": 64, "heads": 4,
        "seq_len": 32, "vocab": 100, "ffn_hidden": 96, "ffn_kind": "swiglu",
        "tied_embeddings": False, "bias": False, "norm": "rmsnorm",
        "position_embedding": "rotary"}


def toy(**keys):
    return build_transformer({**BASE, **keys}, "toy")


def test_plain_model_is_one_kind_and_means_are_exact():
    m = toy()
    assert m.layer_kinds() == ((LayerKind("attention", "dense"), 4),)
    assert m.layer_params() * 4 == m.layers_params()
    attn = 4 * 64 * 64
    ffn = 3 * 64 * 96
    assert m.layer_params() == attn + ffn + 2 * 64
    assert m.params() == 4 * (attn + ffn + 128) + 2 * 100 * 64 + 64
    s = 32
    assert m.layer_matmul_flops() == 2 * s * (attn + ffn) + 4 * s * s * 64
    assert m.forward_flops() == 4 * m.layer_matmul_flops() + 2 * s * 64 * 100


def test_head_dim_apart_from_hidden():
    """Qwen3 / GPT-OSS: q is heads x head_dim wide, the output projection q_dim x hidden."""
    m = toy(heads=4, kv_heads=2, head_dim=32)
    assert (m.head_dim, m.q_dim, m.kv_dim) == (32, 128, 64)
    assert m.attention_params() == 64 * 128 + 2 * 64 * 64 + 128 * 64
    s = 32
    assert m.attention_core_flops() == 2 * 2 * s * s * 4 * 32
    assert m.layer_matmul_flops() == (2 * s * (64 * 128 + 2 * 64 * 64 + 128 * 64 + 3 * 64 * 96)
                                      + 4 * s * s * 128)


def test_qk_norm_and_biases():
    base = toy(head_dim=32).attention_params()
    assert toy(head_dim=32, qk_norm=True).attention_params() == base + 2 * 32
    # Qwen2: q, k, v biases only
    assert toy(qkv_bias=True).attention_params() == toy().attention_params() + 64 + 2 * 64
    assert toy(out_bias=True).attention_params() == toy().attention_params() + 64
    assert toy(mlp_bias=True).expert_params() == 3 * 64 * 96 + 2 * 96 + 64


def test_mla_matrices():
    """DeepSeek-V3 shapes on a small model: q_a, q_a_norm, q_b, kv_a (with the rope key),
    kv_a_norm, kv_b, o."""
    mla = {"q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 12,
           "qk_rope_head_dim": 4, "v_head_dim": 10}
    m = toy(mla=mla)
    weights = (64 * 16 + 16 * 4 * 16 + 64 * (8 + 4) + 8 * 4 * (12 + 10) + 4 * 10 * 64)
    assert m.attention_weights() == weights
    assert m.attention_params() == weights + 16 + 8
    assert (m.head_dim, m.v_head_dim) == (16, 10)
    s = 32
    assert m.attention_core_flops() == 2 * s * s * 4 * 16 + 2 * s * s * 4 * 10
    no_q = toy(mla={**mla, "q_lora_rank": None})
    assert no_q.attention_weights() == 64 * 4 * 16 + 64 * 12 + 8 * 4 * 22 + 4 * 10 * 64
    with pytest.raises(SpecError, match="head_dim"):
        toy(mla=mla, head_dim=8)


def test_shared_experts_dense_layers_and_router_bias():
    m = toy(first_dense_layers=1, ffn_hidden=200,
            moe={"experts": 8, "top_k": 2, "expert_ffn_hidden": 32, "shared_experts": 2,
                 "shared_expert_ffn_hidden": 48, "router_bias": True})
    assert [(k.name, n) for k, n in m.layer_kinds()] == [("attention+dense", 1),
                                                         ("attention+moe", 3)]
    attn, norms = 4 * 64 * 64, 2 * 64
    dense = 3 * 64 * 200
    moe = 8 * 3 * 64 * 32 + 2 * 3 * 64 * 48 + 8 * 65
    assert m.params() == attn * 4 + norms * 4 + dense + 3 * moe + 2 * 100 * 64 + 64
    active_moe = 2 * 3 * 64 * 32 + 2 * 3 * 64 * 48 + 8 * 65
    assert m.active_params() == 4 * (attn + norms) + dense + 3 * active_moe
    s = 32
    core = 4 * s * s * 64
    assert m.layers_matmul_flops() == (
        4 * (2 * s * attn + core) + 2 * s * 3 * 64 * 200
        + 3 * (2 * s * 3 * 64 * (2 * 32 + 2 * 48) + 2 * s * 64 * 8))
    # GPT-OSS experts: biases on every expert matrix
    oss = toy(mlp_bias=True, moe={"experts": 4, "top_k": 1, "router_bias": True})
    assert oss.moe_params() == 4 * (3 * 64 * 96 + 2 * 96 + 64) + 4 * 65


def test_sliding_window_pattern_and_sinks():
    m = toy(seq_len=64, sliding_window=16, sliding_window_pattern="SF", attention_sinks=True)
    assert [k.mixer for k in m.layer_sequence()] == ["sliding", "attention"] * 2
    s = 64
    assert m.kind_attention_core_flops(LayerKind("sliding", "dense")) == 4 * s * 16 * 64
    assert m.kind_attention_core_flops(LayerKind("attention", "dense")) == 4 * s * s * 64
    assert m.attention_core_flops() * 4 == 2 * 4 * s * 16 * 64 + 2 * 4 * s * s * 64
    assert m.attention_params() == 4 * 64 * 64 + 4  # one sink per head
    # a window wider than the sequence is full attention
    short = with_seq_len(m, 8)
    assert short.kind_attention_core_flops(LayerKind("sliding", "dense")) == 4 * 8 * 8 * 64
    gemma3 = toy(layers=12, sliding_window=16, sliding_window_pattern="SSSSSF")
    assert [(k.mixer, n) for k, n in gemma3.layer_kinds()] == [("sliding", 10), ("attention", 2)]
    with pytest.raises(SpecError, match="sliding_window"):
        toy(sliding_window_pattern="SF")
    with pytest.raises(SpecError, match="S .sliding"):
        toy(sliding_window=8, sliding_window_pattern="SX")


def test_post_norms():
    assert toy(post_norms=True).layer_params() == toy().layer_params() + 2 * 64


MAMBA = {"state_size": 16, "heads": 8, "head_dim": 16, "n_groups": 2, "conv_kernel": 4,
         "chunk_size": 8}


def test_hybrid_mamba_layers_itemised():
    """Nemotron-H's layer pattern on a small model: M = Mamba-2, * = attention, - = MLP."""
    m = toy(layers=5, layer_pattern="M-*M-", ffn_kind="relu2", mamba=MAMBA)
    assert [(k.name, n) for k, n in m.layer_kinds()] == [("mamba", 2), ("dense", 2),
                                                         ("attention", 1)]
    d_in, conv = 8 * 16, 8 * 16 + 2 * 2 * 16
    in_proj = 64 * (2 * d_in + 2 * 2 * 16 + 8)
    mamba = in_proj + conv * 4 + conv + 3 * 8 + d_in + d_in * 64
    assert m.mamba_params() == mamba
    norm = 64
    assert m.params() == (2 * (mamba + norm) + 2 * (2 * 64 * 96 + norm) + (4 * 64 * 64 + norm)
                          + 2 * 100 * 64 + 64)
    # SSD scan: 4 chunks of 8 tokens
    q, n, p, g, h = 8, 16, 16, 2, 8
    scan = 4 * (2 * q * q * n * g + h * (2 * q * q * p + 4 * q * n * p))
    assert m.ssm_scan_flops() == scan
    s = 32
    assert m.kind_matmul_flops(LayerKind("mamba", None)) == 2 * s * (in_proj + d_in * 64) + scan
    assert m.kind_attention_core_flops(LayerKind("mamba", None)) == 0
    assert m.attention_core_flops() == _round(4 * s * s * 64, 5)
    assert m.forward_flops() == sum(m.kind_matmul_flops(k) for k in m.layer_sequence()) + (
        2 * s * 64 * 100)


def _round(total, count):
    return (2 * total + count) // (2 * count)


@pytest.mark.parametrize("keys, message", [
    ({"layer_pattern": "M-*"}, "layer_pattern has 3 layers"),
    ({"layer_pattern": "M-*-"}, "no mamba"),
    ({"layer_pattern": "MX*-", "mamba": MAMBA}, "unknown layer 'X'"),
    ({"layer_pattern": "E-*-"}, "no moe"),
    ({"mamba": MAMBA}, "needs a layer_pattern"),
    ({"first_dense_layers": 1}, "needs moe"),
    ({"first_dense_layers": 4, "moe": {"experts": 2, "top_k": 1}}, "leaves no MoE layer"),
])
def test_bad_architecture_keys_are_spec_errors(keys, message):
    with pytest.raises(SpecError, match=message):
        toy(**keys)


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "nemotron-h-8b",
                                  "qwen3-235b-a22b", "mixtral-8x22b"])
def test_totals_are_the_sum_over_layers(name):
    """Two ways to the same totals: per kind times its count, and layer by layer."""
    m = load_model(name)
    seq = m.layer_sequence()
    assert len(seq) == m.layers
    mtp = (seq[-1],) * m.mtp_layers  # multi-token prediction blocks (DeepSeek-V3: one)
    h = m.hidden
    assert m.params() == (sum(map(m.kind_params, seq + mtp)) + m.embedding_params()
                          + m.head_params() + m.mtp_layers * (2 * h * h + 3 * m.norm_params()))
    assert m.forward_flops() == (sum(map(m.kind_matmul_flops, seq + mtp))
                                 + (1 + m.mtp_layers) * m.logit_flops()
                                 + m.mtp_layers * 4 * m.seq_len * h * h)
    assert m.model_flops(count_masked=True) == 3 * m.forward_flops()
    assert m.model_flops() == 3 * (m.forward_flops()
                                   - sum(map(m.kind_masked_attention_flops, seq + mtp)))
    assert abs(m.layer_params() * m.layers - m.layers_params()) <= m.layers


def test_with_seq_len_keeps_the_architecture():
    m = load_model("gpt-oss-120b")
    longer = with_seq_len(m, 131072)
    assert dataclasses.replace(longer, seq_len=m.seq_len) == m
    assert longer.params() == m.params()
    # sliding layers grow linearly, full ones quadratically
    sliding = LayerKind("sliding", "moe")
    assert longer.kind_attention_core_flops(sliding) == 32 * m.kind_attention_core_flops(sliding)


def test_hybrid_activation_memory_counts_each_kinds_tensors():
    """Nemotron-H 8B (24 Mamba-2, 24 MLP, 4 attention layers, no dropout, flash attention):
    each layer has one part, so one norm's input and output outside (4 bytes per value of h);
    inside, a Mamba layer its in_proj output, conv output, scan output and gated norm output,
    an MLP layer its 4 h GeLU count scaled to 21,504 (relu2: not gated), an attention layer
    Q, K, V, O. The stage's mean per layer, at t = 1, micro-batch 1."""
    from planner.cost.transformer import Hardware, activation_bytes_per_layer
    from planner.spec.hardware import Precision

    m = load_model("nemotron-h-8b")
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    h, s = m.hidden, m.seq_len
    d_in, conv, heads = 128 * 64, 128 * 64 + 2 * 8 * 128, 128
    mamba = 4 * h + 2 * (d_in + conv + heads) + 2 * conv + 4 * d_in  # bytes per token
    mlp = 4 * h + 16 * 21504 / 4
    attention = 4 * h + 2 * 2 * (4096 + 1024)
    want = s * (24 * mamba + 24 * mlp + 4 * attention) / 52
    got = activation_bytes_per_layer(m, hw, 1, 1, "none", False)
    assert got == pytest.approx(want, rel=1e-12)
