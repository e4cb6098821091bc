"""Launcher outputs: each agrees with the JSON plan; env output is shell-evalable and quoted."""

import json
import re
import subprocess

import pytest

GPT3 = ("solve", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices-max", "4096",
        "--global-batch", "1536")
RESNET = ("solve", "-m", "resnet50", "-H", "dgx-a100-80gb", "--global-batch", "4096")


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


def test_slurm_torchrun_megatron_deepspeed_agree_with_json(run, run_json):
    cfg = run_json(*GPT3)["config"]
    slurm = _out(run, *GPT3, "--format", "slurm")
    assert f"#SBATCH --nodes={cfg['nodes']}\n" in slurm
    assert f"#SBATCH --ntasks-per-node={cfg['devices_per_node']}\n" in slurm
    assert f"#SBATCH --gpus-per-node={cfg['devices_per_node']}\n" in slurm
    tr = _out(run, *GPT3, "--format", "torchrun")
    assert f"--nnodes={cfg['nodes']} --nproc-per-node={cfg['devices_per_node']}" in tr
    meg = _out(run, *GPT3, "--format", "megatron")
    flags = dict(re.findall(r"--([a-z-]+) (\d+)", meg))
    assert int(flags["tensor-model-parallel-size"]) == cfg["tp"]
    assert int(flags["pipeline-model-parallel-size"]) == cfg["pp"]
    assert int(flags["micro-batch-size"]) == cfg["micro_batch"]
    assert int(flags["global-batch-size"]) == cfg["global_batch"]
    assert ("--sequence-parallel" in meg) == cfg["sequence_parallel"]
    if cfg["interleave"] > 1:
        assert int(flags["num-layers-per-virtual-pipeline-stage"]) * cfg["pp"] * \
            cfg["interleave"] == 96
    ds = json.loads(_out(run, *GPT3, "--format", "deepspeed"))
    assert ds["train_batch_size"] == cfg["global_batch"]
    assert ds["train_micro_batch_size_per_gpu"] == cfg["micro_batch"]
    assert ds["gradient_accumulation_steps"] == cfg["gradient_accumulation"]
    assert ds["zero_optimization"]["stage"] == cfg["zero"]


def test_megatron_format_needs_a_transformer(run):
    code, _, err = run(*RESNET, "--format", "megatron")
    assert code == 2 and "transformer" in err and len(err.strip().splitlines()) == 1


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
