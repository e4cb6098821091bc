"""Hybrid sharding (HSDP: ZeRO inside groups of dp_shard replicas, the groups replicating;
Megatron-LM --num-distributed-optimizer-instances, PyTorch HSDP, DeepSpeed MiCS): the state
divided by the group, the sync written out collective by collective, the launchers' keys,
the search against brute force."""

import dataclasses
import itertools
import json
import math

import pytest

from planner import api
from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware
from planner.errors import SpecError
from planner.plan import Plan
from planner.search.hybrid import HybridSolver, Search, predict
from planner.spec.hardware import Precision
from tests.brute import fastest_fitting
from tests.test_launch import MEGATRON_FLAGS, megatron_flags

# Llama-3-8B on 4 DGX H100, pure data parallel: 8 replicas on each node
LLAMA = dict(devices=32, global_batch=64, precision="bf16", overlap=False)


def _eval(**over):
    return api.evaluate("llama3-8b", "dgx-h100", **(LLAMA | over)).prediction


@pytest.mark.parametrize("zero, sharded", [(1, ["optimizer"]), (2, ["optimizer", "gradients"]),
                                           (3, ["optimizer", "gradients", "weights"])])
def test_the_sharded_state_is_divided_by_the_group_not_by_dp(zero, sharded):
    whole, hybrid = _eval(zero=zero), _eval(zero=zero, dp_shard=8)
    for key, value in hybrid.memory_breakdown.items():
        factor = 32 / 8 if key in sharded else 1
        assert value == pytest.approx(whole.memory_breakdown[key] * factor, rel=1e-12), key
    assert hybrid.optimizer_time_s == pytest.approx(whole.optimizer_time_s * 4, rel=1e-12)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_one_group_of_every_replica_is_plain_zero(zero):
    whole, hybrid = _eval(zero=zero), _eval(zero=zero, dp_shard=32)
    assert hybrid.iteration_time_s == pytest.approx(whole.iteration_time_s, rel=1e-12)
    assert hybrid.memory_bytes_per_device == pytest.approx(whole.memory_bytes_per_device,
                                                           rel=1e-12)


def test_the_sync_is_a_reduce_scatter_and_all_gather_in_the_node_and_an_allreduce_across():
    """ZeRO 1, groups of 8 = one node each: inside it a ring reduce-scatter of the fp32
    gradients and an all-gather of the bf16 weights over NVLink (together one ring allreduce
    of Psi (4 + 2) / 2 bytes), then across the 4 nodes one allreduce of each rank's 1 / 8
    shard of the gradients, every rank on its own NIC share (Megatron-LM's two collectives,
    one after the other). Not overlapped, all of it shows."""
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    pred = _eval(zero=1, dp_shard=8)
    psi = pred.memory_breakdown["weights"] / 2  # bf16 weights, whole at ZeRO 1
    inside = 2 * 7 * hw.intra_lat + 2 * 7 / 8 * psi * (4 + 2) / 2 / hw.intra_bw
    nic = hw.nic_bw / hw.g
    across = 2 * 3 * hw.inter_lat + 2 * 3 / 4 * psi * 4 / 8 * max(1 / hw.intra_bw, 1 / nic)
    assert pred.time_breakdown["dp_comm_exposed"] == pytest.approx(inside + across, rel=1e-9)


def test_zero3_gathers_inside_a_node_skip_the_ring_steps_between_nodes():
    """On 256 nodes a ZeRO-3 gather over every replica is a ring through 256 nodes, 2 x 255
    inter-node steps, in each micro-batch; over groups of 8 on one node it stays on NVLink.
    With the first layer's gathers exposed in each of 4 micro-batches, less data-parallel
    communication shows, even with the one allreduce across the groups added, as long as the
    overlapped traffic costs the compute nothing. Priced with the compute slowdown beside a
    collective (18.9 %, Lee et al. 2025), the allreduce across the groups is more overlapped
    traffic than the gathers it moves onto NVLink save: HSDP shows more. (On a few nodes the
    ring's bandwidth, not its steps, sets the cost, and both are about equal: NVLink and the
    node's NICs carry a ring at similar rates.)"""
    m, system = load_model("llama3-8b"), load_system("dgx-h100")
    kernels = system.device.kernels
    free = dataclasses.replace(system, device=system.device.model_copy(update={
        "kernels": kernels.model_copy(update={"overlap_slowdown": 0.0})}))

    def exposed(sys_, **over):
        plan = Plan.split(1, 1, 2048, 1, 8192, node_size=8, zero=3, overlap=True, **over)
        return predict(m, sys_, Precision.bf16, plan).time_breakdown["dp_comm_exposed"]

    assert exposed(free, dp_shard=8) < 0.95 * exposed(free)
    assert exposed(system, dp_shard=8) > exposed(system)


@pytest.mark.parametrize("over, message", [
    ({"zero": 0, "dp_shard": 8}, "needs ZeRO"),
    ({"zero": 1, "dp_shard": 5}, "do not divide dp"),
    ({"zero": 1, "dp_shard": -1}, "must be a non-negative integer"),
])
def test_hsdp_refuses_what_it_cannot_be(over, message):
    with pytest.raises(SpecError, match=message):
        _eval(**over)


def test_dp_shard_zero_is_zero_over_every_replica():
    """0 pins hybrid sharding off (solve then does not try it): the plan of plain ZeRO."""
    off = _eval(zero=1, dp_shard=0)
    assert off.iteration_time_s == _eval(zero=1).iteration_time_s
    ev = api.evaluate("llama3-8b", "dgx-h100", **LLAMA, zero=1, dp_shard=0)
    assert ev.plan.dp_shard is None


def test_launchers_write_instances_replicate_degrees_and_mics(run):
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "32",
            "--global-batch", "64", "--precision", "bf16", "--dp-shard", "8", "--recompute", "full")
    code, out, _ = run(*args, "--zero", "1", "--format", "json")
    assert code == 0 and json.loads(out)["config"]["dp_shard"] == 8
    code, out, _ = run(*args, "--zero", "3", "--format", "megatron")
    flags = out.split()
    assert set(megatron_flags(out)) <= MEGATRON_FLAGS  # pretrain_gpt.py's, not torchrun's
    assert flags[flags.index("--num-distributed-optimizer-instances") + 1] == "4"
    assert flags[flags.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"
    from tests.test_launch_torchtitan import torchtitan_config

    par = torchtitan_config(_ok(run, *args, "--zero", "3", "--format", "torchtitan")).parallelism
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (4, 8)
    ds_args = (*args, "--recompute", "none", "--seq-len", "2048")  # a ds_config recomputes not
    ds = json.loads(_ok(run, *ds_args, "--zero", "3", "--format", "deepspeed"))
    assert ds["zero_optimization"] == {"stage": 3, "overlap_comm": True,
                                       "mics_shard_size": 8}
    code, _, err = run(*ds_args, "--zero", "1", "--format", "deepspeed")
    assert code == 2 and "MiCS" in err
    # MiCS groups are counted over the whole world: with tp 2 they are not the plan's groups
    code, _, err = run(*ds_args, "--zero", "3", "--tp", "2", "--dp-shard", "4", "--format",
                       "deepspeed")
    assert code == 2 and "MiCS shard groups are counted over all ranks" in err


def _ok(run, *args):
    code, out, err = run(*args)
    assert code == 0, err
    return out


@pytest.mark.slow
def test_search_with_pinned_hsdp_equals_brute_force():
    m, system = load_model("llama3-8b"), load_system("dgx-h100")
    B, budget, z = 64, 32, 4
    best = fastest_fitting(m, system, B, budget, (
        {"t": t, "p": p, "d": d, "mb": mb} for t, p, d, mb in itertools.product(
            (1, 2, 4, 8), (1, 2, 4), (4, 8, 16, 32), (1, 2, 4, 8))),
        dp_shard=z)
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, interleave=1, cp=1,
                              dp_shard=z)).solve()
    assert sol.status == "optimal" and sol.plan.dp_shard == z and sol.plan.dp % z == 0
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


@pytest.mark.slow
def test_search_with_hsdp_on_moe_keeps_to_plans_the_expert_grid_allows():
    """With MoE the dp / dp_shard instances also split the expert data-parallel group (tp cp
    dp / (etp ep) ranks), so etp x ep must divide tp x cp x dp_shard: the search offers only
    those plans, and agrees with brute force over the plans `Plan` accepts."""
    from tests.test_moe_folding import _moe

    m, system = _moe(), load_system("dgx-h100")
    B, budget, z = 16, 16, 2
    splits = [{"t": t, "ep": ep, "etp": t if etp == "tp" else etp, "p": p, "d": d, "mb": mb}
              for t, ep, etp, p, d, mb in itertools.product(
                  (1, 2, 4, 8), (1, 2, 4, 8), ("tp", 1), (1, 2, 4), (2, 4, 8, 16),
                  (1, 2, 4, 8))]
    best = fastest_fitting(m, system, B, budget, splits, dp_shard=z)
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, interleave=1, cp=1,
                              dp_shard=z)).solve()
    assert sol.status == "optimal"
    p = sol.plan
    assert (p.tp * p.cp * z) % (p.ep * p.etp) == 0
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)
    # ep pinned at 4: only tp 2 x etp 1 (x dp_shard 2) and wider tp leave whole instances
    best = fastest_fitting(m, system, B, budget, [s for s in splits if s["ep"] == 4],
                           dp_shard=z)
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, interleave=1, cp=1,
                              dp_shard=z, ep=4)).solve()
    assert sol.status == "optimal" and sol.plan.tp * z % (4 * sol.plan.etp) == 0
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)
    # and the rule itself: ep 4 over tp 1 x dp_shard 2 cannot split
    with pytest.raises(SpecError, match="expert data-parallel"):
        Plan.split(1, 1, 8, 1, 16, node_size=8, ep=4, zero=1, dp_shard=2)
    Plan.split(1, 1, 8, 1, 16, node_size=8, ep=2, zero=1, dp_shard=2)


def _shard_groups(system, t: int, p: int, cp: int, d: int) -> list[int]:
    """The shard groups beside all d that the search tries, enumerated here on their own:
    z replicas span z t cp p consecutive ranks, at most one scale-up domain; z a power of
    two or the most that fit, dividing d, 1 < z < d."""
    u = system.devices_per_scale_up_domain or system.devices_per_node
    most = max(1, u // (t * cp * p))
    tries = {2**j for j in range(1, most.bit_length())} | {most}
    return [z for z in sorted(tries) if 1 < z < d and d % z == 0]


@pytest.mark.slow
def test_the_search_tries_hybrid_sharding_as_brute_force_does():
    """With --dp-shard free, the search's pick is the fastest of every plan without hybrid
    sharding and every plan with each shard group inside a scale-up domain (brute force
    over the plans `Plan` accepts, priced one pin at a time). At ZeRO 3 a hybrid plan wins
    (16 micro-batches' gathers inside a node); with the stage free, plain ZeRO 2 does."""
    m, system = load_model("llama3-8b"), load_system("dgx-h100")
    B, budget = 512, 32
    splits = [{"t": t, "p": p, "d": d, "mb": mb} for t, p, d, mb in itertools.product(
        (1, 2, 4, 8), (1, 2, 4), (4, 8, 16, 32), (1, 2, 4, 8))]
    for zeros, hybrid_wins in (((3,), True), ((2, 3), False)):
        plain = fastest_fitting(m, system, B, budget, splits, zeros=zeros)
        hybrid = min(fastest_fitting(m, system, B, budget, [s], zeros=zeros, dp_shard=z)
                     for s in splits for z in _shard_groups(system, s["t"], s["p"], 1, s["d"]))
        assert (hybrid < plain) == hybrid_wins
        sol = HybridSolver(m, system, Precision.bf16,
                           Search(global_batch=B, devices_max=budget, interleave=1, cp=1,
                                  zero=zeros[0] if len(zeros) == 1 else None,
                                  searched=("dp_shard",))).solve()
        assert sol.status == "optimal"
        assert math.isclose(sol.prediction.iteration_time_s, min(plain, hybrid), rel_tol=1e-12)
        assert (sol.plan.dp_shard is not None) == hybrid_wins


def test_solve_picks_hybrid_sharding_where_it_is_faster_and_names_it_uncovered():
    """ZeRO-3 over 32 H100 with 16 micro-batches a step: the weights gathered twice per
    micro-batch inside groups of 4 replicas (NVLink) beat gathering them over the NICs, and
    `solve` picks HSDP; `--dp-shard 0` keeps ZeRO over all replicas, slower. No calibration
    run shards so: its band says it is not covered."""
    args = dict(devices=32, global_batch=512, zero=3, precision="bf16")
    free = api.solve("llama3-8b", "dgx-h100", **args)
    whole = api.solve("llama3-8b", "dgx-h100", dp_shard=0, **args)
    assert free.plan.dp_shard is not None and 1 < free.plan.dp_shard < free.plan.dp
    assert whole.plan.dp_shard is None
    assert free.prediction.iteration_time_s < whole.prediction.iteration_time_s
    pinned = api.evaluate("llama3-8b", "dgx-h100", **args, tp=free.plan.tp, pp=free.plan.pp,
                          micro_batch=free.plan.micro_batch, dp_shard=free.plan.dp_shard)
    assert pinned.prediction.iteration_time_s == free.prediction.iteration_time_s
    assert "hybrid sharding" in free.prediction.time_band["note"]
    assert "low_s" not in free.prediction.time_band


# Qwen3-30B-A3B on 8 DGX H100 at ep 8: the experts' gradients reduced over their own 8-rank
# group (one per node, over the NICs), the dense ones over all 64 replicas
QWEN = dict(devices=64, tp=1, pp=1, ep=8, micro_batch=1, global_batch=128, seq_len=4096)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_one_group_of_every_replica_is_plain_zero_for_experts_too(zero):
    """HSDP splits the expert data-parallel group into the same instances, so one instance
    of all dp replicas syncs the routed experts as plain ZeRO does: over their own group."""
    whole = api.evaluate("qwen3-30b-a3b", "dgx-h100", zero=zero, **QWEN).prediction
    hybrid = api.evaluate("qwen3-30b-a3b", "dgx-h100", zero=zero, dp_shard=64,
                          **QWEN).prediction
    assert hybrid.iteration_time_s == pytest.approx(whole.iteration_time_s, rel=1e-12)
    assert hybrid.time_breakdown["dp_comm_exposed"] == pytest.approx(
        whole.time_breakdown["dp_comm_exposed"], rel=1e-12)


def test_the_experts_sync_inside_their_instance_and_across_the_instances():
    """ZeRO 1 over groups of 8 replicas (one node each) at ep 8: the expert group (the 8
    nodes' ep rank of each: 8 ranks, one a node) splits into the 8 instances of one rank
    each, so the experts' reduce-scatter inside an instance moves nothing and their whole
    gradients are allreduced across the instances, one rank on each node's NIC share; the
    dense part syncs as for a dense model (`test_the_sync_is_...`). Not overlapped."""
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    m = load_model("qwen3-30b-a3b")
    pred = api.evaluate("qwen3-30b-a3b", "dgx-h100", zero=1, dp_shard=8, overlap=False,
                        **QWEN).prediction
    experts = m.experts * 3 * m.hidden * m.ffn_hidden * m.layers / 8  # per rank at ep 8
    dense = pred.memory_breakdown["weights"] / 2 - experts  # bf16 weights, whole at ZeRO 1
    nic = hw.nic_bw / hw.g
    inside = 2 * 7 * hw.intra_lat + 2 * 7 / 8 * dense * (4 + 2) / 2 / hw.intra_bw
    across = 2 * 7 * hw.inter_lat + 2 * 7 / 8 * dense * 4 / 8 * max(1 / hw.intra_bw, 1 / nic)
    expert_across = (2 * 7 * hw.inter_lat
                     + 2 * 7 / 8 * experts * 4 * max(1 / hw.intra_bw, 1 / nic))
    assert pred.time_breakdown["dp_comm_exposed"] == pytest.approx(
        inside + across + expert_across, rel=1e-9)


@pytest.mark.parametrize("model, zero", [("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", None),
                                         ("llama3-8b", None)])
def test_the_search_prices_its_pick_as_its_prediction(model, zero):
    """The search prices every row in HSDP's form where hybrid sharding is tried (one
    instance of all dp where it is off): that form must be the plan's own, for a MoE plan its
    routed experts synced over their own group too, or the table under-prices every such plan
    and the pick's prediction is slower than what the search compared."""
    from planner import switches
    from planner.spec.transformer import with_seq_len

    solver = HybridSolver(with_seq_len(load_model(model), 4096), load_system("dgx-h100"),
                          Precision.bf16, Search(global_batch=128, devices=64, zero=zero,
                                                 searched=switches.SEARCHED))
    assert solver._hsdp_form
    sol = solver.solve()
    rows, times, _ = solver._rows()
    assert sol.prediction.iteration_time_s == pytest.approx(float(times.min()), rel=1e-12)
