"""Predict one data-parallel configuration: every number comes from `DataParallelModel`'s
expressions, evaluated at the configuration's (n, g, b)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.cost.collectives import Collective
from planner.cost.data_parallel import DataParallelModel
from planner.errors import SpecError


@dataclass(frozen=True)
class Config:
    nodes: int
    devices_per_node: int
    global_batch: int
    collective: Collective
    overlap: bool

    def __post_init__(self):
        for key in ("nodes", "devices_per_node", "global_batch"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"{key}: must be a positive integer, got {value!r}")
        if self.global_batch % self.devices:
            raise SpecError(
                f"global_batch: {self.global_batch} is not divisible by {self.devices} devices "
                f"({self.nodes} nodes x {self.devices_per_node})"
            )

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.devices

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(devices=self.devices, local_batch=self.local_batch,
                 collective=self.collective.value)
        return d


@dataclass(frozen=True)
class Prediction:
    iteration_time_s: float
    throughput_samples_per_s: float
    compute_time_s: float
    communication_time_s: float
    exposed_communication_time_s: float
    optimizer_time_s: float
    memory_bytes_per_device: float
    memory_breakdown: dict
    memory_capacity_bytes: float
    fits_memory: bool
    speedup: float
    efficiency: float

    def to_json(self) -> dict:
        return asdict(self)


def predict(model: DataParallelModel, config: Config) -> Prediction:
    n, g, b = config.nodes, config.devices_per_node, config.local_batch
    col, ov = config.collective, config.overlap
    if g > model.system.devices_per_node:
        raise SpecError(
            f"devices_per_node: {g} exceeds the {model.system.devices_per_node} devices per node "
            f"of '{model.system.name}'"
        )
    val = lambda name: float(model.numeric(name, col, ov)(n, g, b))  # noqa: E731
    t_iter = val("iteration")
    # Speed-up against one device processing the whole global batch without communication.
    t_one = float(model.numeric("compute")(1, 1, config.global_batch)) + val("optimizer")
    speedup = t_one / t_iter
    mem = {k: val(f"memory.{k}") for k in model.memory}
    capacity = model.system.device.memory_bytes
    return Prediction(
        iteration_time_s=t_iter,
        throughput_samples_per_s=config.global_batch / t_iter,
        compute_time_s=val("compute"),
        communication_time_s=val("comm"),
        exposed_communication_time_s=val("exposed"),
        optimizer_time_s=val("optimizer"),
        memory_bytes_per_device=sum(mem.values()),
        memory_breakdown=mem,
        memory_capacity_bytes=capacity,
        fits_memory=sum(mem.values()) <= capacity,
        speedup=speedup,
        efficiency=speedup / config.devices,
    )
