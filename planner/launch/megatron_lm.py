"""Megatron-LM arguments for pretrain_gpt.py: `megatron_args` (a list of tokens) and `megatron`
(one flag with its value per line, joined by backslash-newlines), with the pipeline helpers they
share with the cost model's layout (`pipeline_layout`, `uneven_stages`).

The flags were checked against Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:
megatron/training/arguments.py and the flags its ArgumentGroupFactory generates from
TransformerConfig / ModelParallelConfig (megatron/training/argument_utils.py: field `foo_bar` ->
`--foo-bar`); tests/test_launch.py keeps the flag list with this commit.
"""

from __future__ import annotations

import itertools
import shlex

from planner.errors import SpecError
from planner.launch.common import Target
from planner.plan import chunk_layers


def pipeline_layout(layers: int, pp: int, v: int) -> str:
    """Megatron-LM's --pipeline-model-parallel-layout for v chunks per stage when the layers do
    not divide into pp x v: the pp v chunks in model order (chunk k on stage k mod pp), the
    embedding on the first and the loss on the last, each holding floor(L / (pp v)) layers and
    the L mod (pp v) left over one each on chunks 1, 2, ... (round-robin over the stages, so no
    stage holds more than ceil(L / pp)); the cost model prices this layout."""
    chunks = ["t" * size for size in chunk_layers(layers, pp, v)]
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"
    return "|".join(chunks)


def uneven_stages(layers: int, pp: int) -> tuple[int, int] | None:
    """(first, last) stage sizes for Megatron's uneven pipeline (the middle stages equal), no
    stage over ceil(layers / pp) and the last, which runs the output layer too, at most
    floor(layers / pp): what the cost model prices; None when pp divides layers."""
    if layers % pp == 0:
        return None
    most, least = -(-layers // pp), layers // pp
    if pp == 2:
        return most, layers - most
    # a last stage of at most floor(L / pp) first (what the cost model prices), else of at
    # most ceil(L / pp)
    for bound, middle in itertools.product((least, most), (most, least)):
        total = layers - (pp - 2) * middle
        for last in range(min(bound, total - 1), 0, -1):
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
    first, last = plan.get("first_stage_layers"), plan.get("last_stage_layers")
    if plan["interleave"] > 1 and not (first or last) and m.layers % (
            plan["pp"] * plan["interleave"]):
        # exclusive with the other layout flags (arguments.py)
        a += ["--pipeline-model-parallel-layout",
              pipeline_layout(m.layers, plan["pp"], plan["interleave"])]
    elif plan["interleave"] > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", plan["interleave"]]
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
    elif plan["recompute"] == "full" and plan.get("recompute_layers"):
        # block: the first N layers of each model chunk recomputed, the rest kept whole
        a += ["--recompute-granularity", "full", "--recompute-method", "block",
              "--recompute-num-layers", plan["recompute_layers"]]
    elif plan["recompute"] == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", 1]
    if not plan["flash_attention"]:
        a += ["--attention-backend", "unfused"]
    if plan.get("kernels") == "eager":  # the fusions Megatron does by default, off
        a += ["--no-masked-softmax-fusion", "--no-bias-dropout-fusion",
              "--no-bias-swiglu-fusion" if m.gated_ffn else "--no-bias-gelu-fusion"]
        a += ["--no-rope-fusion"] if m.position_embedding == "rotary" else []
    if plan.get("ep_overlap"):  # ModelParallelConfig.overlap_moe_expert_parallel_comm
        a += ["--overlap-moe-expert-parallel-comm"]
    if plan.get("offload_activations"):  # the inputs of every module that saves them
        modules = ["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"]
        modules += ["expert_fc1", "moe_act"] if m.experts > 1 else []
        a += ["--fine-grained-activation-offloading", "--offload-modules", *modules]
    a += _megatron_zero(plan["zero"])
    if plan.get("fp8_weight_gather"):  # needs the distributed optimizer or FSDP (arguments.py)
        a += ["--fp8-param-gather"]
    if plan.get("dp_shard") and plan["dp"] > plan["dp_shard"]:
        # the distributed optimizer / Megatron-FSDP sharded over groups of dp_shard x cp
        # ranks, one copy per group (HSDP in Megatron-FSDP: mcore_fsdp_adapter.py)
        a += ["--num-distributed-optimizer-instances", plan["dp"] // plan["dp_shard"]]
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
