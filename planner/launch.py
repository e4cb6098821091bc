"""A plan in the forms job scripts and launchers take: shell variables, an sbatch script, a
torchrun line, Megatron-LM arguments, a DeepSpeed config, a torchtitan job config.

Every form is written from the same normalised plan (`normalise`), so they agree with the JSON
by construction; values are quoted for the shell with `shlex.quote`. A plan that does not fit
in memory gets no launcher form (`render_launch` raises `InfeasibleError`, exit 1).

Where each form's names come from (the tests keep the flag and key lists with these commits):
- Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553: megatron/training/arguments.py and the
  flags its ArgumentGroupFactory generates from TransformerConfig / ModelParallelConfig
  (megatron/training/argument_utils.py: field `foo_bar` -> `--foo-bar`).
- DeepSpeed edaa7221267243c7be7fb49c5d5f5c4fb97b4641: deepspeed/runtime/constants.py,
  deepspeed/runtime/zero/config.py; train_batch_size = micro x accumulation x the data-parallel
  world size (deepspeed/runtime/config.py `_batch_assertion`).
- torchtitan 238fa9953e4aec2a62582121564273d7cbb1e9f1 (the last commit whose launcher reads a
  TOML job config, `--job.config_file`; 9810191 moved to Python config functions, where the same
  `[section] key` pairs are the `--section.key` overrides): torchtitan/config/job_config.py.
"""

from __future__ import annotations

import json
import math
import shlex

from planner.errors import InfeasibleError, SpecError

LAUNCH_FORMATS = ("env", "slurm", "torchrun", "megatron", "deepspeed", "torchtitan")

# sbatch --time: the predicted time to train times this margin plus a fixed allowance for
# start-up and checkpoint loading; without a training target, a documented default.
SLURM_TIME_MARGIN = 1.25
SLURM_TIME_ALLOWANCE_S = 15 * 60
SLURM_DEFAULT_TIME = "1-00:00:00"
RDZV_PORT = 29500

# torchtitan's built-in Llama 3 flavors (torchtitan/models/llama3/__init__.py at the commit above):
# (layers, hidden, heads, kv_heads) -> (name, flavor)
TORCHTITAN_FLAVORS = {(32, 4096, 32, 8): ("llama3", "8B"), (80, 8192, 64, 8): ("llama3", "70B"),
                      (126, 16384, 128, 8): ("llama3", "405B")}


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
                "offload_activations": config.get("offload_activations", False)}
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


def _summary(doc: dict, plan: dict) -> list[str]:
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


# --- env, torchrun, slurm ------------------------------------------------------------------------

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
             *(f"# {line}" for line in _summary(doc, plan)),
             f"# --time: {time_note}",
             "# usage: TRAIN_SCRIPT=pretrain_gpt.py sbatch job.sh [training arguments]",
             "set -euo pipefail",
             ': "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to the training entry point}"',
             'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             f"srun torchrun --nnodes={n} --nproc-per-node={g} --rdzv-id=\"$SLURM_JOB_ID\" "
             f"--rdzv-backend c10d --rdzv-endpoint \"$head_node:{RDZV_PORT}\" "
             '"$TRAIN_SCRIPT" "$@"']
    return "\n".join(lines)


# --- Megatron-LM ----------------------------------------------------------------------------------

def pipeline_layout(layers: int, pp: int, v: int) -> str:
    """Megatron-LM's --pipeline-model-parallel-layout for v chunks per stage when the layers do
    not divide into pp x v: the pp v chunks in model order (chunk k on stage k mod pp), the
    embedding on the first and the loss on the last, each holding floor(L / (pp v)) layers and
    the L mod (pp v) left over one each on chunks 1, 2, ... (round-robin over the stages, so no
    stage holds more than ceil(L / pp)); the cost model prices this layout."""
    n = pp * v
    base, left = divmod(layers, n)
    sizes = [base + (1 <= k <= left) for k in range(n)]
    chunks = ["t" * size for size in sizes]
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"
    return "|".join(chunks)


def uneven_stages(layers: int, pp: int) -> tuple[int, int] | None:
    """(first, last) stage sizes for Megatron's uneven pipeline (the middle stages equal), no
    stage over ceil(layers / pp), the bound the cost model prices; None when pp divides
    layers."""
    if layers % pp == 0:
        return None
    most = -(-layers // pp)
    if pp == 2:
        return most, layers - most
    for middle in (most, layers // pp):
        total = layers - (pp - 2) * middle
        for last in range(min(most, total - 1), 0, -1):
            if 1 <= total - last <= most:
                return total - last, last
    raise SpecError(f"format: Megatron-LM's uneven pipeline (first and last stage sizes, equal "
                    f"middle stages) cannot place {layers} layers on pp({pp}) stages of at "
                    f"most {most}")


def _megatron_precision(precision: str) -> list[str]:
    if precision == "bf16":
        return ["--bf16"]
    if precision == "fp16":
        return ["--fp16"]
    if precision == "fp8":  # Transformer Engine FP8: e4m3 forward, e5m2 gradients; bf16 elsewhere
        return ["--bf16", "--fp8-format", "hybrid"]
    if precision == "mxfp8":  # block-scaled FP8 (Blackwell)
        return ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]
    if precision in ("nvfp4", "fp4"):  # NVFP4 block scaling (Blackwell)
        return ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    if precision in ("fp32", "tf32"):
        return []  # Megatron's default: fp32 parameters and compute (TF32 matmuls on Ampere+)
    raise SpecError(f"format: Megatron-LM has no {precision} training; use --precision bf16, "
                    "fp16, fp8, tf32 or fp32")


def _megatron_zero(zero: int) -> list[str]:
    if zero == 0:
        return []
    if zero == 1:  # optimizer state sharded over data-parallel ranks (ZeRO-1)
        return ["--use-distributed-optimizer"]
    # Megatron-FSDP: optim_grads shards optimizer state and gradients (ZeRO-2), optim_grads_params
    # the weights too (ZeRO-3); it needs the fsdp_dtensor checkpoint format (arguments.py)
    strategy = "optim_grads" if zero == 2 else "optim_grads_params"
    return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy,
            "--ckpt-format", "fsdp_dtensor"]


def _torchtitan_less_layers(layers: int, plan: dict) -> tuple[int, int]:
    """torchtitan's first / last stage "less layers" for the plan's pinned stage sizes: it
    counts the embedding and the output as that many layers and splits L + less_first +
    less_last evenly (pipeline_parallel.py, generate_llm_fqn_per_model_part), so a middle
    stage of M layers and a first stage of F take less_first = M - F."""
    first, last = plan.get("first_stage_layers"), plan.get("last_stage_layers")
    pp, v = plan["pp"], plan["interleave"]
    if not (first or last) and v > 1 and layers % (pp * v):
        # uneven chunks: torchtitan gives every chunk `per` layers but the first and last,
        # which count the embedding and the output as the layers they lack; priced as the
        # planner's layout only when no stage then holds more than ceil(L / pp)
        per = -(-layers // (pp * v))
        lack = pp * v * per - layers
        if v * per > -(-layers // pp) or lack > 2 * per:
            raise SpecError(f"format: torchtitan cannot place {layers} layers in pp({pp}) x "
                            f"interleave({v}) chunks as the plan does; use --format megatron")
        return (lack + 1) // 2, lack // 2
    if not (first or last):
        return 0, 0
    if plan["interleave"] > 1:
        raise SpecError("format: torchtitan's interleaved schedules split the layers evenly; "
                        "pinned first / last stage layers need --format megatron")
    others = plan["pp"] - bool(first) - bool(last)
    middle = (layers - (first or 0) - (last or 0)) // others if others else max(first, last)
    less = (middle - first if first else 0, middle - last if last else 0)
    if min(less) < 0:
        raise SpecError(f"format: torchtitan can only give the first / last stage fewer layers "
                        f"than the others ({middle}); this plan gives them {first} / {last}: "
                        "use --format megatron")
    return less


def megatron_args(doc: dict, plan: dict, target: Target) -> list[str]:
    """The Megatron-LM arguments (pretrain_gpt.py) for the plan, as a list of tokens."""
    m = target.model
    if m is None:
        raise SpecError("format: megatron needs a transformer model (CNN plans have no "
                        "Megatron-LM form)")
    a = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--num-attention-heads", m.heads]
    if m.kv_heads != m.heads:
        a += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    a += ["--ffn-hidden-size", m.ffn_hidden]
    if m.ffn_kind == "swiglu":
        a += ["--swiglu"]
    a += ["--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"]
    rotary = m.position_embedding == "rotary"
    a += ["--position-embedding-type", "rope" if rotary else "learned_absolute",
          "--max-position-embeddings", m.seq_len if rotary else max(m.max_positions, m.seq_len),
          "--seq-length", m.seq_len]
    # the vocabulary comes from the tokenizer; NullTokenizer takes it as a number (replace both
    # with your tokenizer's flags; Megatron pads it to a multiple of 128 x tp either way)
    a += ["--tokenizer-type", "NullTokenizer", "--vocab-size", m.vocab]
    if not m.tied_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    if not m.bias:
        a += ["--disable-bias-linear"]
    if m.experts > 1:  # the all-to-all dispatcher is the one the cost model prices
        a += ["--num-experts", m.experts, "--moe-router-topk", m.top_k,
              "--moe-ffn-hidden-size", m.ffn_hidden, "--moe-token-dispatcher-type", "alltoall"]
        if plan.get("capacity_factor", 1.0) > 1:  # every expert padded to its capacity
            a += ["--moe-expert-capacity-factor", plan["capacity_factor"],
                  "--moe-pad-expert-input-to-capacity"]
    a += _megatron_precision(target.precision)
    a += ["--tensor-model-parallel-size", plan["tp"], "--pipeline-model-parallel-size",
          plan["pp"]]
    if plan.get("cp", 1) > 1:  # the sequence must divide into 2 cp chunks (checked by the plan)
        a += ["--context-parallel-size", plan["cp"]]
    if plan.get("ep", 1) > 1:
        a += ["--expert-model-parallel-size", plan["ep"]]
    if plan.get("etp", plan["tp"]) != plan["tp"]:  # Megatron's default is tp
        a += ["--expert-tensor-parallel-size", plan["etp"]]
    if plan["interleave"] > 1 and m.layers % (plan["pp"] * plan["interleave"]):
        a += ["--pipeline-model-parallel-layout",
              pipeline_layout(m.layers, plan["pp"], plan["interleave"])]
    elif plan["interleave"] > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", plan["interleave"]]
    first, last = plan.get("first_stage_layers"), plan.get("last_stage_layers")
    if first or last:  # pinned by the plan (checked against Megatron's rules there)
        a += ["--decoder-first-pipeline-num-layers", first] if first else []
        a += ["--decoder-last-pipeline-num-layers", last] if last else []
    elif plan["interleave"] == 1 and plan["pp"] > 1:
        uneven = uneven_stages(m.layers, plan["pp"])
        if uneven:
            a += ["--decoder-first-pipeline-num-layers", uneven[0],
                  "--decoder-last-pipeline-num-layers", uneven[1]]
    if plan["sequence_parallel"] and plan["tp"] > 1:
        a += ["--sequence-parallel"]
        if plan.get("tp_overlap"):  # Transformer Engine userbuffers; needs sequence parallel
            a += ["--tp-comm-overlap"]
    if plan["recompute"] == "selective":
        a += ["--recompute-granularity", "selective"]
    elif plan["recompute"] == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", 1]
    if not plan["flash_attention"]:
        a += ["--attention-backend", "unfused"]
    if plan.get("offload_activations"):  # the inputs of every module that saves them
        modules = ["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"]
        modules += ["expert_fc1", "moe_act"] if m.experts > 1 else []
        a += ["--fine-grained-activation-offloading", "--offload-modules", *modules]
    a += _megatron_zero(plan["zero"])
    if plan["overlap"] and plan["dp"] > 1:
        a += ["--overlap-grad-reduce"]
    a += ["--micro-batch-size", plan["micro_batch"], "--global-batch-size",
          plan["global_batch"]]
    return [str(x) for x in a]


def megatron(doc: dict, plan: dict, target: Target) -> str:
    """One flag (with its value) per line, joined by backslash-newlines: pastes after
    `torchrun ... pretrain_gpt.py`."""
    tokens, lines = megatron_args(doc, plan, target), []
    for tok in tokens:
        if tok.startswith("--") or not lines:
            lines.append(tok)
        else:
            lines[-1] += " " + shlex.quote(tok)
    return " \\\n  ".join(lines)


# --- DeepSpeed ------------------------------------------------------------------------------------

def deepspeed(doc: dict, plan: dict, target: Target) -> str:
    """ds_config JSON. train_batch_size = micro x accumulation x data-parallel world size
    (DeepSpeed divides by dp, not by all ranks, when a model-parallel unit is given)."""
    for key, what in (("offload_activations", "activation offload"),
                      ("first_stage_layers", "pinned first-stage layers"),
                      ("last_stage_layers", "pinned last-stage layers")):
        if plan.get(key):
            raise SpecError(f"format: this ds_config has no {what} (DeepSpeed sets pipeline "
                            f"partitions and offload in the model code); use --format megatron")
    if plan.get("ep", 1) > 1:
        raise SpecError(f"format: this ds_config has no MoE expert-parallel block (DeepSpeed "
                        f"sets ep in the model code); this plan has ep {plan['ep']}: use --format "
                        f"megatron or torchtitan")
    if plan.get("cp", 1) > 1:
        raise SpecError(f"format: DeepSpeed has no ring-attention context parallelism (its "
                        f"Ulysses sequence parallelism is all-to-all); this plan has cp "
                        f"{plan['cp']}: use --format megatron or torchtitan")
    if plan["pp"] > 1 and plan["zero"] >= 2:
        raise SpecError(f"format: DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only "
                        f"(this plan: pp {plan['pp']}, ZeRO {plan['zero']})")
    cfg = {"train_batch_size": plan["micro_batch"] * plan["gradient_accumulation"] * plan["dp"],
           "train_micro_batch_size_per_gpu": plan["micro_batch"],
           "gradient_accumulation_steps": plan["gradient_accumulation"]}
    p = target.precision
    if p in ("bf16", "fp8", "mxfp8", "nvfp4", "fp4"):  # fp8 / fp4 run through Transformer
        # Engine in the model, bf16 around it
        cfg["bf16"] = {"enabled": True}
    elif p == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif p == "fp64":
        raise SpecError("format: DeepSpeed has no fp64 training; use --precision bf16, fp16, "
                        "tf32 or fp32")
    cfg["zero_optimization"] = {"stage": plan["zero"]}
    if plan["zero"] >= 1:
        cfg["zero_optimization"]["overlap_comm"] = bool(plan["overlap"])
    return json.dumps(cfg, indent=2)


# --- torchtitan -----------------------------------------------------------------------------------

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a TOML basic string: JSON's escapes are valid TOML escapes


def torchtitan(doc: dict, plan: dict, target: Target) -> str:
    """torchtitan's job-config TOML (`--job.config_file`). torchtitan shards with FSDP2:
    ZeRO 0 is plain data parallel (replicate), ZeRO 3 FSDP resharding after forward, ZeRO 1-2
    FSDP keeping the weights gathered between forward and backward (reshard "never": weights
    whole, gradients and optimizer state sharded: ZeRO-2, which also covers ZeRO-1's memory)."""
    m = target.model
    if m is None:
        raise SpecError("format: torchtitan needs a transformer model (CNN plans have no "
                        "torchtitan form)")
    key = (m.layers, m.hidden, m.heads, m.kv_heads)
    known = TORCHTITAN_FLAVORS.get(key) if (m.ffn_kind, m.norm, m.position_embedding) == (
        "swiglu", "rmsnorm", "rotary") else None
    name, flavor = known or ("llama3", m.name)
    head = [f"# {line}" for line in _summary(doc, plan)]
    if known is None:
        head.append(f"# torchtitan has no built-in flavor for '{m.name}': register one named "
                    f"'{m.name}' ({m.layers} layers, dim {m.hidden}, {m.heads} heads, "
                    f"{m.kv_heads} kv heads, vocab {m.vocab})")
    dp, zero = plan["dp"], plan["zero"]
    # with a pipeline, every micro-batch of an iteration goes through it in one step
    local = plan["micro_batch"] * (plan["gradient_accumulation"] if plan["pp"] > 1 else 1)
    if target.precision in ("fp64", "nvfp4", "fp4"):
        raise SpecError(f"format: torchtitan has no {target.precision} training; use "
                        "--precision bf16, fp16, fp8, mxfp8, tf32 or fp32")
    low = target.precision in ("bf16", "fp16", "fp8", "mxfp8")
    if target.precision == "fp16":
        head.append("# precision: torchtitan trains in bf16 (same cost as the plan's fp16)")
    model = {"name": name, "flavor": flavor}
    if target.precision in ("fp8", "mxfp8"):
        model["converters"] = ["quantize.linear.float8" if target.precision == "fp8"
                               else "quantize.linear.mx"]
    training = {"local_batch_size": local, "global_batch_size": plan["global_batch"],
                "seq_len": m.seq_len, "mixed_precision_param": "bfloat16" if low else "float32"}
    parallelism = {"data_parallel_replicate_degree": dp if zero == 0 else 1,
                   "data_parallel_shard_degree": 1 if zero == 0 else dp,
                   "tensor_parallel_degree": plan["tp"],
                   "pipeline_parallel_degree": plan["pp"],
                   "context_parallel_degree": plan.get("cp", 1),
                   "expert_parallel_degree": plan.get("ep", 1)}
    if m.experts > 1:
        # torchtitan runs the experts at etp = 1 or etp = tp only (job_config.py), 1 by default
        etp = plan.get("etp", plan["tp"])
        if etp not in (1, plan["tp"]):
            raise SpecError(f"format: torchtitan runs experts at etp 1 or etp = tp; this plan "
                            f"has etp {etp} with tp {plan['tp']}: use --format megatron")
        parallelism["expert_tensor_parallel_degree"] = etp
        if plan.get("capacity_factor", 1.0) > 1:
            raise SpecError("format: torchtitan's MoE is dropless (no capacity factor); use "
                            "--format megatron")
    if plan.get("offload_activations"):  # its CPU offload is FSDP's, of the weights' state
        raise SpecError("format: torchtitan has no activation offload; use --format megatron")
    if plan.get("tp_overlap") and plan["tp"] > 1:  # AsyncTP works under torch.compile only
        parallelism["enable_async_tensor_parallel"] = True
    if zero in (1, 2):
        parallelism["fsdp_reshard_after_forward"] = "never"
    elif zero == 3:
        parallelism["fsdp_reshard_after_forward"] = "always"
    if plan["pp"] > 1:
        parallelism["pipeline_parallel_microbatch_size"] = plan["micro_batch"]
        less = _torchtitan_less_layers(m.layers, plan)
        parallelism["pipeline_parallel_first_stage_less_layers"] = less[0]
        parallelism["pipeline_parallel_last_stage_less_layers"] = less[1]
        if plan["interleave"] > 1:
            parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B"
            parallelism["pipeline_parallel_layers_per_stage"] = \
                -(-m.layers // (plan["pp"] * plan["interleave"]))
        else:
            parallelism["pipeline_parallel_schedule"] = (
                "GPipe" if plan["schedule"] == "gpipe" else "1F1B")
    ac = {"mode": plan["recompute"]}
    if plan["recompute"] == "selective":
        ac["selective_ac_option"] = "op"  # per-op: keeps matmul outputs, recomputes the rest
    sections = [("model", model), ("training", training), ("parallelism", parallelism),
                ("activation_checkpoint", ac)]
    if target.precision == "fp8":
        sections.append(("quantize.linear.float8", {"filter_fqns": ["output"]}))
    if parallelism.get("enable_async_tensor_parallel"):
        sections.append(("compile", {"enable": True, "components": ["model", "loss"]}))
    out = head
    for title, body in sections:
        out += ["", f"[{title}]", *(f"{k} = {_toml_value(v)}" for k, v in body.items())]
    return "\n".join(out)


# --- dispatch -------------------------------------------------------------------------------------

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
    target = target or Target()
    plan = normalise(doc["config"])
    forms = {"env": env, "slurm": slurm, "torchrun": torchrun, "megatron": megatron,
             "deepspeed": deepspeed, "torchtitan": torchtitan}
    return forms[fmt](doc, plan, target)
