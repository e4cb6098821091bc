"""Hardware specs: devices, links and the systems that combine them.

YAML keys carry their units (`memory_GiB`, `bandwidth_GBps`, `latency_us`); the properties below
convert to SI base units (bytes, FLOP/s, B/s, s), and the rest of the code only uses those.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.spec.base import Spec

GB = 1e9
GiB = 2**30


class Precision(str, Enum):
    """Numeric formats a device may offer a peak for."""

    fp64 = "fp64"
    fp32 = "fp32"
    tf32 = "tf32"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"

    @property
    def bytes(self) -> int:
        """Bytes per stored value (tf32 is stored as fp32)."""
        return {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[self.value]


Fraction = Field(gt=0, le=1)


class Efficiency(Spec):
    """Achievable fraction of peak; fitted to published runs by `planner calibrate`
    (planner/calibrate.py), each spec saying what its value was fitted to."""

    compute: float = Fraction
    memory: float = Fraction
    matmul: float | None = Field(default=None, gt=0, le=1)  # large GEMMs (transformers)


class Device(Spec):
    kind: Literal["device"]
    name: str = Field(min_length=1)
    description: str = ""
    peak_tflops: dict[Annotated[Precision, Field(strict=False)], float] = Field(min_length=1)
    memory_GiB: float = Field(gt=0, le=1e6)
    memory_bandwidth_GBps: float = Field(gt=0, le=1e6)
    efficiency: Efficiency
    price_per_hour_usd: float | None = Field(default=None, gt=0, le=1e6)
    default_precision: Annotated[Precision, Field(strict=False)] = Precision.fp32
    sources: dict[str, str] = Field(min_length=1)

    @model_validator(mode="after")
    def _peaks_positive(self) -> Device:
        for precision, value in self.peak_tflops.items():
            if not 0 < value <= 1e6:
                raise ValueError(f"peak_tflops.{precision.value} must be in (0, 1e6], got {value}")
        return self

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * GiB

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
    bandwidth_GBps: float = Field(gt=0, le=1e6, description="per direction, per port")
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


class SystemSpec(Spec):
    """A system as written in YAML: names (or paths) of a device and links."""

    kind: Literal["system"]
    name: str = Field(min_length=1)
    description: str = ""
    device: str = Field(min_length=1)
    devices_per_node: int = Field(ge=1, le=1024)
    intra_node: str = Field(min_length=1)
    inter_node: InterNode
    sources: dict[str, str] = Field(default_factory=dict)


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

    @property
    def inter_node_bandwidth_Bps(self) -> float:
        """Aggregate achievable network bandwidth of one node (all NICs), per direction."""
        return self.inter_node.bandwidth_Bps * self.nics_per_node
