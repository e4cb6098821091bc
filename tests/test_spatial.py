"""Spatial (domain) parallelism of CNNs: the halo exchange against a hand computation, CP-SAT
against every mode assignment (with fewer samples than devices too), the branch and bound
against every point, and the pick: spatial on large volumes at small batches, data
parallelism at large ones."""

import itertools
import math
from fractions import Fraction

import pytest

from planner.api import build
from planner.cost.layer_modes import LayerModes
from planner.expr.cnn import DataParallelModel, Options
from planner.expr.collectives import Collective
from planner.search.data_parallel import Problem
from planner.search.layer_modes import best_modes
from planner.search.strategy import SplitSearch, Strategy
from planner.spec.cnn import build_cnn
from planner.spec.hardware import Precision

# a small 3-D CNN (CosmoFlow's shape): two 3x3x3 'same' convs with pools, two dense layers
VOLUME = {
    "kind": "cnn", "name": "volume", "input": [2, 32, 32, 32],
    "layers": [
        {"type": "conv", "out": 8, "kernel": 3, "padding": "same"}, {"type": "relu"},
        {"type": "maxpool", "kernel": 2},
        {"type": "conv", "out": 16, "kernel": 3, "padding": "same"}, {"type": "relu"},
        {"type": "maxpool", "kernel": 2},
        {"type": "fc", "out": 64}, {"type": "relu"},
        {"type": "fc", "out": 4},
    ],
}


def volume_model(hardware="dgx-a100-80gb", side=32):
    spec = {**VOLUME, "input": [2, side, side, side]}
    system = build("alexnet", hardware).system
    return DataParallelModel(build_cnn(spec, "volume"), system, Options(Precision.bf16))


def brute(lm: LayerModes, capacity: float = 1e15):
    rows, best = range(len(lm.segments)), None
    for assign in itertools.product(range(len(lm.degrees)), repeat=len(lm.segments)):
        if not lm.valid[rows, assign].all():
            continue
        br = lm.evaluate(assign)
        if br.memory_bytes <= capacity and (best is None or br.iteration_time_s < best[0]):
            best = (br.iteration_time_s, assign)
    return best


def test_halo_exchange_by_hand():
    """Spatial k on a 3x3x3 'same' conv: each of the group's k b samples sends and receives
    kernel - stride = 2 rows of its input (both neighbours: two messages) forward, and the
    input gradient's backward: 2 (2 alpha + bytes / beta)."""
    dp = volume_model()
    n, g, b, k = 1, 8, 1, 4
    lm = LayerModes(dp, n, g, b, Collective.ring, True)
    j = next(j for j, (kind, deg) in enumerate(zip(lm.kinds, lm.degrees, strict=True))
             if kind == "spatial" and deg == k)
    conv2 = next(i for i, l in enumerate(dp.cnn.layers) if l.type == "conv" and l.params > 500)
    layer = dp.cnn.layers[conv2]
    rows_in = layer.output_shape[1]  # 'same', stride 1: as many input rows
    per_row = layer.input_elements // rows_in
    size = k * b * 2 * per_row * Precision.bf16.bytes
    link = dp.intra  # a group of 4 inside a node of 8
    assert lm.layer_act[conv2, j] == pytest.approx(2 * (2 * link.alpha + size / link.beta),
                                                   rel=1e-12)
    # compute per device is the data mode's (b samples' work), the weights whole
    assert lm.layer_fwd[conv2, j] == pytest.approx(lm.layer_fwd[conv2, 0], rel=1e-12)
    assert lm.share[conv2, j] == 1.0


def test_fc_segments_and_thin_volumes_cannot_run_spatial():
    lm = LayerModes(volume_model(), 1, 8, 1, Collective.ring, True)
    spatial = [j for j, kind in enumerate(lm.kinds) if kind == "spatial"]
    assert spatial
    last = len(lm.segments) - 1  # the dense layers
    assert not lm.valid[last, spatial].any()
    assert lm.valid[0, spatial].all()  # 32 rows take every degree of 8 devices


def test_a_segment_no_whole_group_can_take_leaves_the_point_without_a_plan():
    """b = 1/8 on 16 devices: the dense segment needs a model group of 8 (a multiple of 8
    devices per sample), wider than its 4 outputs allow, and cannot run spatial."""
    lm = LayerModes(volume_model(), 2, 8, Fraction(1, 8), Collective.ring, True)
    assert not lm.feasible
    assert brute(lm) is None and best_modes(lm, 1e15, 10) is None


def test_fewer_samples_than_devices_leave_only_whole_groups():
    """b = 1/4: data mode and degree-2 modes cannot run (half a sample each); degree 4 and 8
    can (whole samples per group)."""
    lm = LayerModes(volume_model(), 1, 8, Fraction(1, 4), Collective.ring, True)
    for j, k in enumerate(lm.degrees):
        assert lm.valid[0, j] == (k % 4 == 0), (lm.kinds[j], k)


@pytest.mark.parametrize(("n", "g", "b", "collective", "overlap"), [
    (1, 8, 1, Collective.ring, True),
    (2, 8, 2, Collective.hierarchical, True),
    (1, 8, Fraction(1, 4), Collective.ring, True),
    (2, 8, Fraction(1, 4), Collective.halving_doubling, False),
    (4, 4, Fraction(1, 2), Collective.ring, True),
])
def test_cp_sat_equals_every_assignment(n, g, b, collective, overlap):
    lm = LayerModes(volume_model(), n, g, b, collective, overlap)
    want = brute(lm)
    got = best_modes(lm, 1e15, 10)
    assert got is not None and got[1]
    assert lm.valid[range(len(lm.segments)), got[0]].all()
    assert lm.evaluate(got[0]).iteration_time_s == pytest.approx(want[0], abs=1e-7)


def _every_point(dp, batch: int, nodes_max: int, collectives) -> float:
    """The best objective (iteration time / batch) over every point the hybrid search
    prices, each at its brute-force optimum: whole local batches and, with fewer samples
    than devices, every device count a multiple of the batch."""
    g_max = dp.system.devices_per_node
    best = math.inf
    for n, g in itertools.product(range(1, nodes_max + 1), range(1, g_max + 1)):
        N = n * g
        if batch % N == 0:
            b = Fraction(batch // N)
        elif batch < N and N % batch == 0:
            b = Fraction(batch, N)
        else:
            continue
        for c in collectives:
            lm = LayerModes(dp, n, g, b, c, True)
            if not lm.feasible:
                continue
            got = brute(lm)
            if got is not None:
                best = min(best, got[0] / batch)
    return best


@pytest.mark.parametrize("batch", [2, 64])
def test_branch_and_bound_equals_every_point(batch):
    dp = volume_model(side=32)
    cols = (Collective.ring,)
    sol = SplitSearch(dp, Problem(global_batch=batch, nodes_max=2, collectives=cols)).solve(
        Strategy.hybrid)
    assert sol.status == "optimal"
    assert sol.objective["value"] == pytest.approx(_every_point(dp, batch, 2, cols), rel=1e-6)


def test_spatial_at_small_batches_of_large_volumes_data_at_large_batches():
    """128^3 volumes at batch 2 on up to two nodes of 8 A100s: the convolutions run spatial
    over several devices per sample (data parallelism could use only 2 of the 16 devices);
    at batch 512 every convolution runs data parallel."""
    dp = volume_model(side=128)
    small = SplitSearch(dp, Problem(global_batch=2, nodes_max=2)).solve(Strategy.hybrid)
    convs = [l for l in small.plan["layers"] if l["name"].startswith("conv")]
    assert all(l["mode"] == "spatial" for l in convs)
    assert small.config["devices"] > 2 and "devices_per_sample" in small.config
    assert small.prediction.iteration_time_s < small.data_parallel["iteration_time_s"]
    large = SplitSearch(dp, Problem(global_batch=512, nodes_max=2)).solve(Strategy.hybrid)
    assert all(l["mode"] == "data" for l in large.plan["layers"]
               if l["name"].startswith("conv"))


def test_cosmoflow_at_batch_4_splits_its_volumes(run_json):
    doc = run_json("solve", "-m", "cosmoflow", "-H", "dgx-a100-80gb", "--global-batch", "4",
                   "--nodes-max", "4", "--precision", "bf16", "--strategy", "hybrid")
    modes = {l["name"]: l["mode"] for l in doc["plan"]["layers"]}
    # the large volumes split spatially (the thin last ones may take channels instead)
    assert all(modes[f"conv_conv{i}_1"] == "spatial" for i in (1, 2, 3))
    assert doc["config"]["devices_per_sample"] > 1
    from jsonschema import validate

    from planner.schema import schemas

    validate(doc, schemas()["solve"])


@pytest.mark.parametrize("k", [2, 4, 8])
def test_crossover_side_matches_a_sweep_of_built_models(k):
    """The closed-form side above which k devices per sample beat one (from the model at side
    32) against models built at every side from 8 to 400: the first side where the split
    sample's work and halos undercut one device's work is the crossover, rounded up; and the
    root lies between its two one-term forms."""
    from planner.analysis.spatial import crossover, trunk_terms

    c = crossover(volume_model(side=32), k)
    first = None
    for side in range(8, 401):
        t = trunk_terms(volume_model(side=side), k)
        if t is None:
            continue
        if t["work_one_s"] - t["work_split_s"] > t["halo_bandwidth_s"] + t["halo_latency_s"]:
            first = side
            break
    assert first is not None and first == math.ceil(c["side"] - 1e-9)
    lo = max(c["scale_bandwidth_only"], c["scale_latency_only"])
    if c["issue_bound"]:  # the slabs' kernels are issue bound there: the root lies higher
        assert c["scale"] > lo
    else:
        assert lo <= c["scale"] <= c["scale_bandwidth_only"] + c["scale_latency_only"]


def test_hybrid_solution_reports_the_crossover(run_json):
    doc = run_json("solve", "-m", "cosmoflow", "-H", "dgx-a100-80gb", "--global-batch", "4",
                   "--nodes-max", "2", "--precision", "bf16", "--strategy", "hybrid")
    sides = {x["devices_per_sample"]: x["side"] for x in doc["spatial"]}
    assert set(sides) == {2, 4, 8} and all(0 < s < 128 for s in sides.values())


def test_limits_carry_the_same_crossover(run_json):
    from planner.analysis.spatial import crossovers

    doc = run_json("limits", "-m", "cosmoflow", "-H", "dgx-a100-80gb", "--global-batch", "64",
                   "--precision", "bf16")
    want = crossovers(build("cosmoflow", "dgx-a100-80gb", "bf16"))
    assert [x["side"] for x in doc["spatial"]] == pytest.approx([x["side"] for x in want])
