"""fp8-saved activations (Transformer Engine keeps the fp8 cast each fp8 GEMM ran on for its
backward): the saved GEMM inputs at 1 byte, written out tensor by tensor; the rules and the
launchers."""

import itertools
import json
import math

import pytest

from planner import api
from planner.catalog import load_model, load_system
from planner.errors import SpecError
from planner.search.hybrid import HybridSolver, Search
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len
from tests.brute import fastest_fitting


def _acts(model, fp8, **plan):
    return api.evaluate(model, "dgx-h100", precision="fp8", fp8_activations=fp8,
                        **plan).prediction.memory_breakdown["activations"]


def test_dense_layer_saves_its_gemm_inputs_at_one_byte():
    """Llama-3-8B (h 4,096, FFN 14,336, s 8,192) at tp 2 with sequence parallelism, pp 1 (one
    micro-batch in flight): per layer the two norm outputs (QKV's and fc1's input, each
    8,192 x 4,096 split over tp) and fc2's input (8,192 x 14,336 / tp) drop from 2 bytes to 1;
    the out-projection keeps a 1-byte copy of its input (8,192 x 4,096 / tp) beside the 16-bit
    output flash attention saves, and without flash holds that input in fp8 alone; the norm
    inputs, Q / K / V, fc1's output and the logits keep theirs. 32 layers."""
    plan = dict(devices=8, tp=2, global_batch=32, sequence_parallel=True)
    saved = 32 * 8_192 * (2 * 4_096 - 4_096 + 14_336) / 2
    assert _acts("llama3-8b", False, **plan) - _acts("llama3-8b", True, **plan) == saved
    unfused = {**plan, "flash_attention": False}
    saved = 32 * 8_192 * (2 * 4_096 + 4_096 + 14_336) / 2
    assert _acts("llama3-8b", False, **unfused) - _acts("llama3-8b", True, **unfused) == saved


def test_moe_layer_keeps_the_routers_input_and_saves_the_experts_in_fp8():
    """Mixtral-8x7B (top 2 of 8, FFN 14,336) at s 4,096, ep 8, tp 1: the FFN's norm output
    stays 16-bit (the router saves it); the attention's norm output (4,096), the two routed
    copies of each token (2 x 4,096) and their fc2 inputs (2 x 14,336) drop to 1 byte; the
    out-projection adds its 1-byte copy (4,096) beside flash attention's output."""
    plan = dict(devices=8, ep=8, global_batch=32, seq_len=4_096)
    saved = 32 * 4_096 * (4_096 - 4_096 + 2 * 4_096 + 2 * 14_336)
    assert _acts("mixtral-8x7b", False, **plan) - _acts("mixtral-8x7b", True, **plan) == saved


def test_full_recompute_saves_the_layer_input_and_rebuilds_one_layer_in_fp8():
    """Each fully recomputed layer keeps its 16-bit input either way; the one layer rebuilt
    in the backward saves its GEMM inputs in fp8: one layer's saving of the test above."""
    plan = dict(devices=8, tp=2, global_batch=32, sequence_parallel=True, recompute="full")
    one_layer = 8_192 * (2 * 4_096 - 4_096 + 14_336) / 2
    assert _acts("llama3-8b", False, **plan) - _acts("llama3-8b", True, **plan) == one_layer


@pytest.mark.parametrize("over, message", [
    ({"precision": "bf16"}, "needs fp8 training"),
    ({"offload_activations": True}, "fp8_activations"),
])
def test_fp8_activations_refuse_what_they_cannot_be(over, message):
    with pytest.raises(SpecError, match=message):
        api.evaluate("llama3-8b", "gb200-nvl72", **({"devices": 8, "global_batch": 32,
                                                     "precision": "fp8",
                                                     "fp8_activations": True} | over))


def test_launchers_and_json(run):
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "8", "--tp", "2",
            "--sequence-parallel", "--zero", "1", "--global-batch", "32", "--precision", "fp8",
            "--fp8-activations")
    code, out, err = run(*args, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["config"]["fp8_activations"] is True
    code, out, _ = run(*args, "--format", "megatron")  # Transformer Engine's default
    assert code == 0 and "--fp8-format" in out.split()
    code, _, err = run(*args, "--format", "torchtitan")
    assert code == 2 and err.count("\n") == 1 and "torchao" in err
    code, _, err = run(*args[:-2], "bf16", "--fp8-activations")
    assert code == 2 and "fp8_activations" in err


@pytest.mark.slow
def test_search_with_fp8_activations_equals_brute_force():
    m, system = load_model("llama3-8b"), load_system("dgx-h100")
    B, budget = 32, 16
    best = fastest_fitting(m, system, B, budget, (
        {"t": t, "p": p, "d": d, "mb": mb} for t, p, d, mb in itertools.product(
            (1, 2, 4, 8), (1, 2, 4), (1, 2, 4, 8, 16), (1, 2, 4, 8))),
        precision=Precision.fp8, fp8_activations=True)
    sol = HybridSolver(m, system, Precision.fp8,
                       Search(global_batch=B, devices_max=budget, interleave=1, cp=1,
                              fp8_activations=True)).solve()
    assert sol.status == "optimal" and sol.plan.fp8_activations
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


def test_solve_chooses_fp8_activations_where_the_memory_they_free_buys_time():
    """Left free, `solve` tries the switch on and off: its plan is the faster of the two
    searches with it pinned. Llama-3-70B at s 8,192 on 64 H100 in fp8 needs full
    recomputation either way; the 1-byte inputs leave room for a faster split."""
    m = with_seq_len(load_model("llama3-70b"), 8_192)
    system = load_system("dgx-h100")

    def solve(**switch):
        q = Search(global_batch=64, devices=64, **switch)
        return HybridSolver(m, system, Precision.fp8, q).solve()

    off, on = solve(fp8_activations=False), solve(fp8_activations=True)
    free = solve(searched=("fp8_activations",))
    assert on.prediction.iteration_time_s < off.prediction.iteration_time_s
    assert free.plan.fp8_activations
    assert free.prediction.iteration_time_s == on.prediction.iteration_time_s


def test_solve_keeps_fp8_activations_off_beside_a_pinned_offload():
    """The two are not priced together: with the offload pinned on, the search leaves the
    switch off instead of refusing the request."""
    m = with_seq_len(load_model("llama3-8b"), 8_192)
    q = Search(global_batch=32, devices=8, offload_activations=True,
               searched=("fp8_activations",))
    solver = HybridSolver(m, load_system("gb200-nvl72"), Precision.fp8, q)
    assert "fp8_activations" not in solver.q.searched
    sol = solver.solve()
    assert sol.plan.offload_activations and not sol.plan.fp8_activations


def test_solve_for_a_launcher_form_tries_only_the_switches_it_writes(run, run_json):
    """`solve --format torchtitan` picks the fastest plan torchtitan starts: the fp8 weight
    gather and the fp8-saved inputs it cannot write stay off (the same request as JSON takes
    the weight gather), instead of picking them and refusing the plan."""
    args = ("solve", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "64", "--global-batch",
            "64", "--seq-len", "8192", "--precision", "fp8")
    free = run_json(*args)["config"]
    assert free["fp8_weight_gather"] or free["fp8_activations"]
    code, out, err = run(*args, "--format", "torchtitan")
    assert code == 0, err
    assert "torchtitan.train" in out and "float8" in out
    # the plan written is the one solved for torchtitan with the two pinned off (priced as
    # torchtitan runs it: beside the fastest ZeRO 2 plan the covered ZeRO 1 plan is weighed
    # under that framework's terms, which the default framework's solve need not match)
    pinned = run_json(*args, "--framework", "torchtitan", "--no-fp8-weight-gather",
                      "--no-fp8-activations")["config"]
    for key, value in (("tensor", pinned["tp"]), ("pipeline", pinned["pp"]),
                       ("context", pinned["cp"])):
        assert f"{key}_parallel_degree={value}," in out.replace(" ", "")
