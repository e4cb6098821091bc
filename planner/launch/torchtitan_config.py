"""torchtitan's config module for the plan: a Python function returning the `Trainer.Config`
that torchtitan's dataclass config registry runs (`torchrun -m torchtitan.train --module M
--config F`): the model flavor from torchtitan's registry with its float8 / MXFP8 converters,
the batch in tokens, the parallelism degrees (FSDP2 for every data-parallel flavour: replicate
for ZeRO 0, resharding after forward or not for ZeRO 3 / 1-2, HSDP; first / last stage "less
layers" for uneven or pinned stages), activation checkpointing, torch.compile and AsyncTP, and
marked placeholders for the tokenizer, data, learning rate and steps.

Every name, keyword and value was checked against torchtitan TORCHTITAN_COMMIT (its config
refactor 9810191, "TOML to Python dataclass registry", and later): torchtitan/trainer.py
Trainer.Config, torchtitan/config/configs.py, torchtitan/distributed/activation_checkpoint.py,
torchtitan/components/quantization, the models' model_registry. tests/data/
launch_torchtitan_config.json keeps those classes' fields as data at this commit
(tests/data/make_launch_torchtitan_config.py), and tests/test_launch_torchtitan.py runs the
module against stand-ins built from it. The model is one of torchtitan's own flavors at that
commit (`TORCHTITAN_FLAVORS`); a model it has none of (Llama 2, GPT-3, Mixtral, ...) is
refused, exit 2, as is any part of the plan torchtitan cannot run as priced.
"""

from __future__ import annotations

import json

from planner import rules
from planner.errors import SpecError
from planner.launch.common import Target, needs_transformer, priced_steps, summary
from planner.plan import stage_layers

TORCHTITAN_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"  # pytorch/torchtitan, 2026-08-21
MODULE_NAME = "planner_torchtitan"  # the file name the header asks for (--module)
CONFIG_NAME = "planner_plan"  # the function (--config)

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
    if m.moe_latent:
        raise SpecError(f"format: torchtitan ({TORCHTITAN_COMMIT[:7]}) has no LatentMoE (the "
                        f"experts at a latent width, Megatron-LM --moe-latent-size, which "
                        f"--format megatron writes for attention models)")
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


def _recompute(layers: int, plan: dict) -> str | None:
    """torchtitan's activation checkpointing policy for the plan: "full" (FullAC, every block),
    "selective" (SelectiveAC: per op, keeps the matmul outputs but every second one, recomputes
    the rest) or None. Partial recomputation (N layers of each chunk) has no policy at this
    commit (its layer-selective option is gone): refused, unless N covers every layer."""
    if plan["recompute"] == "none":
        return None
    if plan["recompute"] == "selective":
        return "selective"
    n_rec = plan.get("recompute_layers")
    if n_rec:
        stages = stage_layers(layers, plan["pp"], plan["interleave"],
                              plan.get("first_stage_layers"), plan.get("last_stage_layers"))
        if n_rec * plan["interleave"] < max(stages):
            raise SpecError(f"format: torchtitan ({TORCHTITAN_COMMIT[:7]}) checkpoints every "
                            f"layer (FullAC) or per op (SelectiveAC); recomputing {n_rec} "
                            "layers of each chunk needs --format megatron")
    return "full"


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




def _stage_fqns(layers: list[int]) -> list[list[str]]:
    """torchtitan's module_fqns_per_model_part for stages of the given layer counts: the
    embedding with the first, the final norm and the output head with the last (the module
    names `_generate_llm_fqn_per_model_part` uses, pipeline_parallel.py)."""
    out, first = [], 0
    for n in layers:
        out.append([f"layers.{i}" for i in range(first, first + n)])
        first += n
    out[0].insert(0, "tok_embeddings")
    out[-1] += ["norm", "lm_head"]
    return out


def _pool_run(plan: dict) -> list[str]:
    """How to start a pipeline over node kinds: torchrun with fixed node ranks in stage order
    (the pp dimension is the outermost of torchtitan's device mesh, so stage j runs on global
    ranks [j, j + 1) x the rest: node ranks in stage order put each stage on its pool)."""
    lines, first = [], 0
    for pool, nodes, stages in plan["pool_nodes"]:
        lines.append(f"#     node ranks {first}-{first + nodes - 1}: {pool} ({stages})")
        first += nodes
    return [f"#   torchrun --nnodes={plan['nodes']} --nproc-per-node={plan['devices_per_node']} "
            "--node-rank=$NODE_RANK --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT \\",
            f"#       -m torchtitan.train --module {MODULE_NAME} --config {CONFIG_NAME}",
            "#   with NODE_RANK in stage order (a rendezvous that ranks nodes as they join "
            "would mix the pools):", *lines,
            "# or under the planner's --format slurm job (one component per pool; it sets "
            "NODE_RANK), TRAIN_SCRIPT",
            "# a script that runs the torchrun line above."]


class _Call:
    """A call in the config module, `func(key=value, ...)`, one keyword a line."""

    def __init__(self, func: str, comments: dict | None = None, **kwargs):
        self.func, self.kwargs, self.comments = func, kwargs, comments or {}

    def render(self, indent: int) -> str:
        if not self.kwargs:
            return f"{self.func}()"
        pad = " " * (indent + 4)
        lines = [f"{self.func}("]
        for key, value in self.kwargs.items():
            note = f"  # {self.comments[key]}" if key in self.comments else ""
            first, *rest = f"{pad}{key}={_py(value, indent + 4)},".split("\n")
            lines += [first + note, *rest]  # the comment on the keyword's own line
        return "\n".join([*lines, " " * indent + ")"])


class _Code(str):
    """Python source written as it is (a variable, an expression)."""


def _py(value, indent: int = 0) -> str:
    if isinstance(value, _Call):
        return value.render(indent)
    if isinstance(value, _Code):
        return str(value)
    if isinstance(value, list) and any(isinstance(v, _Call) for v in value):
        pad = " " * (indent + 4)
        return "\n".join(["[", *(f"{pad}{_py(v, indent + 4)}," for v in value),
                          " " * indent + "]"])
    if isinstance(value, list):
        return "[" + ", ".join(_py(v, indent) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)  # a Python string literal for printable text
    return repr(value)  # bool, int, float, None: Python literals


def _steps(doc: dict, plan: dict) -> str:
    steps = priced_steps(doc)
    if steps:
        return (f'    steps = int(os.environ.get("TRAIN_STEPS") or {steps})  # the '
                f"steps priced for the training target at global batch {plan['global_batch']}")
    return ('    steps = int(_placeholder("TRAIN_STEPS", "the number of steps (no training '
            'target was given to the planner)"))')


def torchtitan(doc: dict, plan: dict, target: Target) -> str:
    """torchtitan's config module (`--module planner_torchtitan --config planner_plan`).
    torchtitan runs every data-parallel flavour with FSDP2 over a (replicate, shard) mesh: ZeRO
    0 is replicate only (shard degree 1), ZeRO 3 FSDP resharding after forward, ZeRO 1-2 FSDP
    keeping the weights gathered between forward and backward (reshard "never": weights whole,
    gradients and optimizer state sharded: ZeRO-2, which also covers ZeRO-1's memory), HSDP
    replicate x shard. The shard group spans the context-parallel ranks too (dp_shard x cp, as
    the planner's ZeRO prices it); ZeRO 0 with cp > 1 would be sharded there, so it is
    refused."""
    needs_transformer("torchtitan", target)
    m = target.model
    name, flavor, notes = _flavor(m)
    tt = TORCHTITAN_COMMIT[:7]
    if m.mtp_layers and (plan["pp"] > 1 or plan.get("cp", 1) > 1):
        # deepseek_v3/MTP.md at b5bcd76: MTP is rejected with pipeline or context parallelism
        raise SpecError(f"format: torchtitan ({tt}) runs multi-token prediction without "
                        "pipeline or context parallelism only; plan with --pp 1 --cp 1, or "
                        "use --format megatron")
    precision = target.precision
    if precision in ("fp64", "nvfp4", "fp4"):
        raise SpecError(f"format: torchtitan has no {precision} training as the plan prices "
                        "it; use --precision bf16, fp16, fp8, mxfp8, tf32 or fp32")
    dp, zero, tp, pp = plan["dp"], plan["zero"], plan["tp"], plan["pp"]
    cp, ep = plan.get("cp", 1), plan.get("ep", 1)
    eager = plan.get("kernels") == "eager"
    # what no torchtitan config writes (planner.rules; partial recompute below, by stage)
    rules.check_form("torchtitan", plan, skip=("recompute_layers",))
    shard = plan.get("dp_shard") or dp  # HSDP: FSDP inside groups of dp_shard, replicated
    replicate, shard = (dp, 1) if zero == 0 else (dp // shard, shard)
    # parallel_dims.py: ep divides dp_shard x cp x tp (the search keeps to it without HSDP:
    # `planner.rules.FORM_RULES`; here the shard group of an HSDP plan too)
    if m.experts > 1 and (shard * cp * tp) % ep:
        raise SpecError(f"format: torchtitan ({tt}) takes the expert-parallel ranks from "
                        f"dp_shard x cp x tp = {shard * cp * tp} (ZeRO {zero}), which ep "
                        f"{ep} does not divide"
                        + ("; plan with --zero 1, 2 or 3" if zero == 0 else "")
                        + ", or use --format megatron")
    if plan.get("tp_overlap") and tp > 1 and eager:
        raise SpecError("format: torchtitan's AsyncTP (tp overlap) runs under torch.compile "
                        "only, not with eager kernels")
    if precision == "mxfp8" and tp > 1 and not eager:
        raise SpecError(f"format: torchtitan ({tt}) runs MXFP8 linears with tp > 1 only "
                        "without torch.compile (torchao's compiled MXFP8 matmul fails on "
                        "tensor-parallel shards, pytorch/ao#4624); plan with --kernels eager, "
                        "or use --format megatron")
    ac = _recompute(m.layers, plan)
    seq = m.seq_len
    micro_tokens = plan["micro_batch"] * seq
    sp = tp > 1 and bool(plan.get("sequence_parallel", True))
    divisor = (tp if sp else 1) * (2 * cp if cp > 1 else 1)  # trainer.py: tokens per micro-batch
    if micro_tokens % divisor:
        raise SpecError(f"format: torchtitan needs the tokens of a micro-batch ({micro_tokens}) "
                        f"divisible by {divisor} (sequence and context parallelism)")

    imports = {"torchtitan.components.checkpointer": ["CheckpointManager"],
               "torchtitan.components.data": ["ConcatThenSplitPackingConfig",
                                              "GrainDataLoader"],
               "torchtitan.components.loss": ["ChunkedLossWrapper", "CrossEntropyLoss"],
               "torchtitan.components.optimizer": ["LRSchedulersContainer", "default_adamw"],
               "torchtitan.config": ["CompileConfig", "ParallelismConfig", "TrainingConfig"],
               "torchtitan.hf_datasets.text_datasets": ["DATASETS"],
               "torchtitan.models.common.config_utils": ["decoder_vocab_size"],
               f"torchtitan.models.{name}": ["model_registry"],
               "torchtitan.trainer": ["Trainer"]}
    head = [f"# torchtitan {TORCHTITAN_COMMIT} (pytorch/torchtitan): a config module",
            "# for its Python dataclass config registry (torchtitan 9810191 and later read no "
            "TOML).",
            f"# Save it as {MODULE_NAME}.py in the torchtitan checkout and run on every node:",
            *(_pool_run(plan) if plan.get("pool_nodes") else [
                f"#   torchrun --nnodes={plan['nodes']} --nproc-per-node="
                f"{plan['devices_per_node']} --rdzv-backend=c10d "
                "--rdzv-endpoint=\"$MASTER_ADDR:$MASTER_PORT\" \\",
                f"#       -m torchtitan.train --module {MODULE_NAME} --config {CONFIG_NAME}",
                "# or with the planner's --format slurm script:",
                f"#   PYTHONPATH=. TRAIN_SCRIPT=torchtitan/train.py sbatch job.sh --module "
                f"{MODULE_NAME} --config {CONFIG_NAME}"]),
            "# PLACEHOLDER marks what the planner does not choose (tokenizer, data, learning "
            "rate,",
            "# steps, schedule, checkpoints); the run stops until the required ones are set:",
            "#   HF_ASSETS_PATH, DATASET, LR (and TRAIN_STEPS without a training target).",
            *(f"# {line}" for line in summary(doc, plan)), f"# precision {precision}", *notes]
    if precision == "fp16":
        head.append("# precision: torchtitan trains in bf16 (same cost as the plan's fp16)")
    low = precision in ("bf16", "fp16", "fp8", "mxfp8")
    compiled = not eager  # the fused non-matmul kernels the plan was priced with
    converters = []
    if precision == "fp8":
        imports["torchtitan.components.quantization"] = ["Float8LinearConverter"]
        head.append("# fp8: torchao float8 with rowwise scaling (the Float8Linear recipes at "
                    "this commit)")
        converters.append(_Call("Float8LinearConverter.Config", filter_fqns=(
            ["lm_head", "router.gate"] if m.experts > 1 else ["lm_head"]),
            model_compile_enabled=compiled))
        if m.experts > 1:
            imports["torchtitan.components.quantization"].append(
                "Float8GroupedExpertsConverter")
            converters.append(_Call("Float8GroupedExpertsConverter.Config",
                                    model_compile_enabled=compiled))
    elif precision == "mxfp8":
        imports["torchtitan.components.quantization"] = ["MXFP8LinearConverter"]
        converters.append(_Call("MXFP8LinearConverter.Config", model_compile_enabled=compiled))
        if m.experts > 1:
            imports["torchtitan.components.quantization"].append(
                "MXFP8GroupedExpertsConverter")
            converters.append(_Call("MXFP8GroupedExpertsConverter.Config",
                                    model_compile_enabled=compiled))
    # the multi-token prediction depths are a model_registry argument (deepseek_v3 at b5bcd76)
    extra = ({"converters": converters} if converters else {}) | (
        {"num_mtp_layers": m.mtp_layers} if m.mtp_layers else {})
    registry = (_Call("model_registry", flavor=flavor, **extra) if extra
                else _Code(f"model_registry({flavor!r})"))

    # torchtitan captures each step's forward and backward in a CUDA graph by default and
    # refuses to with pp or ep (Trainer.Config._validate_cuda_graphs): off unless priced on
    graphs = bool(plan.get("cuda_graphs"))
    if graphs and (pp > 1 or ep > 1):
        raise SpecError(f"format: torchtitan ({tt}) captures no CUDA graphs with pipeline or "
                        "expert parallelism; plan without --cuda-graphs, or use --format "
                        "megatron")
    training = _Call(
        "TrainingConfig",
        comments={"num_tokens_per_microbatch_per_dp_rank":
                  f"micro-batch {plan['micro_batch']} x seq_len {seq}",
                  "num_tokens_per_train_step": f"global batch {plan['global_batch']} x seq_len "
                  f"{seq}" + ("" if pp > 1 else f": {plan['gradient_accumulation']} "
                              "accumulation steps"),
                  "disable_cuda_graphs": "the plan is priced without CUDA graphs"},
        num_tokens_per_microbatch_per_dp_rank=micro_tokens,
        num_tokens_per_train_step=plan["global_batch"] * seq,
        max_context_length=seq, steps=_Code("steps"),
        mixed_precision_param="bfloat16" if low else "float32",
        **({} if graphs else {"disable_cuda_graphs": True}))
    par = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
           "tensor_parallel_degree": tp}
    if tp > 1:
        par["enable_sequence_parallel"] = sp
    par |= {"context_parallel_degree": cp, "pipeline_parallel_degree": pp,
            "expert_parallel_degree": ep}
    if zero in (1, 2):
        par["fsdp_reshard_after_forward"] = "never"
    elif zero == 3:
        par["fsdp_reshard_after_forward"] = "always"
    comments = {}
    if pp > 1:
        # every micro-batch of an iteration goes through the pipeline in one step
        par["num_pp_microbatches"] = plan["gradient_accumulation"]
        if plan.get("stage_layers"):  # a pipeline over node kinds: each stage its own layers
            par["module_fqns_per_model_part"] = _stage_fqns(plan["stage_layers"])
            comments["module_fqns_per_model_part"] = "each stage's layers, as planned per pool"
        else:
            less = _torchtitan_less_layers(m.layers, plan)
            par["pipeline_parallel_first_stage_less_layers"] = less[0]
            par["pipeline_parallel_last_stage_less_layers"] = less[1]
        if plan["interleave"] > 1:
            par["pipeline_parallel_schedule"] = "Interleaved1F1B"
            par["pipeline_parallel_layers_per_stage"] = -(-m.layers // (pp * plan["interleave"]))
            comments["pipeline_parallel_layers_per_stage"] = \
                f"{plan['interleave']} chunks per stage"
        else:
            par["pipeline_parallel_schedule"] = "GPipe" if plan["schedule"] == "gpipe" else "1F1B"
    parallelism = _Call("ParallelismConfig", comments=comments, **par)
    if ac == "full":
        imports["torchtitan.distributed.activation_checkpoint"] = ["FullAC"]
        checkpointing = _Code("FullAC.Config()")
    elif ac == "selective":
        imports["torchtitan.distributed.activation_checkpoint"] = ["SelectiveAC"]
        checkpointing = _Code("SelectiveAC.Config()")
    else:
        checkpointing = _Code("None")
    if compiled:
        compile_ = _Call("CompileConfig", enable=True, components=["model", "loss"],
                         **({"enable_async_tensor_parallel": True}
                            if plan.get("tp_overlap") and tp > 1 else {}))
    else:
        compile_ = _Call("CompileConfig", enable=False)

    trainer = _Call(
        "Trainer.Config",
        comments={"hf_assets_path": "PLACEHOLDER tokenizer",
                  "dataloader": "PLACEHOLDER data",
                  "lr_scheduler": "PLACEHOLDER schedule: cosine to LR / 10 after 1 % warm-up",
                  "checkpoint": "PLACEHOLDER checkpoints: off unless CHECKPOINT_DIR is set",
                  "compile": "the fused kernels the plan was priced with" if compiled
                  else "eager kernels, as priced"},
        model_spec=_Code("model_spec"), hf_assets_path=_Code("hf_assets_path"),
        loss=_Call("ChunkedLossWrapper.Config", loss_fn=_Call(
            "CrossEntropyLoss.Config",
            global_vocab_size=_Code("decoder_vocab_size(model_spec)"))),
        optimizer=_Code("default_adamw(lr=lr)"),
        lr_scheduler=_Call("LRSchedulersContainer.Config",
                           warmup_steps=_Code("max(1, (steps + 99) // 100)"),
                           decay_type="cosine", min_lr_factor=0.1),
        dataloader=_Call("GrainDataLoader.Config", dataset=_Call(
            "ConcatThenSplitPackingConfig", dataset=_Code("DATASETS[dataset]"))),
        checkpoint=_Call("CheckpointManager.Config", enable=_Code("bool(checkpoint_dir)"),
                         folder=_Code('checkpoint_dir or "checkpoint"'),
                         interval=_Code('int(os.environ.get("SAVE_INTERVAL") or 500)')),
        training=training, parallelism=parallelism, activation_checkpoint=checkpointing,
        compile=compile_)

    lines = [*head, "", "import os", ""]
    for module in sorted(imports):
        lines.append(f"from {module} import {', '.join(sorted(imports[module]))}")
    lines += [
        "", "",
        "def _placeholder(name: str, what: str) -> str:",
        '    value = os.environ.get(name, "")',
        "    if not value:",
        '        raise SystemExit(f"PLACEHOLDER: set {name}, {what}")',
        "    return value",
        "", "",
        f"def {CONFIG_NAME}() -> Trainer.Config:",
        "    # --- PLACEHOLDERS (environment, or write the values here) ---",
        '    hf_assets_path = _placeholder("HF_ASSETS_PATH", "a folder with the model\'s '
        'Hugging Face tokenizer files (python scripts/download_hf_assets.py --repo_id ... '
        '--assets tokenizer)")',
        '    dataset = _placeholder("DATASET", "a key of torchtitan.hf_datasets.text_datasets.'
        'DATASETS, e.g. c4 (or put your own SingleDatasetConfig here)")',
        "    if dataset not in DATASETS:",
        '        raise SystemExit(f"PLACEHOLDER: DATASET {dataset!r} is none of {sorted('
        'DATASETS)}")',
        '    lr = float(_placeholder("LR", "the peak learning rate"))',
        _steps(doc, plan),
        '    checkpoint_dir = os.environ.get("CHECKPOINT_DIR", "")  # under ./outputs; '
        "saves and resumes",
        "    # --- the plan ---",
        f"    model_spec = {_py(registry, 4)}",
        f"    return {trainer.render(4)}",
    ]
    return "\n".join(lines) + "\n"
