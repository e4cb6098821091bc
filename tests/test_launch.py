"""Launcher outputs: each is parsed by the real parser (the shell, json, shlex, torchtitan's
config classes as data) and agrees with the JSON plan; Megatron-LM flags and torchtitan fields
exist at the commits named."""

import argparse
import ast
import json
import math
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest

from planner import rules
from planner.errors import SpecError
from planner.launch import slurm_time, uneven_stages
from tests.test_launch_deepspeed import DATA as DEEPSPEED_DATA
from tests.test_launch_torchtitan import torchtitan_config

GPT3 = ("solve", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices-max", "4096",
        "--global-batch", "1536")
RESNET = ("solve", "-m", "resnet50", "-H", "dgx-a100-80gb", "--global-batch", "4096")
# Llama-3-70B on 4 DGX H100: tp 8 x pp 4 x dp 1, full recompute (fits: 80 GiB per device)
LLAMA = ("evaluate", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "32", "--tp", "8",
         "--pp", "4", "--micro-batch", "1", "--global-batch", "64", "--recompute", "full",
         "--sequence-parallel", "--precision", "bf16")
# Llama-3-8B on one DGX A100: tp 4 x dp 2 at 97.1 % of the device memory with ZeRO 2
TIGHT = ("evaluate", "-m", "llama3-8b", "-H", "dgx-a100-80gb", "--devices", "8", "--tp", "4",
         "--pp", "2", "--micro-batch", "4", "--zero", "2", "--global-batch", "64")

# Megatron-LM's argument parser as data: every argument megatron/training/arguments.py
# `add_megatron_arguments` builds (its _add_*_args and the ArgumentGroupFactory flags of the
# config dataclasses), dumped by tests/data/make_launch_megatron_args.py at the commit it names
MEGATRON_DATA = json.loads((Path(__file__).parent / "data" / "launch_megatron_args.json")
                           .read_text())
MEGATRON_COMMIT = MEGATRON_DATA["commit"]
assert MEGATRON_COMMIT == "d98e8a64ddf34856e74b24714e3bedb2f5a39553"  # NVIDIA/Megatron-LM
MEGATRON_FLAGS = frozenset(f for a in MEGATRON_DATA["arguments"] for f in a["flags"])
MEGATRON_PLACEHOLDERS = {"DATA_PATH": "mock", "LR": "3e-4", "TRAIN_ITERS": "100"}


def _layer_pattern(text: str) -> list[int] | int:
    """Megatron's moe_freq_type: an integer, or a list expression of 0 / 1 built with + and *
    (evaluated here on the syntax tree, never by eval)."""
    if "[" not in text:
        return int(text)

    def value(node):
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.Constant) and node.value in (0, 1):
            return node.value
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(f"not a layer pattern: {text}")

    return value(ast.parse(text, mode="eval"))


def megatron_parser() -> argparse.ArgumentParser:
    """An argparse parser with Megatron-LM's arguments, rebuilt from the dumped data: option
    strings, action, nargs, type and choices as Megatron-LM declares them."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    types = {"int": int, "float": float, "str": str, "moe_freq_type": _layer_pattern}
    for a in MEGATRON_DATA["arguments"]:
        kw = {"dest": a["dest"]}
        if a["action"] in ("store_true", "store_false"):
            kw["action"] = a["action"]
        elif a["action"] == "booleanoptional":
            kw["action"] = argparse.BooleanOptionalAction
            a = {**a, "flags": [f for f in a["flags"] if not f.startswith("--no-")]}
        else:
            kw["type"] = types.get(a["type"], str)
            if a["nargs"] is not None:
                kw["nargs"] = a["nargs"]
            if a["choices"] is not None:
                kw["choices"] = [type(c)(c) if not isinstance(c, str) else c
                                 for c in a["choices"]]
                if a["type"] == "enum":
                    kw["type"] = str
        parser.add_argument(*a["flags"], **kw)
    return parser


def megatron_argv(text: str, **env) -> tuple[list[str], str]:
    """Runs the megatron form's script with a stand-in torchrun on PATH and returns the
    arguments pretrain_gpt.py would get and CUDA_DEVICE_MAX_CONNECTIONS as the script left it
    ("unset" when unset)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "argv"
        fake = Path(tmp) / "torchrun"
        fake.write_text("#!/bin/bash\nprintf '%s\\0' \"$@\" > \"$FAKE_ARGV\"\n"
                        "echo \"${CUDA_DEVICE_MAX_CONNECTIONS-unset}\" > \"$FAKE_ARGV.env\"\n")
        fake.chmod(0o755)
        script = Path(tmp) / "megatron.sh"
        script.write_text(text)
        run_env = {**os.environ, **MEGATRON_PLACEHOLDERS, **env, "FAKE_ARGV": str(out),
                   "PATH": f"{tmp}:{os.environ['PATH']}"}
        run_env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        subprocess.run(["bash", str(script)], env=run_env, check=True)
        argv = out.read_bytes().split(b"\0")[:-1]
        conn = (Path(tmp) / "argv.env").read_text().strip()
    argv = [a.decode() for a in argv]
    start = next(i for i, a in enumerate(argv) if a.endswith("/pretrain_gpt.py"))
    return argv[start + 1:], conn


def _megatron_flags(text: str) -> dict[str, list[str]]:
    """The megatron form's pretrain_gpt.py arguments, as the script passes them (run with a
    stand-in torchrun), parsed by Megatron-LM's parser rebuilt from data: {flag: [values]}."""
    argv, _ = megatron_argv(text)
    megatron_parser().parse_args(argv)  # unknown flags, arity, types and choices fail here
    flags: dict[str, list[str]] = {}
    for tok in argv:
        if tok.startswith("--"):
            flags[tok] = []
            last = tok
        else:
            flags[last].append(tok)
    return flags


megatron_flags = _megatron_flags
MEGATRON_CHOICES = {  # the choices= / Literal values of the flags that take one
    "--normalization": {"LayerNorm", "RMSNorm"},
    "--position-embedding-type": {"learned_absolute", "rope", "yarn", "mrope", "relative",
                                  "none"},
    "--fp8-format": {"e4m3", "hybrid"},
    "--fp8-recipe": {"tensorwise", "delayed", "mxfp8", "blockwise", "custom"},
    "--fp4-format": {"e2m1"}, "--fp4-recipe": {"nvfp4", "custom"},
    "--recompute-granularity": {"full", "selective"},
    "--recompute-method": {"uniform", "block"},
    "--data-parallel-sharding-strategy": {"no_shard", "optim", "optim_grads",
                                          "optim_grads_params"},
    "--ckpt-format": {"torch", "torch_dist", "torch_dcp", "fsdp_dtensor"},
    "--attention-backend": {"flash", "fused", "unfused", "local", "auto"},
    "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"},
}
# TransformerConfig.offload_modules' documented choices
MEGATRON_OFFLOAD_MODULES = {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                            "expert_fc1", "moe_act", "fused_group_mlp", "gdp_qkv"}

# torchtitan: tests/test_launch_torchtitan.py runs the config module against stand-ins built from
# torchtitan's config classes at the commit the form names (tests/data/launch_torchtitan_config.json)

# DeepSpeed: the keys DeepSpeedConfig reads at the commit the form names, as data
# (tests/data/launch_deepspeed_config.json); tests/test_launch_deepspeed.py checks every key and
# value against DeepSpeed's pydantic models and enums there
DEEPSPEED_COMMIT = DEEPSPEED_DATA["commit"]
assert DEEPSPEED_COMMIT == "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"  # deepspeedai/DeepSpeed
DEEPSPEED_KEYS = frozenset(DEEPSPEED_DATA["keys"])


def _out(run, *args):
    code, out, err = run(*args)
    assert code == 0, err
    return out


@pytest.mark.parametrize("args", [GPT3, RESNET])
def test_env_is_evaluated_by_the_shell_and_matches_json(run, run_json, args):
    cfg = run_json(*args)["config"]
    env = _out(run, *args, "--format", "env")
    show = 'for v in ${!PLANNER_@}; do echo "$v=${!v}"; done'
    shell = subprocess.run(["bash", "-c", env + "\n" + show], capture_output=True, text=True,
                           check=True).stdout
    got = dict(line.split("=", 1) for line in shell.splitlines() if line.startswith("PLANNER_"))
    assert int(got["PLANNER_NODES"]) == cfg["nodes"]
    assert int(got["PLANNER_DEVICES_PER_NODE"]) == cfg["devices_per_node"]
    assert int(got["PLANNER_GLOBAL_BATCH"]) == cfg["global_batch"]
    tp, pp = cfg.get("tp", 1), cfg.get("pp", 1)
    assert (int(got["PLANNER_TP"]), int(got["PLANNER_PP"])) == (tp, pp)
    assert int(got["PLANNER_DP"]) * tp * pp == cfg["devices"]
    mb = int(got["PLANNER_MICRO_BATCH"])
    assert mb * int(got["PLANNER_GRADIENT_ACCUMULATION"]) * int(got["PLANNER_DP"]) == \
        cfg["global_batch"]


def test_megatron_gpt3_flags_exist_and_agree_with_json(run, run_json):
    doc = run_json(*GPT3)
    cfg = doc["config"]
    flags = _megatron_flags(_out(run, *GPT3, "--format", "megatron"))
    assert set(flags) <= MEGATRON_FLAGS, set(flags) - MEGATRON_FLAGS
    for flag, choices in MEGATRON_CHOICES.items():
        if flag in flags:
            assert flags[flag][0] in choices
    one = {k: int(v[0]) for k, v in flags.items() if len(v) == 1 and v[0].isdigit()}
    assert one["--num-layers"] == 96 and one["--hidden-size"] == 12288
    assert one["--num-attention-heads"] == 96 and one["--ffn-hidden-size"] == 4 * 12288
    assert one["--seq-length"] == 2048 and one["--max-position-embeddings"] == 2048
    assert one["--vocab-size"] == 50257
    assert one["--tensor-model-parallel-size"] == cfg["tp"]
    assert one["--pipeline-model-parallel-size"] == cfg["pp"]
    assert one["--micro-batch-size"] == cfg["micro_batch"]
    assert one["--global-batch-size"] == cfg["global_batch"]
    assert ("--sequence-parallel" in flags) == cfg["sequence_parallel"]
    if cfg["interleave"] > 1:
        assert one["--num-virtual-stages-per-pipeline-rank"] == cfg["interleave"]
    assert flags["--position-embedding-type"] == ["learned_absolute"]
    assert flags["--normalization"] == ["LayerNorm"]
    assert "--swiglu" not in flags and "--disable-bias-linear" not in flags
    assert "--fp16" in flags  # the A100's default precision in its spec
    zero = {0: None, 1: "--use-distributed-optimizer", 2: "optim_grads",
            3: "optim_grads_params"}[cfg["zero"]]
    if cfg["zero"] >= 2:
        assert flags["--data-parallel-sharding-strategy"] == [zero]
        assert "--use-megatron-fsdp" in flags and flags["--ckpt-format"] == ["fsdp_dtensor"]
    elif zero:
        assert zero in flags


def test_megatron_llama3_70b_defines_the_model(run, run_json):
    doc = run_json(*LLAMA)
    assert doc["prediction"]["fits_memory"]
    flags = _megatron_flags(_out(run, *LLAMA, "--format", "megatron"))
    assert set(flags) <= MEGATRON_FLAGS
    want = {"--num-layers": ["80"], "--hidden-size": ["8192"], "--num-attention-heads": ["64"],
            "--group-query-attention": [], "--num-query-groups": ["8"],
            "--ffn-hidden-size": ["28672"], "--swiglu": [], "--normalization": ["RMSNorm"],
            "--position-embedding-type": ["rope"], "--max-position-embeddings": ["8192"],
            "--seq-length": ["8192"], "--vocab-size": ["128256"],
            "--untie-embeddings-and-output-weights": [], "--disable-bias-linear": [],
            "--bf16": [], "--tensor-model-parallel-size": ["8"],
            "--pipeline-model-parallel-size": ["4"], "--sequence-parallel": [],
            "--recompute-granularity": ["full"], "--recompute-method": ["uniform"],
            "--recompute-num-layers": ["1"], "--micro-batch-size": ["1"],
            "--global-batch-size": ["64"]}
    for flag, values in want.items():
        assert flags.get(flag) == values, flag
    assert "--use-distributed-optimizer" not in flags  # ZeRO 0


@pytest.mark.parametrize(("zero", "expect"), [
    (1, ["--use-distributed-optimizer"]),
    (3, ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]),
])
def test_megatron_zero_maps_to_what_shards_the_same_state(run, zero, expect):
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--tp",
            "8", "--global-batch", "64", "--zero", str(zero), "--precision", "fp8")
    code, out, err = run(*args, "--format", "megatron")
    assert code == 0, err
    tokens, conn = megatron_argv(out)
    assert set(_megatron_flags(out)) <= MEGATRON_FLAGS
    joined = " ".join(tokens)
    assert " ".join(expect) in joined
    assert "--bf16 --fp8-format hybrid" in joined
    # validate_args: tp > 1 wants 1 before Blackwell; Megatron-FSDP asserts it is not 1
    assert conn == ("unset" if zero >= 2 else "1")


def test_megatron_uneven_pipeline_stages():
    # pp divides the layers: no flags; otherwise first/last sizes with equal middle stages,
    # none above ceil(L / pp), the layout the cost model prices
    assert uneven_stages(96, 8) is None
    for layers in range(2, 130):
        for pp in range(2, min(layers, 17)):
            most = -(-layers // pp)
            try:
                got = uneven_stages(layers, pp)
            except SpecError:  # then no first / last / equal-middle layout exists: brute force
                assert not any(
                    layers - f - la >= 1 and (layers - f - la) % (pp - 2) == 0
                    and (layers - f - la) // (pp - 2) <= most
                    for f in range(1, most + 1) for la in range(1, most + 1))
                continue
            if layers % pp == 0:
                assert got is None
                continue
            first, last = got
            middle = layers - first - last
            assert 1 <= first <= most and 1 <= last <= most
            if pp > 2:
                assert middle % (pp - 2) == 0 and 1 <= middle // (pp - 2) <= most
            else:
                assert middle == 0


def test_megatron_and_torchtitan_need_a_transformer(run):
    """Said first, whatever else the form would refuse (torchtitan writes AdamW only: a CNN
    plan priced with SGD or without overlap was told to use the Megatron form)."""
    for fmt in ("megatron", "torchtitan"):
        for extra in ((), ("--optimizer", "sgd"), ("--no-overlap",)):
            code, _, err = run(*RESNET, *extra, "--format", fmt)
            assert code == 2 and "needs a transformer model" in err, err
            assert len(err.strip().splitlines()) == 1


def test_a_cnn_plan_carries_its_optimizer_and_its_pipeline_schedule(run, run_json):
    """A CNN plan's optimizer is the one it was priced with (the JSON config and the env
    form; it had been None, written as adam), and a CNN pipeline, priced as 1F1B
    (`planner.cost.stages`), is written as 1F1B."""
    assert run_json(*RESNET, "--optimizer", "sgd")["config"]["optimizer"] == "sgd"
    assert run_json(*RESNET)["config"]["optimizer"] == "momentum"  # the CNN default
    assert "PLANNER_OPTIMIZER=sgd" in _out(run, *RESNET, "--optimizer", "sgd", "--format", "env")
    # a ds_config names no optimizer and a CNN plan is ZeRO 0: the script's own runs
    assert json.loads(_out(run, *RESNET, "--format", "deepspeed"))["zero_optimization"] == \
        {"stage": 0}
    pipe = ("solve", "-m", "vgg16", "-H", "dgx-a100-80gb", "--global-batch", "64",
            "--strategy", "pipeline", "--devices-max", "8")
    assert run_json(*pipe)["config"]["stages"] > 1
    assert "PLANNER_SCHEDULE=1f1b" in _out(run, *pipe, "--format", "env")


# Llama-3-8B on 2 DGX H100 with a 2-stage pipeline; on one with tp 2 (DeepSpeed AutoTP)
# (sequence 2,048: no recomputation, which a ds_config cannot turn on)
DS_PP = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--pp", "2",
         "--micro-batch", "1", "--global-batch", "64", "--seq-len", "2048", "--precision",
         "bf16")
DS_TP = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "8", "--tp", "2",
         "--global-batch", "64", "--zero", "1", "--seq-len", "2048", "--precision", "bf16")


def test_deepspeed_config_parses_and_batch_is_micro_x_accumulation_x_dp(run, run_json):
    doc = run_json(*DS_PP)
    cfg = doc["config"]
    ds = json.loads(_out(run, *DS_PP, "--format", "deepspeed"))
    assert set(ds) <= DEEPSPEED_KEYS
    assert cfg["pp"] > 1
    assert ds["train_batch_size"] == cfg["micro_batch"] * cfg["gradient_accumulation"] * \
        cfg["dp"] == cfg["global_batch"]
    assert ds["train_micro_batch_size_per_gpu"] == cfg["micro_batch"]
    assert ds["gradient_accumulation_steps"] == cfg["gradient_accumulation"]
    assert ds["zero_optimization"]["stage"] == cfg["zero"]
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds
    fp16 = json.loads(_out(run, *DS_PP[:-2], "--precision", "fp16", "--format", "deepspeed"))
    assert fp16["fp16"]["enabled"] is True and "bf16" not in fp16
    # bf16 under ZeRO: fp32 gradients accumulated and reduced, as priced
    zero1 = json.loads(_out(run, *DS_PP, "--zero", "1", "--format", "deepspeed"))
    assert zero1["communication_data_type"] == "fp32"
    assert zero1["data_types"] == {"grad_accum_dtype": "fp32"}
    assert "data_types" not in ds and "data_types" not in fp16
    # tensor parallelism: AutoTP over tp ranks; the batch counts data-parallel ranks only
    cfg = run_json(*DS_TP)["config"]
    ds = json.loads(_out(run, *DS_TP, "--format", "deepspeed"))
    assert set(ds) <= DEEPSPEED_KEYS
    assert ds["tensor_parallel"] == {"autotp_size": 2}
    assert ds["train_batch_size"] == cfg["micro_batch"] * cfg["gradient_accumulation"] * \
        cfg["dp"] == cfg["global_batch"] != cfg["micro_batch"] * \
        cfg["gradient_accumulation"] * cfg["devices"]


@pytest.mark.parametrize(("extra", "names"), [
    (("--tp", "2", "--pp", "2"), "pipeline engine"),  # AutoTP under PipelineEngine
    (("--tp", "2", "--sequence-parallel"), "sequence parallelism"),
    (("--pp", "2", "--interleave", "2"), "interleaved"),
    (("--precision", "fp8"), "fp8"),
    (("--precision", "mxfp8"), "mxfp8"),
    (("--recompute", "full"), "activation recomputation"),  # the model code's call
    (("--recompute", "selective"), "activation recomputation"),
])
def test_deepspeed_expresses_the_plan_or_refuses_it(run, extra, names):
    """One rule for every format: what the ds_config cannot say is refused (exit 2) with a
    one-line message naming the format that can, never dropped."""
    base = ("evaluate", "-m", "llama3-8b", "-H", "dgx-b200" if "mxfp8" in extra else "dgx-h100",
            "--devices", "16", "--global-batch", "64", "--seq-len", "2048", "--zero", "1")
    code, _, err = run(*base, *extra, "--format", "deepspeed")
    assert code == 2 and names in err and "--format megatron" in err, err
    assert len(err.strip().splitlines()) == 1


def test_deepspeed_refuses_zero_2_with_a_pipeline(run):
    code, _, err = run(*GPT3, "--format", "deepspeed", "--zero", "2", "--pp", "4")
    assert code == 2 and "ZeRO" in err and len(err.strip().splitlines()) == 1


def test_torchtitan_float8_where_chosen(run):
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "8", "--tp", "8",
            "--global-batch", "64", "--precision", "fp8", "--format", "torchtitan")
    cfg = torchtitan_config(_out(run, *args), devices=8)
    assert cfg.model_spec.flavor == "8B"
    (conv,) = cfg.model_spec.converters
    assert type(conv).__name__ == "Float8LinearConverter.Config"
    assert conv.filter_fqns == ["lm_head"]  # the output projection stays bf16


def test_slurm_is_a_complete_script(run, run_json, tmp_path):
    cfg = run_json(*GPT3)["config"]
    text = _out(run, *GPT3, "--format", "slurm")
    script = tmp_path / "job.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert text.startswith("#!/bin/bash\n")
    sbatch = dict(re.findall(r"^#SBATCH (--[a-z-]+)=(\S+)$", text, re.M))
    assert int(sbatch["--nodes"]) == cfg["nodes"]
    assert sbatch["--ntasks-per-node"] == "1"
    assert int(sbatch["--gpus-per-node"]) == cfg["devices_per_node"]
    # one task per node runs all its ranks: give it cores for each (8 per device)
    assert int(sbatch["--cpus-per-task"]) == 8 * cfg["devices_per_node"]
    assert sbatch["--time"] == "1-00:00:00"  # the default without a training target
    # the header's split names every degree, cp included
    assert f"tp {cfg['tp']} x cp {cfg['cp']} x pp {cfg['pp']} x dp {cfg['dp']}" in text
    srun = next(line.strip() for line in text.splitlines() if "srun" in line
                and "torchrun" in line)
    words = shlex.split(srun)
    assert words[0] == "srun" and words[1] == '--cpus-per-task=$SLURM_CPUS_PER_TASK'
    assert words[2] == "torchrun"
    assert f"--nnodes={cfg['nodes']}" in words
    assert f"--nproc-per-node={cfg['devices_per_node']}" in words
    assert words[words.index("--rdzv-backend") + 1] == "c10d"
    assert words[words.index("--rdzv-endpoint") + 1] == "$head_node:29500"


def test_slurm_runs_the_megatron_script_and_sets_what_megatron_asserts(run, tmp_path):
    """TRAIN_SCRIPT=megatron.sh runs the megatron form on every node (it starts torchrun);
    CUDA_DEVICE_MAX_CONNECTIONS as validate_args wants it, in both forms."""
    text = _out(run, *LLAMA, "--format", "slurm")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text  # tp 8
    fake = tmp_path / "srun"
    fake.write_text('#!/bin/bash\necho "$@" > "$OUT"\n')
    fake.chmod(0o755)
    (tmp_path / "scontrol").write_text("#!/bin/bash\necho node1; echo node2\n")
    (tmp_path / "scontrol").chmod(0o755)
    (tmp_path / "job.sh").write_text(text)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "OUT": str(tmp_path / "o"),
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_CPUS_PER_TASK": "64", "SLURM_JOB_ID": "7",
           "TRAIN_SCRIPT": "megatron.sh"}
    subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, check=True)
    assert (tmp_path / "o").read_text().split() == ["--cpus-per-task=64", "bash", "megatron.sh"]
    fsdp = _out(run, *LLAMA, "--zero", "3", "--format", "slurm")
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in fsdp and "MAX_CONNECTIONS=1" not in fsdp


def test_slurm_time_is_capped_per_job_with_a_chain(run):
    """A run longer than a cluster's per-job limit gets --time at that limit (48 h) and the
    number of chained jobs, with how to chain them."""
    args = ("solve", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices-max", "1024",
            "--global-batch", "1536", "--critical-batch", "4096", "--target-tokens", "3e11")
    text = _out(run, *args, "--format", "slurm")
    assert re.search(r"^#SBATCH --time=2-00:00:00$", text, re.M)
    jobs = int(re.search(r"run it as (\d+) chained jobs", text).group(1))
    assert jobs > 1 and "--dependency=afterok:$jid" in text and "--requeue" in text
    assert slurm_time(10 * 86400, 48 * 3600) == "2-00:00:00"


def test_slurm_time_from_the_predicted_time_to_train(run, run_json):
    args = ("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "16",
            "--global-batch", "64", "--critical-batch", "128", "--target-tokens", "1e9")
    ttt = run_json(*args)["prediction"]["time_to_train_s"]
    text = _out(run, *args, "--format", "slurm")
    got = re.search(r"^#SBATCH --time=(\d+)-(\d\d):(\d\d):(\d\d)$", text, re.M).groups()
    d, h, m, s = map(int, got)
    seconds = ((d * 24 + h) * 60 + m) * 60 + s
    assert ttt * 1.25 + 15 * 60 <= seconds < ttt * 1.25 + 16 * 60
    assert slurm_time(None) == "1-00:00:00" and slurm_time(0) == "0-00:15:00"
    assert slurm_time(86400) == "1-06:15:00"


def test_torchrun_agrees_with_json(run, run_json):
    cfg = run_json(*GPT3)["config"]
    tr = _out(run, *GPT3, "--format", "torchrun")
    assert f"--nnodes={cfg['nodes']} --nproc-per-node={cfg['devices_per_node']}" in tr


def test_no_launcher_config_for_a_plan_that_does_not_fit(run, run_json):
    # Llama-3-70B, tp 8 x pp 3, no recompute: over the 80 GiB of an H100
    args = ("evaluate", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "24", "--tp", "8",
            "--pp", "3", "--global-batch", "48")
    doc = run_json(*args)
    assert doc["prediction"]["fits_memory"] is False
    code, out, _ = run(*args)
    assert code == 0 and "DOES NOT FIT" in out
    for fmt in ("env", "slurm", "torchrun", "megatron", "deepspeed", "torchtitan"):
        code, out, err = run(*args, "--format", fmt)
        assert code == 1 and out == "", fmt
        assert "does not fit" in err and len(err.strip().splitlines()) == 1


def test_memory_headroom_decides_the_fit(run, run_json):
    # 94.8 % of the 77 GiB a process can use on an 80 GiB A100 (3 GiB are the runtime's):
    # fits with no headroom, not with 6 % kept free
    doc = run_json(*TIGHT, "--memory-headroom", "0")
    pred = doc["prediction"]
    assert pred["fits_memory"] and 0.94 < pred["memory_bytes_per_device"] / \
        pred["memory_capacity_bytes"] < 1
    assert pred["memory_capacity_bytes"] == pytest.approx(77 * 2**30)
    doc = run_json(*TIGHT, "--memory-headroom", "0.06")
    assert doc["prediction"]["fits_memory"] is False
    assert doc["prediction"]["memory_capacity_bytes"] == pytest.approx(0.94 * 77 * 2**30)
    assert run(*TIGHT, "--format", "megatron")[0] == 0
    assert run(*TIGHT, "--memory-headroom", "0.06", "--format", "megatron")[0] == 1
    # CNNs: resnet50 with 1080 samples per A100 is 98.9 % of its 77 usable GiB
    cnn = ("evaluate", "-m", "resnet50", "-H", "dgx-a100-80gb", "--devices", "8",
           "--local-batch", "1080")
    assert run_json(*cnn)["prediction"]["fits_memory"] is True
    assert run_json(*cnn, "--memory-headroom", "0.05")["prediction"]["fits_memory"] is False


def test_memory_headroom_in_solve_and_sweep(run, run_json):
    args = ("solve", "-m", "llama3-8b", "-H", "dgx-a100-80gb", "--devices", "8",
            "--global-batch", "64")
    for headroom in ("0", "0.3"):
        pred = run_json(*args, "--memory-headroom", headroom)["prediction"]
        cap = (1 - float(headroom)) * 77 * 2**30  # 80 GiB less the 3 GiB runtime reserve
        assert pred["memory_capacity_bytes"] == pytest.approx(cap)
        assert pred["memory_bytes_per_device"] <= cap
    sw = run_json("sweep", "-m", "resnet50", "-H", "dgx-a100-80gb", "--local-batch", "1080",
                  "--nodes", "1,2", "--memory-headroom", "0.05")
    assert all(p["fits_memory"] is False for p in sw["points"])
    code, _, err = run(*args, "--memory-headroom", "1")
    assert code == 2 and "memory-headroom" in err


def test_memory_headroom_default_is_shown_in_help(run):
    for cmd in ("evaluate", "solve", "sweep"):
        code, out, _ = run(cmd, "--help")
        assert code == 0
        text = " ".join(out.split())
        assert "--memory-headroom" in text and "[default: 0.0" in text.split(
            "--memory-headroom", 1)[1][:400]


def test_env_values_are_quoted(tmp_path, run):
    """A model file path with shell metacharacters comes out quoted, not executed."""
    spec = tmp_path / "m;touch pwned.yaml"
    spec.write_text("kind: transformer\nname: tiny\nlayers: 2\nhidden: 64\nheads: 4\n"
                    "seq_len: 64\nvocab: 100\n")
    env = _out(run, "evaluate", "-m", str(spec), "-H", "dgx-a100-80gb", "--devices", "8",
               "--global-batch", "64", "--format", "env")
    got = subprocess.run(["bash", "-c", env + '\necho "$PLANNER_MODEL"'], cwd=tmp_path,
                         check=True, capture_output=True, text=True).stdout.strip()
    assert got == str(spec) and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4"])
def test_megatron_precision_flags_exist(precision):
    from planner.catalog import load_model
    from planner.launch import Target, megatron, megatron_args

    plan = {"nodes": 1, "devices_per_node": 8, "devices": 8, "tp": 8, "pp": 1, "dp": 1,
            "micro_batch": 1, "global_batch": 8, "gradient_accumulation": 8, "interleave": 1,
            "recompute": "none", "sequence_parallel": False, "zero": 0, "schedule": "1f1b",
            "overlap": True, "flash_attention": True}
    target = Target(load_model("llama3-8b"), precision)
    flags = _megatron_flags(megatron({}, plan, target))
    assert set(flags) <= MEGATRON_FLAGS
    for flag, choices in MEGATRON_CHOICES.items():
        if flag in flags:
            assert flags[flag][0] in choices, flag
    assert ("--bf16" in flags) == (precision in ("bf16", "fp8", "mxfp8", "nvfp4"))
    argv, _ = megatron_argv(megatron({}, plan, target))
    assert argv[:len(megatron_args({}, plan, target))] == megatron_args({}, plan, target)


MIXTRAL = ("evaluate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "--devices", "64", "--tp", "2",
           "--ep", "8", "--etp", "1", "--pp", "4", "--global-batch", "256", "--seq-len", "4096",
           "--recompute", "full", "--zero", "1")


def test_megatron_moe_stages_overlap_and_offload_flags(run, run_json):
    args = (*MIXTRAL, "--first-stage-layers", "5", "--last-stage-layers", "9", "--tp-overlap",
            "--capacity-factor", "1.25")
    cfg = run_json(*args)["config"]
    assert (cfg["etp"], cfg["first_stage_layers"], cfg["last_stage_layers"]) == (1, 5, 9)
    flags = _megatron_flags(_out(run, *args, "--format", "megatron"))
    assert set(flags) <= MEGATRON_FLAGS, set(flags) - MEGATRON_FLAGS
    for flag, choices in MEGATRON_CHOICES.items():
        if flag in flags:
            assert flags[flag][0] in choices, flag
    assert flags["--expert-tensor-parallel-size"] == ["1"]
    assert flags["--expert-model-parallel-size"] == ["8"]
    assert flags["--decoder-first-pipeline-num-layers"] == ["5"]
    assert flags["--decoder-last-pipeline-num-layers"] == ["9"]
    assert flags["--moe-expert-capacity-factor"] == ["1.25"]
    assert "--moe-pad-expert-input-to-capacity" in flags and "--tp-comm-overlap" in flags
    assert "--sequence-parallel" in flags
    flags = _megatron_flags(_out(run, *MIXTRAL[:-4], "--recompute", "selective", "--zero", "1",
                                 "--interleave", "2", "--ep-overlap", "--format", "megatron"))
    assert "--overlap-moe-expert-parallel-comm" in flags
    # etp = tp is Megatron's default: no flag
    default = tuple(x for i, x in enumerate(MIXTRAL) if "--etp" not in MIXTRAL[i - 1:i + 1])
    assert "--etp" not in default and len(default) == len(MIXTRAL) - 2
    flags = _megatron_flags(_out(run, *default, "--format", "megatron"))
    assert "--expert-tensor-parallel-size" not in flags


def test_megatron_offload_modules_are_its_choices(run):
    args = ("evaluate", "-m", "llama3-70b", "-H", "gb200-nvl72", "--devices", "64", "--tp", "4",
            "--pp", "2", "--global-batch", "128", "--sequence-parallel", "--zero", "1",
            "--offload-activations")
    flags = _megatron_flags(_out(run, *args, "--format", "megatron"))
    assert "--fine-grained-activation-offloading" in flags
    assert set(flags["--offload-modules"]) <= MEGATRON_OFFLOAD_MODULES
    code, _, err = run(*args, "--format", "torchtitan")
    assert code == 2 and "no activation offload" in err


def test_uneven_chunks_get_a_megatron_layout_and_torchtitan_stage_weights(run):
    args = ("evaluate", "-m", "llama3.1-405b", "-H", "dgx-h100", "--devices", "16384", "--tp",
            "8", "--pp", "16", "--interleave", "8", "--global-batch", "2048", "--seq-len",
            "8192", "--sequence-parallel", "--zero", "1", "--recompute", "full")
    flags = _megatron_flags(_out(run, *args, "--format", "megatron"))
    assert "--num-virtual-stages-per-pipeline-rank" not in flags  # exclusive with the layout
    layout = flags["--pipeline-model-parallel-layout"][0].split("|")
    assert len(layout) == 16 * 8 and sum(c.count("t") for c in layout) == 126
    par = torchtitan_config(_out(run, *args, "--format", "torchtitan"),
                            devices=16384).parallelism
    # torchtitan: ceil((126 + 1 + 1) / 1) = 128 virtual stages, the first and last empty
    assert par.pipeline_parallel_layers_per_stage == 1
    assert (par.pipeline_parallel_first_stage_less_layers,
            par.pipeline_parallel_last_stage_less_layers) == (1, 1)


def test_eager_kernels_turn_megatron_fusions_off_and_torchtitan_compile_off(run):
    """--kernels eager: Megatron's fusions off (its flags, each in arguments.py); torchtitan
    runs eager unless compiled, so fused plans enable torch.compile and eager ones do not."""
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "8", "--tp", "2",
            "--global-batch", "64", "--sequence-parallel", "--zero", "1")
    fused = _megatron_flags(_out(run, *args, "--format", "megatron"))
    eager = _megatron_flags(_out(run, *args, "--kernels", "eager", "--format", "megatron"))
    assert set(eager) <= MEGATRON_FLAGS
    assert set(eager) - set(fused) == {"--no-masked-softmax-fusion", "--no-bias-dropout-fusion",
                                       "--no-bias-swiglu-fusion", "--no-rope-fusion"}
    gpt = _megatron_flags(_out(run, *GPT3, "--kernels", "eager", "--format", "megatron"))
    assert "--no-bias-gelu-fusion" in gpt and "--no-rope-fusion" not in gpt
    assert torchtitan_config(_out(run, *args, "--format", "torchtitan")).compile.enable
    assert not torchtitan_config(_out(run, *args, "--kernels", "eager", "--format",
                                      "torchtitan")).compile.enable
    code, _, err = run(*args, "--kernels", "eager", "--tp-overlap", "--format", "torchtitan")
    assert code == 2 and "torch.compile" in err


def test_a_token_budget_sets_the_launchers_steps_and_time(run, run_json):
    """`--tokens` prices the run for a token budget (the document's `token_budget`): the
    launchers write its steps and its time to train, as for a critical batch's target."""
    args = ("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "16",
            "--global-batch", "64", "--tokens", "1e9")
    budget = run_json(*args)["token_budget"]
    text = _out(run, *args, "--format", "slurm")
    got = re.search(r"^#SBATCH --time=(\d+)-(\d\d):(\d\d):(\d\d)$", text, re.M).groups()
    d, h, m, s = map(int, got)
    seconds = ((d * 24 + h) * 60 + m) * 60 + s
    ttt = budget["time_to_train_s"]
    assert ttt * 1.25 + 15 * 60 <= seconds < ttt * 1.25 + 16 * 60
    assert "no training target" not in text
    mega = _out(run, *args, "--format", "megatron")
    assert f'TRAIN_ITERS="${{TRAIN_ITERS:-{math.ceil(budget["steps"])}}}"' in mega


@pytest.mark.parametrize("form, args", [
    ("deepspeed", ("-m", "llama3-8b", "-H", "dgx-h100", "--devices-max", "16",
                   "--global-batch", "128")),
    ("torchtitan", ("-m", "qwen3-30b-a3b", "-H", "dgx-h100", "--devices-max", "64",
                    "--global-batch", "256")),
    ("deepspeed", ("-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices-max", "512",
                   "--global-batch", "1536")),
])
def test_solve_for_a_form_picks_a_plan_the_form_writes(run, run_json, form, args):
    """`solve --format F` searches only the plans F writes (`planner.rules.FORM_RULES`): its
    pick is written (exit 0; these picks had been refused: tp with sequence parallelism for
    DeepSpeed, partial recompute for torchtitan), `--framework F` picks the same plan, and it
    is no faster than the pick of a search free of the form."""
    code, _, err = run("solve", *args, "--format", form)
    assert code == 0, err
    framed = run_json("solve", *args, "--framework", form)
    free = run_json("solve", *args, "--prefer-supported", "0")
    assert framed["framework"] == form
    assert framed["prediction"]["iteration_time_s"] >= free["prediction"]["iteration_time_s"]
    plan = framed["config"]
    rules.check_form(form, plan)  # what the writer checks too
    if form == "deepspeed":
        assert plan["cp"] == 1 and plan["ep"] == 1 and not (plan["tp"] > 1 and plan["pp"] > 1)
        assert plan["recompute"] == "none" and not plan.get("recompute_layers")
        assert not (plan["tp"] > 1 and plan["sequence_parallel"])
    else:
        assert not plan.get("recompute_layers")


@pytest.mark.parametrize("pins, says", [
    (("--zero", "2", "--pp", "4"), "ZeRO stage 0 or 1 only"),
    (("--cp", "2"), "no ring-attention context parallelism"),
    (("--tp", "2", "--pp", "2"), "does not run under its pipeline engine"),
])
def test_solve_for_a_form_refuses_pins_it_cannot_write(run, pins, says):
    """Pins that break one of the form's rules whatever else the search chooses: the rule's
    one line, exit 2 (not an empty search's infeasibility)."""
    code, _, err = run("solve", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices-max",
                       "4096", "--global-batch", "1536", *pins, "--format", "deepspeed")
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("given", [("--devices", "64", "--devices-max", "32"),
                                   ("--nodes", "8", "--nodes-max", "2")])
def test_a_transformer_solve_refuses_a_budget_below_its_pinned_size(run, given):
    code, _, err = run("solve", "-m", "llama3-8b", "-H", "dgx-h100", "--global-batch", "512",
                       *given)
    assert code == 2 and " is over " in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args, check", [
    (("-m", "deepseek-v3", "-H", "gb200-nvl72", "--devices-max", "256", "--global-batch",
      "1024"), lambda c: c["pp"] == 1 and c["cp"] == 1),  # multi-token prediction
    (("-m", "llama3-8b", "-H", "dgx-h100", "--devices-max", "64", "--global-batch", "512",
      "--cuda-graphs"), lambda c: c["pp"] == 1 and c["ep"] == 1),
])
def test_solve_for_torchtitan_keeps_to_its_model_and_switch_rules(run, run_json, args, check):
    """torchtitan's rules that depend on the model (MTP without pp or cp) or on a pinned switch
    (CUDA graphs without pp or ep) bound its search too: the form writes the pick."""
    code, _, err = run("solve", *args, "--format", "torchtitan")
    assert code == 0, err
    assert check(run_json("solve", *args, "--framework", "torchtitan")["config"])


def test_a_spec_file_name_cannot_add_a_line_to_a_generated_script(run, tmp_path):
    """A model file whose name holds a newline and a command: every form keeps it inside a
    comment (escaped) or a quoted value; the sbatch script had run the command."""
    import shutil

    from planner.catalog import MODELS

    path = tmp_path / "x\necho PWNED\n.yaml"
    shutil.copy(MODELS / "llama3-8b.yaml", path)
    args = ("solve", "-m", str(path), "-H", "dgx-h100", "--devices-max", "8", "--global-batch",
            "64")
    for fmt in ("slurm", "megatron", "torchtitan", "torchrun", "deepspeed", "env"):
        out = _out(run, *args, "--format", fmt)
        assert not any(line.startswith("echo PWNED") for line in out.splitlines()
                       if fmt != "env"), fmt
        if fmt == "torchtitan":
            ast.parse(out)
        if fmt == "env":  # the value is one quoted word: sourcing it runs nothing
            shell = subprocess.run(["bash", "-c", out + '\nprintf %s "$PLANNER_MODEL"'],
                                   capture_output=True, text=True, check=True).stdout
            assert shell == str(path)
