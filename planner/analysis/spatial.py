"""Where spatial (domain) parallelism beats one device per sample: the volume side above which
splitting each sample over k devices (`planner.cost.layer_modes`, spatial k) finishes a sample
sooner than one device does, in closed form.

At a fixed small global batch the devices beyond one per sample can only help by splitting
samples (Gholami et al., SPAA 2018). For the convolution trunk (the leading segments a spatial
k can take) one sample costs W on one device and W_k + H on k devices, W_k the work of a
1 / k slab and H the halo exchange, whose bandwidth part H_bw scales with a slab's face and
latency part H_lat (two messages per neighbour pair, forward and backward, per windowed
layer) does not. Scaling every spatial side by x (the spec's input side times x) multiplies W
and W_k by x^d (d spatial dimensions: compute and activations follow the volume) and H_bw by
x^(d - 1):

    spatial k wins where  (W - W_k) x^d  >  H_bw x^(d - 1) + H_lat

so above x* = H_bw / (W - W_k) when latency is negligible, x* = (H_lat / (W - W_k))^(1/d)
when bandwidth is (fast scale-up links: NVLink), and in general the polynomial's largest real
root, which lies between the larger of the two and their sum. Every device issues all of a
layer's kernels, so a layer runs at least its kernels' issue time F_l on one device and on k
alike (`planner.expr.roofline`): where the slabs of x* are still issue bound the gain is
sum_l max(W_l x^d, F_l) - max(W_k,l x^d, F_l), and x* is the root of that piecewise form,
found by bisection above the polynomial's (it only grows in x). Weight traffic, which does not scale with
x, and the gradient allreduce (the trunk's weights, the same bytes either way) are left out:
at the crossover sizes they are a small share of a layer's time. `python -m pytest
tests/test_spatial.py` checks the crossover against models built at each side.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from planner.cost.cnn_layout import issue_floors
from planner.cost.layer_modes import LayerModes
from planner.expr.cnn import DataParallelModel
from planner.expr.collectives import Collective


def trunk_terms(dp: DataParallelModel, k: int, collective: Collective = Collective.ring
                ) -> dict | None:
    """(W, W_k, H_bw, H_lat, layers) of the convolution trunk at the spec's size, per sample:
    one device (data mode, one sample) against a group of k devices sharing it (spatial k
    inside one node of at least k devices), the works with their kernels' issue floors (as a
    plan prices them; `_passes` holds them per layer and pass without, and the floors); None
    where no leading segment takes spatial k."""
    g = dp.system.devices_per_node
    if k < 2 or k > g or g % k:
        return None
    one = LayerModes(dp, 1, 1, 1, collective, True, spatial=False)
    split = LayerModes(dp, 1, k, Fraction(1, k), collective, True)
    j = next((j for j, (kind, deg) in enumerate(zip(split.kinds, split.degrees, strict=True))
              if kind == "spatial" and deg == k), None)
    if j is None:
        return None
    leading = 0
    while leading < len(split.segments) and split.valid[leading, j]:
        leading += 1
    if leading == 0:
        return None
    layers = [i for s in split.segments[:leading] for i in s.layers]
    h_lat = float(split.halo_latency[layers, j].sum())
    total = float(split.layer_act[layers, j].sum())
    # the volume-scaled work without the issue floor, per layer and pass, and the floors
    bare_one = LayerModes(dp, 1, 1, 1, collective, True, spatial=False, floors=False)
    bare = LayerModes(dp, 1, k, Fraction(1, k), collective, True, floors=False)
    bwd_floor, fwd_floor = issue_floors(dp, split.arrays)
    costed = split.arrays.costed[layers]
    return {"work_one_s": float((one.layer_fwd[layers, 0] + one.layer_bwd[layers, 0]).sum()),
            "work_split_s": float((split.layer_fwd[layers, j] + split.layer_bwd[layers, j]).sum()),
            "halo_bandwidth_s": total - h_lat, "halo_latency_s": h_lat,
            "layers": [dp.cnn.layers[i].name for i in layers],
            "_passes": (np.concatenate([bare_one.layer_fwd[layers, 0], bare_one.layer_bwd[layers, 0]]),
                        np.concatenate([bare.layer_fwd[layers, j], bare.layer_bwd[layers, j]]),
                        np.concatenate([fwd_floor * costed, bwd_floor[layers] * costed]))}


def crossovers(dp: DataParallelModel, collective: Collective = Collective.ring) -> list[dict]:
    """`crossover` for every group size a node allows (k dividing its devices), as the JSON
    documents carry them (without the trunk's layer names)."""
    g = dp.system.devices_per_node
    found = [crossover(dp, k, collective) for k in range(2, g + 1) if g % k == 0]
    return [{key: v for key, v in x.items() if key not in ("layers", "_passes")}
            for x in found if x]


def crossover(dp: DataParallelModel, k: int, collective: Collective = Collective.ring
              ) -> dict | None:
    """The side above which spatial k beats one device per sample (module docstring): the
    closed form x* = H_bw / (W - W_k) and the root with latency, as a multiple of the spec's
    side and as a side; None where the trunk cannot split k ways or never gains."""
    t = trunk_terms(dp, k, collective)
    if t is None:
        return None
    one, split, floor = t["_passes"]
    gain = float(one.sum() - split.sum())  # W - W_k at the spec's size, floors apart
    if gain <= 0:
        return None
    d = len(dp.cnn.input_shape) - 1
    h_bw, h_lat = t["halo_bandwidth_s"], t["halo_latency_s"]
    x_bw = h_bw / gain
    # (W - W_k) x^d - H_bw x^(d-1) - H_lat = 0: its largest real root
    coeffs = [gain, -h_bw, *([0.0] * (d - 2)), -h_lat]
    roots = np.roots(coeffs)
    real = [r.real for r in roots if abs(r.imag) < 1e-9 * max(1.0, abs(r)) and r.real > 0]
    x = max(real) if real else x_bw

    def margin(x):  # what splitting saves at scale x, issue floors included, less the halos
        v = x**d
        return (np.maximum(one * v, floor).sum() - np.maximum(split * v, floor).sum()
                - h_bw * x ** (d - 1) - h_lat)

    floored = bool(np.any(split * x**d < floor))
    if floored:  # the slabs at x are issue bound: the piecewise root lies above x
        lo, hi = x, x
        while margin(hi) <= 0:
            lo, hi = hi, 2 * hi
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if margin(mid) <= 0 else (lo, mid)
        x = hi
    side = dp.cnn.input_shape[1]
    x_lat = (h_lat / gain) ** (1 / d)
    return {"devices_per_sample": k, "spatial_dims": d, "side_now": side,
            "scale": float(x), "side": float(x * side), "scale_bandwidth_only": x_bw,
            "side_bandwidth_only": x_bw * side, "scale_latency_only": x_lat,
            "issue_bound": floored,
            "formula": ("side* = side x, sum_l max(W_l x^d, F_l) - max(W_k,l x^d, F_l) = "
                        "H_bw x^(d-1) + H_lat (the slabs' kernels issue bound: above the "
                        "one-term forms, which leave the floors F_l out)" if floored else
                        "side* = side x, (W - W_k) x^d = H_bw x^(d-1) + H_lat; between "
                        "max(H_bw / (W - W_k), (H_lat / (W - W_k))^(1/d)) and their sum"),
            **t}
