"""The plan as shell: `env` (PLANNER_* variables, each value quoted with `shlex.quote`),
`torchrun` (the torchrun line for one node's devices, c10d rendezvous) and `slurm` (a complete
sbatch script, one torchrun per node, its --time from `slurm_time`). The flags are torchrun's and
sbatch's own; no training framework is involved.
"""

from __future__ import annotations

import math
import shlex

from planner.launch.common import Target, summary

# sbatch --time: the predicted time to train times this margin plus a fixed allowance for
# start-up and checkpoint loading; without a training target, a documented default.
SLURM_TIME_MARGIN = 1.25
SLURM_TIME_ALLOWANCE_S = 15 * 60
SLURM_DEFAULT_TIME = "1-00:00:00"
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


def slurm_time(time_to_train_s: float | None) -> str:
    """sbatch --time as D-HH:MM:SS: the predicted time to train x SLURM_TIME_MARGIN plus
    SLURM_TIME_ALLOWANCE_S, rounded up to a minute; SLURM_DEFAULT_TIME without a prediction."""
    if time_to_train_s is None or not math.isfinite(time_to_train_s):
        return SLURM_DEFAULT_TIME
    minutes = math.ceil((time_to_train_s * SLURM_TIME_MARGIN + SLURM_TIME_ALLOWANCE_S) / 60)
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def slurm(doc: dict, plan: dict, target: Target) -> str:
    """A complete sbatch script: one task per node, each starting torchrun for that node's
    devices; the first node of the allocation is the c10d rendezvous host. The training entry
    point and its arguments are the user's: TRAIN_SCRIPT and the script's own arguments."""
    n, g = plan["nodes"], plan["devices_per_node"]
    ttt = doc.get("prediction", {}).get("time_to_train_s")
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(doc.get("model")))[:64]
    time_note = ("predicted time to train x " f"{SLURM_TIME_MARGIN:g} + "
                 f"{SLURM_TIME_ALLOWANCE_S // 60} min" if ttt is not None else
                 "default: no training target given (--critical-batch with a target sets it)")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=planner-{name}",
             f"#SBATCH --nodes={n}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={g}",
             f"#SBATCH --time={slurm_time(ttt)}",
             *(f"# {line}" for line in summary(doc, plan)),
             f"# --time: {time_note}",
             "# usage: TRAIN_SCRIPT=pretrain_gpt.py sbatch job.sh [training arguments]",
             "set -euo pipefail",
             ': "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to the training entry point}"',
             'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             f"srun torchrun --nnodes={n} --nproc-per-node={g} --rdzv-id=\"$SLURM_JOB_ID\" "
             f"--rdzv-backend c10d --rdzv-endpoint \"$head_node:{RDZV_PORT}\" "
             '"$TRAIN_SCRIPT" "$@"']
    return "\n".join(lines)
