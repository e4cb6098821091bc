"""torchtitan's TOML job config (`--job.config_file`) for the plan: the model flavor, the batch,
the parallelism degrees (FSDP2 resharding for ZeRO, first / last stage "less layers" for uneven or
pinned stages), activation checkpointing, the float8 / MX converters.

The keys were checked against torchtitan TORCHTITAN_COMMIT (238fa99, the last commit whose
launcher reads a TOML job config, `--job.config_file`; 9810191 moved to Python config
functions): torchtitan/config/job_config.py; tests/test_launch.py keeps the key list with this
commit. The model is one of torchtitan's own flavors at that commit (`TORCHTITAN_FLAVORS`);
a model it has none of (Llama 2, GPT-3, Mixtral, ...) is refused, exit 2.
"""

from __future__ import annotations

import json

from planner.errors import SpecError
from planner.launch.common import Target, summary
from planner.plan import stage_layers

TORCHTITAN_COMMIT = "238fa9953e4aec2a62582121564273d7cbb1e9f1"  # pytorch/torchtitan, 2026-02

# torchtitan's built-in flavors at TORCHTITAN_COMMIT (torchtitan/models/*/__init__.py), keyed by
# the architecture they build: (layers, hidden, heads, kv_heads, dense FFN, expert FFN, experts,
# top_k, vocab, MLA) -> (model name, flavor, what differs from the spec's published model or "")
TORCHTITAN_FLAVORS = {
    (32, 4096, 32, 8, 14336, 14336, 1, 1, 128256, False): ("llama3", "8B", "llama3"),
    (80, 8192, 64, 8, 28672, 28672, 1, 1, 128256, False): ("llama3", "70B", "llama3"),
    (126, 16384, 128, 8, 53248, 53248, 1, 1, 128256, False): ("llama3", "405B", "llama3"),
    (61, 7168, 128, 128, 18432, 2048, 256, 8, 129280, True): ("deepseek_v3", "671B", ""),
    (48, 2048, 32, 4, 6144, 768, 128, 8, 151936, False): ("qwen3", "30B-A3B", ""),
    (94, 4096, 64, 4, 12288, 1536, 128, 8, 151936, False): ("qwen3", "235B-A22B", "qwen3-235b"),
}


def _flavor(m) -> tuple[str, str, list[str]]:
    """torchtitan's (model name, flavor) that builds `m`, with comment lines on what differs in
    its positional encoding; exit 2 for a model torchtitan has no flavor of (writing another
    model's flavor would train a different network)."""
    key = (m.layers, m.hidden, m.heads, m.kv_heads, m.dense_ffn_hidden or m.ffn_hidden,
           m.ffn_hidden, m.experts, m.top_k, m.vocab, m.mla is not None)
    if key not in TORCHTITAN_FLAVORS:
        kind = "mixture-of-experts " if m.experts > 1 else ""
        raise SpecError(f"format: torchtitan ({TORCHTITAN_COMMIT[:7]}) has no {kind}flavor that "
                        f"builds '{m.name}' ({m.layers} layers, hidden {m.hidden}, "
                        f"{m.experts} experts); use --format megatron")
    name, flavor, note = TORCHTITAN_FLAVORS[key]
    notes = []
    if note == "llama3" and m.rope_scaling is None:
        notes.append("# rope: torchtitan's llama3 flavors apply Llama 3.1's frequency scaling "
                     "(factor 8); Llama 3 has none (same cost)")
    if note == "qwen3-235b":
        notes.append("# rope: torchtitan's 235B-A22B flavor sets rope_theta 5,000,000; the "
                     f"published model {m.rope_theta:,.0f} (same cost)")
    return name, flavor, notes


def _every_kth_layer(layers: int, plan: dict) -> int | None:
    """torchtitan's layer selective checkpointing for the plan's partial recomputation: option
    k checkpoints every k-th block it wraps (activation_checkpoint.py, _apply_layer_sac), so
    N of each chunk's n layers when the chunks are even and k = n / N is whole; None when N
    covers every chunk (full checkpointing)."""
    n_rec = plan["recompute_layers"]
    chunks = plan["pp"] * plan["interleave"]
    per = layers // chunks
    stages = stage_layers(layers, plan["pp"], plan["interleave"],
                          plan.get("first_stage_layers"), plan.get("last_stage_layers"))
    if n_rec * plan["interleave"] >= max(stages):  # every layer of every chunk: full
        return None
    if (layers % chunks or plan.get("first_stage_layers") or plan.get("last_stage_layers")
            or per % n_rec):
        raise SpecError(f"format: torchtitan checkpoints every k-th layer; recomputing "
                        f"{n_rec} layers of each chunk needs even chunks of a multiple of "
                        f"{n_rec} layers ({layers} layers in pp({plan['pp']}) x "
                        f"interleave({plan['interleave']})); use --format megatron")
    return per // n_rec


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
    name, flavor, notes = _flavor(m)
    head = [f"# torchtitan {TORCHTITAN_COMMIT} job config (--job.config_file): the last",
            "# commit whose launcher reads a TOML job config",
            *(f"# {line}" for line in summary(doc, plan)), f"# precision {target.precision}",
            *notes]
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
    shard = plan.get("dp_shard") or dp  # HSDP: FSDP inside groups of dp_shard, replicated
    parallelism = {"data_parallel_replicate_degree": dp if zero == 0 else dp // shard,
                   "data_parallel_shard_degree": 1 if zero == 0 else shard,
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
    if plan.get("ep_overlap"):
        raise SpecError("format: torchtitan does not overlap the MoE all-to-alls across "
                        "micro-batches; use --format megatron")
    if plan.get("grad_reduce_bf16"):  # job_config.py: mixed_precision_reduce Literal["float32"]
        raise SpecError("format: torchtitan reduces gradients in float32 only; use --format "
                        "megatron for --grad-reduce-bf16")
    if plan.get("offload_activations"):  # its CPU offload is FSDP's, of the weights' state
        raise SpecError("format: torchtitan has no activation offload; use --format megatron")
    eager = plan.get("kernels") == "eager"
    if plan.get("tp_overlap") and plan["tp"] > 1:  # AsyncTP works under torch.compile only
        if eager:
            raise SpecError("format: torchtitan's AsyncTP (tp overlap) runs under torch.compile "
                            "only, not with eager kernels")
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
    elif plan["recompute"] == "full" and plan.get("recompute_layers"):
        k = _every_kth_layer(m.layers, plan)
        if k is not None:
            ac = {"mode": "selective", "selective_ac_option": str(k)}
    sections = [("model", model), ("training", training), ("parallelism", parallelism),
                ("activation_checkpoint", ac)]
    if target.precision == "fp8":
        float8 = {"filter_fqns": ["output"]}
        if plan.get("fp8_weight_gather"):  # FSDP2 gathers the fp8 weights (tensorwise scaling)
            float8 |= {"enable_fsdp_float8_all_gather": True,
                       "precompute_float8_dynamic_scale_for_fsdp": True}
        sections.append(("quantize.linear.float8", float8))
    elif plan.get("fp8_weight_gather"):
        raise SpecError("format: torchtitan gathers fp8 weights with its float8 (tensorwise) "
                        "recipe only, not with mxfp8")
    if plan.get("fp8_activations"):  # torchao's float8 linear saves the 16-bit input
        raise SpecError("format: torchtitan's float8 linears (torchao) save their inputs at "
                        "16 bits; the plan saves them in fp8 (Transformer Engine): use "
                        "--format megatron, or plan without --fp8-activations")
    if not eager:  # the fused non-matmul kernels the plan was priced with (default: off)
        sections.append(("compile", {"enable": True, "components": ["model", "loss"]}))
    out = head
    for title, body in sections:
        out += ["", f"[{title}]", *(f"{k} = {_toml_value(v)}" for k, v in body.items())]
    return "\n".join(out)
