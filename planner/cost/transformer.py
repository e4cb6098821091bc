"""Hybrid-parallel transformer training, evaluated: the expressions of
`planner.expr.transformer`, compiled once per (model, hardware, choices) and run on numpy
arrays (one element per candidate plan), so the solver prices hundreds of thousands of splits
in a few array passes and `evaluate` is the same program on arrays of length one.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from planner import switches
from planner.cost.programs import program
from planner.expr.choices import OUTPUTS, RECOMPUTE, SCHEDULES, Choices
from planner.spec.hardware import FlashCurve, Precision, System
from planner.spec.transformer import Transformer

__all__ = ["OUTPUTS", "PARTIAL", "RECOMPUTE", "SCHEDULES", "Hardware", "activation_bytes_per_layer",
           "hardware_flops_per_sequence", "iteration"]

# PLAN_SYMBOLS order; "ds": the replicas of a ZeRO shard group under HSDP (a switch the cost
# model takes as a plan argument, `Switch.argument`: the dp_shard value where it is one number)
_NUMERIC = ("t", "p", "d", "mb", "acc", "v", "cp", "ep", "etp", "rl", "ds")
# the recompute codes: RECOMPUTE's three, and full recomputation of the first rl layers of
# each pipeline chunk (partial)
PARTIAL = len(RECOMPUTE)
_CATEGORICAL = ("recompute", "sp", "zero", "gpipe")
# the switches a row may set for itself (the search chooses them per row), overriding the
# shared value: the key names the switch
_PER_ROW = switches.PER_ROW
_KEYS = {*_NUMERIC, *_CATEGORICAL, *switches.NAMES}


@dataclass(frozen=True)
class Hardware:
    """The rates the model needs, in SI units, for one system and precision."""

    g: int  # devices per node: they share the node's NICs
    matmul_flops: float  # achievable FLOP/s of large matmuls
    mem_bw: float  # achievable HBM bytes/s
    intra_bw: float
    intra_lat: float
    nic_bw: float  # one node's network bandwidth (all NICs)
    inter_lat: float
    memory_bytes: float  # what a plan may take: the device memory less the runtime reserve
    value_bytes: int  # bytes per stored activation / weight value
    # bytes per gradient value as accumulated and reduced: fp32 with bf16 weights, as
    # Megatron-LM (bf16 forces --accumulate-allreduce-grads-in-fp32) and PyTorch FSDP2
    # (torchtitan's reduce_dtype float32) do by default; the weight width otherwise (fp16)
    grad_bytes: int
    launch_s: float = 0.0  # host time to issue one kernel: every kernel takes at least this
    gemm_half_dim: float = 0.0  # GEMM dimension at half the large-GEMM rate (0: one flat rate)
    gemm_half_dim_fp8: float = 0.0  # the same on 1-byte (fp8 / fp4) operands
    overlap_slowdown: float = 0.0  # compute slowdown beside an overlapped collective
    kernel_gpu_s: float = 0.0  # the GPU's fixed time per kernel, paid under CUDA graphs
    step_sync_s: float = 0.0  # the host's time per step the device waits for (one sync a step)
    gemm_only: bool = False  # an fp8 / fp4 format: only the GEMMs run in it, inputs cast to it
    quantize_bytes: Fraction = Fraction(0)  # HBM bytes per GEMM input value its cast moves
    # bytes per layer weight of its quantized copy (rowwise and columnwise, with the scales)
    weight_copy_bytes: Fraction = Fraction(0)
    held_weight_bytes: Fraction = Fraction(0)  # bytes per weight held in the format itself
    per_tensor_fp8: bool = False  # fp8 with one scale per tensor (current scaling applies)
    # what quantizing inside a norm saves, per value and in kernels, delayed / current scaled
    # (`Precision.norm_fused_saving`)
    norm_fused: tuple = ((Fraction(0), 0), (Fraction(0), 0))
    domain: int = 0  # devices per scale-up domain (NVLink / Infinity Fabric); 0: the node
    host_bw: float = 0.0  # one device's share of its host link, bytes/s (0: no host offload)
    # the fused attention kernel's measured rate curve (the device spec's `flash_attention`);
    # None: attention priced as two thin GEMMs
    flash: FlashCurve | None = None
    # the operands of fp8 dot-product attention: Transformer Engine quantizes them as the
    # recipe does, per tensor ("fp8"), or per 32-value block under an MXFP8 recipe ("mxfp8":
    # pytorch/attention/dot_product_attention/backends.py at d0067d0, MXFP8Tensor inputs)
    attention_format: str = "fp8"
    # the rate of what an fp8 / fp4 recipe keeps in 16 bits (attention's products without a
    # fused curve, the SSM scan), and of attention's products in fp8 (`fp8_attention`); both
    # `matmul_flops` for a 16-bit or wider precision (0: take `matmul_flops`)
    attention_flops: float = 0.0
    attention_fp8_flops: float = 0.0

    @property
    def sixteen_bit_flops(self) -> float:
        """What an fp8 / fp4 recipe keeps at 16 bits runs at (`attention_flops`, else the
        matmul rate)."""
        return self.attention_flops or self.matmul_flops

    @property
    def scale_up(self) -> int:
        """Devices a group can span on the intra-node / scale-up link (GB200 NVL72: 72)."""
        return self.domain or self.g

    @classmethod
    def of(cls, system: System, precision: Precision) -> Hardware:
        dev = system.device
        eff16 = dev.efficiency.matmul or dev.efficiency.compute
        eff8 = dev.efficiency.matmul_fp8 or eff16
        eff4 = dev.efficiency.matmul_fp4 or eff16
        eff = {Precision.fp8: eff8, Precision.mxfp8: dev.efficiency.matmul_mxfp8 or eff8,
               Precision.nvfp4: eff4, Precision.fp4: eff4}.get(precision, eff16)
        matmul = dev.peak_flops(precision) * eff
        # Transformer Engine runs only the linear layers' GEMMs in fp8 / fp4: attention's
        # products stay 16-bit unless its fp8 dot-product attention is on (at the fp8 GEMM
        # rate without a fused curve; a fused curve's fp8 / MXFP8 directions where measured,
        # `attention_format`), as does the Mamba-2 scan (Micikevicius et al. 2022, sec. 4)
        attention, attention_fp8 = matmul, matmul
        if precision.gemm_only:
            attention = dev.peak_flops(Precision.bf16) * eff16
            attention_fp8 = (dev.peak_flops(Precision.fp8) * eff8
                             if Precision.fp8 in dev.peak_tflops else attention)
        kernels = dev.kernels
        return cls(
            g=system.devices_per_node,
            matmul_flops=matmul,
            mem_bw=dev.memory_bandwidth_Bps * dev.efficiency.memory,
            intra_bw=system.scale_up_link.bandwidth_Bps,
            intra_lat=system.scale_up_link.latency_s,
            nic_bw=system.inter_node_bandwidth_Bps,
            inter_lat=system.inter_node.latency_s,
            memory_bytes=dev.usable_memory_bytes,
            value_bytes=precision.storage_bytes,
            grad_bytes=(4 if precision is not Precision.fp16 and precision.storage_bytes == 2
                        else precision.storage_bytes),
            launch_s=kernels.launch_us * 1e-6 if kernels else 0.0,
            gemm_half_dim=kernels.gemm_half_dim if kernels else 0.0,
            gemm_half_dim_fp8=(kernels.gemm_half_dim_fp8 or kernels.gemm_half_dim
                               if kernels else 0.0),
            overlap_slowdown=kernels.overlap_slowdown if kernels else 0.0,
            kernel_gpu_s=(kernels.kernel_gpu_us or 0.0) * 1e-6 if kernels else 0.0,
            step_sync_s=(kernels.step_sync_us or 0.0) * 1e-6 if kernels else 0.0,
            gemm_only=precision.gemm_only,
            quantize_bytes=precision.quantize_bytes(dev.fp8_gemm_any_layout),
            weight_copy_bytes=precision.weight_copy_bytes(dev.fp8_gemm_any_layout),
            held_weight_bytes=precision.held_weight_bytes,
            per_tensor_fp8=precision is Precision.fp8,
            norm_fused=tuple(precision.norm_fused_saving(dev.fp8_gemm_any_layout, cur)
                             for cur in (False, True)),
            domain=system.devices_per_scale_up_domain,
            host_bw=(system.host_link.bandwidth_Bps / system.devices_per_host_link
                     if system.host_link else 0.0),
            # the fitted kernels are 16-bit ones, with their fp8 / MXFP8 directions where
            # measured (`--fp8-attention`); fp32 / tf32 attention has no such kernel
            flash=(dev.flash_attention.curve()
                   if dev.flash_attention and precision.storage_bytes == 2 else None),
            attention_flops=attention, attention_fp8_flops=attention_fp8,
            attention_format="mxfp8" if precision is Precision.mxfp8 else "fp8",
        )


def _choice(rec, sp, zero, gpipe, *per_row, shared: dict, names: tuple = ()) -> Choices:
    """The Choices of one categorical cell: recompute, sp, zero, gpipe, then the per-row
    switches `names` (their values in `per_row`) over the `shared` ones."""
    partial = int(rec) == PARTIAL
    own = {k: bool(v) for k, v in zip(names, per_row, strict=True)}
    return Choices(recompute="full" if partial else RECOMPUTE[int(rec)],
                   sequence_parallel=bool(sp), zero=int(zero), schedule=SCHEDULES[int(gpipe)],
                   partial=partial, **{**shared, **own})


def iteration(m: Transformer, hw: Hardware, cfg: dict,
              outputs: tuple[str, ...] = OUTPUTS) -> dict:
    """Time and memory of one iteration for arrays of configurations: name -> array of the
    configurations' broadcast shape, for the names in `outputs` (default: all of `OUTPUTS`;
    the search asks for time and memory only).

    cfg keys (arrays or scalars): t, p, d, mb, acc, v, cp, ep (default 1), etp (default t),
    rl (layers of each chunk recomputed by the PARTIAL rows; default 1), ds (the replicas of
    a ZeRO shard group where dp_shard is on per row; default the dp_shard given), recompute
    (0/1/2 as RECOMPUTE, or PARTIAL), sp (0/1), zero, gpipe (0/1); and scalars named as the
    switches of `planner.switches` (each its default when left out), shared by every row,
    except that those of `planner.switches.PER_ROW` may be arrays too (0/1 per row: the search
    chooses them)."""
    # cp, ep default to 1; etp to t (Megatron-LM's default expert tensor parallelism); ds to a
    # dp_shard given as one number
    shard = cfg.get("dp_shard")
    given = {"etp": cfg["t"], "ds": shard if np.ndim(shard) == 0 and shard else 1}
    nums = [np.asarray(cfg.get(k, given.get(k, 1)), dtype=float) for k in _NUMERIC]
    names = tuple(k for k in _PER_ROW if k in cfg and np.ndim(cfg[k]))
    cats = np.broadcast_arrays(*(np.asarray(cfg[k]) for k in (*_CATEGORICAL, *names)))
    unknown = set(cfg) - _KEYS
    if unknown:  # a misspelt switch would otherwise price its default
        raise ValueError(f"iteration: unknown keys {sorted(unknown)}")
    shared = {s.name: cfg[s.name] for s in switches.SWITCHES
              if s.name in cfg and s.name not in names}
    shape = np.broadcast_shapes(*(x.shape for x in nums), cats[0].shape)
    num_shape = (1,) * len(shape) + np.broadcast_shapes(*(x.shape for x in nums))
    cat_shape = (1,) * len(shape) + cats[0].shape
    num_shape, cat_shape = num_shape[-len(shape):], cat_shape[-len(shape):]
    if len(shape) and any(a > 1 and c > 1 for a, c in zip(num_shape, cat_shape, strict=True)):
        # choices vary along the same axes as the plan: price each choice on its own rows
        return _grouped(m, hw, nums, cats, shared, shape, outputs, names)

    # each cell of the choice grid prices every plan: one program for all the cells' choices
    cells = list(np.ndindex(cats[0].shape)) or [()]
    choices = [_choice(*(c[i] for c in cats), shared=shared, names=names) for i in cells]
    unique = tuple(dict.fromkeys(choices))
    values = program(m, hw, unique, outputs)(*nums)
    out = {k: np.empty(shape) for k in outputs}
    lead = len(shape) - cats[0].ndim
    for cell, choice in zip(cells, choices, strict=True):
        j = unique.index(choice)
        where = (slice(None),) * lead + tuple(
            slice(i, i + 1) if n > 1 else slice(None) for i, n in zip(cell, cats[0].shape,
                                                                       strict=True))
        for k in outputs:
            out[k][where] = values[f"{j}/{k}"]
    return out


def _grouped(m, hw, nums, cats, shared, shape, outputs, names=()) -> dict:
    nums = [np.broadcast_to(x, shape).ravel() for x in nums]
    cats = [np.broadcast_to(c, shape).ravel() for c in cats]
    combos, inverse = np.unique(np.column_stack(cats), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    out = {k: np.empty(inverse.size) for k in outputs}
    for j, combo in enumerate(combos):
        rows = np.flatnonzero(inverse == j)
        values = program(m, hw, (_choice(*combo, shared=shared, names=names),),
                         outputs)(*(x[rows] for x in nums))
        for k in outputs:
            out[k][rows] = values[f"0/{k}"]
    return {k: v.reshape(shape) for k, v in out.items()}


def activation_bytes_per_layer(m: Transformer, hw: Hardware, tp, micro_batch, recompute: str,
                               sp: bool, flash: bool = True, cp: int = 1) -> float:
    """Stored activations of one layer (Korthikanti et al. 2022, Table 2), evaluated."""
    from planner.expr.transformer import TransformerExpressions
    from planner.expr.vocab import b, t

    expr = TransformerExpressions(m, hw, Choices(recompute=recompute, sequence_parallel=bool(sp),
                                                 flash_attention=flash),
                                  cp=cp, ep=1).activation_bytes_per_layer(recompute)
    return float(expr.subs({t: tp, b: micro_batch}))


def hardware_flops_per_sequence(m: Transformer, recompute: str,
                                recomputed_layers: int | None = None,
                                count_masked: bool = False, lora_rank: int = 0,
                                mla_up: bool = False) -> int:
    """FLOPs executed per sequence including recomputation (SC21 eq. 3 for full recompute, of
    `recomputed_layers` of the model's layers when partial; `mla_up`: MLA's up projections
    run again, `recompute_mla_up`); `count_masked`: a causal mask's skipped products counted,
    as SC21 does (`Transformer.model_flops`)."""
    full = m.layers if recomputed_layers is None else min(recomputed_layers, m.layers)
    skipped = 0 if count_masked else m.masked_attention_flops()  # per layer, the mean
    extra = {"none": 0, "selective": m.layers * (m.attention_core_flops() - skipped),
             "full": full * (m.layer_matmul_flops() - skipped)}[recompute]
    if mla_up and m.mla:
        attention = sum(n for k, n in m.layer_kinds() if k.mixer in ("attention", "sliding"))
        attention += m.mtp_layers * sum(k.mixer in ("attention", "sliding")
                                        for k in m.mtp_kinds())
        extra += attention * 2 * m.mla_up_weights() * m.seq_len
    base = (m.lora_model_flops(lora_rank, count_masked) if lora_rank
            else m.model_flops(count_masked))
    return base + extra
