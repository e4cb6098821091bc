"""The plan as shell: `env` (PLANNER_* variables, each value quoted with `shlex.quote`),
`torchrun` (the torchrun line for one node's devices, c10d rendezvous) and `slurm` (a complete
sbatch script, one torchrun per node, its --time from `slurm_time`, capped at a per-job limit,
with how to chain the jobs of a longer run). The flags are torchrun's and sbatch's own; the
script also sets CUDA_DEVICE_MAX_CONNECTIONS as Megatron-LM wants it (`common.max_connections`),
and runs a planner --format megatron script (TRAIN_SCRIPT=*.sh) on each node as it is.
"""

from __future__ import annotations

import math
import shlex

from planner.launch.common import Target, job_name, max_connections, summary, trained

# sbatch --time: the predicted time to train times this margin plus a fixed allowance for
# start-up and checkpoint loading; without a training target, a documented default.
SLURM_TIME_MARGIN = 1.25
SLURM_TIME_ALLOWANCE_S = 15 * 60
SLURM_DEFAULT_TIME = "1-00:00:00"
# the longest job most clusters' partitions allow (MaxTime is often 24 h or 48 h); a longer
# run is a chain of jobs of this length, each resuming from the last checkpoint
SLURM_MAX_TIME_S = 48 * 3600
# CPU cores per GPU for the data loader workers and the rank's own thread
SLURM_CPUS_PER_DEVICE = 8
RDZV_PORT = 29500


def env(doc: dict, plan: dict, target: Target) -> str:
    values = {**plan, "model": doc.get("model"), "hardware": doc.get("hardware"),
              "precision": target.precision,
              "iteration_time_s": doc.get("prediction", {}).get("iteration_time_s")}
    out = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = int(value)
        out.append(f"PLANNER_{key.upper()}={shlex.quote(str(value))}")
    return "\n".join(out)


def torchrun(doc: dict, plan: dict, target: Target) -> str:
    return (f"torchrun --nnodes={plan['nodes']} --nproc-per-node={plan['devices_per_node']} "
            "--rdzv-backend=c10d --rdzv-endpoint=\"$MASTER_ADDR:$MASTER_PORT\"")


def job_seconds(time_to_train_s: float | None) -> float | None:
    """The whole run's wall time: the predicted time to train x SLURM_TIME_MARGIN plus
    SLURM_TIME_ALLOWANCE_S (None without a prediction)."""
    if time_to_train_s is None or not math.isfinite(time_to_train_s):
        return None
    return time_to_train_s * SLURM_TIME_MARGIN + SLURM_TIME_ALLOWANCE_S


def slurm_time(time_to_train_s: float | None, cap_s: float | None = None) -> str:
    """sbatch --time as D-HH:MM:SS: the predicted time to train x SLURM_TIME_MARGIN plus
    SLURM_TIME_ALLOWANCE_S, rounded up to a minute, at most `cap_s`; SLURM_DEFAULT_TIME
    without a prediction."""
    seconds = job_seconds(time_to_train_s)
    if seconds is None:
        return SLURM_DEFAULT_TIME
    minutes = math.ceil(seconds / 60)
    if cap_s is not None:
        minutes = min(minutes, math.floor(cap_s / 60))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def slurm(doc: dict, plan: dict, target: Target) -> str:
    """A complete sbatch script: one task per node with SLURM_CPUS_PER_DEVICE cores per device,
    each starting torchrun for that node's devices (or, for TRAIN_SCRIPT=*.sh, that script,
    which starts torchrun itself: the megatron form); the first node of the allocation is the
    c10d rendezvous host. --time is the predicted run, capped at SLURM_MAX_TIME_S per job; a
    longer run says how many chained jobs it needs and how to chain them."""
    n, g = plan["nodes"], plan["devices_per_node"]
    ttt = trained(doc).get("time_to_train_s")
    whole = job_seconds(ttt)
    name = job_name(doc)
    if whole is None:
        time_note = ["# --time: a default; no training target was given (a token budget or "
                     "--critical-batch with a target sets it)"]
    else:
        time_note = [f"# --time: predicted time to train x {SLURM_TIME_MARGIN:g} + "
                     f"{SLURM_TIME_ALLOWANCE_S // 60} min = {whole / 3600:.4g} h"]
    if whole is not None and whole > SLURM_MAX_TIME_S:
        jobs = math.ceil(whole / SLURM_MAX_TIME_S)
        time_note += [
            f"# That is over the {SLURM_MAX_TIME_S // 3600} h per-job limit most clusters set: "
            f"run it as {jobs} chained jobs of",
            "# this length, each resuming from the last checkpoint (Megatron-LM: "
            "CHECKPOINT_DIR, and EXIT_MINUTES a",
            "# little under the limit so that each job saves and exits cleanly), e.g.",
            "#   jid=$(sbatch --parsable job.sh)",
            f"#   for i in $(seq 2 {jobs}); do jid=$(sbatch --parsable "
            "--dependency=afterok:$jid job.sh); done",
            "# (afterany if a job may end at the time limit instead; or #SBATCH --requeue "
            "with --signal=B:USR1@600",
            "# and a handler that checkpoints and calls scontrol requeue)"]
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=planner-{name}",
             f"#SBATCH --nodes={n}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={g}",
             f"#SBATCH --cpus-per-task={SLURM_CPUS_PER_DEVICE * g}",
             f"#SBATCH --time={slurm_time(ttt, SLURM_MAX_TIME_S)}",
             *(f"# {line}" for line in summary(doc, plan)),
             f"# precision {target.precision}",
             *time_note,
             f"# --cpus-per-task: {SLURM_CPUS_PER_DEVICE} cores per device for its rank and "
             "data loader (lower it on smaller nodes)",
             "# usage: TRAIN_SCRIPT=pretrain_gpt.py sbatch job.sh [training arguments]",
             "#    or: TRAIN_SCRIPT=megatron.sh sbatch job.sh  (planner --format megatron: it "
             "starts torchrun itself)",
             "set -euo pipefail",
             ': "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to the training entry point}"',
             *max_connections(plan),
             "# the first host (awk reads them all: head would end the pipe early, which pipefail fails)",
             'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk "NR == 1")',
             f'export MASTER_ADDR="$head_node" MASTER_PORT={RDZV_PORT}',
             "# srun does not inherit --cpus-per-task from sbatch on every Slurm version: "
             "pass it on",
             'if [[ "$TRAIN_SCRIPT" == *.sh ]]; then',
             '  srun --cpus-per-task="$SLURM_CPUS_PER_TASK" bash "$TRAIN_SCRIPT" "$@"',
             "else",
             f'  srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun --nnodes={n} '
             f'--nproc-per-node={g} --rdzv-id="$SLURM_JOB_ID" '
             f'--rdzv-backend c10d --rdzv-endpoint "$head_node:{RDZV_PORT}" '
             '"$TRAIN_SCRIPT" "$@"',
             "fi"]
    return "\n".join(lines)
