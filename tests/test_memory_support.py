"""A plan filling more of a device's usable memory, by the model, than any calibration run of
its system family has no measurement behind its fit: its band says "not covered", and `solve`
takes the fastest plan within the family's fullest run where it lies within that plan's error
band (`planner.search.support`), as for context and expert parallelism beyond the data."""

import csv
import dataclasses
import json

import pytest

from planner import bands, switches
from planner.catalog import load_model, load_system
from planner.search.hybrid import HybridSolver, Search
from planner.search.support import covered_by, covered_parts, covered_pins, fullness, supported_solve
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len

LLAMA2 = with_seq_len(load_model("llama2-70b"), 8192)
MI300X = load_system("mi300x-8")


def _lora(**pins) -> Search:
    """Llama 2 70B LoRA on one MI300X node as MLPerf Training runs it (global batch 8, fp8,
    rank 16), every choice free but `pins`."""
    return Search(global_batch=8, devices=8, lora_rank=16, grad_reduce_bf16=True,
                  searched=switches.SEARCHED, **pins)


def test_the_reach_is_the_fullest_run_of_each_family_read_from_the_csv():
    """Read straight from the shipped CSV (not through `bands`): each family's reach is its
    fullest priced run; the A100's runs record no memory, so that family has no bound."""
    with open(bands.CSV, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    most = {}
    for r in rows:
        if r["full"]:
            most[r["family"]] = max(most.get(r["family"], 0.0), float(r["full"]))
    assert bands.covered("h100-sxm5-80gb", "full") == most["H100 / H200"]
    assert bands.covered("gb200", "full") == most["Blackwell"]
    assert bands.covered("mi300x", "full") == most["AMD CDNA"]
    assert "A100" not in most and bands.covered("a100-sxm4-80gb", "full") is None
    # every MLPerf run fits, so every reach is at most the whole usable memory
    assert all(0.5 < v <= 1 for v in most.values())


def test_the_fullest_run_of_a_family_is_covered_by_its_own_reach():
    """The reach is the exact fullness of a run's own plan (not a rounded one, which would
    leave the fullest run itself beyond it): AMD's Llama 2 70B LoRA runs on MI300X."""
    from planner import mlperf

    runs = [r for r in mlperf.read() if r.system == "mi300x-8" and r.why_not is None]
    preds = [p for p in (mlperf.prediction(r)[0] for r in runs) if p is not None]
    assert len(preds) >= 10
    fulls = [p.memory_bytes_per_device / p.memory_capacity_bytes for p in preds]
    assert max(fulls) == pytest.approx(bands.covered("mi300x", "full"), rel=1e-12)
    assert all("low_s" in p.time_band for p in preds)


def test_a_plan_beyond_the_fullest_run_is_not_covered_and_one_at_it_is():
    reach = bands.covered("mi300x", "full")
    at = lambda full: bands.band(bands.features(  # noqa: E731
        LLAMA2, "mi300x", Precision.fp8, 1, 8, 8, full=full))
    assert at(reach).low is not None and at(None).low is not None
    beyond = at(reach + 0.05)
    assert beyond.low is None and beyond.note.startswith(
        f"not covered: no calibration run filling a device beyond {reach:.1%} of its usable "
        f"memory by this model on AMD CDNA systems (this plan: {reach + 0.05:.1%})")


def test_covered_pins_bound_the_memory_as_a_headroom_and_keep_a_larger_one():
    q = _lora()
    plan = HybridSolver(LLAMA2, MI300X, Precision.fp8, _lora(zero=1, pp=1)).solve().plan
    assert plan.zero == 1 and plan.cp <= 4
    pins = covered_pins(q, plan, 4, None, 0.71, True)
    assert pins == {"zero": 1, "cp_max": 4, "memory_headroom": pytest.approx(0.29), "pp": 1}
    assert covered_pins(q, plan, 4, None, 0.71, False) is None  # within it: nothing beside
    assert "memory_headroom" not in covered_pins(dataclasses.replace(q, memory_headroom=0.4),
                                                 plan, 4, None, 0.71, True)
    label = covered_by(False, 2, None, 0.942)
    assert label == "cp at most 2, memory at most 94.2%"
    pipe, cp, ep, full = covered_parts(label)
    assert (pipe, cp, ep) == (False, 2, None) and full == pytest.approx(0.942)


def test_solve_takes_the_fastest_plan_within_the_fullest_run_within_the_band():
    """On one MI300X node at ZeRO 1 and pp 1 (MLPerf's recipe) the fastest LoRA plan fills
    more of the memory than any AMD run does (the runs: 71 %); the pick is the fastest plan
    within it, slower by less than its band's spread, exactly the search's answer with that
    headroom, and its memory is reported against the whole usable memory (the bound is the
    search's only)."""
    reach = bands.covered("mi300x", "full")
    fastest, pick = supported_solve(LLAMA2, MI300X, Precision.fp8, _lora(zero=1, pp=1))
    assert fastest.plan.zero == 1 and fastest.plan.pp == 1
    assert fullness(fastest, MI300X) > reach
    assert fastest.prediction.time_band["note"].startswith(
        "not covered: no calibration run filling a device beyond")
    sup = pick.support
    assert sup["taken"] and sup["covered_by"] == f"memory at most {reach:.1%}"
    assert sup["memory_headroom"] == pytest.approx(1 - reach, rel=1e-12)
    assert fullness(pick, MI300X) <= reach and "low_s" in pick.prediction.time_band
    band = pick.prediction.time_band
    assert pick.objective.value <= fastest.objective.value * band["high_ratio"] / band[
        "low_ratio"]
    alone = HybridSolver(LLAMA2, MI300X, Precision.fp8,
                         _lora(zero=1, pp=1, memory_headroom=1 - reach)).solve()
    assert alone.plan == pick.plan
    assert pick.prediction.memory_capacity_bytes == MI300X.device.usable_memory_bytes
    assert alone.prediction.memory_capacity_bytes < pick.prediction.memory_capacity_bytes
    kept = supported_solve(LLAMA2, MI300X, Precision.fp8, _lora(zero=1, pp=1), prefer=0.0)[1]
    assert kept.plan == fastest.plan and not kept.support["taken"]


def test_the_cli_says_which_plan_it_took_and_how_to_keep_or_pin_it(run):
    """stderr names the memory bound, the JSON meets the schema's `covered_by` pattern, and
    with --prefer-supported 0 the warning names the headroom that pins the covered plan."""
    import jsonschema

    from planner.schema import schemas

    args = ("solve", "-m", "llama2-70b", "-H", "mi300x-8", "--devices", "8", "--global-batch",
            "8", "--precision", "fp8", "--seq-len", "8192", "--lora-rank", "16", "--zero", "1",
            "--pp", "1")
    code, out, err = run(*args, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, schemas()["solve"])
    reach = bands.covered("mi300x", "full")
    assert doc["support"]["covered_by"] == f"memory at most {reach:.1%}"
    assert f"took the fastest plan filling {reach:.1%} of the usable memory or less" in err
    code, _, err = run(*args, "--prefer-supported", "0")
    # the hint's headroom is the searched one rounded up: never a looser bound
    room = float(err.split("--memory-headroom ")[1].split()[0])
    assert code == 0 and "--zero 1 --memory-headroom" in err
    assert 1 - reach <= room < 1 - reach + 0.001
    assert "Traceback" not in err


def test_beyond_the_band_within_the_memory_the_zero1_plan_covered_but_for_it_is_taken():
    """Llama 3.1 405B on 2,432 H100 as MLPerf's recipe runs it: the fastest plan is ZeRO 2
    and fills more than any H100 run; the fastest ZeRO 1 plan within the fullest run lies
    outside the band, so the pick is the next best supported, the fastest ZeRO 1 plan at any
    fullness, weighed with the covered plan's spread; its own band says what it still lacks."""
    m = with_seq_len(load_model("llama3.1-405b"), 8192)
    system = load_system("dgx-h100")
    q = Search(global_batch=1216, devices=2432, grad_reduce_bf16=True, fp8_weight_gather=True,
               searched=tuple(n for n in switches.SEARCHED if n != "fp8_weight_gather"))
    reach = bands.covered("h100-sxm5-80gb", "full")
    fastest, pick = supported_solve(m, system, Precision.fp8, q)
    assert fastest.plan.zero == 2 and fullness(fastest, system) > reach
    covered = HybridSolver(m, system, Precision.fp8,
                           dataclasses.replace(q, zero=1, memory_headroom=1 - reach)).solve()
    band = covered.prediction.time_band
    spread = band["high_ratio"] / band["low_ratio"] - 1
    assert covered.objective.value > (1 + spread) * fastest.objective.value  # out of band
    sup = pick.support
    assert sup["taken"] and sup["covered_by"] == "ZeRO 1" and "sharded gradients" in sup["note"]
    assert sup["tolerance"] == pytest.approx(spread, rel=1e-12)
    assert pick.plan.zero == 1 and fullness(pick, system) > reach
    assert pick.objective.value <= (1 + spread) * fastest.objective.value
    assert pick.prediction.time_band["note"].startswith(
        "not covered: no calibration run filling a device beyond")
    alone = HybridSolver(m, system, Precision.fp8, dataclasses.replace(q, zero=1)).solve()
    assert alone.objective.value == pytest.approx(pick.objective.value, rel=1e-12)


def test_the_cascade_drops_the_memory_bound_after_the_ep_bound():
    """DeepSeek-V3 on up to 256 GB200 with the shipped residuals: the fastest plan is ZeRO 3
    at ep 64 (within the memory); no ZeRO 1 plan within Blackwell's fullest run lies within
    the band, at ep 32 or at ep 64, so the pick is the fastest ZeRO 1 plan at any ep and
    fullness (the cascade's last step), whose own band still says its ep is not covered."""
    deepseek = with_seq_len(load_model("deepseek-v3"), 4096)
    system = load_system("gb200-nvl72")
    q = Search(global_batch=1024, devices_max=256)
    reach = bands.covered("gb200", "full")
    fastest, pick = supported_solve(deepseek, system, Precision.bf16, q)
    assert fastest.plan.zero == 3 and fastest.plan.ep == 64
    assert fullness(fastest, system) <= reach
    sup = pick.support
    assert sup["taken"] and sup["covered_by"] == "ZeRO 1" and sup["memory_headroom"] is None
    assert pick.plan.zero == 1 and fullness(pick, system) > reach
    for bound in ({"ep_max": 32}, {}):  # each bounded step's plan: outside the band
        kept = HybridSolver(deepseek, system, Precision.bf16, dataclasses.replace(
            q, zero=1, memory_headroom=1 - reach, **bound)).solve()
        assert kept.objective.value > (1 + sup["tolerance"]) * fastest.objective.value
    assert pick.prediction.time_band["note"].startswith(
        "not covered: no calibration run of expert parallelism beyond ep 32")


def test_the_recorded_headroom_passed_back_searches_the_covered_plan():
    """Through the Python API: the `support` record's `memory_headroom` given back as
    `memory_headroom=` is the covered plan's own search (the same plan, covered: no record)."""
    import planner

    kw = dict(devices=8, global_batch=8, precision="fp8", seq_len=8192, lora_rank=16, zero=1,
              pp=1)
    sol = planner.solve("llama2-70b", "mi300x-8", **kw)
    room = sol.support["memory_headroom"]
    assert sol.support["taken"] and room == pytest.approx(1 - bands.covered("mi300x", "full"))
    again = planner.solve("llama2-70b", "mi300x-8", memory_headroom=room, **kw)
    assert again.plan == sol.plan and again.support is None
