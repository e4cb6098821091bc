"""Launch forms of plans over several pools: a pipeline across pools as Megatron-LM's per-stage
layout with fixed node ranks (parsed by Megatron-LM's parser rebuilt from data, the layout
checked by the rules of its PipelineParallelLayerLayout), the heterogeneous sbatch job run
with stand-in Slurm commands, the best single-pool plan in every form, and the refusals."""

import contextlib
import io
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from planner import rules
from tests.test_launch import megatron_argv, megatron_flags

LAB = ("solve", "-m", "gpt3-175b", "-H", "lab-a100-h100", "--global-batch", "512")


@pytest.fixture(scope="module")
def lab():
    """The lab plan (a pipeline across the A100 and H100 pools) in json, megatron and slurm."""
    from planner.cli import main

    out = {}
    for fmt in ("json", "megatron", "slurm"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            main([*LAB, "--format", fmt])  # returns on success (SystemExit on an error)
        out[fmt] = buf.getvalue()
    return out


def _stages(doc: dict) -> list[tuple[str, int]]:
    import json

    plan = json.loads(doc)["plan"]
    assert plan["kind"] == "pipeline across pools"
    (group,) = plan["groups"]
    return [(s["pool"], s["layers"]) for s in group["stages"]]


def test_megatron_layout_is_the_plan_and_megatron_valid(lab):
    stages = _stages(lab["json"])
    flags = megatron_flags(lab["megatron"].replace('${NODE_RANK:?', '${NODE_RANK:-0', 1))
    (layout,) = flags["--pipeline-model-parallel-layout"]
    chunks = layout.split("|")
    # PipelineParallelLayerLayout: one chunk per stage (len % pp == 0, vpp 1), the embedding
    # first and the loss last, each once, the decoder layers the model's
    assert flags["--pipeline-model-parallel-size"] == [str(len(stages))] == [str(len(chunks))]
    assert layout.startswith("E") and layout.endswith("L")
    assert layout.count("E") == layout.count("L") == 1
    assert [c.count("t") for c in chunks] == [n for _, n in stages]
    assert sum(c.count("t") for c in chunks) == 96
    # exclusive with the other layout flags (validate_args)
    assert not {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                "--num-virtual-stages-per-pipeline-rank"} & set(flags)


def _torchrun_args(text: str, **env) -> list[str]:
    """Every argument the script gives torchrun (a stand-in that records them)."""
    with tempfile.TemporaryDirectory() as tmp:
        fake, out = Path(tmp) / "torchrun", Path(tmp) / "argv"
        fake.write_text("#!/bin/bash\nprintf '%s\\0' \"$@\" > \"$FAKE_ARGV\"\n")
        fake.chmod(0o755)
        script = Path(tmp) / "m.sh"
        script.write_text(text)
        run_env = {**os.environ, "DATA_PATH": "mock", "LR": "1e-4", "TRAIN_ITERS": "10",
                   "FAKE_ARGV": str(out), "PATH": f"{tmp}:{os.environ['PATH']}", **env}
        done = subprocess.run(["bash", str(script)], env=run_env, capture_output=True,
                              text=True)
        if done.returncode:
            return [f"exit {done.returncode}: {done.stderr.strip()}"]
        return [a.decode() for a in out.read_bytes().split(b"\0")[:-1]]


def test_megatron_pins_node_ranks(lab):
    args = _torchrun_args(lab["megatron"], NODE_RANK="37", MASTER_ADDR="a001")
    assert "--node-rank=37" in args and "--master-addr=a001" in args
    assert "--nnodes=48" in args and not any(a.startswith("--rdzv") for a in args)
    (missing,) = _torchrun_args(lab["megatron"], NODE_RANK="")
    assert missing.startswith("exit 1") and "NODE_RANK" in missing
    argv, _ = megatron_argv(lab["megatron"], NODE_RANK="0")
    assert argv[argv.index("--global-batch-size") + 1] == "512"


def test_slurm_het_job_gives_each_node_its_stage_order_rank(lab):
    """The sbatch script under stand-in scontrol / srun: srun starts every node of both
    components (here in a shuffled order); each must get the rank of its place in stage order:
    the A100 pool's 32 nodes 0-31, the H100 pool's 16 nodes 32-47."""
    text = lab["slurm"]
    assert text.count("#SBATCH hetjob") == 1
    assert "#SBATCH --nodes=32 " in text and "#SBATCH --nodes=16 " in text
    a100 = [f"a{i:03d}" for i in range(32)]
    h100 = [f"h{i:03d}" for i in range(16)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "scontrol").write_text("#!/bin/bash\n[ \"$1 $2\" = 'show hostnames' ] || exit 9\n"
                                      "for h in $3; do echo \"$h\"; done\n")
        # srun: runs the step's command once per node, as that node, in a scrambled order
        (tmp / "srun").write_text(
            "#!/bin/bash\n[ \"$1\" = --het-group=0-1 ] || exit 9\nshift\n"
            "for h in $(echo $ALL_NODES | tr ' ' '\\n' | sort -r); do\n"
            "  SLURMD_NODENAME=$h \"$@\" || exit $?\ndone\n")
        (tmp / "train.sh").write_text("echo \"$SLURMD_NODENAME $NODE_RANK $MASTER_ADDR $*\" "
                                      ">> \"$RANKS\"\n")
        for f in ("scontrol", "srun"):
            (tmp / f).chmod(0o755)
        (tmp / "job.sh").write_text(text)
        env = {**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}",
               "SLURM_JOB_NODELIST_HET_GROUP_0": " ".join(a100),
               "SLURM_JOB_NODELIST_HET_GROUP_1": " ".join(h100),
               "ALL_NODES": " ".join(a100 + h100), "TRAIN_SCRIPT": str(tmp / "train.sh"),
               "RANKS": str(tmp / "ranks")}
        subprocess.run(["bash", str(tmp / "job.sh"), "--seed", "7"], env=env, check=True)
        lines = (tmp / "ranks").read_text().split("\n")[:-1]
    got = {line.split()[0]: line.split()[1:] for line in lines}
    assert {h: int(v[0]) for h, v in got.items()} == {h: r for r, h in enumerate(a100 + h100)}
    assert {tuple(v[1:]) for v in got.values()} == {("a000", "--seed", "7")}


def test_best_single_pool_plan_has_every_form(run):
    """When one pool alone is best (B200 at batch 768), its plan is an ordinary plan."""
    args = ("solve", "-m", "gpt3-175b", "-H", "mixed-hopper-blackwell", "--global-batch",
            "768", "--format")
    code, out, err = run(*args, "megatron")
    assert code == 0, err
    flags = megatron_flags(out)
    assert "--pipeline-model-parallel-layout" not in flags and "NODE_RANK" not in out
    for fmt in ("slurm", "env", "torchrun"):  # the forms any plan on one system has
        code, out, err = run(*args, fmt)
        assert code == 0 and out, (fmt, err)
        # stderr says where (a ds_config, say, has no comment to)
        assert "runs on pool dgx-b200 alone" in err and "of mixed-hopper-blackwell" in err


@pytest.mark.parametrize("fmt, message", [
    ("torchtitan", "has no flavor that builds 'gpt3-175b'"),  # torchtitan's own refusal
    ("env", "cannot express a pipeline across pools")])
def test_pipeline_forms_refused_in_one_line(run, fmt, message):
    code, out, err = run(*LAB, "--format", fmt)
    assert code == 2 and message in err and out == ""
    assert len(err.strip().splitlines()) == 1


def test_replicas_across_pools_refused_naming_the_shares(run):
    code, _, err = run("solve", "-m", "gpt3-175b", "-H", "mixed-hopper-blackwell",
                       "--global-batch", "4096", "--format", "env")
    assert code == 2 and "same micro-batches" in err and "on dgx-b200" in err


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed"])
def test_a_framework_picks_a_mix_its_form_writes(run, run_json, fmt):
    """`--framework F` (and `--format F`) over a cluster searches the mixes F's form writes
    (`planner.rules.MIXED_FORMS`: pipelines for Megatron-LM and torchtitan, no mix for
    DeepSpeed, replicas for none), so the form then writes the pick; it had picked replicas
    or a pipeline across pools the form refused."""
    args = ("solve", "-m", "gpt3-175b", "-H", "mixed-hopper-blackwell", "--global-batch",
            "4096")
    free = run_json(*args)["plan"]["kind"]
    picked = run_json(*args, "--framework", fmt)
    assert free == "replicas across pools"
    writes = [kind for kind, forms in rules.MIXED_FORMS.items() if fmt in forms]
    assert picked["plan"]["kind"] in ("one pool", *writes)
    assert picked["plan"]["kind"] == ("pipeline across pools" if fmt == "megatron"
                                      else "one pool")
    code, out, err = run(*args, "--format", fmt)
    assert code == 0 and out, err


def test_slurm_components_take_the_pools_partitions(run, tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text("kind: cluster\nname: lab\npools:\n"
                    "  - {system: dgx-a100-80gb, nodes: 32, partition: a100}\n"
                    "  - {system: dgx-h100, nodes: 16, partition: h100}\n"
                    "between_pools: {link: ndr-ib, count: 8}\n")
    code, out, err = run("solve", "-m", "gpt3-175b", "-H", str(path), "--global-batch", "512",
                         "--format", "slurm")
    assert code == 0, err
    assert "#SBATCH --partition=a100" in out and "#SBATCH --partition=h100" in out
    assert "PLACEHOLDER" not in out


def test_torchtitan_lists_each_stage_modules(run):
    """torchtitan (its config classes and startup checks, stood in at the pinned commit):
    one model part per stage with the planned layers, the embedding first and the norm and
    head last; torchrun with fixed node ranks."""
    from tests.test_launch_torchtitan import torchtitan_config

    args = ("solve", "-m", "llama3-70b", "-H", "lab-a100-h100", "--global-batch", "512",
            "--pp", "5")
    code, out, err = run(*args, "--format", "json")
    assert code == 0, err
    stages = _stages(out)
    code, text, err = run(*args, "--format", "torchtitan")
    assert code == 0, err
    assert "--node-rank=$NODE_RANK" in text and "rdzv-backend" not in text
    par = torchtitan_config(text, devices=320).parallelism
    parts = par.module_fqns_per_model_part
    assert par.pipeline_parallel_degree == len(parts) == len(stages)
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == [n for _, n in stages]
    layers = [m for p in parts for m in p if m.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(80)]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
