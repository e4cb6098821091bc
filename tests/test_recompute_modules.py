"""Megatron-LM's recompute modules (`--recompute-norms`, `--recompute-moe-act`,
`--recompute-mla-up`: --recompute-granularity selective --recompute-modules layernorm moe_act
mla_up_proj): the activations each frees against a count by hand, the work each runs again
against its roofline, the hardware FLOPs of the up projections again, the refusals, the
search keeping a pinned module, and the Megatron-LM flags through its own parser."""

import json

import pytest

from planner import api
from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, hardware_flops_per_sequence, iteration
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len
from tests.test_launch import _megatron_flags, _out

S, T = 4096, 2  # tokens of the one micro-batch; tensor-parallel ranks (sequence parallel)


def _deepseek():
    m = with_seq_len(load_model("deepseek-v3"), S)
    return m, Hardware.of(load_system("dgx-h100"), Precision.bf16)


def _run(m, hw, **switch):
    """One micro-batch on one pipeline stage: every layer (and the MTP depth) in flight once."""
    cfg = {"t": T, "p": 1, "d": 1, "mb": 1, "acc": 1, "v": 1, "cp": 1, "ep": 1, "etp": 1,
           "recompute": 0, "sp": 1, "zero": 0, "gpipe": 0, **switch}
    return {k: float(v) for k, v in iteration(m, hw, cfg).items()}


def test_each_module_frees_its_tensors_counted_by_hand():
    """DeepSeek-V3 in bf16 at tp 2 with sequence parallelism, 4,096 tokens: per layer
    - the two norm outputs, s h 2 bytes each over tp: 58.7 MB (62 layers with the MTP depth);
    - the routed experts' activation output, s top_k f 2 bytes over tp: 67.1 MB (59 MoE
      layers with the MTP depth's);
    - MLA's Q, K and V, s heads (192 + 192 + 128) 2 bytes over tp: 268 MB (62 layers)."""
    m, hw = _deepseek()
    layers, moe = m.layers + m.mtp_layers, 58 + m.mtp_layers
    base = _run(m, hw)["activations"]
    expected = {"recompute_norms": layers * 2 * S * m.hidden * 2 / T,
                "recompute_moe_act": moe * S * m.top_k * m.ffn_hidden * 2 / T,
                "recompute_mla_up": layers * S * m.heads * (192 + 192 + 128) * 2 / T}
    assert expected["recompute_norms"] / layers == 58_720_256
    for name, freed in expected.items():
        assert base - _run(m, hw, **{name: True})["activations"] == pytest.approx(freed,
                                                                                 rel=1e-12)
    everything = _run(m, hw, **dict.fromkeys(expected, True))["activations"]
    assert base - everything == pytest.approx(sum(expected.values()), rel=1e-12)


@pytest.mark.parametrize("seq", [4096, 16384])
def test_the_norms_again_are_memory_bound_kernels_at_the_hbm_rate(seq):
    """Recomputing the norms reads and writes s h values a norm in the backward, two kernels
    a layer: at 4,096 tokens each moves 117 MB, under the host's issue time at the HBM rate,
    so each costs that issue time; at 16,384 tokens the traffic at the device's HBM rate."""
    m, hw = _deepseek()
    m = with_seq_len(m, seq)
    layers = m.layers + m.mtp_layers
    extra = _run(m, hw, recompute_norms=True)["compute"] - _run(m, hw)["compute"]
    traffic = 2 * seq * m.hidden * 2 * 2 / hw.mem_bw
    assert extra == pytest.approx(layers * max(traffic, 2 * hw.launch_s), rel=1e-9)
    assert (traffic < 2 * hw.launch_s) == (seq == 4096)


def test_the_up_projections_again_count_as_hardware_flops():
    """q_b (1,536 -> 128 x 192) and kv_b (512 -> 128 x 256) once more per attention layer and
    token: 2 x 128 x (1,536 x 192 + 512 x 256) FLOPs, over 61 layers and the MTP depth."""
    m = load_model("deepseek-v3")
    again = (hardware_flops_per_sequence(m, "none", mla_up=True)
             - hardware_flops_per_sequence(m, "none"))
    assert again == 62 * 2 * 128 * (1536 * 192 + 512 * 256) * m.seq_len
    plan = dict(devices=2048, tp=4, pp=16, ep=32, micro_batch=1, global_batch=4096,
                sequence_parallel=True, seq_len=4096)
    off = api.evaluate("deepseek-v3", "dgx-h100", **plan).prediction
    on = api.evaluate("deepseek-v3", "dgx-h100", recompute_mla_up=True, **plan).prediction
    m4k = with_seq_len(m, 4096)
    assert (on.hardware_flops_per_iteration - off.hardware_flops_per_iteration
            == 62 * 2 * 128 * (1536 * 192 + 512 * 256) * 4096 * 4096)
    assert on.model_flops_per_iteration == off.model_flops_per_iteration == \
        m4k.model_flops() * 4096
    assert on.iteration_time_s > off.iteration_time_s
    assert on.memory_bytes_per_device < off.memory_bytes_per_device


@pytest.mark.parametrize("args, message", [
    (["-m", "llama3-8b", "--recompute-moe-act"], "recompute_moe_act: 'llama3-8b' is a dense"),
    (["-m", "llama3-8b", "--recompute-mla-up"], "recompute_mla_up: 'llama3-8b' has no"),
    (["-m", "llama3-8b", "--recompute-norms", "--recompute", "full"],
     "recompute_norms: --recompute-norms is a selective recomputation"),
    (["-m", "llama3-8b", "--recompute-norms", "--recompute", "full", "--recompute-layers", "2"],
     "recompute_norms: --recompute-norms is a selective recomputation"),
    (["-m", "llama3-8b", "--recompute-norms", "--offload-activations", "-H", "gb200-nvl72"],
     "recompute_norms: --recompute-norms is not priced with --offload-activations"),
])
def test_what_no_framework_runs_is_one_line_exit_2(run, args, message):
    base = ["evaluate", "-H", "dgx-h100", "--devices", "8", "--micro-batch", "1",
            "--global-batch", "64"]
    if "-H" in args:
        base = base[:1] + base[3:]
    code, _, err = run(*base, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"planner: {message}")


def test_solve_keeps_a_pinned_module_and_never_recomputes_whole_layers(run):
    """Llama-3-70B on 16 H100 fits only with full recomputation; with the norms pinned the
    search keeps them on, masks every full-recomputation row (the module is a selective
    granularity) and finds nothing that fits: exit 1, naming memory. On 32 it keeps them on
    and picks a plan without full recomputation."""
    args = ["solve", "-m", "llama3-70b", "-H", "dgx-h100", "--global-batch", "256",
            "--format", "json"]
    code, out, err = run(*args, "--devices", "16")
    assert code == 0, err
    assert json.loads(out)["config"]["recompute"] == "full"
    code, out, err = run(*args, "--devices", "16", "--recompute-norms")
    assert code == 1 and "infeasible: memory" in err
    code, out, err = run(*args, "--devices", "32", "--recompute-norms")
    assert code == 0, err
    config = json.loads(out)["config"]
    assert config["recompute_norms"] is True
    assert config["recompute"] in ("none", "selective")


def test_megatron_writes_the_module_list_its_parser_takes(run):
    """--recompute selective with the three modules: Megatron-LM's selective granularity with
    core_attn (its default list) and the modules, parsed by its own parser (d98e8a6)."""
    text = _out(run, "evaluate", "-m", "deepseek-v3", "-H", "dgx-h100", "--devices", "2048",
                "--tp", "4", "--pp", "16", "--ep", "32", "--micro-batch", "1",
                "--global-batch", "4096", "--sequence-parallel", "--seq-len", "4096",
                "--recompute", "selective", "--recompute-norms", "--recompute-moe-act",
                "--recompute-mla-up", "--format", "megatron")
    flags = _megatron_flags(text)
    assert flags["--recompute-granularity"] == ["selective"]
    assert flags["--recompute-modules"] == ["core_attn", "layernorm", "moe_act", "mla_up_proj"]
    alone = _megatron_flags(_out(run, "evaluate", "-m", "llama2-7b", "-H", "dgx-h100",
                                 "--devices", "8", "--tp", "2", "--sequence-parallel",
                                 "--zero", "1", "--micro-batch", "1", "--global-batch", "64",
                                 "--recompute-norms", "--format", "megatron"))
    assert alone["--recompute-granularity"] == ["selective"]
    assert alone["--recompute-modules"] == ["layernorm"]  # no core_attn: --recompute none


def test_megatron_refuses_the_norms_in_fp8_with_delayed_scaling(run):
    """transformer_config.py: "Delayed scaling does not support moe_act and layernorm
    recompute for fp8"; with current scaling (--fp8-recipe tensorwise) it takes them."""
    base = ["evaluate", "-m", "llama2-7b", "-H", "dgx-h100", "--devices", "8", "--tp", "2",
            "--sequence-parallel", "--zero", "1", "--micro-batch", "1", "--global-batch", "64",
            "--precision", "fp8",
            "--recompute-norms", "--format", "megatron"]
    code, _, err = run(*base)
    assert code == 2
    assert "only with current scaling" in err
    flags = _megatron_flags(_out(run, *base, "--fp8-current-scaling"))
    assert flags["--recompute-modules"] == ["layernorm"]
    assert flags["--fp8-recipe"] == ["tensorwise"]


def test_an_out_of_memory_answer_names_the_modules_the_search_does_not_try(run):
    """With the recomputation pinned to none or selective the search never tries the modules,
    so an out-of-memory answer names those the model has and the request leaves off; with full
    recomputation free it does not (full recomputation frees more than all of them)."""
    args = ["solve", "-m", "deepseek-v3", "-H", "dgx-h100", "--devices", "64",
            "--global-batch", "1024", "--seq-len", "4096"]
    code, _, err = run(*args, "--recompute", "none", "--recompute-moe-act")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.strip().endswith("(the search does not try Megatron-LM's recompute modules: "
                                "--recompute-norms, --recompute-mla-up free more)")
    code, _, err = run(*args)
    assert code == 1 and "infeasible: memory" in err and "recompute modules" not in err
