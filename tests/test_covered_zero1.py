"""The covered plan beside a ZeRO-2 / ZeRO-3 pick (the fastest with gradients and weights
whole, ZeRO 1) comes from the table the search already priced: each ZeRO 2 row carries its
memory with the gradients whole, and the rows that fit so are ZeRO 1 twins at the same time.
Checked against two independent references: the memory of the twin priced as a ZeRO 1 plan,
and the search run again with ZeRO 1 pinned (what `solve` did before)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from planner import switches
from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.search.hybrid import HybridSolver, Plan, Search, _cfg, predict
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len


@pytest.mark.parametrize("model, hardware, plan", [
    ("llama3-70b", "dgx-h100", dict(tp=4, pp=4, dp=4, recompute="selective")),
    ("mixtral-8x7b", "dgx-h100", dict(tp=2, pp=1, dp=8, ep=8, etp=1)),
    ("llama2-7b", "dgx-a100-80gb", dict(tp=2, pp=2, dp=4, recompute="full",
                                          recompute_layers=3)),
])
def test_a_zero2_rows_memory_with_whole_gradients_is_its_zero1_twins(model, hardware, plan):
    m, system = load_model(model), load_system(hardware)
    t, p, d = plan.pop("tp"), plan.pop("pp"), plan.pop("dp")
    two = Plan.split(t, p, d, 1, 8 * d, node_size=system.devices_per_node, zero=2,
                     sequence_parallel=t > 1, **plan)
    hw = Hardware.of(system, Precision.bf16)
    whole = float(iteration(m, hw, _cfg(two), ("memory_zero1",))["memory_zero1"][0])
    twin = predict(m, system, Precision.bf16, dataclasses.replace(two, zero=1))
    assert whole == pytest.approx(twin.memory_bytes_per_device, rel=1e-12)
    assert whole > predict(m, system, Precision.bf16, two).memory_bytes_per_device


@pytest.mark.parametrize("model, hardware, batch, devices, seq", [
    ("llama2-7b", "dgx-h100", 32, 8, 4096),  # ZeRO 1 needs more layers recomputed: own rows
    ("llama3-70b", "dgx-a100-80gb", 128, 16, 8192),
    ("llama3-70b", "dgx-h100", 256, 64, None),
    ("llama3-8b", "dgx-h100", 64, 16, 8192),
])
def test_the_covered_plan_is_the_search_with_zero1_pinned(model, hardware, batch, devices,
                                                          seq):
    m, system = with_seq_len(load_model(model), seq), load_system(hardware)
    q = Search(global_batch=batch, devices=devices, searched=switches.SEARCHED)
    solver = HybridSolver(m, system, Precision.bf16, q)
    fastest = solver.solve()
    covered = solver.covered()
    pinned = HybridSolver(m, system, Precision.bf16, dataclasses.replace(q, zero=1)).solve()
    assert covered.plan.zero == 1 and covered.prediction.fits_memory
    assert covered.prediction.iteration_time_s == pytest.approx(
        pinned.prediction.iteration_time_s, rel=1e-12)
    assert covered.prediction.iteration_time_s >= fastest.prediction.iteration_time_s


def test_the_runners_up_of_a_covered_pick_are_covered_too():
    """When `solve` takes the covered plan, its runners-up and the plans of its Pareto front
    hold their gradients whole as well (they come from the same covered table), the pick
    being the fastest plan's own split at ZeRO 1 where that fits (same time)."""
    from planner.search.support import supported_solve
    from planner.search.training import Training

    m, system = load_model("llama2-7b"), load_system("dgx-a100-80gb")
    q = Search(global_batch=512, devices=64, top=3, searched=switches.SEARCHED)
    fast, pick = supported_solve(m, system, Precision.bf16, q)
    assert fast.plan.zero == 2 and pick.support["taken"]
    assert pick.plan == dataclasses.replace(fast.plan, zero=1)
    assert pick.prediction.iteration_time_s == fast.prediction.iteration_time_s
    assert any(p.zero == 2 for p, _ in fast.alternatives)
    assert len(pick.alternatives) == 3
    assert all(p.zero == 1 and pred.fits_memory for p, pred in pick.alternatives)
    q = Search(global_batch_range=(256, 1024), devices_max=64, pareto=True,
               training=Training(critical_batch=512, target_steps=1000,
                                 price_per_device_hour=2.0),
               searched=switches.SEARCHED)
    fast, pick = supported_solve(m, system, Precision.bf16, q)
    assert fast.plan.zero == 2 and pick.support["taken"] and pick.pareto
    assert all(p["config"]["zero"] == 1 for p in pick.pareto)


def test_the_note_of_an_as_fast_covered_twin_says_nothing_was_given_up(run):
    """Where the covered ZeRO 1 plan is the fastest plan's twin (the same time), the note says
    so rather than a +0.0 % cost; where it is slower, it names the cost and the band."""
    code, _, err = run("solve", "-m", "llama2-7b", "-H", "dgx-a100-80gb", "--devices-max",
                       "64", "--global-batch", "1024")
    assert code == 0 and "note: took ZeRO 1, as fast as the fastest plan" in err, err
    code, _, err = run("solve", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "64",
                       "--global-batch", "256")
    assert code == 0 and re.search(r"ZeRO 1, \+[1-9]\d*\.\d% time, within its error band", err)


@pytest.fixture
def no_moe_runs(monkeypatch):
    """The shipped residuals without the MoE runs: a MoE plan on B200 as uncovered as on
    Hopper, AMD or the A100 (where no such twin is as fast at these sizes)."""
    from planner import bands

    kept = tuple(r for r in bands.residuals() if r["moe"] != "moe")
    monkeypatch.setattr(bands, "residuals", lambda path=bands.CSV: kept)
    bands.cache_clear()
    yield
    bands.cache_clear()


def test_an_as_fast_zero1_twin_of_a_moe_pick_is_taken_though_no_band_covers_either(
        run, no_moe_runs):
    """A mixture-of-experts plan without MoE runs of its family has no band at any ZeRO
    stage: the default rule then takes the ZeRO 1 twin only where it is as fast (tolerance
    0), as --prefer-supported 0 does; before, the default kept the ZeRO 2 plan that 0 gave
    up."""
    from planner.search.support import supported_solve

    m, system = load_model("gpt-oss-120b"), load_system("dgx-b200")
    q = Search(global_batch=256, devices_max=64, searched=switches.SEARCHED)
    fast, pick = supported_solve(m, system, Precision.fp8, q)
    zero0 = supported_solve(m, system, Precision.fp8, q, prefer=0.0)[1]
    assert fast.plan.zero >= 2  # the case: a sharded-gradient pick beside its ZeRO 1 twin
    assert pick.plan.zero == zero0.plan.zero == 1 and pick.support["taken"]
    assert pick.support["tolerance"] == 0.0
    assert pick.objective.value == pytest.approx(zero0.objective.value, rel=1e-12)
    assert pick.objective.value == pytest.approx(fast.objective.value, rel=1e-12)


def test_the_covered_plan_is_compared_in_the_searchs_objective(no_memory_reach):
    """Under --objective cost the covered plan is weighed by its cost, not its step time (a
    ZeRO 1 plan on fewer devices is slower a step and about as cheap): --prefer-supported 0
    keeps the cheapest plan, and a taken plan is within the band of the cheapest's cost."""
    from planner.search.support import supported_solve
    from planner.search.training import Training

    m, system = load_model("gpt3-175b"), load_system("dgx-h100")
    q = Search(global_batch=1024, devices_max=512, objective="cost",
               training=Training(critical_batch=None, target_samples=512_000,
                                 price_per_device_hour=2.0),
               searched=switches.SEARCHED)
    fast, pick = supported_solve(m, system, Precision.bf16, q)
    kept = supported_solve(m, system, Precision.bf16, q, prefer=0.0)[1]
    assert kept.objective.value == pytest.approx(fast.objective.value, rel=1e-12)
    sup = pick.support
    cost = sup["alternative"]["objective_value"]
    assert sup["fastest_objective"] == fast.objective.value
    assert sup["taken"] == (cost <= (1 + sup["tolerance"]) * fast.objective.value)
    # here (ZeRO 2 on 256 GPUs, ZeRO 1 on 128) the covered plan is within the band in cost
    # and far outside it in step time: a step-time rule would not have taken it
    assert sup["taken"] and pick.plan.zero == 1 and pick.plan.devices < fast.plan.devices
    assert pick.prediction.iteration_time_s > (1 + sup["tolerance"]) * \
        fast.prediction.iteration_time_s
