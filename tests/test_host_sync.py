"""The host's time per training step (`KernelCosts.step_sync_us`): the training loop syncs the
host once a step, so that time adds to every iteration once, whatever the plan, and to no
evaluation step; the limits and the derived formulas carry it (an Amdahl floor)."""

from __future__ import annotations

import dataclasses

import pytest

from planner.analysis.transformer_limits import TransformerLimits
from planner.catalog import load_model, load_system
from planner.plan import Plan
from planner.search.hybrid import predict
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len


def _with_sync(system, us):
    dev = system.device
    kernels = dev.kernels.model_copy(update={"step_sync_us": us})
    return dataclasses.replace(system, device=dev.model_copy(update={"kernels": kernels}))


@pytest.mark.parametrize("plan", [
    Plan.split(2, 1, 64, 1, 64, node_size=4, cp=4, sequence_parallel=True, zero=1,
               cuda_graphs=True),
    Plan.split(1, 4, 4, 1, 64, node_size=4, interleave=8, zero=1),
    Plan.split(4, 2, 2, 2, 32, node_size=4, zero=3)])
def test_the_host_time_adds_once_to_training_and_not_to_evaluation(plan):
    """Two routes: the spec's host time priced in, against the same system without it."""
    m = with_seq_len(load_model("llama3-8b"), 8192)
    system = load_system("gb200-nvl72")
    us = system.device.kernels.step_sync_us
    assert us and us > 0
    with_it = predict(m, system, Precision.fp8, plan)
    without = predict(m, _with_sync(system, None), Precision.fp8, plan)
    assert with_it.time_breakdown["host_sync"] == pytest.approx(us * 1e-6, rel=1e-12)
    assert without.time_breakdown["host_sync"] == 0
    assert with_it.iteration_time_s - without.iteration_time_s == pytest.approx(us * 1e-6,
                                                                               rel=1e-9)
    assert with_it.forward_time_s == without.forward_time_s
    assert sum(with_it.time_breakdown.values()) == pytest.approx(with_it.iteration_time_s,
                                                                  rel=1e-12)


def test_the_host_time_floors_the_iteration_along_d_in_the_limits():
    """Along the data-parallel degree the iteration never falls below the host's time a
    step, and the limits' curve moves by exactly it."""
    m = load_model("gpt3-175b")
    system = load_system("dgx-h100")
    us = system.device.kernels.step_sync_us
    args = dict(tp=8, pp=8, micro_batch=1, global_batch=1536)
    lim = TransformerLimits(m, system, Precision.bf16, **args)
    bare = TransformerLimits(m, _with_sync(system, None), Precision.bf16, **args)
    for d in (1.0, 16.0, 1536.0):
        t, t0 = float(lim.d_time(d)), float(bare.d_time(d))
        assert t - t0 == pytest.approx(us * 1e-6, rel=1e-9)
        assert t > us * 1e-6


def test_a_plan_without_a_host_sync_pays_none_on_one_pool_or_across_pools():
    """`host_sync` off (on-device gradient clipping, torchtitan's loop): no host time, and a
    pipeline across pools prices it as the one-system model does."""
    from planner.catalog import load_target
    from planner.cost import pools as cost
    from planner.cost.pools import Group, MixedPlan, Shape, Stage
    from planner.plan import stage_layers

    m = load_model("gpt3-175b")
    c = load_target("lab-a100-h100")
    h100 = next(k for k, pool in enumerate(c.pools) if pool.system.device.name.startswith("h100"))
    us = c.pools[h100].system.device.kernels.step_sync_us
    times = {}
    for sync in (True, False):
        shape = Shape(8, 1, "full", True, 1, True, switches=() if sync else (("host_sync", False),))
        plan = MixedPlan(shape, (Group(tuple(Stage(h100, n) for n in stage_layers(96, 8)), 2,
                                       64),))
        priced = cost.price(m, c, Precision.bf16, plan)
        ref = predict(m, c.pools[h100].system, Precision.bf16, Plan.split(
            8, 8, 2, 1, 128, node_size=8, recompute="full", sequence_parallel=True, zero=1,
            host_sync=sync))
        assert priced.iteration_time_s == pytest.approx(ref.iteration_time_s, rel=1e-12)
        assert ref.time_breakdown["host_sync"] == pytest.approx(us * 1e-6 if sync else 0)
        times[sync] = ref.iteration_time_s
    assert times[True] - times[False] == pytest.approx(us * 1e-6, rel=1e-9)


def test_the_v6_lora_rows_read_back_what_their_training_scripts_read_back():
    """v6.0's Llama 2 70B LoRA recipe has no ON_DEVICE_CLIP_GRAD knob: NVIDIA's train.py turns
    every per-step read-back off (the optimizer-step check, the norm's sync across model
    parallel ranks, the training log) on a Megatron-LM that keeps the clipped norm on the
    device, so its rows pay no host time; Quanta's copy keeps the default checks, and pays it.
    The v5.1 rows follow their knob."""
    from planner import mlperf

    runs = [r for r in mlperf.read() if r.row["benchmark"] == "llama2_70b_lora"]
    v6 = {r.row["system"]: mlperf.plan_of(r).host_sync for r in runs if r.row["round"] == "v6.0"}
    assert v6 == {"theia_ngpu8_ngc26.04_nemo": False, "theia_ngpu72_ngc26.04_nemo": False,
                  "theia_ngpu512_ngc26.04_nemo": False, "D75U-1U_ngpu64": True}
    for run in runs:
        if run.row["round"] == "v5.1":
            assert mlperf.plan_of(run).host_sync == (run.row["on_device_clip_grad"] != "1")
