"""Per-layer compute time by the roofline model, as SymPy expressions in the local batch b.

time = max(FLOPs / (eta * P), bytes / (eta_mem * beta_mem))   (Williams, Waterman & Patterson,
"Roofline", CACM 2009). Weight bytes are paid once per pass, activation bytes per sample, so at a
small local batch the weights dominate the bytes and the layer turns memory bound: the seed
paper's "the local batch must stay large enough to use the hardware".
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from planner.spec.cnn import CNN
from planner.spec.hardware import Device, Precision


@dataclass(frozen=True)
class Work:
    """What one layer does in one pass: FLOPs and bytes per sample, bytes per pass (weights)."""

    layer: str
    flops_per_sample: float
    bytes_per_sample: float
    bytes_fixed: float


def forward_work(cnn: CNN, precision: Precision) -> list[Work]:
    d = precision.bytes
    # Reads input and weights, writes output.
    return [
        Work(l.name, l.forward_flops, d * (l.input_elements + l.activation_elements), d * l.params)
        for l in cnn.layers
        if l.forward_flops or l.params
    ]


def backward_work(cnn: CNN, precision: Precision) -> list[Work]:
    """In backward (output-to-input) order. Backward of a weighted layer is 2x its forward
    (input gradient + weight gradient), except the first weighted layer, which needs no input
    gradient (1x); elementwise layers cost about their forward (Narayanan et al. SC21, sec. 3.1)."""
    d = precision.bytes
    first = next((l.name for l in cnn.layers if l.params), None)
    work = []
    for l in reversed(cnn.layers):
        if not (l.forward_flops or l.params):
            continue
        factor = (1 if l.name == first else 2) if l.params else 1
        # Reads output gradient and input, writes input gradient; reads weights, writes their gradient.
        work.append(
            Work(l.name, factor * l.forward_flops,
                 d * (2 * l.input_elements + l.activation_elements), 2 * d * l.params)
        )
    return work


def time(work: Work, device: Device, precision: Precision, b: sp.Expr) -> sp.Expr:
    compute = work.flops_per_sample * b / (device.efficiency.compute * device.peak_flops(precision))
    memory = (work.bytes_fixed + work.bytes_per_sample * b) / (
        device.efficiency.memory * device.memory_bandwidth_Bps
    )
    if work.flops_per_sample == 0:
        return memory
    return sp.Max(compute, memory, evaluate=False)


def total_time(works: list[Work], device: Device, precision: Precision, b: sp.Expr) -> sp.Expr:
    return sp.Add(*(time(w, device, precision, b) for w in works))
