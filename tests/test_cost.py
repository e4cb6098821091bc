"""The symbolic cost model: collectives, roofline, overlap, memory; symbolic against numeric."""

import math

import pytest
import sympy as sp

from planner.api import build
from planner.expr import collectives as coll
from planner.expr.collectives import Collective
from planner.expr.piecewise import affine_pieces
from planner.expr.symbols import b, g, n


def test_ring_allreduce_formula():
    # 4 ranks, 1 GB, 1 us, 10 GB/s: 2*3*1e-6 + 2*3/4*0.1 s
    assert math.isclose(float(coll.ring_allreduce(4, 1e9, 1e-6, 1e10)), 6e-6 + 0.15)


def test_bandwidth_terms_of_ring_and_halving_doubling_agree():
    p, m, bw = sp.Integer(16), 1e9, 1e10
    ring = coll.ring_allreduce(p, m, 0, bw)
    hd = coll.halving_doubling_allreduce(p, m, 0, bw)
    assert math.isclose(float(ring), float(hd))


def test_hierarchical_equals_ring_on_one_node():
    """With one node the hierarchical allreduce is reduce-scatter + all-gather = a ring."""
    h = coll.hierarchical_allreduce(8, 1, 1e9, 2e-6, 1e11, 1e-6, 1e10)
    r = coll.ring_allreduce(8, 1e9, 2e-6, 1e11)
    assert math.isclose(float(h), float(r))


def test_parameter_server_traffic_scales_with_workers_over_servers():
    one = float(coll.parameter_server(8, 1e9, 0, 1e10, 1))
    four = float(coll.parameter_server(8, 1e9, 0, 1e10, 4))
    assert math.isclose(one, 4 * four)


def test_roofline_makes_small_local_batches_inefficient():
    dp = build("alexnet", "k80-fdr")
    per_sample = [float(dp.numeric("compute")(1, 1, x)) / x for x in (1, 4, 64, 256)]
    assert per_sample[0] > 1.5 * per_sample[-1]  # weights dominate the bytes at b = 1
    assert per_sample == sorted(per_sample, reverse=True)


def test_backward_is_about_twice_forward():
    dp = build("vgg16", "dgx-a100-80gb")
    fwd = float(dp.numeric("forward")(1, 1, 128))
    bwd = float(dp.numeric("backward")(1, 1, 128))
    assert 1.6 < bwd / fwd < 2.2


def test_no_communication_on_one_device_and_overlap_hides_some():
    dp = build("resnet50", "dgx-a100-80gb")
    assert float(dp.numeric("comm", Collective.ring)(1, 1, 64)) == 0
    exposed_on = float(dp.numeric("exposed", Collective.ring, True)(4, 8, 64))
    exposed_off = float(dp.numeric("exposed", Collective.ring, False)(4, 8, 64))
    assert exposed_on < exposed_off


def test_memory_breakdown_matches_hand_count():
    dp = build("alexnet", "k80-fdr", "fp32", "momentum")
    p = 60_965_224
    assert float(dp.memory["weights"]) == 4 * p
    assert float(dp.memory["gradients"]) == 4 * p
    assert float(dp.memory["optimizer"]) == 4 * p
    mixed = build("alexnet", "dgx-a100-80gb", "fp16", "adam")
    assert float(mixed.memory["weights"]) == (2 + 4) * p  # 16-bit copy + fp32 master
    assert float(mixed.memory["optimizer"]) == 8 * p


@pytest.mark.parametrize("model", ["googlenet", "alexnet"])
@pytest.mark.parametrize("hw", ["k80-fdr", "dgx-a100-80gb"])  # the A100: kernels issue bound
def test_roofline_pieces_symbolic_and_numeric_agree(model, hw):
    """Three independent routes to the compute time: pieces read off the expanded SymPy sum,
    pieces from the ridge points of the layer arrays, and the numpy reduction; on the A100 each
    layer's kernels take at least the issue time, which the small batches show."""
    dp = build(model, hw)
    symbolic = affine_pieces(dp.expand(dp.t_compute), b, 0)
    numeric = dp.compute_sum.pieces()
    f = dp.numeric("compute")
    for x in (0.5, 1, 3, 17, 100, 1000, 1e5):
        exact = float(dp.expand(dp.t_compute).subs(b, x))
        if hw != "k80-fdr" and x == 0.5:  # every layer issue bound: the floors' sum
            floors = dp.compute_sum.floors.sum()
            assert floors > 0 and math.isclose(exact, floors, rel_tol=1e-12)
        for pieces in (symbolic, numeric):
            piece = next(p for p in pieces if p.b_lo <= x <= p.b_hi)
            assert math.isclose(piece(x), exact, rel_tol=1e-9)
        assert math.isclose(float(f(1, 1, x)), exact, rel_tol=1e-9)
        assert math.isclose(float(dp.compute_sum.direct(x)), exact, rel_tol=1e-9)


@pytest.mark.parametrize("col", list(Collective))
def test_symbolic_comm_is_a_function_of_n_and_g_only(col):
    dp = build("alexnet", "dgx1-v100")
    assert dp.t_comm(col).free_symbols <= {n, g}
