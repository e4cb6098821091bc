"""A plan in the forms job scripts and launchers take: shell variables, an sbatch header, a
torchrun line, Megatron-LM arguments, a DeepSpeed config.

Every form is written from the same normalised plan (`normalise`), so they agree with the JSON
by construction; values are quoted for the shell with `shlex.quote`.
"""

from __future__ import annotations

import json
import shlex

LAUNCH_FORMATS = ("env", "slurm", "torchrun", "megatron", "deepspeed")


def normalise(config: dict) -> dict:
    """The launcher-facing fields of a `config` JSON object: a `planner.plan.Plan` (every
    family), or a CNN split's (pipeline stages or per-layer modes)."""
    devices = config["devices"]
    dpn = config["devices_per_node"]
    if "tp" in config:  # a Plan
        return {"nodes": config["nodes"], "devices_per_node": dpn, "devices": devices,
                "tp": config["tp"], "pp": config["pp"], "dp": config["dp"],
                "micro_batch": config["micro_batch"], "global_batch": config["global_batch"],
                "gradient_accumulation": config["gradient_accumulation"],
                "interleave": config["interleave"], "recompute": config["recompute"],
                "sequence_parallel": config["sequence_parallel"], "zero": config["zero"]}
    if "stages" in config:  # CNN pipeline plan
        return {"nodes": config["nodes"], "devices_per_node": dpn, "devices": devices, "tp": 1,
                "pp": config["stages"], "dp": config["replicas"],
                "micro_batch": config["micro_batch"], "global_batch": config["global_batch"],
                "gradient_accumulation": config["micro_batches"], "interleave": 1,
                "recompute": "none", "sequence_parallel": False, "zero": 0}
    # per-layer modes: data parallel outside the model-parallel layers
    return {"nodes": config["nodes"], "devices_per_node": dpn, "devices": devices, "tp": 1,
            "pp": 1, "dp": devices, "micro_batch": config["local_batch"],
            "global_batch": config["global_batch"], "gradient_accumulation": 1, "interleave": 1,
            "recompute": "none", "sequence_parallel": False, "zero": 0}


def _summary(doc: dict, plan: dict) -> list[str]:
    pred = doc.get("prediction", {})
    lines = [f"planner: {doc.get('model')} on {doc.get('hardware')} ({doc.get('status', 'evaluated')})",
             f"nodes {plan['nodes']} x {plan['devices_per_node']} devices = {plan['devices']}; "
             f"tp {plan['tp']} x pp {plan['pp']} x dp {plan['dp']}; micro-batch "
             f"{plan['micro_batch']} x {plan['gradient_accumulation']} accumulation = global "
             f"batch {plan['global_batch']}"]
    if "iteration_time_s" in pred:
        lines.append(f"predicted iteration time {pred['iteration_time_s']:.6g} s")
    return lines


def env(doc: dict, plan: dict) -> str:
    values = {**plan, "model": doc.get("model"), "hardware": doc.get("hardware"),
              "iteration_time_s": doc.get("prediction", {}).get("iteration_time_s")}
    out = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = int(value)
        out.append(f"PLANNER_{key.upper()}={shlex.quote(str(value))}")
    return "\n".join(out)


def slurm(doc: dict, plan: dict) -> str:
    g = plan["devices_per_node"]
    head = ["#!/bin/bash", f"#SBATCH --nodes={plan['nodes']}", f"#SBATCH --ntasks-per-node={g}",
            f"#SBATCH --gpus-per-node={g}"]
    return "\n".join(head + [f"# {line}" for line in _summary(doc, plan)])


def torchrun(doc: dict, plan: dict) -> str:
    return (f"torchrun --nnodes={plan['nodes']} --nproc-per-node={plan['devices_per_node']} "
            "--rdzv-backend=c10d --rdzv-endpoint=\"$MASTER_ADDR:$MASTER_PORT\"")


def megatron(doc: dict, plan: dict, arch: dict | None) -> str:
    if arch is None:
        from planner.errors import SpecError

        raise SpecError("format: megatron needs a transformer model")
    args = [f"--num-layers {arch['layers']}", f"--hidden-size {arch['hidden']}",
            f"--num-attention-heads {arch['heads']}", f"--seq-length {arch['seq_len']}",
            f"--tensor-model-parallel-size {plan['tp']}",
            f"--pipeline-model-parallel-size {plan['pp']}",
            f"--micro-batch-size {plan['micro_batch']}",
            f"--global-batch-size {plan['global_batch']}"]
    if arch["kv_heads"] != arch["heads"]:
        args.append(f"--group-query-attention --num-query-groups {arch['kv_heads']}")
    if plan["interleave"] > 1:
        per_chunk = arch["layers"] // (plan["pp"] * plan["interleave"])
        args.append(f"--num-layers-per-virtual-pipeline-stage {per_chunk}")
    if plan["sequence_parallel"]:
        args.append("--sequence-parallel")
    if plan["recompute"] == "selective":
        args.append("--recompute-granularity selective")
    elif plan["recompute"] == "full":
        args.append("--recompute-granularity full --recompute-method uniform "
                    "--recompute-num-layers 1")
    if plan["zero"] >= 1:
        args.append("--use-distributed-optimizer")
    return " \\\n  ".join(args)


def deepspeed(doc: dict, plan: dict) -> str:
    cfg = {"train_batch_size": plan["global_batch"],
           "train_micro_batch_size_per_gpu": plan["micro_batch"],
           "gradient_accumulation_steps": plan["gradient_accumulation"],
           "zero_optimization": {"stage": plan["zero"]}}
    return json.dumps(cfg, indent=2)


def render_launch(fmt: str, doc: dict, arch: dict | None = None) -> str:
    plan = normalise(doc["config"])
    if fmt == "megatron":
        return megatron(doc, plan, arch)
    return {"env": env, "slurm": slurm, "torchrun": torchrun, "deepspeed": deepspeed}[fmt](doc, plan)
