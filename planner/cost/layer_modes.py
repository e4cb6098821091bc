"""Per-layer data or model parallelism for a CNN (Krizhevsky, "One weird trick for parallelizing
convolutional neural networks", arXiv 1404.5997, 2014), priced for one (nodes n, devices per
node g, local batch b, collective) as arrays over (segment, mode).

Modes, per segment (`cnn_layout.segments`):
- data (degree 1): weights replicated, each device runs its own b samples, gradients are
  allreduced over all N = n g devices, exactly as `cost/data_parallel.py`;
- model k: output channels / neurons are split over a group of k devices that run the group's
  k b samples together (Krizhevsky 2014, sec. 3). Each weighted layer all-gathers its input
  (k b samples, all features) forward and reduce-scatters its input gradient backward; leaving
  model k for anything else re-partitions the segment's output by samples with an all-to-all
  each way. The 1/k weight shard is allreduced over the N/k groups.
- spatial k (domain parallelism: Gholami et al., "Integrated model, batch and domain
  parallelism in training neural networks", SPAA 2018; Dryden et al., IPDPS 2019): a group
  of k devices runs its k b samples together, each device holding a slab of 1/k of every
  sample's first spatial dimension (depth of a volume, height of an image) and all the
  weights. Every conv or pool layer exchanges halos with its two neighbours forward (the
  kernel - stride rows of the input its slab's outputs need) and the input gradient's halos
  backward; entering spatial k from another mode and leaving it re-partition the activations
  by an all-to-all each way (not at the first segment: the loader reads slabs). The weights'
  gradient is allreduced over all N devices, as in data mode. Segments whose layers lose the
  spatial dimensions (fc, flatten) or have fewer than k rows cannot run spatial k.
With fewer samples than devices (b < 1) data mode is out and a mode of degree k runs where its
group's k b samples are whole: that is where spatial and model parallelism pay.
FLOPs per device are the same in every mode; what model parallelism changes is the weight bytes
a device streams (W/k instead of W: the memory-bound FC layers at small b speed up), the
gradient volume (W/k over N/k replicas) and the activation traffic it adds.

iteration = sum_segments (compute + activation collectives) + all-to-all exits + optimizer
            + max(0, gradient allreduce - backward left after the first bucket)
with the same bucketed overlap rule as data parallelism. Every term is linear in the one-hot
mode choice except the per-call latency (ceil(bytes / bucket) calls per replica group) and the
overlap max: the search models those two exactly with integer and max variables.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from planner.cost import cnn_layout
from planner.cost.cnn_layout import (
    Group,
    LayerArrays,
    allreduce_terms,
    issue_floors,
    link,
    roofline,
    segments,
)
from planner.expr import collectives as coll
from planner.expr.cnn import DataParallelModel
from planner.expr.collectives import Collective


def _halo_rows(layer) -> int:
    """Input rows (of the first spatial dimension) a slab's outputs need beyond its own: a
    window of k rows moving s at a time reads k - s more than it advances (0 for 1x1 convs
    and pools whose window is their stride)."""
    return max(0, layer.kernel[0] - layer.stride[0]) if layer.kernel else 0


def _first_dim(cnn, i: int) -> int:
    """Rows of layer i's input along its first spatial dimension (0 if it has none): its
    output's rows times its stride (a windowed layer), else its output's."""
    layer = cnn.layers[i]
    if len(layer.output_shape) < 3:
        return 0
    return layer.output_shape[1] * (layer.stride[0] if layer.stride else 1)


def _rows(cnn, seg) -> int:
    """The fewest rows any layer of the segment holds along the first spatial dimension, in
    or out: a spatial k needs k of them (0: a layer without spatial dimensions)."""
    out = []
    for i in seg.layers:
        shape = cnn.layers[i].output_shape
        if len(shape) < 3:
            return 0
        out += [shape[1], _first_dim(cnn, i)]
    return min(out)


@dataclass(frozen=True)
class Modes:
    """The modes of one point: each one's kind ("data", "model", "spatial") and degree, and
    per segment which of them can run there."""

    kinds: list[str]
    degrees: list[int]
    valid: np.ndarray  # (segments, modes)


@functools.lru_cache(maxsize=64)
def _limits(cnn) -> tuple[int, tuple[int, ...]]:
    """(the narrowest weighted layer's channels: model k's largest degree, each segment's
    fewest rows: spatial k's), per network (the search asks at every point)."""
    segs = segments(cnn)
    widths = [cnn.layers[i].output_shape[0] for s in segs for i in s.layers
              if cnn.layers[i].params]
    return (min(widths) if widths else 1), tuple(_rows(cnn, s) for s in segs)


def modes_at(cnn, n: int, g: int, b: Fraction, spatial: bool = True) -> Modes:
    """The modes of a point of n nodes x g devices at b samples per device. Groups of k tile
    the nodes (k divides g, or g divides k); model k splits at most the narrowest weighted
    layer's channels; spatial k needs k rows in every layer of its segment; with b < 1 a
    mode runs only where its group holds whole samples (k b an integer)."""
    N = n * g
    widest, rows = _limits(cnn)
    tiles = [k for k in range(2, N + 1) if N % k == 0 and (g % k == 0 or k % g == 0)]
    model = [k for k in tiles if k <= widest]
    spatial_degrees = [k for k in tiles if k <= max(rows, default=0)] if spatial else []
    kinds = ["data"] + ["model"] * len(model) + ["spatial"] * len(spatial_degrees)
    degrees = [1, *model, *spatial_degrees]
    spat = np.array([kind == "spatial" for kind in kinds])
    whole = np.array([(k * b).denominator == 1 for k in degrees])
    valid = np.tile(whole, (len(rows), 1))
    for s_, r in enumerate(rows):
        valid[s_, spat] &= np.array([k <= r for k in spatial_degrees], dtype=bool)
    return Modes(kinds, degrees, valid)


@dataclass(frozen=True)
class Breakdown:
    """One assignment of modes, evaluated (seconds, bytes)."""

    iteration_time_s: float
    compute_time_s: float
    activation_comm_s: float  # gathers, reduce-scatters, all-to-all exits (never hidden)
    gradient_comm_s: float
    exposed_gradient_comm_s: float
    optimizer_time_s: float
    memory_bytes: float
    memory_breakdown: dict
    layers: list[dict]  # {name, mode, degree, compute_time_s, communication_time_s}


class LayerModes:
    """Cost tables of every (segment, mode) for one point: `kinds` and `degrees` per mode
    (mode 0 is data), `valid` per segment and mode."""

    def __init__(self, dp: DataParallelModel, n: int, g: int, b: int | Fraction,
                 collective: Collective, overlap: bool, spatial: bool = True,
                 floors: bool = True):
        """`b`: samples per device, a fraction where several devices share one sample (only
        the modes whose group's k b samples are whole run then); `spatial`: offer the spatial
        modes; `floors`: each layer's kernels take at least their issue time (False: the bare
        roofline, what scales with the sample's volume: `planner.analysis.spatial`)."""
        b = Fraction(b)
        self.dp, self.n, self.g, self.b = dp, n, g, b
        self.collective, self.overlap = collective, overlap
        cnn, prec = dp.cnn, dp.options.precision
        self.segments: list[Group] = segments(cnn)
        self.arrays = a = LayerArrays.of(cnn)
        N = n * g
        # modes: data, model k, spatial k; `degrees` the degree of each, `kinds` its kind,
        # `valid` where each can run (`modes_at`)
        modes = modes_at(cnn, n, g, b, spatial)
        self.kinds, self.degrees, self.valid = modes.kinds, modes.degrees, modes.valid
        S, K = len(self.segments), len(self.degrees)
        spat = np.array([kind == "spatial" for kind in self.kinds])
        self.spatial = spat
        # the gradient's replica group of each mode: data and spatial modes allreduce over all
        # N devices (group 0), model k over the N / k replicas of its shard
        self.group = np.array([0 if kind != "model" else j for j, kind in enumerate(self.kinds)])
        d = prec.bytes
        rates = cnn_layout.rates(dp)
        first_weighted = next((i for i in range(len(cnn.layers)) if a.params[i] > 0), -1)
        hide_layers = {w.layer for w in dp.roofline["T_hide"].works}
        self.hides = np.array([cnn.layers[i].name in hide_layers for i in range(len(cnn.layers))])
        state_bytes = dp.options.optimizer.state_bytes_per_param
        master = 4 if d < 4 else 0

        # Per layer x degree: the shard of the layer a device holds. Weighted layers split
        # their output channels (ceil: the largest shard sets the pace), weightless ones their
        # elements evenly.
        L = len(cnn.layers)
        ks = np.array(self.degrees, dtype=float)
        out_ch = np.array([l.output_shape[0] for l in cnn.layers], dtype=float)
        share = np.where(a.params[:, None] > 0,
                         np.ceil(out_ch[:, None] / ks[None, :]) / out_ch[:, None],
                         1.0 / ks[None, :])  # (L, K)
        fb = float(b)
        samples = ks[None, :] * fb  # samples a device's group runs
        # weighted layers see all inputs in model mode; a spatial slab is 1 / k of k b samples
        gathered = np.where((a.params[:, None] > 0) & ~spat[None, :], samples, fb)
        share = np.where(spat[None, :], 1.0 / ks[None, :], share)
        weights_share = np.where(spat[None, :], 1.0, share)  # spatial: every device all weights
        work = share * samples  # fraction of the layer's per-sample work, times samples
        bwd_floor, fwd_floor = issue_floors(dp, a)  # every device issues the layer's kernels
        if not floors:
            bwd_floor, fwd_floor = 0 * bwd_floor, 0.0
        fwd = roofline(a.flops[:, None] * work,
                       d * (a.params[:, None] * weights_share + a.inputs[:, None] * gathered
                            + a.outputs[:, None] * work), *rates, fwd_floor)
        bwd = roofline(a.bwd_factor[:, None] * a.flops[:, None] * work,
                       d * (2 * a.params[:, None] * weights_share
                            + 2 * a.inputs[:, None] * gathered
                            + a.outputs[:, None] * work), *rates, bwd_floor[:, None])
        fwd, bwd = fwd * a.costed[:, None], bwd * a.costed[:, None]

        # Activation collectives of weighted layers in model k: gather inputs forward,
        # reduce-scatter input gradients backward (none for the first weighted layer).
        act = np.zeros((L, K))
        halo_latency = np.zeros((L, K))  # of `act`, the spatial halos' message latencies
        exit_ = np.zeros((S, K))
        entry = np.zeros((S, K))
        halo = np.array([_halo_rows(l) for l in cnn.layers], dtype=float)
        depth = np.array([_first_dim(cnn, i) for i in range(L)], dtype=float)
        for j, k in enumerate(self.degrees[1:], start=1):
            lk = link(dp, k > g)
            if spat[j]:
                # halos: (kernel - stride) input rows of every one of the group's k b samples,
                # from both neighbours (two messages), forward and the gradient's backward
                rows_bytes = halo * np.divide(a.inputs, depth, out=np.zeros(L), where=depth > 0)
                size = k * fb * rows_bytes * d
                halo_latency[:, j] = np.where(halo > 0, 4 * lk.alpha, 0.0)
                act[:, j] = np.where(halo > 0, halo_latency[:, j] + 2 * size / lk.beta, 0.0)
            else:
                m = k * fb * a.inputs * d
                gather = np.array([float(coll.all_gather(k, x, lk.alpha, lk.beta)) for x in m])
                scatter = np.array([float(coll.reduce_scatter(k, x, lk.alpha, lk.beta))
                                    for x in m])
                scatter[first_weighted] = 0.0
                act[:, j] = np.where(a.params > 0, gather + scatter, 0.0)
            for s, seg in enumerate(self.segments):
                last = seg.layers[-1]
                per_device = share[last, j] * k * fb * a.outputs[last] * d
                exit_[s, j] = 2 * float(coll.all_to_all(k, per_device, lk.alpha, lk.beta))
                if spat[j] and s > 0:  # re-partition the segment's input into slabs
                    first = seg.layers[0]
                    entry[s, j] = 2 * float(coll.all_to_all(k, fb * a.inputs[first] * d,
                                                            lk.alpha, lk.beta))

        # Gradient allreduce over the replicas of each mode's group (by group index: data
        # and spatial modes share group 0, all N devices).
        self.latency = np.zeros(K)
        self.per_byte = np.zeros(K)
        for j, k in enumerate(self.degrees):
            if self.kinds[j] != "model":
                k = 1
            per_node = g // k if k <= g else 1
            self.latency[j], self.per_byte[j] = allreduce_terms(dp, collective, N // k, per_node)

        seg_sum = lambda x: np.array([x[list(s.layers)].sum(axis=0) for s in self.segments])  # noqa: E731
        self.layer_fwd, self.layer_bwd, self.layer_act = fwd, bwd, act
        self.halo_latency = halo_latency
        self.share = weights_share  # of each layer's weights a device holds
        self.compute = seg_sum(fwd + bwd)  # (S, K)
        self.act = seg_sum(act)
        self.exit = exit_
        self.entry = entry
        self.hide = seg_sum(bwd * self.hides[:, None])
        shard_params = seg_sum(a.params[:, None] * weights_share)
        self.grad_bytes = np.ceil(shard_params * d)  # whole bytes (the search counts buckets)
        self.optimizer = shard_params * (d + 2 * (4 + state_bytes)) / rates[1]
        self.memory_parts = {
            "weights": shard_params * (d + master),
            "gradients": shard_params * d,
            "optimizer": shard_params * state_bytes,
            "activations": d * seg_sum(a.stored[:, None] * work
                                       + np.where((ks[None, :] > 1) & ~spat[None, :],
                                                  a.inputs[:, None] * gathered
                                                  * (a.params[:, None] > 0), 0.0)),
        }
        self.memory = sum(self.memory_parts.values())
        self.memory_fixed = d * fb * math.prod(cnn.input_shape)  # the input images (slabs)
        self.bucket = dp.options.bucket_bytes

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.segments), len(self.degrees)

    def calls(self, bytes_: float) -> int:
        return max(1, math.ceil(bytes_ / self.bucket)) if bytes_ > 0 else 0

    def evaluate(self, assign: list[int] | tuple[int, ...]) -> Breakdown:
        """The iteration of one assignment (degree index per segment), in float."""
        rows = np.arange(len(self.segments))
        sel = np.asarray(assign)
        leaving = np.append(sel[1:] != sel[:-1], True) & (sel > 0)
        exits = self.exit[rows, sel] * leaving
        entering = np.insert(sel[1:] != sel[:-1], 0, False)
        entries = self.entry[rows, sel] * entering
        groups = self.group[sel]
        grad_bytes = np.bincount(groups, weights=self.grad_bytes[rows, sel],
                                 minlength=len(self.degrees))
        calls = np.array([self.calls(x) for x in grad_bytes])
        grad = float((calls * self.latency).sum() + (grad_bytes * self.per_byte).sum())
        hide = float(self.hide[rows, sel].sum())
        exposed = max(0.0, grad - hide) if self.overlap else grad
        compute = float(self.compute[rows, sel].sum())
        act = float(self.act[rows, sel].sum() + exits.sum() + entries.sum())
        opt = float(self.optimizer[rows, sel].sum())
        mem = {k: float(v[rows, sel].sum()) for k, v in self.memory_parts.items()}
        mem["activations"] += self.memory_fixed
        # Per layer: compute, and communication with the segment's exit on its last layer and
        # its gradient share (bandwidth plus latency in proportion to bytes).
        layers = []
        for s, seg in enumerate(self.segments):
            j = int(sel[s])
            k, grp = self.degrees[j], int(self.group[j])
            per_call = self.latency[j] * calls[grp] / grad_bytes[grp] if grad_bytes[grp] else 0.0
            for i in seg.layers:
                l_bytes = self.arrays.params[i] * self.share[i, j] * self.dp.options.precision.bytes
                comm = self.layer_act[i, j] + l_bytes * (self.per_byte[j] + per_call)
                if i == seg.layers[0]:
                    comm += entries[s]
                if i == seg.layers[-1]:
                    comm += exits[s]
                layers.append({"name": self.dp.cnn.layers[i].name,
                               "mode": self.kinds[j], "degree": k,
                               "compute_time_s": float(self.layer_fwd[i, j] + self.layer_bwd[i, j]),
                               "communication_time_s": float(comm)})
        return Breakdown(compute + act + opt + exposed, compute, act, grad, exposed, opt,
                         sum(mem.values()), mem, layers)

    def lower_bound(self) -> float:
        """No assignment is faster: each segment at its cheapest compute + activation traffic,
        all gradient traffic hidden, the cheapest optimizer step."""
        inf = np.where(self.valid, 0.0, np.inf)
        return float((self.compute + self.act + inf).min(axis=1).sum()
                     + (self.optimizer + inf).min(axis=1).sum())

    @property
    def feasible(self) -> bool:
        """Whether every segment has a mode that runs (with fewer samples than devices, a
        segment no spatial or model group can take leaves the point without a plan)."""
        return bool(self.valid.any(axis=1).all())

    MAX_GROUP_SETS = 8  # degrees up to which the chain bound tracks which groups allreduce

    def chain_bound(self, weight: float, fixed_latency: bool) -> tuple[float, list[int]]:
        """A lower bound on the iteration time of every assignment, memory aside, and the
        assignment reaching it, by dynamic programming along the segments (a shortest path:
        the all-to-all exits depend on the next segment's mode, everything else on the
        segment's own).

        The exposed gradient time max(0, G - H) (overlap) or G (none) is at least
        weight x (G - H) for a weight in [0, 1] (weight 1 without overlap: then H = 0 here).
        G's latency is ceil(bytes / bucket) calls per replica group used: priced either as one
        call per group used (`fixed_latency`: the path also tracks the set of groups used) or
        as latency / bucket per byte; both are at most the true count."""
        S, K = self.shape
        hide = self.hide if self.overlap else np.zeros_like(self.hide)
        per_byte = self.per_byte + (0.0 if fixed_latency else self.latency / self.bucket)
        own = (self.compute + self.act + self.optimizer
               + weight * (self.grad_bytes * per_byte[None, :] - hide))  # (S, K)
        own = np.where(self.valid, own, np.inf)
        # (S, K): mode j of segment s adds to its group's allreduce (bit group[j] of the set)
        uses = self.grad_bytes > 0
        sets = 1 << K if fixed_latency else 1
        masks = np.arange(sets)
        # cost[j, u]: best cost of segments 0..s with segment s in mode j and groups u used.
        cost = np.full((K, sets), np.inf)
        for j in range(K):
            cost[j, (1 << self.group[j]) * int(uses[0, j]) if fixed_latency else 0] = own[0, j]
        back = []  # per step: (mode of the segment before, its set) for every (j, u)
        for s in range(1, S):
            nxt = np.full((K, sets), np.inf)
            arg_i = np.zeros((K, sets), dtype=np.int64)
            arg_u = np.zeros((K, sets), dtype=np.int64)
            for j in range(K):  # segment s in mode j
                bit = (1 << self.group[j]) * int(uses[s, j]) if fixed_latency else 0
                for i in range(K):  # segment s - 1 in mode i (ties: the first i wins)
                    step = cost[i] + own[s, j] + (self.exit[s - 1, i] + self.entry[s, j]
                                                  if i != j else 0.0)
                    # From set v the path reaches v | bit: the sets with the bit come from
                    # themselves or from the same set without it.
                    src = masks.copy()
                    if bit:
                        without = masks ^ bit
                        src = np.where(step[without] < step[masks], without, masks)
                        cand = np.where(masks & bit, step[src], np.inf)
                    else:
                        cand = step
                    better = cand < nxt[j]
                    nxt[j] = np.where(better, cand, nxt[j])
                    arg_i[j] = np.where(better, i, arg_i[j])
                    arg_u[j] = np.where(better, src, arg_u[j])
            cost = nxt
            back.append((arg_i, arg_u))
        total = cost + (self.exit[S - 1] * (np.arange(K) > 0))[:, None]
        if fixed_latency:
            lat = np.array([sum(self.latency[g] for g in range(K) if u >> g & 1) for u in masks])
            total = total + weight * lat[None, :]
        j, u = (int(x) for x in np.unravel_index(int(np.argmin(total)), total.shape))
        value = float(total[j, u])
        plan = [j]
        for arg_i, arg_u in reversed(back):
            j, u = int(arg_i[j, u]), int(arg_u[j, u])
            plan.append(j)
        return value, plan[::-1]

    def bound_and_plans(self) -> tuple[float, list[list[int]]]:
        """A lower bound on every assignment (memory aside: the best of `lower_bound` and the
        chain bounds) and assignments worth pricing before any search: every segment in data
        mode (the data-parallel plan) and the assignments the chain bounds reach. When one of
        them fits in memory and prices at the bound, it is optimal."""
        bound = self.lower_bound()
        plans = [[0] * len(self.segments)]  # dropped below where data mode cannot run
        # Without overlap weight 1 is the better bound (G >= 0); one call per group used is
        # the better latency price while no group fills a bucket.
        options = [(1.0, False)] + ([(0.0, False)] if self.overlap else [])
        if len(self.degrees) <= self.MAX_GROUP_SETS:
            # the most bytes any group can allreduce: per segment its largest mode in the group
            most = max(self.grad_bytes[:, self.group == grp].max(axis=1).sum()
                       for grp in set(self.group.tolist()))
            fits = most <= self.bucket
            options = [(1.0, True)] + ([o for o in options if o[0] == 0.0] if fits else options)
        for weight, fixed in options:
            value, plan = self.chain_bound(weight, fixed)
            bound = max(bound, value)
            if plan not in plans:
                plans.append(plan)
        rows = np.arange(len(self.segments))
        return bound, [p for p in plans if self.valid[rows, p].all()]
