"""Context parallelism beyond every calibration run of a system family has no measurement
behind it (Hopper's runs reach cp 2): its band says "not covered", and `solve` takes the fastest
plan within the family's calibrated degrees where it lies within that plan's error band
(`planner.search.support`), as for ZeRO-2 / -3 and LoRA pipelines."""

import dataclasses
import json

import jsonschema
import pytest

import planner
from planner import bands, switches
from planner.catalog import load_model, load_system
from planner.errors import SpecError
from planner.schema import schemas
from planner.search.hybrid import Search
from planner.search.hybrid_space import cps
from planner.search.support import covered_by, covered_pins, fullness, supported_solve
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len


def _request(devices: int, **pins) -> tuple:
    """The Llama 2 70B LoRA job of MLPerf (rank 16, sequence 8,192, global batch 8) on
    `devices` H100 in fp8 with the v4.1 recipe's switches (CUDA graphs, no fp8 attention),
    every plan choice free unless pinned."""
    m = with_seq_len(load_model("llama2-70b"), 8192)
    q = Search(global_batch=8, devices=devices, grad_reduce_bf16=True, cuda_graphs=True,
               lora_rank=16, fp8_weight_gather=True, weight_cache=False,
               searched=tuple(n for n in switches.SEARCHED if n != "fp8_weight_gather"),
               **pins)
    return m, load_system("dgx-h100"), q


def test_each_familys_covered_degree_is_the_highest_its_runs_ran():
    # MLPerf Training: Hopper's LoRA and Llama 3.1 405B runs at cp 2, Blackwell's LoRA on
    # NVL72 and B200 at cp 8, one MI300X LoRA run at cp 4; vTrain and SC21 at cp 1
    got = {name: bands.covered_cp(load_system(name).device.name)
           for name in ("dgx-h100", "hgx-h200", "gb200-nvl72", "dgx-b200", "mi300x-8",
                        "dgx-a100-80gb")}
    assert got == {"dgx-h100": 2, "hgx-h200": 2, "gb200-nvl72": 8, "dgx-b200": 8,
                   "mi300x-8": 4, "dgx-a100-80gb": 1}
    # a family with no calibration run covers no degree (its plans have no band at all)
    assert bands.covered_cp(load_system("dgx2-v100").device.name) is None


def test_a_plan_beyond_the_covered_degree_has_no_band_and_within_it_the_same_band():
    m = load_model("llama2-70b")
    h100 = load_system("dgx-h100").device.name
    feat = {c: bands.features(m, h100, Precision.fp8, 1, 64, cp=c) for c in (1, 2, 4)}
    one, two, four = (bands.band(feat[c]) for c in (1, 2, 4))
    assert four.low is None and four.note.startswith(
        "not covered: no calibration run of context parallelism beyond cp 2 on H100 / H200 "
        "systems (this plan: cp 4)")
    # the degree is no grouping key: within the covered range the band is the family's
    assert (two.low, two.high, two.group) == (one.low, one.high, one.group)


def test_the_search_offers_no_degree_above_cp_max():
    m = with_seq_len(load_model("llama2-70b"), 8192)
    assert cps(m, Search(global_batch=8, devices=64)) == [1, 2, 4, 8, 16]
    assert cps(m, Search(global_batch=8, devices=64, cp_max=2)) == [1, 2]


def test_the_covered_search_pins_what_the_data_covers():
    plan = type("P", (), {"cp": 4, "pp": 1, "zero": 1, "lora_rank": 16})()
    sharded = type("P", (), {"cp": 2, "pp": 1, "zero": 3, "lora_rank": 16})()
    _, _, q = _request(64)
    assert covered_pins(q, plan, 2) == {"cp_max": 2, "pp": 1, "zero": 1}
    assert covered_pins(dataclasses.replace(q, cp=4), plan, 2) is None  # the user's cp
    assert covered_pins(dataclasses.replace(q, zero=2), plan, 2) is None  # itself uncovered
    assert covered_pins(dataclasses.replace(q, lora_rank=None), plan, 2) == {"cp_max": 2,
                                                                            "zero": 1}
    assert covered_pins(q, plan, 4) is None  # covered but for another reason (none here)
    # a sharded pick within the degrees: its covered plan keeps to them too
    assert covered_pins(q, sharded, 2) == {"cp_max": 2, "pp": 1, "zero": 1}
    assert covered_pins(q, sharded, None) == {"pp": 1, "zero": 1}  # no run: no bound
    # the request's own bound is never raised to the family's degree
    assert covered_pins(dataclasses.replace(q, cp_max=1), sharded, 2)["cp_max"] == 1
    assert covered_by(True, 2) == "pp 1, cp at most 2" and covered_by(True, None) == "pp 1"
    assert covered_by(False, None) == "ZeRO 1" and covered_by(False, 8) == "cp at most 8"


def test_a_cp_beyond_the_data_weighs_the_fastest_plan_within_it():
    m, system, q = _request(64)
    fastest, pick = supported_solve(m, system, Precision.fp8, q)
    assert fastest.plan.cp > 2
    assert fastest.prediction.time_band["note"].startswith("not covered")
    sup = pick.support
    # a pipelined LoRA pick loses its pipeline too (every LoRA run is pp 1)
    assert sup["covered_by"] == covered_by(fastest.plan.pp > 1, 2)
    alt, tol = sup["alternative"], sup["tolerance"]
    assert alt["config"]["cp"] <= 2 and "low_s" in alt["time_band"]
    assert sup["taken"] == (alt["objective_value"] <= (1 + tol) * fastest.objective.value)
    assert (pick.plan.cp <= 2) == sup["taken"]
    # the alternative is the fastest plan of each covered degree, pinned one at a time
    best = min(supported_solve(m, system, Precision.fp8,
                               dataclasses.replace(q, cp=c, pp=1, zero=1))[1].objective.value
               for c in (1, 2))
    assert abs(alt["objective_value"] / best - 1) < 1e-9


def test_a_pinned_cp_beyond_the_data_is_the_users_and_said_to_be_not_covered():
    for pins in ({"cp": 4}, {"cp": 4, "zero": 1}):
        m, system, q = _request(64, **pins)
        fastest, pick = supported_solve(m, system, Precision.fp8, q)
        sup = pick.support
        assert pick.plan == fastest.plan and pick.plan.cp == 4
        assert sup["covered_by"] == "cp at most 2" and sup["alternative"] is None
        assert not sup["taken"] and "beyond cp 2" in sup["note"]


def test_a_sharded_pick_is_weighed_against_a_plan_within_the_covered_degrees():
    """A ZeRO-2 / -3 pick at a covered degree: its ZeRO 1 plan stays at a covered degree too
    (the table's ZeRO 1 twin may be at a higher cp: then it is searched again)."""
    m = with_seq_len(load_model("llama3-70b"), 16384)
    q = Search(global_batch=16, devices=64, searched=switches.SEARCHED)
    fastest, pick = supported_solve(m, load_system("dgx-h100"), Precision.bf16, q)
    assert fastest.plan.zero >= 2 and fastest.plan.cp <= 2  # the premise: a covered degree
    sup = pick.support
    # (the fastest also fills more of the memory than any H100 run: the label says so)
    reach = bands.covered("h100-sxm5-80gb", "full")
    assert fullness(fastest, load_system("dgx-h100")) > reach
    assert sup["covered_by"] == f"memory at most {reach:.1%}"
    alt = sup["alternative"]
    assert alt["config"]["cp"] <= 2 and alt["config"]["zero"] == 1 and "low_s" in alt["time_band"]


def test_solve_says_it_took_a_plan_within_the_covered_degree(run):
    args = ("solve", "-m", "llama2-70b", "-H", "dgx-h100", "--devices", "64", "--global-batch",
            "8", "--seq-len", "8192", "--lora-rank", "16", "--precision", "fp8",
            "--fp8-weight-gather", "--no-weight-cache", "--cuda-graphs")
    code, out, err = run(*args, "--format", "json")
    assert code == 0
    doc = json.loads(out)
    jsonschema.validate(doc, schemas()["solve"])
    piped = doc["support"]["covered_by"] == "pp 1, cp at most 2"
    assert piped or doc["support"]["covered_by"] == "cp at most 2"
    line = next(x for x in err.splitlines() if "cp 2 or less" in x)
    assert ("at cp 2 or less (" + ("pp 1, " if piped else "") + "cp " in line
            or "--cp " in line and "--zero " in line and ("--pp 1" in line) == piped)


def test_cp_max_on_the_command_line_bounds_solve_and_sweep(run):
    args = ("-m", "llama2-70b", "-H", "dgx-h100", "--global-batch", "8", "--seq-len", "8192",
            "--lora-rank", "16", "--precision", "fp8", "--fp8-weight-gather",
            "--no-weight-cache", "--cuda-graphs", "--format", "json")
    free = json.loads(run("solve", *args, "--devices", "64", "--prefer-supported", "0")[1])
    assert free["config"]["cp"] > 2  # the premise: unbounded, the fastest goes beyond cp 2
    code, out, _ = run("solve", *args, "--devices", "64", "--cp-max", "2",
                       "--prefer-supported", "0")
    assert code == 0
    bounded = json.loads(out)
    assert bounded["config"]["cp"] <= 2  # its degree covered: no cp note (a ZeRO one may be)
    assert "context parallelism" not in bounded.get("support", {}).get("note", "")
    assert bounded["objective"]["value"] >= free["objective"]["value"]
    code, out, _ = run("sweep", *args, "--nodes", "4:8:x2", "--cp-max", "1")
    assert code == 0 and all(p["config"]["cp"] == 1 for p in json.loads(out)["points"])


def test_cp_max_refuses_a_pin_above_it_and_a_cnn(run):
    code, _, err = run("solve", "-m", "llama2-70b", "-H", "dgx-h100", "--global-batch", "8",
                       "--devices", "64", "--seq-len", "8192", "--cp", "8", "--cp-max", "4")
    assert code == 2 and "the pinned cp 8 is above cp_max 4" in err
    code, _, err = run("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
                       "--cp-max", "4")
    assert code == 2 and "--cp-max applies to transformer models only" in err


def test_cp_max_beyond_the_degrees_tried_is_refused(run):
    code, _, err = run("solve", "-m", "llama2-70b", "-H", "dgx-h100", "--global-batch", "8",
                       "--devices", "64", "--cp-max", "32")
    assert code == 2 and "--cp-max" in err and "Traceback" not in err
    m, system, q = _request(64, cp_max=32)
    with pytest.raises(SpecError, match="cp_max: must be 1 to 16"):
        supported_solve(m, system, Precision.fp8, q)
    with pytest.raises(SpecError, match="applies to transformer models only"):
        planner.solve("alexnet", "k80-fdr", global_batch=256, cp_max=2)


def test_the_covered_by_label_reads_back_as_written():
    from planner.search.support import covered_parts

    for pipeline in (False, True):
        for most in (None, 2, 8):
            for ep_most in (None, 32):
                for full in (None, 0.942, 0.71):
                    label = covered_by(pipeline, most, ep_most, full)
                    assert covered_parts(label) == (pipeline, most, ep_most, full), label
