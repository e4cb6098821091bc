"""A DeepSpeed config (ds_config JSON) for the plan: batch sizes, precision, ZeRO stage and
AutoTP tensor parallelism (`tensor_parallel.autotp_size`). One rule, as for every form: what
the plan chooses is expressed or refused (SpecError, exit 2, naming the form that can): expert or
context parallelism, pinned stage sizes, interleaved or GPipe pipelines, activation offload,
fp8 / mxfp8 / fp4 training, tensor parallelism beside a pipeline or with sequence parallelism,
ZeRO 2 or 3 under a pipeline.

Every key and value is checked against deepspeedai/DeepSpeed
edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (DEEPSPEED_COMMIT):
the keys DeepSpeedConfig reads (deepspeed/runtime/config.py, constants.py), the pydantic models
it validates the blocks with (zero/config.py DeepSpeedZeroConfig and ZeroStageEnum,
precision_config.py, tensor_parallel/config.py TPTrainingConfig), the strings
communication_data_type accepts and DtypeEnum for data_types.grad_accum_dtype; train_batch_size
= micro x accumulation x the data-parallel world size (config.py `_batch_assertion`).
tests/data/make_launch_deepspeed_config.py reads them from that commit's source into
tests/data/launch_deepspeed_config.json; tests/test_launch_deepspeed.py checks this form's output
against it.
"""

from __future__ import annotations

import json

from planner import rules
from planner.errors import SpecError
from planner.launch.common import Target

DEEPSPEED_COMMIT = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"  # deepspeedai/DeepSpeed


def deepspeed(doc: dict, plan: dict, target: Target) -> str:
    """ds_config JSON. train_batch_size = micro x accumulation x data-parallel world size
    (DeepSpeed divides by dp, not by all ranks, when a model-parallel unit is given)."""
    rules.check_form("deepspeed", plan)  # what no ds_config writes (planner.rules)
    p = target.precision
    if p in ("fp8", "mxfp8", "nvfp4", "fp4"):
        raise SpecError(f"format: a ds_config has no {p} training (DeepSpeed leaves low-precision "
                        "GEMMs to the model code); use --format megatron"
                        + (" or torchtitan" if p in ("fp8", "mxfp8") else ""))
    if plan["pp"] > 1 and plan.get("schedule") == "gpipe":
        raise SpecError("format: DeepSpeed's pipeline engine runs 1F1B, not the plan's GPipe "
                        "schedule; use --format torchtitan")
    cfg = {"train_batch_size": plan["micro_batch"] * plan["gradient_accumulation"] * plan["dp"],
           "train_micro_batch_size_per_gpu": plan["micro_batch"],
           "gradient_accumulation_steps": plan["gradient_accumulation"]}
    if p == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif p == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif p == "fp64":
        raise SpecError("format: DeepSpeed has no fp64 training; use --precision bf16, fp16, "
                        "tf32 or fp32")
    if plan["tp"] > 1:  # AutoTP shards the model's linear layers over tp ranks (engine.py)
        cfg["tensor_parallel"] = {"autotp_size": plan["tp"]}
    cfg["zero_optimization"] = {"stage": plan["zero"]}
    if plan.get("dp_shard") and plan["dp"] > plan["dp_shard"]:
        # MiCS (ZeRO-3 sharded inside groups, replicated across them) is DeepSpeed's hybrid
        # sharding; ZeRO 1 / 2 have none
        if plan["zero"] != 3:
            raise SpecError(f"format: DeepSpeed shards in groups (MiCS) at ZeRO 3 only; this "
                            f"plan has ZeRO {plan['zero']} over groups of {plan['dp_shard']}: "
                            f"use --format megatron or torchtitan")
        if plan["tp"] > 1 or plan.get("cp", 1) > 1:
            # MiCS cuts the whole world into shard groups of consecutive ranks (mics_utils.py
            # create_mics_comm_groups), which with tensor / context parallelism are not the
            # plan's groups of dp_shard replicas
            raise SpecError(f"format: DeepSpeed's MiCS shard groups are counted over all ranks "
                            f"and cannot hold dp_shard({plan['dp_shard']}) replicas beside "
                            f"tp({plan['tp']}) x cp({plan.get('cp', 1)}): use --format "
                            f"megatron or torchtitan")
        cfg["zero_optimization"]["mics_shard_size"] = plan["dp_shard"]
    if plan["zero"] >= 1:
        cfg["zero_optimization"]["overlap_comm"] = bool(plan["overlap"])
        # the fp32 gradients the plan was priced with (DeepSpeed's default for bf16 is bf16
        # gradients and bf16 communication, engine.py: what --grad-reduce-bf16 prices); at
        # ZeRO 0 its bf16 DDP has no fp32 accumulation ("unsupported mix"), so the defaults
        # stay, and a plan for this form is priced so there (`Switch.runs_where`)
        if "bf16" in cfg and not plan.get("grad_reduce_bf16"):
            cfg["communication_data_type"] = "fp32"
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return json.dumps(cfg, indent=2)
