"""What every launcher form is written from: `normalise` turns a plan's `config` JSON object (a
`planner.plan.Plan`, or a CNN split's) into the launcher-facing fields, `Target` carries what a
form needs beyond the plan (the transformer spec and the precision), and `summary` gives the
comment lines about the plan that the sbatch script and the torchtitan config module start with. No
upstream names here: each form's module says which commit its flags / keys were checked against.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from planner import switches
from planner.errors import SpecError


class Target:
    """What a launcher form needs beyond the plan: the transformer spec (None for a CNN) and the
    precision the plan was priced at."""

    def __init__(self, model=None, precision: str = "fp32"):
        self.model = model
        self.precision = getattr(precision, "value", precision)


# the forms that write a transformer only, by the framework's name in their refusal
TRANSFORMER_FORMS = {"megatron": "Megatron-LM", "torchtitan": "torchtitan"}


def needs_transformer(fmt: str, target: Target) -> None:
    """Refuse a CNN plan for a form that writes a transformer only (before anything else the
    form would say of the plan)."""
    if target.model is None and fmt in TRANSFORMER_FORMS:
        raise SpecError(f"format: {fmt} needs a transformer model (CNN plans have no "
                        f"{TRANSFORMER_FORMS[fmt]} form)")


def normalise(config: dict) -> dict:
    """The launcher-facing fields of a `config` JSON object: a `planner.plan.Plan` (every
    family), or a CNN split's (pipeline stages or per-layer modes)."""
    devices = config["devices"]
    dpn = config["devices_per_node"]
    if "tp" in config:  # a Plan: its split, and each switch as given or its default
        keys = ("nodes", "tp", "pp", "dp", "micro_batch", "global_batch",
                "gradient_accumulation", "interleave", "recompute", "sequence_parallel", "zero")
        return {"devices_per_node": dpn, "devices": devices, **{k: config[k] for k in keys},
                "cp": config.get("cp", 1), "ep": config.get("ep", 1),
                "etp": config.get("etp", config["tp"]),
                "schedule": config.get("schedule", "1f1b"),
                "recompute_layers": config.get("recompute_layers"),
                **{s.name: config.get(s.name, s.json(s.default)) for s in switches.SWITCHES},
                "optimizer": config.get("optimizer") or "adam"}
    if "stages" in config:  # CNN pipeline plan
        return {"nodes": config["nodes"], "devices_per_node": dpn, "devices": devices, "tp": 1,
                "pp": config["stages"], "dp": config["replicas"],
                "micro_batch": config["micro_batch"], "global_batch": config["global_batch"],
                "gradient_accumulation": config["micro_batches"], "interleave": 1,
                "recompute": "none", "sequence_parallel": False, "zero": 0,
                # priced as 1F1B (`planner.cost.stages`: min(m, p - j) micro-batches held)
                "schedule": "1f1b", "overlap": config.get("overlap", True),
                "flash_attention": True}
    # per-layer modes: data parallel outside the model-parallel layers
    return {"nodes": config["nodes"], "devices_per_node": dpn, "devices": devices, "tp": 1,
            "pp": 1, "dp": devices, "micro_batch": config["local_batch"],
            "global_batch": config["global_batch"], "gradient_accumulation": 1, "interleave": 1,
            "recompute": "none", "sequence_parallel": False, "zero": 0, "schedule": "1f1b",
            "overlap": config.get("overlap", True), "flash_attention": True}


def max_connections(plan: dict) -> list[str]:
    """Shell lines setting CUDA_DEVICE_MAX_CONNECTIONS as Megatron-LM's validate_args wants it
    (megatron/training/arguments.py at the commit megatron_lm names): 1 with tp or cp > 1
    (asserted before Blackwell, where one hardware queue keeps the tensor-parallel
    communication ahead of the compute it overlaps), never 1 with Megatron-FSDP (ZeRO 2 / 3,
    asserted on every device). Other frameworks run either way."""
    if plan.get("zero", 0) >= 2:
        return ["unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP (ZeRO "
                f"{plan['zero']}) asserts it is not 1"]
    if plan.get("tp", 1) > 1 or plan.get("cp", 1) > 1:
        return [f"export CUDA_DEVICE_MAX_CONNECTIONS=1  # tp {plan['tp']}, cp "
                f"{plan.get('cp', 1)}: Megatron-LM asserts it before Blackwell"]
    return []


def split(plan: dict) -> str:
    """The parallel split in one phrase: tp x cp x pp x dp (ep and etp when they are set)."""
    text = f"tp {plan['tp']} x cp {plan.get('cp', 1)} x pp {plan['pp']} x dp {plan['dp']}"
    if plan.get("ep", 1) > 1:
        text += f" (ep {plan['ep']}, etp {plan.get('etp', plan['tp'])})"
    if plan.get("interleave", 1) > 1:
        text += f", {plan['interleave']} chunks per stage"
    return text


def one_line(text) -> str:
    """`text` with every unprintable character (a newline in a file name) escaped, so that a
    comment of a generated script stays one comment line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def job_name(doc: dict) -> str:
    """The Slurm job name's model part: letters, digits and -_. only, at most 64."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(doc.get("model")))[:64]


def summary(doc: dict, plan: dict) -> list[str]:
    """The plan in a few lines (each one line, whatever the spec files are called): model,
    hardware, grid, batch, the predicted times."""
    pred = doc.get("prediction", {})
    lines = [f"planner: {one_line(doc.get('model'))} on {one_line(doc.get('hardware'))} "
             f"({doc.get('status', 'evaluated')})",
             f"nodes {plan['nodes']} x {plan['devices_per_node']} devices = {plan['devices']}; "
             f"{split(plan)}; ZeRO {plan['zero']}; micro-batch "
             f"{plan['micro_batch']} x {plan['gradient_accumulation']} accumulation = global "
             f"batch {plan['global_batch']}"]
    if "iteration_time_s" in pred:
        lines.append(f"predicted iteration time {pred['iteration_time_s']:.6g} s")
    if "tp" in plan:  # the switches it was priced with (a form's framework defaults among them)
        view = SimpleNamespace(**{s.name: plan.get(s.name, s.default) for s in switches.SWITCHES},
                               interleave=plan.get("interleave", 1), dp=plan["dp"])
        options = switches.describe(view)
        if options:
            lines.append(f"priced with: {', '.join(options)}")
    ttt = trained(doc).get("time_to_train_s")
    if ttt is not None:
        lines.append(f"predicted time to train {ttt / 86400:.3g} days ({ttt / 3600:.4g} h)")
    return lines


def trained(doc: dict) -> dict:
    """The training target the plan was priced for: `steps` and `time_to_train_s` of a
    critical batch's target (in the prediction) or of a token budget (`--tokens`: the
    document's `token_budget`); empty when no target was given."""
    pred = doc.get("prediction", {})
    if pred.get("steps") is not None:
        return pred
    return doc.get("token_budget") or {}


def priced_steps(doc: dict) -> int | None:
    """The optimizer steps the plan was priced for (a training target's, rounded up), or None
    when no target was given: what a launcher writes as its iteration count."""
    steps = trained(doc).get("steps")
    return math.ceil(steps) if steps else None
