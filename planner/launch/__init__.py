"""A plan in the forms job scripts and launchers take: shell variables, an sbatch script, a
torchrun line, Megatron-LM arguments, a DeepSpeed config, a torchtitan job config.

Every form is written from the same normalised plan (`normalise`), so they agree with the JSON
by construction; values are quoted for the shell with `shlex.quote`. A plan that does not fit
in memory gets no launcher form (`render_launch` raises `InfeasibleError`, exit 1).

One module per form, each naming the upstream commit its flags / keys were checked against (the
tests keep the flag and key lists with these commits):
- `shell`: env (shell variables), slurm (an sbatch script), torchrun;
- `megatron_lm`: a per-node Megatron-LM script (Megatron-LM d98e8a6);
- `deepspeed_config`: a DeepSpeed ds_config (DeepSpeed edaa722);
- `torchtitan_config`: a torchtitan Python config module (torchtitan b5bcd76);
- `common`: `Target`, `normalise` and the summary lines the forms share.
This module re-exports their public names and dispatches on the format (`FORMS`,
`render_launch`).
"""

from __future__ import annotations

from planner import switches
from planner.errors import InfeasibleError, SpecError
from planner.launch.common import Target, needs_transformer, normalise
from planner.launch.deepspeed_config import deepspeed
from planner.launch.megatron_lm import megatron, megatron_args, pipeline_layout, uneven_stages
from planner.launch.shell import (
    RDZV_PORT,
    SLURM_DEFAULT_TIME,
    SLURM_MAX_TIME_S,
    SLURM_TIME_ALLOWANCE_S,
    SLURM_TIME_MARGIN,
    env,
    slurm,
    slurm_time,
    torchrun,
)
from planner.launch.torchtitan_config import TORCHTITAN_FLAVORS, torchtitan

__all__ = ["FORMS", "LAUNCH_FORMATS", "RDZV_PORT", "SLURM_DEFAULT_TIME", "SLURM_MAX_TIME_S",
           "SLURM_TIME_ALLOWANCE_S", "SLURM_TIME_MARGIN", "TORCHTITAN_FLAVORS", "Target",
           "check_fits", "deepspeed", "env", "megatron", "megatron_args", "normalise",
           "pipeline_layout", "render_launch", "slurm", "slurm_time", "torchrun", "torchtitan",
           "uneven_stages"]

# format -> its writer, each taking (doc, the normalised plan, Target)
FORMS = {"env": env, "slurm": slurm, "torchrun": torchrun, "megatron": megatron,
         "deepspeed": deepspeed, "torchtitan": torchtitan}
LAUNCH_FORMATS = tuple(FORMS)


def check_fits(doc: dict) -> None:
    """No launcher form for a plan that does not fit in memory (exit 1)."""
    pred = doc.get("prediction", {})
    if pred.get("fits_memory") is False:
        need, cap = pred["memory_bytes_per_device"], pred["memory_capacity_bytes"]
        raise InfeasibleError(
            f"infeasible: memory: the plan needs {need / 2**30:.4g} GiB per device and "
            f"{cap / 2**30:.4g} GiB is usable; no launcher config for a plan that does not fit "
            "(--format json shows the prediction)", ("memory",))


def render_launch(fmt: str, doc: dict, target: Target | None = None) -> str:
    check_fits(doc)
    split = [layer["name"] for layer in (doc.get("plan") or {}).get("layers", [])
             if layer.get("mode") != "data"]
    if split:  # express it or refuse it: no form writes a per-layer split of a CNN
        raise SpecError(f"format: this plan splits CNN layers over devices ({', '.join(split[:3])}"
                        f"{', ...' if len(split) > 3 else ''}: model or spatial modes), which no "
                        "launcher form writes; --format json gives the split, --strategy data a "
                        "plan the forms write")
    target = target or Target()
    needs_transformer(fmt, target)
    plan = normalise(doc["config"])
    # what the form cannot write or runs otherwise, as each switch declares
    switches.refuse_unwritten(fmt, plan, target.precision,
                              "cnn" if target.model is None else "transformer")
    return FORMS[fmt](doc, plan, target)
