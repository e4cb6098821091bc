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
    ({"zero": 1, "dp_shard": 0}, "positive integer"),
])
def test_hsdp_refuses_what_it_cannot_be(over, message):
    with pytest.raises(SpecError, match=message):
        _eval(**over)


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
    ds = json.loads(_ok(run, *args, "--zero", "3", "--format", "deepspeed"))
    assert ds["zero_optimization"] == {"stage": 3, "overlap_comm": True,
                                       "mics_shard_size": 8}
    code, _, err = run(*args, "--zero", "1", "--format", "deepspeed")
    assert code == 2 and "MiCS" in err
    # MiCS groups are counted over the whole world: with tp 2 they are not the plan's groups
    code, _, err = run(*args, "--zero", "3", "--tp", "2", "--dp-shard", "4", "--format",
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
