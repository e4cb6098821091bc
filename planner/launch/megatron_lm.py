"""Megatron-LM for the plan: `megatron_args` (the architecture and the plan as pretrain_gpt.py
arguments, a list of tokens) and `megatron` (a bash script that starts torchrun on one node with
those arguments plus the placeholders the planner does not choose: data, tokenizer, learning
rate, iterations, checkpoints), with the pipeline helpers they share with the cost model's
layout (`pipeline_layout`, `uneven_stages`). A model feature pretrain_gpt.py cannot be told is
refused (exit 2), never dropped.

The flags were checked against Megatron-LM MEGATRON_COMMIT: the parser Megatron-LM builds in
megatron/training/arguments.py (`add_megatron_arguments`: every `_add_*_args` and the flags its
ArgumentGroupFactory generates from the config dataclasses), dumped as data into
tests/data/launch_megatron_args.json by tests/data/make_launch_megatron_args.py; the tests
rebuild that parser and parse every argument this form writes. The cross-flag rules written
here (CUDA_DEVICE_MAX_CONNECTIONS, the layout flags, fsdp_dtensor, top-1 pre-softmax) are
validate_args' and TransformerConfig's at the same commit.
"""

from __future__ import annotations

import itertools
import shlex

from planner import rules, switches
from planner.errors import SpecError
from planner.launch.common import Target, max_connections, needs_transformer, priced_steps, summary
from planner.plan import chunk_layers, stage_chunks, stage_layers

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"  # NVIDIA/Megatron-LM, 2026-08-22


def pipeline_layout(layers: int, pp: int, v: int, mtp: int = 0) -> str:
    """Megatron-LM's --pipeline-model-parallel-layout for v chunks per stage when the layers do
    not divide into pp x v: the pp v chunks in model order (chunk k on stage k mod pp), the
    embedding on the first and the loss on the last, each holding floor(L / (pp v)) layers and
    the L mod (pp v) left over one each on chunks 1, 2, ... (round-robin over the stages, so no
    stage holds more than ceil(L / pp)); the cost model prices this layout."""
    return _layout(["t" * size for size in chunk_layers(layers, pp, v)], mtp)


def stage_layout(layers: list[int], mtp: int = 0) -> str:
    """Megatron-LM's --pipeline-model-parallel-layout for one chunk per stage holding the given
    layer counts: the embedding with the first stage, the loss with the last."""
    return _layout(["t" * n for n in layers], mtp)


def pinned_layout(layers: int, pp: int, v: int, first: int | None, last: int | None,
                  mtp: int = 0) -> str:
    """The layout of pinned first / last stages whose layers do not divide into their v chunks
    (which --decoder-first/last-pipeline-num-layers refuse): each stage's layers split as
    `stage_chunks` does, chunk k of the model on stage k mod pp."""
    per_stage = [stage_chunks(n, v) for n in stage_layers(layers, pp, v, first, last)]
    return _layout(["t" * per_stage[k % pp][k // pp] for k in range(pp * v)], mtp)


def _layout(chunks: list[str], mtp: int) -> str:
    """The chunks joined, the embedding first, then the multi-token prediction depths (which
    Megatron-LM asks to be in the last chunk, after every decoder layer, their count its
    --mtp-num-layers: PipelineParallelLayerLayout.validate_layer_layout at d98e8a6) and the
    loss last."""
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "m" * mtp + "L"
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


def _refuse_unexpressed(m) -> None:
    """Exit 2 for a model feature this form does not write (pretrain_gpt.py would build another
    model): one rule for every format, express it or refuse it."""
    what = None
    if m.layer_pattern or m.mamba:
        what = "a hybrid Mamba layer pattern (Megatron-LM builds it with pretrain_mamba.py)"
    elif not m.causal or m.token_types or m.pooler:
        what = "an encoder (BERT: Megatron-LM's pretrain_bert.py)"
    elif m.sliding_window:
        what = "sliding-window attention"
    elif m.attention_sinks:
        what = "attention sinks"
    elif m.post_norms:
        what = "post-norms"
    elif m.ffn_kind == "geglu":
        what = "a GeGLU FFN"
    elif m.mlp_bias is not None and m.mlp_bias != m.bias:
        what = "FFN biases that differ from the other linear layers'"
    elif m.out_bias is not None and m.out_bias != m.bias:
        what = "an attention output bias that differs from the other linear layers'"
    elif m.qkv_bias is not None and m.qkv_bias != m.bias and m.bias:
        what = "linear biases without QKV biases"
    elif m.router_bias and m.router_score != "sigmoid":
        what = "a router bias on softmax scores (Megatron-LM's expert bias needs sigmoid scores)"
    elif m.rope_scaling and (m.rope_scaling.low_freq_factor, m.rope_scaling.high_freq_factor,
                             m.rope_scaling.original_max_positions) != (1.0, 4.0, 8192):
        what = ("Llama 3.1 rope scaling other than low / high frequency factors 1 / 4 over "
                "8192 positions (Megatron-LM's fixed values)")
    elif m.rope_theta is not None and m.rope_theta != int(m.rope_theta):
        what = f"a fractional rotary base {m.rope_theta:g} (--rotary-base takes an integer)"
    if what:
        raise SpecError(f"format: this Megatron-LM form does not write {what} of '{m.name}'; "
                        "no launcher form of planner writes it")


def _model_args(m) -> list:
    """The architecture: what pretrain_gpt.py needs to build the model the plan was priced on."""
    _refuse_unexpressed(m)
    a = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--num-attention-heads", m.heads]
    if m.mla:  # multi-latent attention (DeepSeek-V2/V3): the ranks and head sizes of the spec
        q = ["--q-lora-rank", m.mla.q_lora_rank] if m.mla.q_lora_rank else []
        a += ["--multi-latent-attention", *q, "--kv-lora-rank", m.mla.kv_lora_rank,
              "--qk-head-dim", m.mla.qk_nope_head_dim,
              "--qk-pos-emb-head-dim", m.mla.qk_rope_head_dim, "--v-head-dim", m.mla.v_head_dim,
              "--qk-layernorm",  # MLA's qk layernorm: the q_a / kv_a latent norms
              # MLA's rope is YaRN; at factor 1 it is plain RoPE, as pre-training runs it
              "--rotary-scaling-factor", 1.0]
    else:
        if m.kv_heads != m.heads:
            a += ["--group-query-attention", "--num-query-groups", m.kv_heads]
        if m.head_dim != m.hidden // m.heads:
            a += ["--kv-channels", m.head_dim]
        if m.qk_norm:
            a += ["--qk-layernorm"]
    a += ["--ffn-hidden-size", m.dense_ffn_hidden or m.ffn_hidden]
    if m.ffn_kind == "swiglu":
        a += ["--swiglu"]
    elif m.ffn_kind == "relu2":
        a += ["--squared-relu"]
    a += ["--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"]
    rotary, learned = m.position_embedding == "rotary", m.position_embedding == "learned"
    a += ["--position-embedding-type",
          "rope" if rotary else "learned_absolute" if learned else "none",
          "--max-position-embeddings", max(m.max_positions, m.seq_len) if learned else m.seq_len,
          "--seq-length", m.seq_len]
    if rotary and m.rope_theta is not None:  # Megatron's default base is 10,000
        a += ["--rotary-base", int(m.rope_theta)]
    if rotary and m.rope_scaling:  # Llama 3.1 (low / high frequency factors 1 / 4 over 8192)
        a += ["--use-rope-scaling", "--rope-scaling-factor", m.rope_scaling.factor]
    # dropout as priced (Megatron's default is 0.1 for both; Llama-lineage models use none)
    a += ["--attention-dropout", m.dropout, "--hidden-dropout", m.dropout]
    if not m.tied_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    if not m.bias:
        a += ["--disable-bias-linear"]
        if m.qkv_bias:  # Qwen2-style: biases on Q, K, V only
            a += ["--add-qkv-bias"]
    if m.experts > 1:
        a += ["--num-experts", m.experts, "--moe-router-topk", m.top_k,
              "--moe-ffn-hidden-size", m.ffn_hidden]
        if m.first_dense_layers:  # 0: a dense layer, 1: a MoE layer (arguments.py moe_freq_type)
            a += ["--moe-layer-freq",
                  f"([0]*{m.first_dense_layers}+[1]*{m.layers - m.first_dense_layers})"]
        if m.shared_experts:  # Megatron's shared expert is one FFN of the summed width
            a += ["--moe-shared-expert-intermediate-size",
                  m.shared_experts * (m.shared_expert_ffn_hidden or m.ffn_hidden)]
        if m.router_score != "softmax":
            a += ["--moe-router-score-function", m.router_score]
        if m.router_bias:  # sigmoid scores: the expert bias of aux-loss-free balancing
            a += ["--moe-router-enable-expert-bias"]
        if m.router_topk_scale is not None:
            a += ["--moe-router-topk-scaling-factor", m.router_topk_scale]
        if m.router_groups:
            a += ["--moe-router-num-groups", m.router_groups,
                  "--moe-router-group-topk", m.router_group_topk]
        if m.top_k == 1 and m.router_score == "softmax":  # Megatron asserts it for top-1
            a += ["--moe-router-pre-softmax"]
        if m.moe_latent:  # TransformerConfig.moe_latent_size at d98e8a6 (MoELayer's projections)
            a += ["--moe-latent-size", m.moe_latent]
    if m.mtp_layers:  # TransformerConfig.mtp_num_layers at d98e8a6: depths on the last stage
        a += ["--mtp-num-layers", m.mtp_layers]
    return a


def megatron_args(doc: dict, plan: dict, target: Target) -> list[str]:
    """The Megatron-LM arguments (pretrain_gpt.py) for the model and the plan, as a list of
    tokens; the placeholders (data, tokenizer, learning rate, iterations) are `megatron`'s."""
    needs_transformer("megatron", target)
    m = target.model
    rules.check_form("megatron", plan, model=m)  # what Megatron-LM refuses (planner.rules)
    a = _model_args(m)
    if m.experts > 1 and plan.get("rank_capacity"):
        # the sync-free path: HybridEP's buffers at the rank's budget, needing Transformer
        # Engine's fused grouped experts (transformer_config.py at d98e8a6), which run
        # without expert tensor parallelism, on SwiGLU or on squared ReLU with its weighted
        # fusion (moe/experts.py `_is_fused_impl_supported`)
        if plan.get("etp", plan["tp"]) != 1 or m.ffn_kind not in ("swiglu", "relu2"):
            raise SpecError("format: Megatron-LM sizes the MoE buffers at a rank capacity only "
                            "with Transformer Engine's fused grouped experts, which need "
                            "--etp 1 and a SwiGLU or squared-ReLU FFN; plan with --etp 1, or "
                            "without --rank-capacity")
        a += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
              "hybridep", "--moe-grouped-gemm", "--use-transformer-engine-op-fuser",
              "--moe-expert-rank-capacity-factor", plan["rank_capacity"]]
        if m.ffn_kind == "relu2":
            a += ["--use-fused-weighted-squared-relu"]
        if plan.get("paged_stash"):
            a += ["--moe-paged-stash", "--moe-paged-stash-buffer-size-factor-cuda",
                  plan["paged_stash"]]
    elif m.experts > 1:  # the all-to-all dispatcher prices as the flex ones do
        a += ["--moe-token-dispatcher-type", "alltoall"]
        if plan.get("capacity_factor", 1.0) > 1:  # every expert padded to its capacity
            a += ["--moe-expert-capacity-factor", plan["capacity_factor"],
                  "--moe-pad-expert-input-to-capacity"]
    a += _megatron_precision(target.precision)
    if (target.precision == "fp8" and not plan.get("fp8_current_scaling")
            and (plan.get("recompute_norms") or plan.get("recompute_moe_act"))):
        # transformer_config.py at d98e8a6: "Delayed scaling does not support moe_act and
        # layernorm recompute for fp8"
        raise SpecError("format: Megatron-LM recomputes the norms or the MoE activation in fp8 "
                        "only with current scaling; plan with --fp8-current-scaling (its "
                        "--fp8-recipe tensorwise), or without --recompute-norms / "
                        "--recompute-moe-act")
    a += ["--tensor-model-parallel-size", plan["tp"], "--pipeline-model-parallel-size",
          plan["pp"]]
    if plan.get("cp", 1) > 1:  # the sequence must divide into 2 cp chunks (checked by the plan)
        a += ["--context-parallel-size", plan["cp"]]
    if plan.get("ep", 1) > 1:
        a += ["--expert-model-parallel-size", plan["ep"]]
    if plan.get("etp", plan["tp"]) != plan["tp"]:  # Megatron's default is tp
        a += ["--expert-tensor-parallel-size", plan["etp"]]
    first, last = plan.get("first_stage_layers"), plan.get("last_stage_layers")
    pp, v = plan["pp"], plan["interleave"]
    # a pinned stage whose layers do not divide into its v chunks needs the layout flag
    uneven_chunks = (first or last) and v > 1 and any(
        n % v for n in stage_layers(m.layers, pp, v, first, last))
    if plan.get("stage_layers"):  # a pipeline over pools: each stage its own layer count
        a += ["--pipeline-model-parallel-layout",
              stage_layout(plan["stage_layers"], m.mtp_layers)]
    elif v > 1 and not (first or last) and m.layers % (pp * v):
        # exclusive with the other layout flags (arguments.py)
        a += ["--pipeline-model-parallel-layout",
              pipeline_layout(m.layers, pp, v, m.mtp_layers)]
    elif uneven_chunks:
        a += ["--pipeline-model-parallel-layout",
              pinned_layout(m.layers, pp, v, first, last, m.mtp_layers)]
        first = last = None  # the layout says it all
    elif v > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", v]
    if first or last:  # pinned by the plan (checked against Megatron's rules there)
        a += ["--decoder-first-pipeline-num-layers", first] if first else []
        a += ["--decoder-last-pipeline-num-layers", last] if last else []
    elif plan["interleave"] == 1 and plan["pp"] > 1 and not plan.get("stage_layers"):
        uneven = uneven_stages(m.layers, plan["pp"])
        if uneven:
            a += ["--decoder-first-pipeline-num-layers", uneven[0],
                  "--decoder-last-pipeline-num-layers", uneven[1]]
    if plan["sequence_parallel"] and plan["tp"] > 1:
        a += ["--sequence-parallel"]
        if plan.get("tp_overlap"):  # Transformer Engine userbuffers; needs sequence parallel
            a += ["--tp-comm-overlap"]
    # selective: the attention core (Megatron's default module list) and the recompute
    # modules the plan sets (transformer_config.py at d98e8a6)
    modules = [module for name, (module, _) in switches.RECOMPUTE_MODULES.items()
               if plan.get(name)]
    if plan["recompute"] == "selective" or modules:
        a += ["--recompute-granularity", "selective"]
        if modules:
            core = ["core_attn"] if plan["recompute"] == "selective" else []
            a += ["--recompute-modules", *core, *modules]
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
    opt = plan.get("optimizer", "adam")  # arguments.py: --optimizer adam|sgd|muon|...
    if opt == "adafactor":
        raise SpecError("format: Megatron-LM has no Adafactor (--optimizer adam, sgd, muon, "
                        "lion, soap); price another optimizer")
    if opt != "adam":
        a += ["--optimizer", "sgd" if opt in ("sgd", "momentum") else opt]
        a += ["--sgd-momentum", "0"] if opt == "sgd" else []
    if plan["interleave"] > 1 and not plan.get("pp_overlap", True):  # overlap_p2p_comm
        a += ["--no-overlap-p2p-communication"]
    if plan.get("offload_activations"):  # the inputs of every module that saves them
        modules = ["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"]
        modules += ["expert_fc1", "moe_act"] if m.experts > 1 else []
        a += ["--fine-grained-activation-offloading", "--offload-modules", *modules]
    a += _megatron_zero(plan["zero"])
    if plan.get("dp_shard") and plan["dp"] > plan["dp_shard"]:
        # the distributed optimizer / Megatron-FSDP sharded over groups of dp_shard x cp
        # ranks, one copy per group (HSDP in Megatron-FSDP: mcore_fsdp_adapter.py)
        a += ["--num-distributed-optimizer-instances", plan["dp"] // plan["dp_shard"]]
    if plan["overlap"] and plan["dp"] > 1:
        a += ["--overlap-grad-reduce"]
    flags = switches.megatron_flags(plan)  # the switches that are one flag each
    if target.precision in ("nvfp4", "fp4"):  # NVFP4 weights are gathered as native NVFP4
        flags = ["--fp4-param-gather" if f == "--fp8-param-gather" else f for f in flags]
    a += flags
    a += ["--micro-batch-size", plan["micro_batch"], "--global-batch-size",
          plan["global_batch"]]
    return [str(x) for x in a]


def _bash_array(name: str, tokens: list[str]) -> list[str]:
    """A bash array, one flag with its values per line, each value quoted for the shell."""
    lines = [f"{name}=("]
    for tok in tokens:
        if tok.startswith("--") or len(lines) == 1:
            lines.append("  " + tok)
        else:
            lines[-1] += " " + shlex.quote(tok)
    return [*lines, ")"]


def _train_iters(doc: dict, plan: dict) -> str:
    steps = priced_steps(doc)
    if steps:
        return (f'TRAIN_ITERS="${{TRAIN_ITERS:-{steps}}}"  # the steps priced for '
                f"the training target at global batch {plan['global_batch']}")
    return ('TRAIN_ITERS="${TRAIN_ITERS:?PLACEHOLDER: set TRAIN_ITERS, the number of '
            'iterations (no training target was given to the planner)}"')


def megatron(doc: dict, plan: dict, target: Target) -> str:
    """A bash script for one node: `bash megatron.sh` on each node (MASTER_ADDR the first), or
    under the planner's sbatch script (`TRAIN_SCRIPT=megatron.sh`). It sets what Megatron-LM
    asserts in the environment, stops on an unset placeholder, and runs torchrun with
    pretrain_gpt.py and the plan's arguments; its own arguments follow them (argparse: the last
    value wins)."""
    model = megatron_args(doc, plan, target)
    n, g = plan["nodes"], plan["devices_per_node"]
    runs = plan.get("pool_nodes")  # a plan over pools: [(pool, nodes, stages)] in stage order
    lines = [
        "#!/bin/bash",
        f"# Megatron-LM pretrain_gpt.py; flags checked against NVIDIA/Megatron-LM "
        f"{MEGATRON_COMMIT[:12]} (megatron/training/arguments.py)",
        *(f"# {line}" for line in summary(doc, plan)),
        f"# precision {target.precision}",
        f"# Run once on each of the {n} node(s), in a Megatron-LM checkout (or set MEGATRON_LM):",
        *([
            "#   MASTER_ADDR=<node rank 0> NODE_RANK=<its rank below> bash THIS on each, or",
            "#   TRAIN_SCRIPT=THIS sbatch job.sh, job.sh from planner --format slurm (one "
            "component per pool)."] if runs else [
            "#   one node: bash THIS; more: MASTER_ADDR=<first node> bash THIS on each, or",
            "#   TRAIN_SCRIPT=THIS sbatch job.sh, job.sh from planner --format slurm."]),
        "# Arguments to this script follow the plan's (the last value of a flag wins).",
        "# PLACEHOLDER marks what the planner does not choose (data, tokenizer, learning rate,",
        "# iterations, checkpoints); the script stops until the required ones are set.",
        "set -euo pipefail",
        *max_connections(plan),
        "",
        "# --- PLACEHOLDERS ---",
        'DATA_PATH="${DATA_PATH:?PLACEHOLDER: set DATA_PATH to a Megatron-LM data prefix '
        '(path/to/corpus_text_document from tools/preprocess_data.py), or mock for synthetic '
        'tokens}"',
        'LR="${LR:?PLACEHOLDER: set LR, the peak learning rate}"',
        _train_iters(doc, plan),
        "# PLACEHOLDER tokenizer: NullTokenizer takes token ids as they are (enough for "
        "DATA_PATH=mock);",
        "# text data needs the tokenizer it was preprocessed with, e.g. --tokenizer-type "
        "HuggingFaceTokenizer --tokenizer-model NAME",
        f"TOKENIZER_ARGS=(--tokenizer-type NullTokenizer --vocab-size {target.model.vocab})",
        'if [ "$DATA_PATH" = mock ]; then DATA_ARGS=(--mock-data); '
        'else DATA_ARGS=(--data-path "$DATA_PATH" --split 99,1,0); fi',
        "# PLACEHOLDER schedule: cosine decay to LR / 10 after 1 % warm-up",
        'SCHEDULE_ARGS=(--lr "$LR" --min-lr "$(awk "BEGIN { print $LR / 10 }")" '
        '--lr-decay-style cosine',
        '  --lr-warmup-iters "$(( (TRAIN_ITERS + 99) / 100 ))" --train-iters "$TRAIN_ITERS")',
        "# PLACEHOLDER checkpoints: CHECKPOINT_DIR saves and resumes (chained jobs under a "
        "per-job time",
        "# limit); EXIT_MINUTES stops with a checkpoint that many minutes into the job",
        "CHECKPOINT_ARGS=()",
        'if [ -n "${CHECKPOINT_DIR:-}" ]; then CHECKPOINT_ARGS=(--save "$CHECKPOINT_DIR" '
        '--load "$CHECKPOINT_DIR" --save-interval "${SAVE_INTERVAL:-1000}"); fi',
        'if [ -n "${EXIT_MINUTES:-}" ]; then CHECKPOINT_ARGS+=(--exit-duration-in-mins '
        '"$EXIT_MINUTES"); fi',
        "",
        "# --- the model and the plan ---",
        *_bash_array("PLAN_ARGS", model),
        "",
        'MEGATRON_LM="${MEGATRON_LM:-.}"',
        *(_static_ranks(runs, n, g) if runs else [
            f"exec torchrun --nnodes={n} --nproc-per-node={g} --rdzv-backend=c10d \\",
            '  --rdzv-endpoint="${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" '
            '--rdzv-id="${SLURM_JOB_ID:-planner}" \\']),
        '  "$MEGATRON_LM/pretrain_gpt.py" "${PLAN_ARGS[@]}" "${TOKENIZER_ARGS[@]}" '
        '"${DATA_ARGS[@]}" \\',
        '  "${SCHEDULE_ARGS[@]}" "${CHECKPOINT_ARGS[@]}" "$@"',
    ]
    return "\n".join(lines)


def _static_ranks(runs: list[tuple[str, int, str]], n: int, g: int) -> list[str]:
    """torchrun with fixed node ranks for a plan over pools: Megatron-LM places pipeline stage
    j on global ranks [j, j + 1) x tp x dp (pp is the outermost of its rank order), so node
    ranks in stage order put each stage on its own pool's nodes; a rendezvous that ranks
    nodes as they join would not."""
    lines, first = ["# node ranks, in pipeline order (each stage's ranks on its pool's nodes):"], 0
    for pool, nodes, stages in runs:
        lines.append(f"#   {first}-{first + nodes - 1}: {pool} ({stages})")
        first += nodes
    return [*lines,
            'NODE_RANK="${NODE_RANK:?set NODE_RANK to the rank of this node in the order above '
            '(planner --format slurm sets it)}"',
            f"exec torchrun --nnodes={n} --nproc-per-node={g} --node-rank=\"$NODE_RANK\" \\",
            '  --master-addr="${MASTER_ADDR:-localhost}" --master-port="${MASTER_PORT:-29500}" '
            '\\']
