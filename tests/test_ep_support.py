"""Expert parallelism beyond every mixture-of-experts calibration run of a system family has no
measurement behind it (Blackwell's MoE runs reach ep 32: DeepSeek-V3's): its band says "not
covered", and `solve` takes the fastest plan at the covered degrees where it lies within that
plan's error band (`planner.search.support`), as for context parallelism beyond the data."""

import dataclasses

import pytest

import planner
from planner import bands
from planner.catalog import load_model, load_system
from planner.errors import SpecError
from planner.search.hybrid import HybridSolver, Search
from planner.search.hybrid_space import eps
from planner.search.support import covered_by, covered_pins, supported_solve
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len

DEEPSEEK = with_seq_len(load_model("deepseek-v3"), 4096)


def _request(**pins) -> Search:
    """DeepSeek-V3 on 8,192 GB200 as MLPerf Training v6.0 runs it (global batch 16,384,
    MXFP8, CUDA graphs, the sync-free experts with the paged stash), every choice free."""
    return Search(global_batch=16384, devices=8192, grad_reduce_bf16=True, cuda_graphs=True,
                  rank_capacity=4.0, paged_stash=1.5, **pins)


def test_the_moe_runs_reach_ep_32_on_blackwell_and_no_degree_on_hopper():
    """The reach is the highest ep of the family's MoE residuals (DeepSeek-V3's 10 runs at ep
    32); Hopper has two MoE runs, fewer than a band takes, so no degree is covered there."""
    rows = [r for r in bands.residuals() if r["moe"] == "moe" and r["family"] == "Blackwell"]
    assert max(int(r["ep"]) for r in rows) == 32
    assert sum(int(r["ep"]) == 32 for r in rows) == 10
    assert bands.covered_ep("gb200") == bands.covered_ep("b300") == 32
    assert bands.covered_ep("h100-sxm5-80gb") is None
    assert all(r["ep"] == "1" for r in bands.residuals() if r["moe"] == "dense")


def test_a_moe_plan_beyond_the_reach_is_not_covered_and_a_dense_one_ignores_ep():
    at = lambda ep, m=DEEPSEEK: bands.band(  # noqa: E731
        bands.features(m, "gb200", Precision.mxfp8, 1, 8192, 1024, ep=ep))
    assert at(32).low is not None and at(16).low is not None
    beyond = at(64)
    assert beyond.low is None and beyond.note.startswith(
        "not covered: no calibration run of expert parallelism beyond ep 32 on Blackwell "
        "systems (this plan: ep 64)")
    dense = load_model("llama3-70b")
    assert at(64, dense).low is not None  # (ep is 1 for a dense plan anyway)


def test_covered_pins_bound_ep_only_for_moe_and_keep_the_users_pins():
    q = _request()
    fast = planner.evaluate("deepseek-v3", "gb200-nvl72", devices=8192, global_batch=16384,
                            tp=1, ep=64, pp=2, interleave=31, precision="mxfp8",
                            rank_capacity=4.0, paged_stash=1.5, cuda_graphs=True)
    plan = fast.plan
    assert covered_pins(q, plan, 8, 32) == {"zero": 1, "cp_max": 8, "ep_max": 32}
    assert covered_pins(q, plan, 8, None) is None  # covered at ep 64: nothing beside it
    assert covered_pins(dataclasses.replace(q, ep=64), plan, 8, 32) is None  # the user's ep
    assert covered_pins(dataclasses.replace(q, ep_max=16), plan, 8, 32)["ep_max"] == 16
    assert covered_by(False, None, 32) == "ep at most 32"
    assert covered_by(True, 2, 32) == "pp 1, cp at most 2, ep at most 32"


def test_ep_max_bounds_the_degrees_the_search_offers_and_a_pin_above_it_is_refused():
    q = Search(global_batch=1024, ep_max=16)
    assert eps(DEEPSEEK, q) == [1, 2, 4, 8, 16]
    assert eps(DEEPSEEK, Search(global_batch=1024))[-1] == 256
    with pytest.raises(SpecError, match="the pinned ep 64 is above ep_max 16"):
        HybridSolver(DEEPSEEK, load_system("gb200-nvl72"), Precision.mxfp8,
                     Search(global_batch=1024, devices=256, ep=64, ep_max=16))
    with pytest.raises(SpecError, match="ep_max: must be a whole number of at least 1"):
        HybridSolver(DEEPSEEK, load_system("gb200-nvl72"), Precision.mxfp8,
                     Search(global_batch=1024, devices=256, ep_max=0))


@pytest.mark.slow
def test_solve_takes_the_fastest_plan_at_the_covered_ep_within_the_band(no_memory_reach):
    """On 8,192 GB200 the fastest plan spreads the experts 64 ways, which no run checks; the
    pick is the fastest plan at ep 32 or less, slower by less than its band's spread, and it
    is exactly the search's answer with ep_max 32 and ZeRO 1 pinned (a second search)."""
    system = load_system("gb200-nvl72")
    fastest, pick = supported_solve(DEEPSEEK, system, Precision.mxfp8, _request())
    assert fastest.plan.ep == 64 and fastest.prediction.time_band["note"].startswith(
        "not covered: no calibration run of expert parallelism beyond ep 32")
    sup = pick.support
    assert sup["taken"] and sup["covered_by"] == "ep at most 32"
    assert pick.plan.ep <= 32 and pick.plan.zero == 1
    band = pick.prediction.time_band
    assert pick.prediction.iteration_time_s <= (
        fastest.prediction.iteration_time_s * band["high_ratio"] / band["low_ratio"])
    alone = HybridSolver(DEEPSEEK, system, Precision.mxfp8,
                         _request(ep_max=32, zero=1)).solve()
    assert alone.plan == pick.plan
    assert alone.prediction.iteration_time_s == pytest.approx(
        pick.prediction.iteration_time_s, rel=1e-12)
    # --prefer-supported 0 keeps the fastest and names the covered plan
    kept = supported_solve(DEEPSEEK, system, Precision.mxfp8, _request(), prefer=0.0)[1]
    assert kept.plan == fastest.plan and not kept.support["taken"]


def test_the_cli_bounds_ep_and_refuses_the_bound_for_a_cnn(run, run_json):
    """--ep-max keeps the search's pick at or under it (exit 0); a pin above it and the
    bound on a CNN are one line each, exit 2."""
    args = ("-m", "deepseek-v3", "-H", "gb200-nvl72", "--devices", "256", "--global-batch",
            "1024", "--precision", "mxfp8", "--ep-max", "16")
    assert run_json("solve", *args)["config"]["ep"] <= 16
    code, _, err = run("solve", *args, "--ep", "32")
    assert code == 2 and "the pinned ep 32 is above ep_max 16" in err
    code, _, err = run("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
                       "--ep-max", "4")
    assert code == 2 and "applies to transformer models only" in err
    assert "Traceback" not in err


def test_beyond_the_band_at_the_covered_ep_the_zero1_twin_covered_but_for_ep_is_taken(no_memory_reach):
    """DeepSeek-V3 on up to 256 GB200: the fastest plan is ZeRO 3 at ep 64; the fastest at
    ep 32 or less and ZeRO 1 lies outside the band, so the pick is the next best supported,
    the fastest ZeRO 1 plan at any ep, weighed with the spread of the covered plan's band;
    its note names what it fixes (the sharded weights) and its own band what it still lacks."""
    system = load_system("gb200-nvl72")
    q = Search(global_batch=1024, devices_max=256)
    fastest, pick = supported_solve(DEEPSEEK, system, Precision.bf16, q)
    assert fastest.plan.zero == 3 and fastest.plan.ep == 64
    covered = HybridSolver(DEEPSEEK, system, Precision.bf16,
                           dataclasses.replace(q, zero=1, ep_max=32)).solve()
    spread = (covered.prediction.time_band["high_ratio"]
              / covered.prediction.time_band["low_ratio"] - 1)
    fast = fastest.objective.value
    assert covered.objective.value > (1 + spread) * fast  # the covered plan: out of band
    sup = pick.support
    assert sup["taken"] and sup["covered_by"] == "ZeRO 1" and pick.plan.zero == 1
    assert sup["tolerance"] == pytest.approx(spread, rel=1e-12)
    assert "sharded weights" in sup["note"] and pick.plan.ep == 64
    assert pick.objective.value <= (1 + spread) * fast
    assert pick.prediction.time_band["note"].startswith(
        "not covered: no calibration run of expert parallelism beyond ep 32")


@pytest.mark.slow
def test_solve_json_names_the_covered_ep_and_meets_the_schema(run, no_memory_reach):
    """The 8,192-GB200 DeepSeek-V3 job through the CLI: the JSON `support` names "ep at most
    32" (the schema's pattern), stderr says which plan was taken, exit 0."""
    import json

    import jsonschema

    from planner.schema import schemas

    code, out, err = run("solve", "-m", "deepseek-v3", "-H", "gb200-nvl72", "--devices", "8192",
                         "--global-batch", "16384", "--precision", "mxfp8", "--rank-capacity",
                         "4", "--paged-stash", "1.5", "--cuda-graphs", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, schemas()["solve"])
    assert doc["support"]["covered_by"] == "ep at most 32" and doc["config"]["ep"] <= 32
    assert "took the fastest plan at ep 32 or less (ep 32, " in err


@pytest.mark.parametrize("pin", [{"zero": 1}, {"ep": 64}])
def test_a_pinned_stage_or_ep_still_gets_the_plan_covered_in_all_else(pin, no_memory_reach):
    """With ZeRO 1 pinned the covered plan is the search at ep 32 or less (no table twin to
    read: the table holds no stage 2 rows); with ep 64 pinned (the user's) the covered plan
    keeps it and holds ZeRO 1, weighed with the spread ZeRO 1 has at the covered ep."""
    system = load_system("gb200-nvl72")
    q = Search(global_batch=1024, devices_max=256, **pin)
    fastest, pick = supported_solve(DEEPSEEK, system, Precision.bf16, q)
    sup = pick.support
    assert sup["alternative"] is not None and sup["taken"] and pick.plan.zero == 1
    if "zero" in pin:
        assert sup["covered_by"] == "ep at most 32" and pick.plan.ep <= 32
        alone = HybridSolver(DEEPSEEK, system, Precision.bf16,
                             dataclasses.replace(q, ep_max=32)).solve()
        assert alone.plan == pick.plan
    else:
        assert fastest.plan.zero == 3 and pick.plan.ep == 64
        assert sup["covered_by"] == "ZeRO 1" and "sharded weights" in sup["note"]
        at32 = bands.band(bands.plan_features(DEEPSEEK, "gb200", Precision.bf16,
                                              fastest.plan, zero=1, ep=32))
        assert sup["tolerance"] == pytest.approx(at32.high / at32.low - 1, rel=1e-12)
        assert at32.spread == pytest.approx(at32.high / at32.low - 1, rel=1e-15)


def test_the_cli_names_what_the_taken_plan_still_lacks(run, no_memory_reach):
    """The note of a plan taken in the cascade says it is itself not covered (its ep), and the
    stage it holds is named beside the covered degree."""
    args = ("solve", "-m", "deepseek-v3", "-H", "gb200-nvl72", "--devices-max", "256",
            "--global-batch", "1024")
    code, _, err = run(*args)
    assert code == 0 and ("the plan taken is itself not covered: no calibration run of expert "
                          "parallelism beyond ep 32") in err
    code, _, err = run(*args, "--zero", "1")
    assert code == 0 and "took the fastest plan at ep 32 or less (ep 32, ZeRO 1, " in err
    code, _, err = run(*args, "--zero", "1", "--prefer-supported", "0")
    assert code == 0 and " x dp 64, ep 32, ZeRO 1: " in err and "--ep 32 --zero 1 pins" in err


def test_the_bounds_are_refused_for_a_cnn_sweep():
    for bound in ({"ep_max": 4}, {"cp_max": 2}):
        with pytest.raises(SpecError, match="applies to transformer models only"):
            planner.sweep("alexnet", "k80-fdr", nodes=[1, 2], global_batch=256, **bound)


def test_the_reach_follows_the_residuals_after_cache_clear(monkeypatch):
    """The reach is read from the residuals once; `cache_clear` makes it read them again
    (a table without the MoE runs covers no ep; the shipped one ep 32 again)."""
    kept = tuple(r for r in bands.residuals() if r["moe"] != "moe")
    assert bands.covered_ep("gb200") == 32
    monkeypatch.setattr(bands, "residuals", lambda path=bands.CSV: kept)
    bands.cache_clear()
    assert bands.covered_ep("gb200") is None
    monkeypatch.undo()
    bands.cache_clear()
    assert bands.covered_ep("gb200") == 32
