"""What per-layer model parallelism and pipeline stages of a CNN share: the units layers are
grouped into, the roofline of one layer at any share of its work, and the gradient allreduce
among the replicas of a weight shard.

A unit is one top-level entry of the model file (a layer, or one repeat of a block such as an
inception module or a bottleneck). Branches live inside units, so cutting between units never
cuts a branch: pipeline stages and hybrid modes change only there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.expr.cnn import DataParallelModel, LinkParams
from planner.expr.collectives import Collective, hierarchical_allreduce
from planner.expr.roofline import issue_time
from planner.spec.cnn import CNN


@dataclass(frozen=True)
class Group:
    """Consecutive layers (indices into `cnn.layers`) that move together."""

    name: str
    layers: tuple[int, ...]


def units(cnn: CNN) -> list[Group]:
    out: list[Group] = []
    for i, layer in enumerate(cnn.layers):
        if out and cnn.layers[out[-1].layers[0]].unit == layer.unit:
            out[-1] = Group(out[-1].name, (*out[-1].layers, i))
        else:
            out.append(Group(layer.block, (i,)))
    return out


def segments(cnn: CNN) -> list[Group]:
    """Hybrid decision groups: a unit with weights and the weightless units after it (pooling,
    activations, dropout follow the mode of the layer before them). Weightless units before
    the first weighted one join it."""
    out: list[Group] = []
    pending: tuple[int, ...] = ()
    for u in units(cnn):
        weighted = any(cnn.layers[i].params for i in u.layers)
        if weighted or not out:
            if weighted:
                out.append(Group(u.name, (*pending, *u.layers)))
                pending = ()
            else:
                pending = (*pending, *u.layers)
        else:
            out[-1] = Group(out[-1].name, (*out[-1].layers, *u.layers))
    if pending:  # a network without weights: one group
        out.append(Group(cnn.layers[pending[0]].block, pending))
    return out


@dataclass(frozen=True)
class LayerArrays:
    """Per-layer counts as arrays (per sample, in elements; params; backward FLOP factor)."""

    flops: np.ndarray
    params: np.ndarray
    inputs: np.ndarray
    outputs: np.ndarray
    bwd_factor: np.ndarray  # backward FLOPs / forward FLOPs (SC21 sec. 3.1; 1 for the first)
    stored: np.ndarray  # activation elements kept for backward (flatten is a view)
    costed: np.ndarray  # layers the roofline prices (any FLOPs or weights)

    @classmethod
    def of(cls, cnn: CNN) -> LayerArrays:
        first = next((i for i, l in enumerate(cnn.layers) if l.params), None)
        arr = lambda f: np.array([f(l) for l in cnn.layers], dtype=float)  # noqa: E731
        factor = arr(lambda l: 2.0 if l.params else 1.0)
        if first is not None:
            factor[first] = 1.0
        return cls(arr(lambda l: l.forward_flops), arr(lambda l: l.params),
                   arr(lambda l: l.input_elements), arr(lambda l: l.activation_elements), factor,
                   arr(lambda l: 0 if l.type == "flatten" else l.activation_elements),
                   arr(lambda l: bool(l.forward_flops or l.params)).astype(bool))


def roofline(flops, bytes_, flop_rate: float, byte_rate: float, floor=0.0):
    """max(FLOPs / achieved FLOP/s, bytes / achieved memory B/s, the kernels' issue floor)
    (Williams et al. 2009), the same per-layer rule as `expr/roofline.py`."""
    return np.maximum(np.maximum(np.asarray(flops) / flop_rate, np.asarray(bytes_) / byte_rate),
                      floor)


def rates(dp: DataParallelModel) -> tuple[float, float]:
    """(achieved FLOP/s, achieved memory B/s) of the device at the model's precision."""
    dev, prec = dp.system.device, dp.options.precision
    return (dev.efficiency.compute * dev.peak_flops(prec),
            dev.efficiency.memory * dev.memory_bandwidth_Bps)


def issue_floors(dp: DataParallelModel, a: LayerArrays) -> tuple[np.ndarray, float]:
    """(backward, forward) issue floor of every layer: its kernels (one forward; backward a
    weighted layer's two, the first's and an elementwise one's one: `bwd_factor`) times the
    host's issue time (`expr/roofline.py`)."""
    t = issue_time(dp.system.device)
    return a.bwd_factor * t, t


def data_layer_times(dp: DataParallelModel, a: LayerArrays, batch) -> np.ndarray:
    """Forward + backward roofline of every layer on `batch` samples with all its weights (data
    mode; the per-layer terms of `DataParallelModel.compute_sum`). `batch` broadcasts: an
    array of shape (P, 1) gives (P, layers)."""
    d = dp.options.precision.bytes
    r = rates(dp)
    bwd_floor, fwd_floor = issue_floors(dp, a)
    x = np.asarray(batch, dtype=float)
    fwd = roofline(a.flops * x, d * (a.params + (a.inputs + a.outputs) * x), *r, fwd_floor)
    bwd = roofline(a.bwd_factor * a.flops * x, d * (2 * a.params + (2 * a.inputs + a.outputs) * x),
                   *r, bwd_floor)
    return (fwd + bwd) * a.costed


def weighted_layer_floor(dp: DataParallelModel, a: LayerArrays, batch, devices) -> np.ndarray:
    """A lower bound on the forward + backward roofline of the weighted layers, summed, in any
    data or model mode (`cost/layer_modes.py`) on `batch` samples per device with groups of up
    to `devices` (arrays broadcast: shape (P, 1) gives (P,)). In model k a device does at least
    the FLOPs of `batch` samples and streams at least P/k weights, k x batch gathered inputs and
    batch outputs; P/k + I k b is smallest at k = sqrt(P / (I b)), clipped to [1, devices]."""
    d = dp.options.precision.bytes
    r = rates(dp)
    bwd_floor, fwd_floor = issue_floors(dp, a)
    w = a.params > 0
    F, P, I, O, bf = a.flops[w], a.params[w], a.inputs[w], a.outputs[w], a.bwd_factor[w]
    b = np.asarray(batch, dtype=float)
    k = np.clip(np.sqrt(P / (I * b)), 1, np.asarray(devices, dtype=float))
    fwd = roofline(F * b, d * (P / k + I * k * b + O * b), *r, fwd_floor)
    bwd = roofline(bf * F * b, d * (2 * P / k + 2 * I * k * b + O * b), *r, bwd_floor[w])
    return (fwd + bwd).sum(axis=-1)


def link(dp: DataParallelModel, across_nodes: bool) -> LinkParams:
    return dp.flat_inter if across_nodes else dp.intra


def allreduce_terms(dp: DataParallelModel, collective: Collective, replicas: int,
                    per_node: int) -> tuple[float, float]:
    """(seconds per call, seconds per byte) of allreducing a gradient over `replicas` devices,
    `per_node` of them in each node. Every collective of `cost/collectives.py` is affine in the
    number of calls and the message size, so time = calls x first + bytes x second; with all
    replicas being every device this is exactly `DataParallelModel.t_comm`."""
    if replicas <= 1:
        return 0.0, 0.0
    # Memoised per model object: the SymPy forms (log, ceiling) are slow to build per point.
    memo = dp.__dict__.setdefault("_allreduce_terms", {})
    key = (collective, replicas, per_node)
    if key not in memo:
        memo[key] = _allreduce_terms(dp, collective, replicas, per_node)
    return memo[key]


def _allreduce_terms(dp: DataParallelModel, collective: Collective, replicas: int,
                     per_node: int) -> tuple[float, float]:
    nodes = max(1, replicas // per_node)

    def cost(m: float, calls: float) -> float:
        if collective is Collective.hierarchical:
            intra, inter = dp.intra, dp.hier_inter
            return float(hierarchical_allreduce(per_node, nodes, m, intra.alpha, intra.beta,
                                                inter.alpha, inter.beta / per_node, calls))
        return float(dp.flat(collective, replicas, m, link(dp, nodes > 1), calls))

    return cost(0.0, 1.0), cost(1.0, 0.0)
