"""Per-layer compute time by the roofline model, as SymPy expressions in the local batch b.

time = max(FLOPs / (eta * P), bytes / (eta_mem * beta_mem), kernels x t_issue)   (Williams,
Waterman & Patterson, "Roofline", CACM 2009). Weight bytes are paid once per pass, activation
bytes per sample, so at a small local batch the weights dominate the bytes and the layer turns
memory bound: the seed paper's "the local batch must stay large enough to use the hardware".
Below that, a layer's kernels take at least the host's time to issue them
(`kernels.launch_us`, the same floor the transformer model's kernels have; 0 on devices
without a fitted one): one kernel forward, a weighted layer's two backward (input and weight
gradients), one for the first weighted layer and for an elementwise layer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.expr.piecewise import Piece
from planner.expr.unordered import smax
from planner.spec.cnn import CNN
from planner.spec.hardware import Device, Precision

if TYPE_CHECKING:
    import sympy as sp


@dataclass(frozen=True)
class Work:
    """What one layer does in one pass: FLOPs and bytes per sample, bytes per pass (weights)."""

    layer: str
    flops_per_sample: float
    bytes_per_sample: float
    bytes_fixed: float
    kernels: int = 1  # kernels the pass launches (each at least the host's issue time)


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
                 d * (2 * l.input_elements + l.activation_elements), 2 * d * l.params,
                 kernels=int(factor))
        )
    return work


def bound(flops, bytes_, flop_rate, byte_rate, floor=0) -> sp.Expr:
    """The roofline of one kernel, a CNN layer or a transformer matmul alike (Williams et al.
    2009): its FLOPs at the achievable FLOP rate or its bytes at the achievable memory
    bandwidth, whichever takes longer, and (`floor`) never less than its kernels take to
    issue. Unevaluated: SymPy would try to order them."""
    terms = ([flops / flop_rate] if flops != 0 else []) + [bytes_ / byte_rate]
    if floor:
        terms.append(floor)
    return smax(*terms) if len(terms) > 1 else terms[0]


def issue_time(device: Device) -> float:
    """Seconds the host takes to issue one kernel on `device` (0: none fitted)."""
    return device.kernels.launch_us * 1e-6 if device.kernels else 0.0


def time(work: Work, device: Device, precision: Precision, b: sp.Expr) -> sp.Expr:
    return bound(work.flops_per_sample * b, work.bytes_fixed + work.bytes_per_sample * b,
                 device.efficiency.compute * device.peak_flops(precision),
                 device.efficiency.memory * device.memory_bandwidth_Bps,
                 work.kernels * issue_time(device))


def total_time(works: list[Work], device: Device, precision: Precision, b: sp.Expr) -> sp.Expr:
    import sympy as sp

    return sp.Add(*(time(w, device, precision, b) for w in works))


@dataclass(frozen=True, eq=False)
class RooflineSum:
    """sum_i max(F_i b / R_f, (W_i + A_i b) / R_m, K_i t_issue) held as per-layer arrays.

    The same quantity as `total_time`, but numeric evaluation is one numpy reduction instead of
    a lambdified sum of hundreds of Max terms, and the affine pieces come straight from the
    ridge points. `expr` builds the SymPy sum when a formula is wanted.
    """

    works: tuple[Work, ...]
    flops: np.ndarray  # per sample
    bytes_per_sample: np.ndarray
    bytes_fixed: np.ndarray
    flop_rate: float  # achieved FLOP/s
    byte_rate: float  # achieved memory B/s
    device: Device
    precision: Precision
    floors: np.ndarray  # per layer: its kernels x the issue time

    @classmethod
    def of(cls, works: list[Work], device: Device, precision: Precision) -> RooflineSum:
        arr = lambda attr: np.array([getattr(w, attr) for w in works], dtype=float)  # noqa: E731
        return cls(tuple(works), arr("flops_per_sample"), arr("bytes_per_sample"), arr("bytes_fixed"),
                   device.efficiency.compute * device.peak_flops(precision),
                   device.efficiency.memory * device.memory_bandwidth_Bps, device, precision,
                   arr("kernels") * issue_time(device))

    def __call__(self, b) -> np.ndarray:
        """The sum at local batch b (any array shape), read off its affine pieces: O(log L) per
        point instead of a points x layers matrix (a solve may ask for millions of points)."""
        x = np.asarray(b, dtype=float)
        lo, t0, c = self._piece_table
        k = np.clip(np.searchsorted(lo, x, side="right") - 1, 0, len(lo) - 1)
        return t0[k] + c[k] * x

    def direct(self, b) -> np.ndarray:
        """The sum layer by layer (the definition; used to check the pieces)."""
        x = np.asarray(b, dtype=float)[..., None]
        t = np.maximum(np.maximum(self.flops * x / self.flop_rate,
                                  (self.bytes_fixed + self.bytes_per_sample * x) / self.byte_rate),
                       self.floors)
        return t.sum(axis=-1)

    @functools.cached_property
    def _piece_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pieces = self.pieces()
        return (np.array([p.b_lo for p in pieces]), np.array([p.t0 for p in pieces]),
                np.array([p.c for p in pieces]))

    def expr(self, b: sp.Expr) -> sp.Expr:
        return total_time(list(self.works), self.device, self.precision, b)

    def pieces(self) -> list[Piece]:
        """Affine pieces in b >= 0, cut wherever a layer's bound changes: its ridge point
        (memory -> compute bound) and where its compute or memory time overtakes its kernels'
        issue floor. Each layer is the max of three affine functions of b (the floor flat), so
        the sum stays convex and piecewise affine."""
        slope_c = self.flops / self.flop_rate
        slope_m = self.bytes_per_sample / self.byte_rate
        icept_m = self.bytes_fixed / self.byte_rate
        # (intercept, slope) of each layer's three lines: compute, memory, issue floor
        lines = ((np.zeros_like(slope_c), slope_c), (icept_m, slope_m),
                 (self.floors, np.zeros_like(slope_c)))
        found = []
        with np.errstate(divide="ignore", invalid="ignore"):
            for i, (a0, a1) in enumerate(lines):
                for b0, b1 in lines[i + 1:]:
                    x = (b0 - a0) / (a1 - b1)
                    found.append(x[np.isfinite(x) & (x > 0)])
        cuts = sorted({0.0, *np.concatenate(found).tolist(), float("inf")})
        pieces = []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            mid = (lo + hi) / 2 if np.isfinite(hi) else max(2 * lo, lo + 1)
            values = np.stack([i0 + i1 * mid for i0, i1 in lines])  # (3, layers)
            top = np.argmax(values, axis=0)
            t0 = float(np.choose(top, [ln[0] for ln in lines]).sum())
            c = float(np.choose(top, [ln[1] for ln in lines]).sum())
            pieces.append(Piece(lo, hi, t0, c))
        return pieces

    def __add__(self, other: RooflineSum) -> RooflineSum:
        return RooflineSum.of(list(self.works + other.works), self.device, self.precision)
