"""Expert tensor parallelism (etp) and the MoE layer's own collectives, as Megatron-LM runs
them: the expert grid etp x ep x expert-dp folded over the dense tp x cp x dp ranks, tokens
dispatched from their sequence-parallel shards by all-to-all over ep, gathered over etp, and a
capacity factor on the experts' rows. Exact traffic and memory against hand-written formulas,
the rules as errors, the search against brute force."""

import dataclasses
import itertools
import math

import pytest

from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.errors import SpecError
from planner.plan import Plan
from planner.search.hybrid import HybridSolver, Search, predict
from planner.spec.hardware import Precision
from planner.spec.transformer import build_transformer
from tests.brute import fastest_fitting


def _hw(**changes):  # no launch floor, one flat GEMM rate: the formulas below stay simple
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    return dataclasses.replace(hw, launch_s=0.0, gemm_half_dim=0.0, **changes)


def _cfg(**over):
    cfg = {"t": 1, "p": 1, "d": 8, "mb": 1, "acc": 1, "v": 1, "cp": 1, "ep": 1, "recompute": 0,
           "sp": 1, "zero": 0, "gpipe": 0, "overlap": True, "flash_attention": True}
    return cfg | over


def _moe(**over):
    spec = {"kind": "transformer", "name": "moe", "layers": 4, "hidden": 512, "heads": 8,
            "seq_len": 1024, "vocab": 1000, "ffn_kind": "swiglu", "ffn_hidden": 1024,
            "bias": False, "norm": "rmsnorm", "position_embedding": "rotary",
            "moe": {"experts": 8, "top_k": 2}}
    return build_transformer(spec | over, "test")


def _ring(n, size, lat, bw):  # a ring allreduce written out: 2 (n - 1) steps of size / n
    return 2 * (n - 1) * (lat + size / (n * bw))


def test_moe_layer_traffic_is_its_formula():
    """t = 2, ep = 2, etp = 2 on one node: per MoE layer and pass, an all-to-all each way of
    this rank's s top_k h / t routed values, (ep - 1) / ep of them leaving, then an all-gather
    (and a reduce-scatter) over etp; forward and backward. The tensor-parallel collectives
    are the attention block's only (one allreduce-equivalent per pass)."""
    m, hw = _moe(), _hw()
    out = iteration(m, hw, _cfg(t=2, d=2, ep=2, etp=2))
    routed = m.seq_len * m.top_k * m.hidden * hw.value_bytes / 2
    a2a = hw.intra_lat + routed * (1 / 2) / hw.intra_bw
    gather = 1 * (hw.intra_lat + routed / hw.intra_bw)
    assert float(out["ep_comm"]) == pytest.approx(m.layers * 4 * (a2a + gather), rel=1e-9)
    tp = _ring(2, m.seq_len * m.hidden * hw.value_bytes, hw.intra_lat, hw.intra_bw)
    assert float(out["tp_comm"]) == pytest.approx(m.layers * 2 * tp, rel=1e-9)
    # etp = 1: no gather, the all-to-all only
    out1 = iteration(m, hw, _cfg(t=2, d=2, ep=2, etp=1))
    assert float(out1["ep_comm"]) == pytest.approx(m.layers * 4 * a2a, rel=1e-9)


def test_expert_grid_beyond_the_node_sends_its_remote_share_over_the_nics():
    """ep = 16 at etp = 1 on 8-GPU nodes: half of each rank's peers are on the other node."""
    m, hw = _moe(moe={"experts": 16, "top_k": 2}), _hw()
    out = iteration(m, hw, _cfg(d=16, ep=16))
    routed = m.seq_len * m.top_k * m.hidden * hw.value_bytes
    a2a = hw.inter_lat + routed * (1 - 8 / 16) / (hw.nic_bw / 8)
    assert float(out["ep_comm"]) == pytest.approx(m.layers * 4 * a2a, rel=1e-9)


def test_etp_splits_the_experts_weights_and_zero_shards_them_over_expert_dp():
    """Mixtral, t = 2, d = 4, ep = 4: experts / (etp ep) per rank; ZeRO-1 shards the expert
    state over t d / (etp ep) ranks (Megatron's expert-data-parallel group)."""
    m, hw = load_model("mixtral-8x7b"), _hw()
    experts = m.layers * m.experts * m.expert_params()
    dense = (m.layers * (m.layer_params() - m.experts * m.expert_params())
             + m.embedding_params() + m.head_params())  # p = 1: the stage holds both
    for etp in (1, 2):
        out = iteration(m, hw, _cfg(t=2, d=4, ep=4, etp=etp, zero=1))
        local = dense / 2 + experts / (etp * 4)
        assert float(out["weights"]) == pytest.approx(local * 2, rel=1e-12)
        state = dense / 2 / 4 + experts / (etp * 4) / (2 * 4 / (etp * 4))
        assert float(out["optimizer_state"]) == pytest.approx(state * 12, rel=1e-12)


def _allreduce(size, n, per_node, hw):
    """`allreduce_form` written out: the ring through n ranks, per_node of them on a node."""
    nodes = math.ceil(n / per_node)
    latency = 2 * (per_node - 1) * hw.intra_lat + 2 * (nodes - 1) * hw.inter_lat
    nic = 1 / (per_node * hw.nic_bw / 8) if n > per_node else 0
    return latency + 2 * (n - 1) / n * size * max(1 / hw.intra_bw, nic)


def test_expert_gradients_are_reduced_over_the_expert_data_parallel_group():
    """Mixtral on two 8-GPU nodes, t = 1, d = 16, ep = 8, no overlap: the dense gradients
    ring through all 16 replicas (8 a node), the routed experts' only through the 2 ranks
    holding the same experts, one on each node, each rank's share over its own NIC
    (Megatron-LM's expert-data-parallel group)."""
    m, hw = load_model("mixtral-8x7b"), _hw()
    experts = m.layers * m.experts * m.expert_params() / 8
    dense = (m.layers * (m.layer_params() - m.experts * m.expert_params())
             + m.embedding_params() + m.head_params())
    out = iteration(m, hw, _cfg(d=16, ep=8, overlap=False))
    g = hw.grad_bytes
    want = _allreduce(dense * g, 16, 8, hw) + _allreduce(experts * g, 2, 1, hw)
    assert float(out["dp_comm_exposed"]) == pytest.approx(want, rel=1e-9)
    # ep = 1 (every rank holds every expert): one group, the one ring of old plus the second
    # ring's latency
    one = iteration(m, hw, _cfg(d=16, ep=1, overlap=False))
    whole = experts * 8 * g
    lat = 2 * 7 * hw.intra_lat + 2 * hw.inter_lat
    assert float(one["dp_comm_exposed"]) == pytest.approx(
        _allreduce(dense * g + whole, 16, 8, hw) + lat, rel=1e-9)


def test_capacity_factor_pads_the_dispatch_and_the_expert_rows():
    m, hw = _moe(), _hw()
    one = iteration(m, hw, _cfg(d=4, ep=4))
    padded = iteration(m, hw, {**_cfg(d=4, ep=4), "capacity_factor": 1.5})
    routed = m.seq_len * m.top_k * m.hidden * hw.value_bytes * 1.5
    a2a = hw.intra_lat + routed * 3 / 4 / hw.intra_bw
    assert float(padded["ep_comm"]) == pytest.approx(m.layers * 4 * a2a, rel=1e-9)
    assert float(padded["compute"]) > float(one["compute"])


def test_the_expert_grid_must_fold_over_the_dense_ranks():
    with pytest.raises(SpecError, match=r"etp\(2\) x ep\(4\) = 8 does not divide "
                                        r"tp\(2\) x cp\(1\) x dp\(2\) = 4"):
        Plan.split(2, 1, 2, 1, 8, node_size=8, ep=4, etp=2, sequence_parallel=True)
    plan = Plan.split(2, 1, 4, 1, 8, node_size=8, ep=8, etp=1, sequence_parallel=True)
    assert plan.to_json()["etp"] == 1
    assert Plan.split(2, 1, 4, 1, 8, node_size=8).etp == 2  # Megatron's default: etp = tp


def test_moe_rules_are_bad_input():
    system, m = load_system("dgx-h100"), load_model("mixtral-8x7b")
    no_sp = Plan.split(2, 1, 4, 1, 8, node_size=8, ep=4)
    with pytest.raises(SpecError, match="sequence_parallel: Megatron-LM trains MoE"):
        predict(m, system, Precision.bf16, no_sp)
    dense = Plan.split(2, 1, 4, 1, 8, node_size=8, etp=1, sequence_parallel=True)
    with pytest.raises(SpecError, match="etp: 'llama3-8b' is a dense model"):
        predict(load_model("llama3-8b"), system, Precision.bf16, dense)
    with pytest.raises(SpecError, match="capacity_factor: must be a number in"):
        Plan.split(1, 1, 8, 1, 8, node_size=8, capacity_factor=0.5)


@pytest.mark.slow
def test_search_over_ep_and_etp_equals_brute_force():
    m, system = _moe(), load_system("dgx-h100")
    B, budget = 16, 16
    best = fastest_fitting(m, system, B, budget, (
        {"t": t, "ep": ep, "etp": t if etp == "tp" else etp, "p": p, "d": d, "mb": mb}
        for t, ep, etp, p, d, mb in itertools.product(
            (1, 2, 4, 8), (1, 2, 4, 8), ("tp", 1), (1, 2, 4), (1, 2, 4, 8, 16),
            (1, 2, 4, 8, 16))))
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, interleave=1)).solve()
    assert sol.status == "optimal"
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


@pytest.mark.slow
def test_search_tries_the_ep_overlap_where_its_rules_allow_it():
    """With the all-to-all overlap left to the search (Qwen3-30B-A3B on up to 32 H100, pp 1,
    cp 1, no tp overlap) it equals the brute force over the overlap pinned off and on (the
    plans its rules refuse skipped: ep 1, one micro-batch, full recompute), and here the
    overlap wins; a dense model never tries it."""
    m, system = load_model("qwen3-30b-a3b"), load_system("dgx-h100")
    B, budget = 256, 32
    splits = [{"t": t, "ep": ep, "etp": t if etp == "tp" else etp, "p": 1, "d": d, "mb": mb}
              for t, ep, etp, d, mb in itertools.product(
                  (1, 2, 4, 8), (1, 2, 4, 8, 16, 32), ("tp", 1), (1, 2, 4, 8, 16, 32),
                  (1, 2, 4, 8))]
    off, on = (fastest_fitting(m, system, B, budget, splits, interleave=1, cp=1,
                               tp_overlap=False, ep_overlap=x) for x in (False, True))
    q = Search(global_batch=B, devices_max=budget, pp=1, interleave=1, cp=1, tp_overlap=False,
               searched=("ep_overlap",))
    sol = HybridSolver(m, system, Precision.bf16, q).solve()
    assert on < off  # the overlap wins here: the search must find it
    assert sol.plan.ep_overlap and sol.plan.ep > 1 and sol.plan.accumulation >= 2
    assert math.isclose(sol.prediction.iteration_time_s, on, rel_tol=1e-12)
    dense = HybridSolver(load_model("llama3-8b"), system, Precision.bf16,
                         Search(global_batch=64, devices=8, searched=("ep_overlap",)))
    assert dense.q.searched == ()


def test_the_search_prices_the_ep_overlap_only_where_its_rules_hold():
    """Every row of the priced table with the overlap on keeps `planner.rules`' ep_overlap
    rules (ep > 1, two or more micro-batches, no full recompute, virtual stages with a
    pipeline), and such rows exist, beside rows with it off."""
    solver = HybridSolver(_moe(), load_system("dgx-h100"), Precision.bf16,
                          Search(global_batch=16, devices_max=16, searched=("ep_overlap",)))
    rows = solver._rows()[0]
    on = rows[rows["ep_overlap"] == 1]
    assert len(on) and (rows["ep_overlap"] == 0).any()
    assert (on["ep"] > 1).all() and (on["B"] // (on["d"] * on["mb"]) >= 2).all()
    assert (on["rec"] < 2).all() and ((on["p"] == 1) | (on["v"] > 1)).all()


def test_ep_overlap_hides_the_all_to_alls_behind_the_layers_compute():
    """Per layer only the all-to-all time beyond one layer's compute x shows, and at least
    the share sigma / (1 + sigma) the compute beside it loses: max(k a2a, a2a - x), in the
    steady state of Megatron-LM's combined 1F1B; the first forward and the last backward run
    alone (1 of m micro-batches without a pipeline), their a2a whole. x from two stage
    splits: p = 1 runs L x + logit per micro-batch, p = 2 L / 2 x + logit."""
    m, mb = _moe(), 2
    base = {**_cfg(d=4, ep=4, acc=mb), "ep_overlap": False}
    for hw, shows in ((_hw(), False), (_hw(intra_bw=1e8), True)):
        one = float(iteration(m, hw, base)["compute"]) / mb
        two = float(iteration(m, hw, {**base, "p": 2})["compute"]) / mb
        x = 2 * (one - two) / m.layers
        plain = float(iteration(m, hw, base)["ep_comm"])
        hidden = float(iteration(m, hw, {**base, "ep_overlap": True})["ep_comm"])
        a2a, share = plain / (mb * m.layers), hw.overlap_slowdown / (1 + hw.overlap_slowdown)
        assert share > 0.15
        paired = max(share * a2a, a2a - x)
        want = mb * m.layers * (a2a / mb + (1 - 1 / mb) * paired)
        assert hidden == pytest.approx(want, rel=1e-9, abs=1e-15)
        assert (hidden > (plain / mb + (1 - 1 / mb) * share * plain) * (1 + 1e-9)) == shows


@pytest.mark.parametrize("acc, alone", [(2, 1.0), (4, 0.5), (8, 0.25)])
def test_ep_overlap_pairs_only_the_steady_state_of_an_interleaved_pipeline(acc, alone):
    """With p = 2 stages of v = 2 chunks, rank k's warm-up runs 2 (p - k - 1) + (v - 1) p + 1
    of its acc v chunk forwards alone, p v = 4 over the two ranks on average (and as many
    backwards in the cool-down): min(p, acc) / acc of the exchanges show whole, 2 micro-batches
    (every forward first) all of them."""
    m = _moe()
    base = {**_cfg(d=4, ep=4, acc=acc), "p": 2, "v": 2, "ep_overlap": False}
    hw = _hw()
    plain = float(iteration(m, hw, base)["ep_comm"])
    hidden = float(iteration(m, hw, {**base, "ep_overlap": True})["ep_comm"])
    share = hw.overlap_slowdown / (1 + hw.overlap_slowdown)
    # the compute beside each exchange is longer than it: only the share shows where paired
    assert hidden == pytest.approx(plain * (alone + (1 - alone) * share), rel=1e-9)


def test_ep_overlap_rules():
    system = load_system("dgx-h100")
    with pytest.raises(SpecError, match="ep_overlap: overlapping the all-to-alls needs ep > 1"):
        predict(_moe(), system, Precision.bf16,
                Plan.split(1, 1, 8, 1, 16, node_size=8, ep=1, ep_overlap=True))
    ok = Plan.split(1, 1, 8, 1, 16, node_size=8, ep=8, ep_overlap=True)
    assert predict(_moe(), system, Precision.fp8, ok).iteration_time_s > 0  # a bf16 model
    with pytest.raises(SpecError, match="needs a bf16 or fp16 model"):
        predict(_moe(), system, Precision.fp32, ok)
    with pytest.raises(SpecError, match="needs a bf16 or fp16 model"):
        HybridSolver(_moe(), system, Precision.fp32,
                     Search(global_batch=16, devices_max=8, ep_overlap=True))
