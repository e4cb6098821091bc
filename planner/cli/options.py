"""The options several commands share, one decorator per group (the transformer's hybrid
choices are all in `transformer_options`), and the checks across them."""

from __future__ import annotations

import functools

import click

from planner.cli.params import (
    COLLECTIVES,
    FORMATS,
    KERNELS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    DecimalInt,
    FiniteFloat,
)
from planner.errors import SpecError


def with_options(f, opts: list):
    """Apply click options so that they show in the order listed."""
    for opt in reversed(opts):
        f = opt(f)
    return f


def spec_options(f=None, *, formats=FORMATS):
    """--model / --hardware and the training options every prediction needs."""
    if f is None:
        return functools.partial(spec_options, formats=formats)
    opts = [
        click.option("--model", "-m", help="Built-in model name or YAML path (required)."),
        click.option("--hardware", "-H", help="Built-in system name or YAML path (required)."),
        click.option("--precision", type=click.Choice(PRECISIONS), default=None,
                     help="Compute precision [default: the device's default_precision]."),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=None,
                     help="The optimizer whose state is held and stepped [default: momentum "
                          "for CNNs, adam for transformers]. adafactor and muon: "
                          "transformers only."),
        click.option("--servers", type=DecimalInt(1, 1_000_000), default=1, show_default=True,
                     help="Parameter servers (for --collective parameter-server)."),
        click.option("--overlap/--no-overlap", default=True, show_default=True,
                     help="Overlap gradient allreduce with the backward pass."),
        click.option("--format", "fmt", type=click.Choice(formats), default=formats[0],
                     show_default=True),
    ]
    return with_options(_checks_optimizer(f), opts)


def _checks_optimizer(f):
    """`f` refusing --optimizer adafactor / muon for a CNN (its memory model knows SGD,
    momentum and Adam only)."""

    @functools.wraps(f)
    def checked(*args, **kw):
        optimizer, model = kw.get("optimizer"), kw.get("model")
        if optimizer in ("adafactor", "muon") and model:
            from planner import api

            if not api.is_transformer(model):
                raise SpecError(f"optimizer: {optimizer} is priced for transformers only; a "
                                "CNN takes sgd, momentum or adam")
        return f(*args, **kw)

    return checked


TRANSFORMER_KEYS = ("tp", "cp", "ep", "etp", "pp", "dp", "micro_batch", "interleave",
                    "recompute", "sequence_parallel", "zero", "schedule", "flash_attention",
                    "tp_overlap", "capacity_factor", "first_stage_layers", "last_stage_layers",
                    "offload_activations", "ep_overlap", "kernels", "recompute_layers",
                    "dp_shard", "fp8_weight_gather", "fp8_activations", "pp_overlap",
                    "grad_reduce_bf16", "lora_rank", "cuda_graphs", "seq_len")


def transformer_options(f):
    """Hybrid-parallel choices (transformer models only). Unset means: evaluate uses the
    default shown, solve lets the solver choose."""
    opts = [
        click.option("--tp", type=DecimalInt(1, 2**20), help="Tensor-parallel degree."),
        click.option("--cp", type=DecimalInt(1, 1024),
                     help="Context-parallel degree: ranks sharing each sequence (Megatron-LM "
                          "ring attention); solve tries 2-16 for sequences of 8k and more."),
        click.option("--ep", type=DecimalInt(1, 2**20),
                     help="Expert-parallel degree (MoE models): ranks sharing each MoE layer's "
                          "experts; tokens reach them by all-to-all."),
        click.option("--etp", type=DecimalInt(1, 2**20),
                     help="Expert tensor-parallel degree (MoE models): ranks sharing each "
                          "expert's matrices [default: tp, as Megatron-LM; solve tries tp and "
                          "1]. etp x ep must divide tp x cp x dp."),
        click.option("--pp", type=DecimalInt(1, 2**20), help="Pipeline stages."),
        click.option("--dp", type=DecimalInt(1, 2**23), help="Data-parallel replicas."),
        click.option("--micro-batch", "micro_batch", type=DecimalInt(1, 2**30),
                     help="Sequences per micro-batch."),
        click.option("--interleave", type=DecimalInt(1, 1024),
                     help="Virtual stages per pipeline stage (interleaved 1F1B)."),
        click.option("--recompute", type=click.Choice(RECOMPUTE),
                     help="Activation recomputation."),
        click.option("--recompute-layers", "recompute_layers", type=DecimalInt(1, 100_000),
                     help="Recompute only the first N layers of each pipeline chunk, the rest "
                          "keeping their activations (Megatron-LM --recompute-method block "
                          "--recompute-num-layers N); implies --recompute full."),
        click.option("--sequence-parallel/--no-sequence-parallel", "sequence_parallel",
                     default=None, help="Megatron sequence parallelism (with tp > 1)."),
        click.option("--zero", type=DecimalInt(0, 3), help="ZeRO / FSDP sharding stage."),
        click.option("--dp-shard", "dp_shard", type=DecimalInt(1, 2**23),
                     help="Hybrid sharding (HSDP): ZeRO shards over groups of N data-parallel "
                          "replicas, the dp / N groups replicating (Megatron-LM "
                          "--num-distributed-optimizer-instances, torchtitan "
                          "data_parallel_shard_degree) [default: all dp]."),
        click.option("--fp8-weight-gather/--no-fp8-weight-gather", "fp8_weight_gather",
                     default=None,
                     help="With ZeRO and --precision fp8 / mxfp8: hold and all-gather the "
                          "weights in fp8 (Megatron-LM --fp8-param-gather, torchtitan "
                          "enable_fsdp_float8_all_gather) [default: off]."),
        click.option("--fp8-activations/--no-fp8-activations", "fp8_activations",
                     default=None,
                     help="With --precision fp8 / mxfp8: save each fp8 GEMM's input for the "
                          "backward in fp8, as Transformer Engine (Megatron-LM) does; torchao "
                          "(torchtitan) keeps it 16-bit [default: off]."),
        click.option("--schedule", type=click.Choice(SCHEDULES),
                     help="Pipeline schedule."),
        click.option("--flash-attention/--no-flash-attention", "flash_attention", default=True,
                     show_default=True, help="Attention scores stay on chip (FlashAttention)."),
        click.option("--tp-overlap/--no-tp-overlap", "tp_overlap", default=None,
                     help="Pipeline the tensor-parallel collectives with their GEMMs "
                          "(Megatron-LM --tp-comm-overlap, torchtitan AsyncTP); needs sequence "
                          "parallelism [default: off]."),
        click.option("--capacity-factor", "capacity_factor", type=FiniteFloat(1, 64),
                     help="MoE: tokens of the busiest expert over the balanced mean (Megatron "
                          "--moe-expert-capacity-factor with padding) [default: 1, balanced]."),
        click.option("--first-stage-layers", "first_stage_layers", type=DecimalInt(1, 100_000),
                     help="Layers on the first pipeline stage, the rest split evenly "
                          "(Megatron-LM --decoder-first-pipeline-num-layers)."),
        click.option("--last-stage-layers", "last_stage_layers", type=DecimalInt(1, 100_000),
                     help="Layers on the last pipeline stage (--decoder-last-pipeline-num-"
                          "layers)."),
        click.option("--pp-overlap/--no-pp-overlap", "pp_overlap", default=None,
                     help="Interleaved pipelines: overlap the sends with the chunks' compute "
                          "(Megatron-LM's default; --no-overlap-p2p-communication) "
                          "[default: on]."),
        click.option("--cuda-graphs/--no-cuda-graphs", "cuda_graphs", default=None,
                     help="Issue the layers' kernels by CUDA graphs (Megatron-LM "
                          "--cuda-graph-impl local): no host issue time per kernel "
                          "[default: off]."),
        click.option("--lora-rank", "lora_rank", type=DecimalInt(1, 1_000_000),
                     help="Fine-tune: freeze the base weights and train LoRA adapters of this "
                          "rank on the attention projections (QKV and output; NeMo PEFT)."),
        click.option("--grad-reduce-bf16/--grad-reduce-fp32", "grad_reduce_bf16", default=None,
                     help="bf16 training: accumulate and reduce gradients in bf16 (Megatron-LM "
                          "--grad-reduce-in-bf16, NVIDIA's MLPerf recipes) [default: fp32]."),
        click.option("--ep-overlap/--no-ep-overlap", "ep_overlap", default=None,
                     help="MoE: run each micro-batch's all-to-alls behind another's compute "
                          "(Megatron-LM --overlap-moe-expert-parallel-comm) [default: off]."),
        click.option("--offload-activations/--no-offload-activations", "offload_activations",
                     default=None,
                     help="Keep saved activations in host memory, copied over the system's "
                          "host link (Grace NVLink-C2C on GB200 / GB300) [default: off]."),
        click.option("--kernels", type=click.Choice(KERNELS),
                     help="Non-matmul ops fused as Megatron-LM / Transformer Engine / "
                          "torch.compile run them, or eager: one PyTorch kernel per op (Hugging "
                          "Face models, torchtitan without compile) [default: fused]."),
        click.option("--seq-len", "seq_len", type=DecimalInt(1, 10_000_000),
                     help="Train at this sequence length [default: the model's seq_len]."),
    ]
    return with_options(f, opts)


def headroom_option(f):
    """--memory-headroom: how full a device may be (evaluate, solve, sweep)."""
    from planner.search.memory_fit import DEFAULT_MEMORY_HEADROOM

    return click.option(
        "--memory-headroom", "memory_headroom", type=FiniteFloat(0, 1, max_open=True),
        default=DEFAULT_MEMORY_HEADROOM, show_default=True,
        help="Fraction of each device's memory kept free (CUDA context, NCCL buffers, "
             "fragmentation): a plan fits when it needs at most (1 - FRACTION) x the device "
             "memory. 0.05 keeps 5 % free.")(f)


def training_options(f):
    """Statistical efficiency (McCandlish et al. 2018): the critical batch and the target."""
    opts = [
        click.option("--critical-batch", type=FiniteFloat(min=0, min_open=True, max=1e15),
                     help="B_noise: steps to the target S(B) = S_min (1 + B_noise / B)."),
        click.option("--target-steps", type=FiniteFloat(min=0, min_open=True, max=1e15),
                     help="S_min: steps to the target at a very large batch."),
        click.option("--target-samples", type=FiniteFloat(min=0, min_open=True, max=1e18),
                     help="E_min: samples to the target at a very small batch "
                          "(S_min = E_min / B_noise)."),
        click.option("--target-tokens", type=FiniteFloat(min=0, min_open=True, max=1e21),
                     help="E_min in tokens (transformers: target samples = tokens / sequence "
                          "length)."),
    ]
    return with_options(f, opts)


def limit_options(f):
    opts = [
        click.option("--global-batch", type=DecimalInt(1, 2**40), required=True,
                     help="Global batch: the largest that still generalises (seed paper)."),
        click.option("--collective", type=click.Choice(COLLECTIVES), default="ring",
                     show_default=True),
        click.option("--local-efficiency", type=FiniteFloat(0, 1, min_open=True,
                                                                 max_open=True),
                     default=0.9, show_default=True,
                     help="A device counts as efficient at this fraction of its large-batch "
                          "rate (sets the smallest useful local batch)."),
        click.option("--target-efficiency", type=FiniteFloat(0, 1, min_open=True,
                                                                  max_open=True),
                     default=0.8, show_default=True,
                     help="Parallel efficiency the bandwidth requirement is computed for."),
        click.option("--at-nodes", type=FiniteFloat(1, 2**20),
                     help="Node count for efficiency and bandwidth [default: max useful nodes]."),
        click.option("--critical-batch", type=FiniteFloat(min=0, min_open=True, max=1e15),
                     help="B_noise: also derive the node count and global batch minimising "
                          "time to train (or the batch alone at --at-nodes)."),
        click.option("--nodes-max", type=DecimalInt(1, 2**20),
                     help="With --critical-batch: node counts the time-to-train optimum "
                          "searches [default: the solver's default space, 4096]."),
    ]
    return with_options(f, opts)


def parallel_options(f):
    """--jobs / --scheduler: where the independent solves of batch and sweep run."""
    opts = [
        click.option("--jobs", "-j", type=DecimalInt(0, 4096), default=1, show_default=True,
                     help="Local processes to run in: 1 runs here, one after the other; 0 uses "
                          "every core."),
        click.option("--scheduler", metavar="tcp://HOST:PORT",
                     help="Run on this Dask cluster instead of local processes (needs "
                          "pip install 'planner[dask]')."),
    ]
    return with_options(f, opts)


def require(model, hardware) -> None:
    """Every prediction needs --model and --hardware (click cannot require them: evaluate
    --batch reads them from its lines)."""
    if not model:
        raise SpecError("model: --model is required (a built-in name or a YAML path)")
    if not hardware:
        raise SpecError("hardware: --hardware is required (a built-in name or a YAML path)")


def reject_transformer_flags(kw: dict) -> None:
    """A CNN takes none of the hybrid choices (flash attention is on by default, so it is
    ignored)."""
    for key in TRANSFORMER_KEYS:
        if key != "flash_attention" and kw.get(key) is not None:
            raise SpecError(f"{key}: --{key.replace('_', '-')} applies to transformer models "
                            "only")


def parallel_check(jobs: int, scheduler: str | None) -> None:
    """--jobs and --scheduler exclude each other."""
    if scheduler is not None and jobs != 1:
        raise SpecError("jobs: --jobs applies to local processes; with --scheduler the "
                        "cluster's workers run the tasks")
