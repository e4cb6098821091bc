"""LatentMoE (Nemotron 3 Super; Megatron-LM --moe-latent-size) and a hybrid model's multi-token
prediction pattern: Nemotron 3 Super's published totals by an independent count, what the
latent width changes against the same model without it, and the launchers' forms."""

import dataclasses

import pytest
import sympy as sp

from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.errors import SpecError
from planner.expr.layer import Choices, LayerCosts
from planner.expr.vocab import b, c_p, e_p, e_t, t
from planner.spec.hardware import Precision
from planner.spec.transformer import build_transformer
from tests.test_launch import _megatron_flags, _out

HW = Hardware.of(load_system("gb200-nvl72"), Precision.bf16)


def test_nemotron_3_super_totals_by_an_independent_count():
    """120,668,707,840 in the main model ("120B total"), 11,696,491,520 active in the layers
    ("A12B"), 5,884,650,496 in the two MTP depths: written out matrix by matrix from the
    Megatron-LM release config (h 4096, 32 heads of 128 over 2 KV groups, 512 experts of 2688
    at latent 1024 between two projections, one 5376 shared expert, squared-ReLU, 128 Mamba
    heads of 64, 8 groups of state 128, conv 4), independently of planner.spec."""
    h, lat, f, fs, vocab, experts, top_k = 4096, 1024, 2688, 5376, 131072, 512, 22
    d_in, groups, state, mheads = 128 * 64, 8, 128, 128
    conv = d_in + 2 * groups * state
    mamba = (h * (2 * d_in + 2 * groups * state + mheads) + d_in * h  # in_proj, out_proj
             + conv * 4 + conv  # depthwise conv weight and bias
             + 3 * mheads + d_in  # dt_bias, A_log, D; the gated norm
             + h)  # the pre-norm
    attention = h * 32 * 128 * 2 + 2 * h * 2 * 128 + h
    expert = 2 * lat * f
    moe = (experts * expert + 2 * h * fs + h * experts + experts  # router weight, expert bias
           + 2 * h * lat + h)  # the latent projections, the pre-norm
    main = 40 * mamba + 40 * moe + 8 * attention + 2 * vocab * h + h  # untied, final norm
    m = load_model("nemotron-3-super")
    assert m.params() - m.mtp_params() == main == 120_668_707_840
    active = 40 * mamba + 8 * attention + 40 * (moe - (experts - top_k) * expert)
    assert m.active_params() == active == 11_696_491_520
    depth = attention + moe + 2 * h * h + 3 * h  # enorm, hnorm, eh_proj, *E, final norm
    assert m.mtp_params() == 2 * depth == 5_884_650_496
    assert m.mtp_kinds() == tuple(k for k in m.layer_sequence()[6:9] if k.mixer != "mamba")


def _mixtral(**moe):
    base = load_model("mixtral-8x7b")
    return dataclasses.replace(base, **moe)


def test_a_latent_as_wide_as_the_model_adds_only_its_two_projections():
    """At l = h the experts and the tokens' traffic are the model's own: the parameters grow by
    the two h x h projections per MoE layer, the forward FLOPs by their 2 s 2 h^2, the expert
    all-to-all is the same expression."""
    base = _mixtral()
    same = _mixtral(moe_latent=base.hidden)
    h, s, n = base.hidden, base.seq_len, base.layers
    assert same.params() - base.params() == n * 2 * h * h
    assert same.forward_flops() - base.forward_flops() == n * 2 * s * 2 * h * h
    choices = Choices(flash_attention=True, sequence_parallel=True)
    assert sp.simplify(LayerCosts(same, HW, choices)._moe_comm()
                       - LayerCosts(base, HW, choices)._moe_comm()) == 0


def test_a_narrow_latent_shrinks_the_experts_and_their_traffic():
    """At l = h / 4 each expert holds a quarter of its weights and its GEMMs a quarter of
    their FLOPs; the dispatched bytes (the all-to-all's size term) are a quarter too: with the
    latency taken out, the expert traffic is a quarter of the model's without a latent."""
    base = _mixtral()
    narrow = _mixtral(moe_latent=base.hidden // 4)
    assert narrow.expert_params() * 4 == base.expert_params()
    at = {t: 2, b: 1, c_p: 1, e_p: 8, e_t: 1}
    choices = Choices(flash_attention=True, sequence_parallel=True)
    fast = dataclasses.replace(HW, intra_lat=0.0, inter_lat=0.0, launch_s=0.0)
    wide = float(LayerCosts(base, fast, choices, ep=e_p, etp=e_t)._moe_comm().subs(at))
    slim = float(LayerCosts(narrow, fast, choices, ep=e_p, etp=e_t)._moe_comm().subs(at))
    assert slim == pytest.approx(wide / 4, rel=1e-12)


def test_nemotron_3_super_prices_its_release_plan():
    """The release run's split (tp 2, ep 64, etp 1, sequence parallel, mxfp8) prices and fits
    a GB200's memory; its MTP depths sit with the output layer."""
    m = load_model("nemotron-3-super")
    hw = Hardware.of(load_system("gb200-nvl72"), Precision.mxfp8)
    cfg = {"t": 2, "p": 1, "d": 32, "mb": 1, "acc": 16, "v": 1, "ep": 64, "etp": 1,
           "recompute": 0, "sp": 1, "zero": 1, "gpipe": 0, "overlap": True,
           "flash_attention": True}
    with_mtp = iteration(m, hw, cfg)
    without = iteration(dataclasses.replace(m, mtp_layers=0, mtp_pattern=""), hw, cfg)
    assert float(with_mtp["memory"]) < hw.memory_bytes
    assert float(with_mtp["compute"]) > float(without["compute"])


@pytest.mark.parametrize("keys, message", [
    ({"mtp_pattern": "*E"}, "needs mtp_layers"),
    ({"mtp_layers": 1, "mtp_pattern": "*X"}, "unknown layer"),
    ({"mtp_layers": 1}, "needs mtp_pattern"),  # a hybrid depth is not the last layer's kind
    ({"mtp_layers": 1, "mtp_pattern": "M"}, "no mamba sizes"),
    ({"mtp_layers": 1, "mtp_pattern": "E"}, "but no moe"),
])
def test_bad_mtp_patterns_are_spec_errors(keys, message):
    spec = {"kind": "transformer", "name": "toy", "layers": 2, "hidden": 256, "heads": 4,
            "seq_len": 128, "vocab": 1000, "norm": "rmsnorm", "position_embedding": "rotary",
            "layer_pattern": "*-"}
    with pytest.raises(SpecError, match=message):
        build_transformer({**spec, **keys}, "test")


def test_megatron_writes_the_latent_size_and_torchtitan_refuses_it(run, tmp_path):
    spec = tmp_path / "latent.yaml"
    spec.write_text(
        "kind: transformer\nname: latent-mixtral\nlayers: 8\nhidden: 4096\nheads: 32\n"
        "kv_heads: 8\nseq_len: 4096\nvocab: 32000\nffn_hidden: 14336\nffn_kind: swiglu\n"
        "tied_embeddings: false\nbias: false\nnorm: rmsnorm\nposition_embedding: rotary\n"
        "moe: {experts: 8, top_k: 2, latent_size: 1024}\n")
    args = ("evaluate", "-m", str(spec), "-H", "dgx-h100", "--devices", "16", "--tp", "2",
            "--ep", "8", "--etp", "1", "--global-batch", "64", "--zero", "1",
            "--sequence-parallel", "--precision", "bf16")
    flags = _megatron_flags(_out(run, *args, "--format", "megatron"))
    assert flags["--moe-latent-size"] == ["1024"]
    code, _, err = run(*args, "--format", "torchtitan")
    assert code == 2 and "no LatentMoE" in err


def test_torchtitan_refuses_latent_moe_on_a_model_it_has_a_flavor_of(run, tmp_path):
    """DeepSeek-V3 is a torchtitan flavor; with a latent width it is another network."""
    from pathlib import Path

    import yaml

    import planner

    spec = yaml.safe_load((Path(planner.__file__).parent / "models" / "deepseek-v3.yaml")
                          .read_text())
    spec["moe"]["latent_size"] = 2048
    spec["name"] = "latent-deepseek"
    path = tmp_path / "latent-deepseek.yaml"
    path.write_text(yaml.safe_dump(spec))
    args = ("evaluate", "-m", str(path), "-H", "dgx-h100", "--devices", "1024", "--tp", "2",
            "--ep", "64", "--etp", "1", "--global-batch", "4096", "--zero", "1",
            "--recompute", "full", "--sequence-parallel", "--format", "torchtitan")
    code, _, err = run(*args)
    assert code == 2 and "no LatentMoE" in err
    code, _, err = run(*args[:-2], "--format", "torchtitan", "-m", "deepseek-v3")
    assert "no LatentMoE" not in err


def test_a_latent_as_wide_as_the_model_saves_and_moves_what_the_model_does():
    """At l = h the stored activations are the model's own plus the l -> h projection's
    input (2 bytes a value at 16 bits); with fp8-saved inputs the same total: that input kept
    in fp8 (1 byte less a value) and the h -> l projection's own fp8 copy of the norm output
    (1 byte more)."""
    base, same = _mixtral(), _mixtral(moe_latent=4096)
    kind = base.layer_sequence()[0]
    at = {t: 1, b: 1, c_p: 1, e_p: 1, e_t: 1}
    sbh = base.seq_len * base.hidden * 2  # bytes of one s b h tensor at 16 bits, b = 1

    def acts(m, **choices):
        lc = LayerCosts(m, HW, Choices(flash_attention=True, **choices))
        return float(lc.kind_activation_bytes("none", kind).subs(at))

    assert acts(same) - acts(base) == pytest.approx(sbh, rel=1e-12)
    assert acts(same, fp8_activations=True) - acts(base, fp8_activations=True) == \
        pytest.approx(sbh, rel=1e-12)
