"""The launcher forms build the published model or refuse: Megatron-LM's arguments for Llama 3 /
3.1, Mixtral, GPT-3 and DeepSeek-V3 (parsed by Megatron-LM's own parser, dumped as data at the
commit tests/test_launch.py names), the script's placeholders and environment, and torchtitan's
flavors (exit 2 for a model it has no flavor of)."""

import subprocess

import pytest

from tests.test_launch import MEGATRON_COMMIT, _megatron_flags, _out, megatron_argv


def _llama(model: str, devices: str = "16", tp: str = "8", *extra: str) -> tuple[str, ...]:
    return ("evaluate", "-m", model, "-H", "dgx-h100", "--devices", devices, "--tp", tp,
            "--global-batch", "64", "--recompute", "full", "--zero", "1", "--precision",
            "bf16", *extra)


DEEPSEEK = ("evaluate", "-m", "deepseek-v3", "-H", "dgx-h100", "--devices", "1024", "--tp", "2",
            "--pp", "8", "--ep", "64", "--etp", "1", "--global-batch", "4096", "--zero", "1",
            "--recompute", "full", "--sequence-parallel")


def test_megatron_deepseek_v3_is_the_published_architecture(run):
    """DeepSeek-V3 (config.json; Technical Report sec. 2): MLA ranks and head sizes, 18,432-wide
    dense FFN in the first 3 layers and 58 MoE layers of 2,048-wide experts plus one shared
    expert, sigmoid router with the expert bias, top-k scaling 2.5, 8 groups / 4 chosen, one
    multi-token prediction depth."""
    flags = _megatron_flags(_out(run, *DEEPSEEK, "--format", "megatron"))
    want = {"--multi-latent-attention": [], "--q-lora-rank": ["1536"],
            "--kv-lora-rank": ["512"], "--qk-head-dim": ["128"],
            "--qk-pos-emb-head-dim": ["64"], "--v-head-dim": ["128"], "--qk-layernorm": [],
            "--num-layers": ["61"], "--hidden-size": ["7168"], "--num-attention-heads": ["128"],
            "--ffn-hidden-size": ["18432"], "--moe-ffn-hidden-size": ["2048"],
            "--num-experts": ["256"], "--moe-router-topk": ["8"],
            "--moe-shared-expert-intermediate-size": ["2048"],
            "--moe-router-score-function": ["sigmoid"], "--moe-router-enable-expert-bias": [],
            "--moe-router-topk-scaling-factor": ["2.5"], "--moe-router-num-groups": ["8"],
            "--moe-router-group-topk": ["4"], "--rotary-base": ["10000"],
            "--mtp-num-layers": ["1"],
            "--attention-dropout": ["0.0"], "--hidden-dropout": ["0.0"]}
    for flag, values in want.items():
        assert flags.get(flag) == values, flag
    assert "--group-query-attention" not in flags  # exclusive with MLA (validate_args)
    # 3 dense layers then 58 MoE layers: the pattern Megatron's moe_freq_type evaluates
    from tests.test_launch import _layer_pattern
    pattern = _layer_pattern(flags["--moe-layer-freq"][0])
    assert pattern == [0] * 3 + [1] * 58


@pytest.mark.parametrize(("model", "theta", "scaling"), [
    ("llama3-8b", "500000", False), ("llama3-70b", "500000", False),
    ("llama3.1-405b", "500000", True), ("llama2-7b", "10000", False),
])
def test_megatron_rotary_base_rope_scaling_and_no_dropout(run, model, theta, scaling):
    devices, pp = {"llama3.1-405b": ("1024", "16"), "llama3-70b": ("32", "4")}.get(
        model, ("16", "1"))
    args = _llama(model, devices, "8", "--pp", pp)
    flags = _megatron_flags(_out(run, *args, "--format", "megatron"))
    assert flags["--rotary-base"] == [theta]
    assert ("--use-rope-scaling" in flags) == scaling
    if scaling:
        assert flags["--rope-scaling-factor"] == ["8.0"]
    # Llama-lineage models use no dropout, and were priced without it
    assert flags["--attention-dropout"] == flags["--hidden-dropout"] == ["0.0"]


def test_megatron_mixtral_rotary_base_and_gpt3_dropout(run):
    args = ("evaluate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "--devices", "64", "--tp", "2",
            "--ep", "8", "--etp", "1", "--pp", "4", "--global-batch", "256", "--seq-len",
            "4096", "--recompute", "full", "--zero", "1")
    flags = _megatron_flags(_out(run, *args, "--format", "megatron"))
    assert flags["--rotary-base"] == ["1000000"] and flags["--num-experts"] == ["8"]
    assert "--moe-layer-freq" not in flags  # every layer MoE: Megatron's default 1
    gpt3 = ("solve", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices-max", "4096",
            "--global-batch", "1536")
    flags = _megatron_flags(_out(run, *gpt3, "--format", "megatron"))
    assert flags["--hidden-dropout"] == flags["--attention-dropout"] == ["0.1"]  # as priced
    assert "--rotary-base" not in flags  # learned positions


def test_megatron_script_header_placeholders_and_environment(run, tmp_path):
    text = _out(run, *_llama("llama3-8b"), "--format", "megatron")
    assert text.startswith("#!/bin/bash\n") and MEGATRON_COMMIT[:12] in text.splitlines()[1]
    script = tmp_path / "m.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    # the placeholders are marked, and the script stops until they are set
    for name in ("DATA_PATH", "LR", "TRAIN_ITERS"):
        assert f"{name}=" in text and "PLACEHOLDER" in text
    assert "PLACEHOLDER tokenizer" in text
    stopped = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"})
    assert stopped.returncode != 0 and "PLACEHOLDER: set DATA_PATH" in stopped.stderr
    argv, conn = megatron_argv(text)
    assert conn == "1"  # tp 8 on H100: validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1
    assert argv[argv.index("--tokenizer-type") + 1] == "NullTokenizer"
    assert "--mock-data" in argv and argv[argv.index("--lr") + 1] == "3e-4"
    argv, _ = megatron_argv(text, DATA_PATH="/data/c4_text_document",
                            CHECKPOINT_DIR="/ckpt", EXIT_MINUTES="2800")
    assert argv[argv.index("--data-path") + 1] == "/data/c4_text_document"
    assert argv[argv.index("--save") + 1] == argv[argv.index("--load") + 1] == "/ckpt"
    assert argv[argv.index("--exit-duration-in-mins") + 1] == "2800"
    # no tp or cp: nothing set; Megatron-FSDP (ZeRO 3): never 1
    dp = _out(run, *_llama("llama3-8b", "16", "1", "--zero", "1"), "--format", "megatron")
    assert megatron_argv(dp)[1] == "unset"
    fsdp = _out(run, *_llama("llama3-8b", "16", "2", "--zero", "3"), "--format", "megatron")
    assert megatron_argv(fsdp, CUDA_DEVICE_MAX_CONNECTIONS="1")[1] == "unset"


@pytest.mark.parametrize(("model", "what"), [
    ("gpt-oss-120b", "sliding-window"), ("nemotron-h-8b", "Mamba"), ("bert-large", "encoder")])
def test_megatron_refuses_what_it_does_not_write(model, what):
    from planner.catalog import load_model
    from planner.errors import SpecError
    from planner.launch import Target, megatron_args

    plan = {"nodes": 1, "devices_per_node": 8, "devices": 8, "tp": 1, "pp": 1, "dp": 8,
            "micro_batch": 1, "global_batch": 8, "gradient_accumulation": 1, "interleave": 1,
            "recompute": "none", "sequence_parallel": False, "zero": 1, "schedule": "1f1b",
            "overlap": True, "flash_attention": True}
    with pytest.raises(SpecError, match=f"does not write .*{what}"):
        megatron_args({}, plan, Target(load_model(model), "bf16"))


@pytest.mark.parametrize("model", ["llama2-7b", "gpt3-175b", "mixtral-8x7b"])
def test_torchtitan_refuses_models_it_has_no_flavor_of(run, model):
    """Llama 2 and GPT-3 are no torchtitan flavor; Mixtral is no dense Llama 3 8B."""
    args = ("evaluate", "-m", model, "-H", "dgx-h100", "--devices", "64", "--tp", "8",
            "--global-batch", "256", "--zero", "1", "--recompute", "full")
    if model == "gpt3-175b":
        args = ("evaluate", "-m", model, "-H", "dgx-h100", "--devices", "1024", "--tp", "8",
                "--pp", "8", "--global-batch", "1024", "--zero", "1", "--recompute", "full")
    code, _, err = run(*args, "--format", "torchtitan")
    assert code == 2 and "no" in err and "flavor" in err and "--format megatron" in err, err


def deepseek_v3_without_mtp(folder) -> str:
    """The built-in DeepSeek-V3 with its multi-token prediction depth removed: what
    torchtitan's 671B flavor builds."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "planner" / "models" / "deepseek-v3.yaml").read_text()
    assert "\nmtp_layers: 1\n" in text
    path = folder / "deepseek-v3-no-mtp.yaml"
    path.write_text(text.replace("\nmtp_layers: 1\n", "\n"))
    return str(path)


def test_torchtitan_runs_deepseek_v3_mtp_without_pipeline_or_context_parallelism(run):
    """torchtitan's model_registry builds the MTP depth (num_mtp_layers) and rejects it with
    pp or cp (deepseek_v3/MTP.md at b5bcd76): refused there, written without them."""
    from tests.test_launch_torchtitan import torchtitan_config

    code, out, err = run(*DEEPSEEK, "--format", "torchtitan")  # pp 8
    assert code == 2 and out == "" and "multi-token prediction" in err
    assert "--format megatron" in err and len(err.strip().splitlines()) == 1
    flat = ("evaluate", "-m", "deepseek-v3", "-H", "dgx-h100", "--devices", "1024", "--ep",
            "64", "--etp", "1", "--global-batch", "4096", "--zero", "3", "--recompute", "full")
    text = _out(run, *flat, "--format", "torchtitan")
    assert "num_mtp_layers=1" in text
    cfg = torchtitan_config(text, devices=1024)
    assert (cfg.model_spec.name, cfg.model_spec.flavor) == ("deepseek_v3", "671B")


def test_torchtitan_deepseek_v3_flavor_and_commit(run, tmp_path):
    from tests.test_launch_torchtitan import torchtitan_config

    model = deepseek_v3_without_mtp(tmp_path)
    text = _out(run, *DEEPSEEK[:2], model, *DEEPSEEK[3:], "--format", "torchtitan")
    assert "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a" in text.splitlines()[0]
    cfg = torchtitan_config(text)
    assert cfg.model_spec.flavor == "671B"
    assert cfg.parallelism.expert_parallel_degree == 64


def test_megatron_writes_fp8_current_scaling_as_the_tensorwise_recipe(run):
    """--fp8-current-scaling is Megatron-LM's --fp8-recipe tensorwise (a choice its parser
    takes); torchtitan refuses it (no separate amax and scale kernels there)."""
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-b200", "--devices", "16", "--tp", "2",
            "--global-batch", "32", "--zero", "1", "--sequence-parallel", "--precision", "fp8",
            "--fp8-current-scaling")
    flags = _megatron_flags(_out(run, *args, "--format", "megatron"))
    assert flags["--fp8-recipe"] == ["tensorwise"] and flags["--fp8-format"] == ["hybrid"]
    code, _, err = run(*args, "--format", "torchtitan")
    assert code == 2 and "--fp8-current-scaling" in err
