"""Exact known totals of the built-in CNNs (the counts the issue names)."""

import pytest

from planner.catalog import MODELS, list_models, load_model, read_yaml

EXPECTED = {
    "alexnet": (60_965_224, 724_406_816),
    "vgg16": (138_357_544, 15_470_264_320),
    "googlenet": (6_998_552, 1_582_671_872),
    "resnet50": (25_557_032, 4_089_184_256),
    # 5 Conv3D layers of kernel 2 (4 -> 32 -> ... -> 512 channels at 128^3 .. 8^3 positions)
    # and Dense 32768 -> 128 -> 64 -> 4, counted by hand in planner/models/cosmoflow.yaml
    "cosmoflow": (5_597_604, 10_204_750_080),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_exact_params_and_macs(name):
    cnn = load_model(name)
    params, macs = EXPECTED[name]
    assert cnn.params == params
    assert sum(l.macs for l in cnn.layers if l.type in ("conv", "fc")) == macs


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_forward_flops_within_3_percent_of_2x_macs(name):
    cnn = load_model(name)
    macs = EXPECTED[name][1]
    assert abs(cnn.forward_flops / (2 * macs) - 1) < 0.03


def test_cosmoflow_volumes_halve_through_same_padded_kernels_and_pools():
    """Kernel 2 with 'same' padding keeps each volume (Keras pads one row after), the pools
    halve it: 128^3 -> 4^3 with 512 channels, 32,768 values into fc1."""
    cnn = load_model("cosmoflow")
    convs = [l for l in cnn.layers if l.type == "conv"]
    assert [l.output_shape for l in convs] == [(32, 128, 128, 128), (64, 64, 64, 64),
                                               (128, 32, 32, 32), (256, 16, 16, 16),
                                               (512, 8, 8, 8)]
    assert all(l.kernel == (2, 2, 2) and l.stride == (1, 1, 1) for l in convs)
    assert next(l for l in cnn.layers if l.type == "flatten").output_shape == (32768,)
    assert cnn.input_shape == (4, 128, 128, 128)


def test_3d_layers_check_their_dimensions():
    from planner.errors import SpecError
    from planner.spec.cnn import build_cnn

    base = {"kind": "cnn", "name": "v", "input": [1, 9, 9, 9]}
    ok = build_cnn({**base, "layers": [{"type": "conv", "out": 2, "kernel": [3, 3, 1],
                                        "stride": 2, "padding": "same"}]}, "v.yaml")
    assert ok.layers[0].output_shape == (2, 5, 5, 5)  # ceil(9 / 2)
    assert ok.layers[0].params == 2 * 9 + 2
    with pytest.raises(SpecError, match="kernel: needs one number or 3"):
        build_cnn({**base, "layers": [{"type": "conv", "out": 2, "kernel": [3, 3]}]}, "v.yaml")
    flat = build_cnn({**base, "layers": [{"type": "globalavgpool"}]}, "v.yaml")
    assert flat.layers[0].output_shape == (1, 1, 1, 1)


def test_alexnet_layer_shapes_follow_caffe():
    cnn = load_model("alexnet")
    shapes = {l.name: l.output_shape for l in cnn.layers}
    assert shapes["conv1"] == (96, 55, 55)
    assert shapes["conv2"] == (256, 27, 27)
    assert shapes["conv5"] == (256, 13, 13)
    assert shapes["fc6"] == (4096,)
    # grouped conv2: 256 x (96/2) x 5 x 5 weights + 256 biases
    assert next(l for l in cnn.layers if l.name == "conv2").params == 256 * 48 * 25 + 256


def test_googlenet_ceil_mode_pooling_gives_caffe_sizes():
    shapes = [l.output_shape for l in load_model("googlenet").layers if l.type == "maxpool"]
    assert shapes[0] == (64, 56, 56) and shapes[1] == (192, 28, 28)


def test_resnet50_projection_shortcuts_are_counted_once_per_stage():
    cnn = load_model("resnet50")
    downs = [l for l in cnn.layers if l.type == "conv" and "down_" in l.name]
    assert len(downs) == 4


def test_every_builtin_loads_and_names_follow_the_contract():
    for name in list_models():
        model = load_model(name)
        assert model.name == name
        if model.kind == "transformer":
            assert model.params() > 0 and model.hidden % model.heads == 0
            continue
        if model.kind == "recommendation":
            assert model.embedding_params() > 0 and model.dense_params() > 0
            continue
        for layer in model.layers:
            if layer.type == "conv":
                assert layer.name.startswith("conv")
            if layer.type == "fc":
                assert layer.name.startswith("fc")


def test_conv_carries_flops_fc_carries_weights_in_alexnet():
    """The seed paper's observation: conv layers hold the FLOPs, FC layers the weights."""
    cnn = load_model("alexnet")
    conv = [l for l in cnn.layers if l.type == "conv"]
    fc = [l for l in cnn.layers if l.type == "fc"]
    assert sum(l.forward_flops for l in conv) > 0.9 * cnn.forward_flops
    assert sum(l.params for l in fc) > 0.95 * cnn.params


# --- built-in transformers of today: exact totals from the config arithmetic, each rounding to
# the published headline (billions, to the digits the source gives) ---------------------------

TRANSFORMERS = {
    "mixtral-8x7b": (46_702_792_704, 46.7, 1),  # Jiang et al. 2024: 46.7B
    "mixtral-8x22b": (140_620_634_112, 141, 0),  # Mistral AI: 141B
    "deepseek-v3": (682_636_487_424, 671, 0),  # 671B: the main model, its MTP depth apart
    "qwen3-30b-a3b": (30_532_122_624, 30.5, 1),
    "qwen3-235b-a22b": (235_093_634_560, 235, 0),
    "gpt-oss-120b": (116_829_156_672, 116.83, 2),  # model card: 116.83B
    "gpt-oss-20b": (20_914_757_184, 20.91, 2),  # model card: 20.91B
    "nemotron-h-8b": (8_100_852_736, 8, 0),
}

# active parameters per token as each source counts them: layers plus the embeddings it includes
ACTIVE = {
    "mixtral-8x7b": (("embedding", "unembedding"), 12.9, 1),  # Mistral AI: 12.9B active
    "mixtral-8x22b": (("embedding", "unembedding"), 39, 0),
    "deepseek-v3": (("unembedding",), 37, 0),  # 37B activated
    "qwen3-30b-a3b": (("embedding", "unembedding"), 3.3, 1),  # 3.353B, truncated to 3.3B
    "qwen3-235b-a22b": (("embedding", "unembedding"), 22, 0),
    "gpt-oss-120b": (("unembedding",), 5.13, 2),  # model card: 5.13B active
    "gpt-oss-20b": (("unembedding",), 3.61, 2),  # model card: 3.61B active
}


@pytest.mark.parametrize("name", sorted(TRANSFORMERS))
def test_builtin_transformer_exact_total(name):
    m = load_model(name)
    params, headline, digits = TRANSFORMERS[name]
    assert m.params() == params
    assert round((params - m.mtp_params()) / 1e9, digits) == headline
    sources = read_yaml(MODELS / f"{name}.yaml")["sources"]
    assert "config.json" in sources["architecture"], "every built-in names its source"


def test_deepseek_v3_mtp_depth_by_its_parts():
    """One multi-token prediction depth: a MoE block like the last layer, the 2h -> h
    projection (7,168 x 14,336) and three RMSNorms; with the checkpoint's copies of the
    embedding and the head (129,280 x 7,168 each) it is the MTP module of DeepSeek's README,
    13.46B (which it rounds to "14B", and 671B + 14B to "685B")."""
    m = load_model("deepseek-v3")
    assert m.mtp_params() == 11_610_068_224
    module = m.mtp_params() + 2 * 129_280 * 7168
    assert 13.4e9 < module < 13.5e9
    # forward FLOPs per sequence: the block, the projection and the head once more
    s = m.seq_len
    assert m.mtp_depth_flops() == (m.kind_matmul_flops(m.layer_sequence()[-1])
                                   + 2 * s * 14336 * 7168 + 2 * s * 7168 * 129_280)


def test_llama31_405b_exact_total():
    """405,853,388,800: 126 x 3,187,703,808 per layer + 2 x 128,256 x 16,384 + 16,384; Meta's
    "405B" truncates it."""
    m = load_model("llama3.1-405b")
    assert m.params() == 405_853_388_800
    assert m.layer_params() == 3_187_703_808 and int(m.params() / 1e9) == 405
    assert m.params() == load_model("llama3-405b").params()


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_builtin_transformer_active_params(name):
    m = load_model(name)
    parts, headline, digits = ACTIVE[name]
    vocab = m.vocab * m.hidden
    active = m.active_params() + vocab * len(parts)
    if name == "qwen3-30b-a3b":  # Qwen truncates its "A3.3B"
        assert headline <= active / 1e9 < headline + 0.1
    else:
        assert round(active / 1e9, digits) == headline


def test_deepseek_v3_itemised():
    """DeepSeek-V3 from its config: MLA 187,107,328 per layer, 3 dense layers of 18,432, 58 MoE
    layers of 256 x 2,048 routed + 1 shared + router with its correction bias."""
    m = load_model("deepseek-v3")
    assert m.attention_params() == 187_107_328
    kinds = dict((k.name, n) for k, n in m.layer_kinds())
    assert kinds == {"attention+dense": 3, "attention+moe": 58}
    moe = 256 * 3 * 7168 * 2048 + 3 * 7168 * 2048 + 256 * (7168 + 1)
    assert m.moe_params() == moe
    main = (3 * (187_107_328 + 3 * 7168 * 18432 + 2 * 7168)
            + 58 * (187_107_328 + moe + 2 * 7168) + 2 * 129280 * 7168 + 7168)
    # and its multi-token prediction depth: a MoE block, the 2h -> h projection, three norms
    assert m.params() == main + (187_107_328 + moe + 2 * 7168) + 7168 * 14336 + 3 * 7168
