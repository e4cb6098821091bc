"""Exact known totals of the built-in CNNs (the counts the issue names)."""

import pytest

from planner.catalog import list_models, load_model

EXPECTED = {
    "alexnet": (60_965_224, 724_406_816),
    "vgg16": (138_357_544, 15_470_264_320),
    "googlenet": (6_998_552, 1_582_671_872),
    "resnet50": (25_557_032, 4_089_184_256),
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
