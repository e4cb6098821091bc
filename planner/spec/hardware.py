"""Hardware specs: devices, links and the systems that combine them.

YAML keys carry their units (`memory_GiB`, `bandwidth_GBps`, `latency_us`); the properties below
convert to SI base units (bytes, FLOP/s, B/s, s), and the rest of the code only uses those.
"""

from __future__ import annotations

import fractions
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Literal

import numpy as np
from pydantic import BeforeValidator, Field, model_validator

from planner.spec.base import Spec

GB = 1e9
GiB = 2**30


class Precision(str, Enum):
    """Numeric formats a device may offer a peak for.

    The block-scaled formats (OCP Microscaling spec v1.0, 2023; NVIDIA Blackwell tuning guide):
    `mxfp8` is E4M3/E5M2 with one E8M0 scale per 32 values; `nvfp4` is E2M1 with one E4M3 scale
    per 16 values plus a tensor-wide fp32 scale; `fp4` is the 4-bit (E2M1) tensor-core rate of a
    device whatever its block scaling (NVFP4 or MXFP4 on Blackwell, MXFP4 on AMD CDNA 4).
    A device offers these formats only where its spec lists a peak for them: they never fall back
    to another format's peak (Hopper and CDNA 3 have fp8 but no MX hardware).
    """

    fp64 = "fp64"
    fp32 = "fp32"
    tf32 = "tf32"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"
    fp4 = "fp4"

    @property
    def bytes(self) -> int:
        """Bytes of one value in the format itself, rounded up to a whole byte (tf32 is stored as
        fp32; the 4-bit formats pack two values per byte, so 1 here overstates nothing but is not
        their size: use `storage_bytes` for what a training run stores and sends)."""
        return {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "mxfp8": 1,
                "nvfp4": 1, "fp4": 1}[self.value]

    @property
    def gemm_only(self) -> bool:
        """True for the low-precision GEMM formats (fp8, mxfp8, nvfp4, fp4): in training only the
        matmuls run in them (inputs cast, with their scales, just before each GEMM), while stored
        activations, weights, gradients and communication stay 16-bit and master weights and
        optimizer state keep theirs (Transformer Engine FP8 / MXFP8 / NVFP4 recipes; Micikevicius
        et al. 2022, FP8 Formats for Deep Learning; NVIDIA, Pretraining LLMs with NVFP4, 2025)."""
        return self.value in {"fp8", "mxfp8", "nvfp4", "fp4"}

    def quantize_bytes(self, fp8_any_layout: bool = False) -> fractions.Fraction:
        """HBM bytes moved to quantize one 16-bit GEMM input value for training in this
        format (0 for the formats GEMMs run in directly): read at 16 bits, written twice, in
        the layout of the forward GEMM and in the transposed one a backward GEMM takes
        (Transformer Engine's Float8Tensor transpose; the MX formats' rowwise and columnwise
        copies), with the block scales: fp8 per-tensor scaled with the amax history of delayed
        scaling fused into the cast (TE's default recipe; Micikevicius et al. 2022, sec. 4),
        written once where the device's fp8 GEMMs take any layout (`fp8_any_layout`: TE's
        is_non_tn_fp8_gemm_supported, sm_100 and later); mxfp8 and the 4-bit MX format one
        E8M0 scale per 32 values (OCP Microscaling spec v1.0); nvfp4 one E4M3 scale per 16
        values and a tensor-wide fp32 scale, whose amax is one more read of the tensor before
        the cast (NVIDIA, Pretraining LLMs with NVFP4, arXiv 2509.25149, sec. 2)."""
        q = fractions.Fraction
        half, mx, nv = q(1, 2), q(1, 32), q(1, 16)
        return {"fp8": q(2 + (1 if fp8_any_layout else 2)), "mxfp8": 2 + 2 * (1 + mx),
                "nvfp4": 2 + 2 + 2 * (half + nv),
                "fp4": 2 + 2 * (half + mx)}.get(self.value, q(0))

    @property
    def held_weight_bytes(self) -> fractions.Fraction:
        """Bytes per weight held in this format itself (its rowwise data and block scales), as
        a run that keeps its layer weights quantized holds and all-gathers them (Megatron-LM
        --fp8-param-gather / --fp4-param-gather, NeMo's fp8_params and its in-place NVFP4
        pre-quantization of frozen LoRA weights); 0 for the formats GEMMs run in directly."""
        q = fractions.Fraction
        return {"fp8": q(1), "mxfp8": 1 + q(1, 32), "nvfp4": q(1, 2) + q(1, 16),
                "fp4": q(1, 2) + q(1, 32)}.get(self.value, q(0))

    def weight_copy_bytes(self, fp8_any_layout: bool = False) -> fractions.Fraction:
        """Bytes per weight of the quantized copy a Transformer Engine layer keeps across a
        step's micro-batches for training in this format (0 for the formats GEMMs run in
        directly): the rowwise data the forward GEMM reads and the columnwise data the
        backward's input-gradient GEMM reads, with their block scales. Megatron-LM passes
        `is_first_microbatch` to TE (extensions/transformer_engine.py at d98e8a6, unless
        TransformerConfig.disable_parameter_transpose_cache), so TE quantizes each weight at
        the step's first micro-batch and caches the result (module/linear.py at d0067d0,
        `_fp8_workspaces["weight"]`): per-tensor fp8 one byte, plus the transpose where the
        device's fp8 GEMMs take only the TN layout (`fp8_any_layout` false: Hopper;
        tensor/float8_tensor.py: `_transpose` only without is_non_tn_fp8_gemm_supported);
        mxfp8 a byte and an E8M0 scale per 32 values in each direction; nvfp4 half a byte and
        an E4M3 scale per 16 values in each direction (tensor/nvfp4_tensor.py
        `inner_tensor_specs`); the 4-bit MX format half a byte and a scale per 32."""
        q = fractions.Fraction
        half, mx, nv = q(1, 2), q(1, 32), q(1, 16)
        return {"fp8": q(1 if fp8_any_layout else 2), "mxfp8": 2 * (1 + mx),
                "nvfp4": 2 * (half + nv), "fp4": 2 * (half + mx)}.get(self.value, q(0))

    def norm_fused_saving(self, fp8_any_layout: bool = False, current_scaling: bool = False
                          ) -> tuple[fractions.Fraction, int]:
        """(bytes per value, kernels) of `quantize_bytes` plus the norm's 16-bit write that Transformer
        Engine saves where a norm feeds the GEMM (LayerNormLinear; pytorch/csrc/extensions/
        normalization.cpp at d0067d0): delayed-scaled fp8 is written by the norm kernel itself
        (FULLY_FUSED: no 16-bit write, no cast's read; 4 bytes), less the transpose kernel's read
        of it where the GEMMs need the transposed copy (rmsnorm_api.cpp: nvte_transpose after
        the norm; 3 bytes); nvfp4's tensor-wide amax is computed by the norm
        (FUSED_NORM_AMAX_NVFP4: the cast's extra read, 2 bytes); current-scaled fp8 writes the
        norm at 16 bits with its amax and casts after (FUSED_NORM_AMAX_FP8: nothing saved
        against a cast that reads the tensor once), and the MX formats are normalised
        unfused unless cuDNN's norm is chosen (NVTE_NORM_FWD_USE_CUDNN). The kernel count
        saved: the cast, where no transpose kernel takes its place."""
        q = fractions.Fraction
        if self.value == "fp8" and not current_scaling:
            return (q(4), 1) if fp8_any_layout else (q(3), 0)
        return (q(2), 0) if self.value == "nvfp4" else (q(0), 0)

    @property
    def storage_bytes(self) -> int:
        """Bytes per value a training run stores and communicates at this compute precision:
        2 (bf16) for the GEMM-only formats, `bytes` otherwise."""
        return 2 if self.gemm_only else self.bytes


# The smallest rates a spec may give: below these a value is a slip (a unit, a sign, an
# exponent), not hardware, and the cost model's times overflow (an efficiency of 1e-320 makes
# every iteration infinite). No device or link here comes within a factor 100 of them.
MIN_FRACTION = 1e-3  # of peak: 0.1 %
MIN_TFLOPS = 1e-3  # 1 GFLOP/s
MIN_GBPS = 1e-9  # 1 byte/s

Fraction = Field(ge=MIN_FRACTION, le=1)


class Efficiency(Spec):
    """Achievable fraction of peak; fitted to published runs by `planner calibrate`
    (planner/calibrate.py), each spec saying what its value was fitted to."""

    compute: float = Fraction
    memory: float = Fraction
    matmul: float | None = Field(default=None, ge=MIN_FRACTION, le=1)  # large GEMMs
    # large fp8 / mxfp8 GEMMs, as a fraction of the fp8 peak (None: `matmul`): measured fp8
    # GEMMs reach a smaller share of their peak than 16-bit ones on every NVIDIA device
    matmul_fp8: float | None = Field(default=None, ge=MIN_FRACTION, le=1)
    # large 4-bit (nvfp4 / fp4) GEMMs, as a fraction of the fp4 peak (None: `matmul`): a
    # measured NVFP4 GEMM reaches a smaller share of its peak than a 16-bit one
    matmul_fp4: float | None = Field(default=None, ge=MIN_FRACTION, le=1)
    # large MXFP8 (1 x 32 block-scaled) GEMMs, as a fraction of the fp8 peak (None:
    # `matmul_fp8`): the block scales cost the tensor cores a few per cent
    matmul_mxfp8: float | None = Field(default=None, ge=MIN_FRACTION, le=1)


class KernelCosts(Spec):
    """What a roofline alone misses on small work, fitted per device (and software stack) by
    `planner calibrate --transformer`: the host time to issue one kernel, which floors every
    kernel's time (a GPU waiting on a Python framework), and the GEMM dimension at which a
    matmul reaches half its large-GEMM rate (tiles and waves underfilled by a thin operand)."""

    launch_us: float = Field(ge=0, le=1e4)
    gemm_half_dim: float = Field(ge=0, le=1e6)
    # the half dimension of GEMMs on 1-byte operands (fp8; fp4 GEMMs, unmeasured, take it
    # too): a doubled rate on the same tiles needs a thicker operand to fill them; None: not
    # measured, gemm_half_dim holds
    gemm_half_dim_fp8: float | None = Field(default=None, ge=0, le=1e6)
    # how much slower compute runs while a collective overlaps it (NCCL / RCCL kernels hold
    # SMs and HBM bandwidth beside the GEMMs): 0.189 is 18.9 %, Lee et al. 2025's mean
    overlap_slowdown: float = Field(default=0.0, ge=0, le=1)
    # the GPU's own fixed time per kernel (start, prologue, last wave): with CUDA graphs
    # issuing the kernels (no host in the loop) each compute kernel takes it beyond its work,
    # and it floors a collective; None: not known (launch_us stays the floor)
    kernel_gpu_us: float | None = Field(default=None, ge=0, le=1e4)
    # the host's time per training step that the device waits for: the training loop
    # synchronises once a step (Megatron-LM reads the loss scale with .item() after every
    # train_step, "a device sync draining the iteration's pending GPU queue", training.py at
    # d98e8a6), so the host's reporting and bookkeeping and its issue of the next step run
    # with the device idle; fitted by `python -m planner.fit_mlperf`; None: not known (0)
    step_sync_us: float | None = Field(default=None, ge=0, le=1e6)


def gemm_share(thin, half_dim):
    """The share of its large-GEMM rate a matmul reaches when its thinnest dimension is
    `thin`: thin^2 / (thin^2 + half_dim^2) (a number, array or expression). The one place the
    curve is written: the cost model prices GEMMs with it and `planner.fit_gemm` fits
    half_dim to GEMM benchmarks with it."""
    return thin**2 / (thin**2 + half_dim**2)


def _digits_to_int(value):
    """A head dimension written as a JSON key ('128', as `show --format json|yaml` prints the
    mapping) read as the integer it spells; anything else is left to the strict check."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        return int(value)
    return value


HeadDim = Annotated[int, BeforeValidator(_digits_to_int), Field(ge=1, le=4096)]


class FlashAttention(Spec):
    """The fused attention kernel's achieved rate, fitted by `python -m planner.fit_flash`
    to published kernel benchmarks (planner/calibration/flash_attention.csv): at a head
    dimension d and k keys per query the forward runs at fwd_tflops[d] x k / (k + k_half)
    (backward: bwd_*), causal masking adding causal_extra_keys to k_half; FLOPs counted as
    the benchmarks count them (4 s k d per head forward, half of that causal; backward 2.5x
    the forward). Head dimensions between two given interpolate; beyond them, the nearest.
    `fp8_fwd_tflops` and `fp8_fwd_half_keys` (and `fp8_bwd_*`, `mxfp8_fwd_*`,
    `mxfp8_bwd_*`): the same kernel's forward (backward) on fp8 operands with one scale per
    tensor (per 32-value block: MXFP8), Transformer Engine's fp8 dot-product attention; None
    where no such benchmark is published."""

    kernel: str = Field(min_length=1)
    fwd_tflops: dict[HeadDim, Annotated[float, Field(gt=0, le=1e6)]] = Field(min_length=1)
    bwd_tflops: dict[HeadDim, Annotated[float, Field(gt=0, le=1e6)]] = Field(min_length=1)
    fp8_fwd_tflops: dict[HeadDim, Annotated[float, Field(gt=0, le=1e6)]] | None = None
    fp8_fwd_half_keys: float | None = Field(default=None, ge=0, le=1e6)
    fp8_bwd_tflops: dict[HeadDim, Annotated[float, Field(gt=0, le=1e6)]] | None = None
    fp8_bwd_half_keys: float | None = Field(default=None, ge=0, le=1e6)
    mxfp8_fwd_tflops: dict[HeadDim, Annotated[float, Field(gt=0, le=1e6)]] | None = None
    mxfp8_fwd_half_keys: float | None = Field(default=None, ge=0, le=1e6)
    mxfp8_bwd_tflops: dict[HeadDim, Annotated[float, Field(gt=0, le=1e6)]] | None = None
    mxfp8_bwd_half_keys: float | None = Field(default=None, ge=0, le=1e6)
    fwd_half_keys: float = Field(ge=0, le=1e6)
    bwd_half_keys: float = Field(ge=0, le=1e6)
    causal_extra_keys: float = Field(ge=0, le=1e6)

    @model_validator(mode="after")
    def _pairs(self):
        for w in FlashCurve.QUANTIZED:  # each quantized direction: its rates and half keys
            if (getattr(self, f"{w}_tflops") is None) != (getattr(self, f"{w}_half_keys") is None):
                raise ValueError(f"{w}_tflops and {w}_half_keys: give both or neither")
        return self

    def rate(self, direction: str, head_dim: float) -> float:
        """FLOP/s at long sequences for `direction` ("fwd", "bwd") at this head dimension."""
        return self.curve().rate(direction, head_dim)

    def curve(self) -> FlashCurve:
        """The same rates as a hashable value (what the cost model's `Hardware` keeps)."""
        return FlashCurve(tuple(
            (w, tuple(sorted(rates.items())), getattr(self, f"{w}_half_keys"))
            for w in FlashCurve.DIRECTIONS
            if (rates := getattr(self, f"{w}_tflops")) is not None), self.causal_extra_keys)


@dataclass(frozen=True)
class FlashCurve:
    """A `FlashAttention` block's rates: per measured direction ("fwd", "bwd", "fp8_fwd",
    ...) its ((head dim, TFLOP/s), ...) and half-rate keys, and the causal mask's extra
    keys. `achieved` is the one place the rate curve is written: the cost model prices
    kernels with it and `planner.fit_flash` checks it against the benchmarks."""

    QUANTIZED = ("fp8_fwd", "fp8_bwd", "mxfp8_fwd", "mxfp8_bwd")  # fp8 attention's operands
    DIRECTIONS = ("fwd", "bwd", *QUANTIZED)

    directions: tuple[tuple[str, tuple[tuple[int, float], ...], float], ...]
    causal_extra_keys: float

    def has(self, direction: str) -> bool:
        """Whether `direction` is measured on this kernel."""
        return any(w == direction for w, _, _ in self.directions)

    def _of(self, direction: str) -> tuple[tuple[tuple[int, float], ...], float]:
        found = next(((table, half) for w, table, half in self.directions if w == direction),
                     None)
        if found is None:
            raise ValueError(f"flash_attention: no {direction!r} rates on this kernel")
        return found

    def rate(self, direction: str, head_dim: float) -> float:
        """FLOP/s of `direction` at long sequences and this head dimension."""
        table = self._of(direction)[0]
        return 1e12 * float(np.interp(head_dim, [d for d, _ in table], [r for _, r in table]))

    def achieved(self, direction: str, head_dim: float, keys, causal_share=0.0):
        """FLOP/s of one kernel call over `keys` keys per query (a number or an expression):
        R[d] k / (k + k_half + causal_share x causal_extra_keys); `causal_share` the part of
        the calls under a causal mask (1, or 1 / c_p with ring attention, 0 without one)."""
        half = self._of(direction)[1]
        return (self.rate(direction, head_dim) * keys
                / (keys + half + causal_share * self.causal_extra_keys))


class Device(Spec):
    kind: Literal["device"]
    name: str = Field(min_length=1)
    description: str = ""
    peak_tflops: dict[Annotated[Precision, Field(strict=False)], float] = Field(min_length=1)
    memory_GiB: float = Field(gt=0, le=1e6)
    # what a training process cannot give its tensors: the capacity the driver keeps, the CUDA
    # (HIP) context, the collective library's buffers (`docs/hardware.md`, Runtime reserve)
    runtime_reserve_GiB: float = Field(default=0.0, ge=0, le=1e6)
    memory_bandwidth_GBps: float = Field(ge=MIN_GBPS, le=1e6)
    efficiency: Efficiency
    kernels: KernelCosts | None = None
    flash_attention: FlashAttention | None = None
    price_per_hour_usd: float | None = Field(default=None, gt=0, le=1e6)
    default_precision: Annotated[Precision, Field(strict=False)] = Precision.fp32
    # the collective library its jobs communicate with: devices of different libraries share
    # no job (NCCL and RCCL do not interoperate)
    collective_library: Literal["nccl", "rccl", "mpi"] = "nccl"
    # its fp8 GEMMs take operands in any layout (Blackwell), so a per-tensor fp8 input needs
    # no transposed copy for the backward (`Precision.quantize_bytes`)
    fp8_gemm_any_layout: bool = False
    sources: dict[str, str] = Field(min_length=1)

    @model_validator(mode="after")
    def _peaks_positive(self) -> Device:
        if self.runtime_reserve_GiB >= self.memory_GiB:
            raise ValueError(f"key 'runtime_reserve_GiB': must be less than memory_GiB "
                             f"({self.memory_GiB:g}), got {self.runtime_reserve_GiB:g}")
        for precision, value in self.peak_tflops.items():
            if not MIN_TFLOPS <= value <= 1e6:
                raise ValueError(f"key 'peak_tflops.{precision.value}': must be in "
                                 f"[{MIN_TFLOPS:g}, 1e6] TFLOP/s, got {value:g}")
        return self

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * GiB

    @property
    def usable_memory_bytes(self) -> float:
        """The bytes a plan's weights, gradients, optimizer state and activations may take:
        the memory less the runtime's reserve."""
        return (self.memory_GiB - self.runtime_reserve_GiB) * GiB

    @property
    def memory_bandwidth_Bps(self) -> float:
        return self.memory_bandwidth_GBps * GB

    def peak_flops(self, precision: Precision) -> float:
        """Peak FLOP/s at `precision`; bf16 and fp16 stand in for each other, tf32 falls back to fp32."""
        fallbacks = {
            Precision.bf16: [Precision.fp16],
            Precision.fp16: [Precision.bf16],
            Precision.tf32: [Precision.fp32],
        }
        for p in [precision, *fallbacks.get(precision, [])]:
            if p in self.peak_tflops:
                return self.peak_tflops[p] * 1e12
        from planner.errors import SpecError

        offered = ", ".join(p.value for p in self.peak_tflops)
        raise SpecError(
            f"device '{self.name}': no peak for precision '{precision.value}' (offers {offered})"
        )


class Link(Spec):
    kind: Literal["link"]
    name: str = Field(min_length=1)
    description: str = ""
    bandwidth_GBps: float = Field(ge=MIN_GBPS, le=1e6, description="per direction, per port")
    latency_us: float = Field(ge=0, le=1e6)
    efficiency: float = Fraction
    sources: dict[str, str] = Field(min_length=1)

    @property
    def bandwidth_Bps(self) -> float:
        """Achievable bandwidth per direction: datasheet figure times the fitted efficiency."""
        return self.bandwidth_GBps * GB * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


class InterNode(Spec):
    link: str = Field(min_length=1)
    count: int = Field(ge=1, le=1024)


class HostOffload(Spec):
    """The CPU link a device offloads to (Grace: NVLink-C2C) and how many devices share it."""

    link: str = Field(min_length=1)
    devices_per_link: int = Field(default=1, ge=1, le=1024)


class SystemSpec(Spec):
    """A system as written in YAML: names (or paths) of a device and links.

    `devices_per_node` is what SLURM and torchrun count (a DGX, a GB200 compute tray);
    `devices_per_scale_up_domain` is what one NVLink / Infinity Fabric domain connects (8 on a
    DGX, 72 on GB200 NVL72), a whole number of nodes, by default one node. `scale_up` names the
    link inside the domain (default: `intra_node`).
    """

    kind: Literal["system"]
    name: str = Field(min_length=1)
    description: str = ""
    device: str = Field(min_length=1)
    devices_per_node: int = Field(ge=1, le=1024)
    devices_per_scale_up_domain: int | None = Field(default=None, ge=1, le=1_000_000)
    intra_node: str = Field(min_length=1)
    scale_up: str | None = Field(default=None, min_length=1)
    inter_node: InterNode
    host_offload: HostOffload | None = None
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _domain_is_whole_nodes(self) -> SystemSpec:
        # A scale-up domain is built from whole nodes (NVL72 = 18 trays of 4), never a part of one.
        g, domain = self.devices_per_node, self.devices_per_scale_up_domain
        if domain is not None and (domain < g or domain % g):
            raise ValueError(
                f"key 'devices_per_scale_up_domain': {domain} must be a whole number of nodes "
                f"(a multiple of devices_per_node = {g}, at least {g})")
        return self


@dataclass(frozen=True)
class System:
    """A resolved system: the device and link objects themselves."""

    name: str
    description: str
    device: Device
    devices_per_node: int
    intra_node: Link
    inter_node: Link
    nics_per_node: int
    devices_per_scale_up_domain: int | None = None  # None at construction: one node
    scale_up: Link | None = None  # None: the intra-node link (see scale_up_link)
    host_link: Link | None = None  # CPU link for activation / optimizer offload (Grace C2C)
    devices_per_host_link: int = 1

    def __post_init__(self) -> None:
        if self.devices_per_scale_up_domain is None:
            object.__setattr__(self, "devices_per_scale_up_domain", self.devices_per_node)
        domain, g = self.devices_per_scale_up_domain, self.devices_per_node
        assert domain >= g and domain % g == 0, (domain, g)  # SystemSpec checked it for users

    @property
    def inter_node_bandwidth_Bps(self) -> float:
        """Aggregate achievable network bandwidth of one node (all NICs), per direction."""
        return self.inter_node.bandwidth_Bps * self.nics_per_node

    @property
    def nodes_per_scale_up_domain(self) -> int:
        """Nodes one scale-up fabric (NVLink / Infinity Fabric) connects: a group inside the
        domain communicates over `scale_up_link`, only traffic leaving it uses the NICs."""
        return self.devices_per_scale_up_domain // self.devices_per_node

    @property
    def scale_up_link(self) -> Link:
        """The link inside the scale-up domain (the intra-node link unless the spec names one)."""
        return self.scale_up or self.intra_node

    @property
    def host_offload_bandwidth_Bps(self) -> float | None:
        """Achievable device-to-host bandwidth per device, per direction, for offload (the host
        link's share when several devices use one link); None when the system has none."""
        if self.host_link is None:
            return None
        return self.host_link.bandwidth_Bps / self.devices_per_host_link
