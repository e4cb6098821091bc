"""LoRA through a pipeline has no calibration run (every LoRA run in the data is pp 1): its band
says "not covered", and `solve` takes the fastest plan without a pipeline where it lies within
that plan's error band of the pipelined one (`planner.search.support`), as for ZeRO-2 / -3."""

import dataclasses

from planner import bands, switches
from planner.catalog import load_model, load_system
from planner.search.hybrid import Search
from planner.search.support import NO_PIPELINE, supported_solve
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len


def _request(devices: int, **pins) -> tuple:
    """The Llama 2 70B LoRA job of MLPerf (rank 16, sequence 8,192, global batch 8) on
    `devices` H100 in fp8, its recipe's switches, every plan choice free unless pinned."""
    m = with_seq_len(load_model("llama2-70b"), 8192)
    q = Search(global_batch=8, devices=devices, grad_reduce_bf16=True, cuda_graphs=True,
               lora_rank=16, fp8_attention=True, fp8_weight_gather=True, host_sync=False,
               weight_cache=False, fp8_activation_input=True,
               searched=tuple(n for n in switches.SEARCHED if n != "fp8_weight_gather"),
               **pins)
    return m, load_system("dgx-h100"), q


def test_no_residual_row_is_a_lora_pipeline():
    assert {r["lora_pipeline"] for r in bands.residuals()} == {"no"}


def test_a_lora_pipeline_is_not_covered_and_the_pick_weighs_the_plan_without_one(no_memory_reach):
    m, system, q = _request(8)
    fastest, pick = supported_solve(m, system, Precision.fp8, q)
    assert fastest.plan.lora_rank == 16 and fastest.plan.pp > 1
    note = fastest.prediction.time_band["note"]
    assert note.startswith("not covered") and "LoRA fine-tuning through a pipeline" in note
    sup = pick.support
    assert sup["covered_by"] == NO_PIPELINE and sup["alternative"]["config"]["pp"] == 1
    alt, tol = sup["alternative"]["objective_value"], sup["tolerance"]
    assert tol > 0 and sup["taken"] == (alt <= (1 + tol) * fastest.objective.value)
    assert (pick.plan.pp == 1) == sup["taken"]
    # the alternative is the fastest plan the search finds with pp 1 pinned
    only = supported_solve(m, system, Precision.fp8, dataclasses.replace(q, pp=1))[1]
    assert only.objective.value == alt and "low_s" in only.prediction.time_band
    # a fraction of 0 keeps the pipeline, naming the covered plan
    kept = supported_solve(m, system, Precision.fp8, q, prefer=0.0)[1]
    assert kept.plan.pp > 1 and not kept.support["taken"]


def test_a_pinned_pipeline_is_the_users_and_said_to_be_not_covered(no_memory_reach):
    m, system, q = _request(8, pp=2)
    fastest, pick = supported_solve(m, system, Precision.fp8, q)
    sup = pick.support
    assert pick.plan == fastest.plan and pick.plan.pp == 2 and sup["covered_by"] == "pp 1"
    assert "LoRA fine-tuning through a pipeline" in sup["note"]
    assert sup["alternative"] is None and not sup["taken"]


def test_solve_says_which_plan_it_took_or_names_the_one_without_a_pipeline(run, no_memory_reach):
    args = ("solve", "-m", "llama2-70b", "-H", "dgx-h100", "--devices", "8", "--global-batch",
            "8", "--seq-len", "8192", "--lora-rank", "16", "--precision", "fp8",
            # the MLPerf recipe's switches (`planner.mlperf.plan_of`)
            "--fp8-weight-gather", "--no-weight-cache", "--fp8-activation-input",
            "--cuda-graphs", "--no-host-sync")
    code, _, err = run(*args)
    assert code == 0
    line = next(x for x in err.splitlines() if "pipeline" in x)
    assert ("took the fastest plan without a pipeline (pp 1" in line
            or "without a pipeline, the fastest plan is" in line and "--pp 1 pins it" in line)


def test_a_pinned_sharded_stage_offers_no_pipeline_free_plan_that_is_still_uncovered():
    """With ZeRO 2 pinned a plan without a pipeline is still not covered (its gradients
    sharded): nothing is offered beside the pick, which is the fastest."""
    m, system, q = _request(8, zero=2)
    fastest, pick = supported_solve(m, system, Precision.fp8, q, prefer=0.5)
    assert pick is fastest


def test_band_groups_name_no_lora_pipeline_feature_of_other_plans():
    m, system, q = _request(8, pp=1, zero=1)
    sol = supported_solve(m, system, Precision.fp8, q)[1]
    group = sol.prediction.time_band["group"]
    assert group.endswith("dense, weights whole") and "no" not in group.split(", ")
