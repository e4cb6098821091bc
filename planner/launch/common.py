"""What every launcher form is written from: `normalise` turns a plan's `config` JSON object (a
`planner.plan.Plan`, or a CNN split's) into the launcher-facing fields, `Target` carries what a
form needs beyond the plan (the transformer spec and the precision), and `summary` gives the
comment lines about the plan that the sbatch script and the torchtitan TOML start with. No
upstream names here: each form's module says which commit its flags / keys were checked against.
"""

from __future__ import annotations


class Target:
    """What a launcher form needs beyond the plan: the transformer spec (None for a CNN) and the
    precision the plan was priced at."""

    def __init__(self, model=None, precision: str = "fp32"):
        self.model = model
        self.precision = getattr(precision, "value", precision)


def normalise(config: dict) -> dict:
    """The launcher-facing fields of a `config` JSON object: a `planner.plan.Plan` (every
    family), or a CNN split's (pipeline stages or per-layer modes)."""
    devices = config["devices"]
    dpn = config["devices_per_node"]
    if "tp" in config:  # a Plan
        return {"nodes": config["nodes"], "devices_per_node": dpn, "devices": devices,
                "tp": config["tp"], "cp": config.get("cp", 1), "ep": config.get("ep", 1),
                "pp": config["pp"],
                "dp": config["dp"],
                "micro_batch": config["micro_batch"], "global_batch": config["global_batch"],
                "gradient_accumulation": config["gradient_accumulation"],
                "interleave": config["interleave"], "recompute": config["recompute"],
                "sequence_parallel": config["sequence_parallel"], "zero": config["zero"],
                "schedule": config.get("schedule", "1f1b"), "overlap": config.get("overlap", True),
                "flash_attention": config.get("flash_attention", True),
                "etp": config.get("etp", config["tp"]),
                "tp_overlap": config.get("tp_overlap", False),
                "capacity_factor": config.get("capacity_factor", 1.0),
                "first_stage_layers": config.get("first_stage_layers"),
                "last_stage_layers": config.get("last_stage_layers"),
                "offload_activations": config.get("offload_activations", False),
                "ep_overlap": config.get("ep_overlap", False),
                "kernels": config.get("kernels", "fused"),
                "recompute_layers": config.get("recompute_layers"),
                "dp_shard": config.get("dp_shard"),
                "fp8_weight_gather": config.get("fp8_weight_gather", False),
                "fp8_activations": config.get("fp8_activations", False)}
    if "stages" in config:  # CNN pipeline plan
        return {"nodes": config["nodes"], "devices_per_node": dpn, "devices": devices, "tp": 1,
                "pp": config["stages"], "dp": config["replicas"],
                "micro_batch": config["micro_batch"], "global_batch": config["global_batch"],
                "gradient_accumulation": config["micro_batches"], "interleave": 1,
                "recompute": "none", "sequence_parallel": False, "zero": 0,
                "schedule": "gpipe", "overlap": config.get("overlap", True),
                "flash_attention": True}
    # per-layer modes: data parallel outside the model-parallel layers
    return {"nodes": config["nodes"], "devices_per_node": dpn, "devices": devices, "tp": 1,
            "pp": 1, "dp": devices, "micro_batch": config["local_batch"],
            "global_batch": config["global_batch"], "gradient_accumulation": 1, "interleave": 1,
            "recompute": "none", "sequence_parallel": False, "zero": 0, "schedule": "1f1b",
            "overlap": config.get("overlap", True), "flash_attention": True}


def summary(doc: dict, plan: dict) -> list[str]:
    """The plan in a few lines: model, hardware, grid, batch, the predicted times."""
    pred = doc.get("prediction", {})
    lines = [f"planner: {doc.get('model')} on {doc.get('hardware')} ({doc.get('status', 'evaluated')})",
             f"nodes {plan['nodes']} x {plan['devices_per_node']} devices = {plan['devices']}; "
             f"tp {plan['tp']} x pp {plan['pp']} x dp {plan['dp']}; micro-batch "
             f"{plan['micro_batch']} x {plan['gradient_accumulation']} accumulation = global "
             f"batch {plan['global_batch']}"]
    if "iteration_time_s" in pred:
        lines.append(f"predicted iteration time {pred['iteration_time_s']:.6g} s")
    if "time_to_train_s" in pred:
        lines.append(f"predicted time to train {pred['time_to_train_s']:.6g} s")
    return lines
