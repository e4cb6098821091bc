"""Partial recomputation (Megatron-LM --recompute-method block --recompute-num-layers N: the
first N layers of each pipeline chunk recomputed, the rest keeping their activations): against
the no- and full-recompute evaluations it must lie between, the activation count written out
from the per-layer bytes, the launchers' flags, the search against brute force."""

import itertools
import json
import math

import pytest

from planner import api
from planner.catalog import load_model, load_system
from planner.cost.transformer import PARTIAL, Hardware, activation_bytes_per_layer
from planner.errors import SpecError
from planner.plan import Plan, stage_layers
from planner.search.hybrid import HybridSolver, Search
from planner.spec.hardware import Precision
from tests.brute import fastest_fitting

# GPT-3 175B on 1,024 A100: 96 layers in 16 stages of 6
GPT3 = dict(global_batch=1536, devices=1024, tp=8, pp=16, micro_batch=1, sequence_parallel=True)


def _eval(**over):
    return api.evaluate("gpt3-175b", "dgx-a100-80gb", **(GPT3 | over)).prediction


def test_recomputing_n_of_a_stages_layers_interpolates_the_iteration_exactly():
    """Every stage holds 6 layers, so every term that grows with recomputation (compute, tp
    collectives, the bubble) is 6 kept layers plus N x a recomputed layer's extra: the
    iteration is none + N / 6 (full - none), at one chunk per stage and at two of 3 layers
    (N = 1 of each chunk: 2 of the stage's 6)."""
    none, full = _eval(), _eval(recompute="full")
    assert full.iteration_time_s > none.iteration_time_s
    for n in (1, 2, 5):
        got = _eval(recompute_layers=n)
        assert got.iteration_time_s == pytest.approx(
            none.iteration_time_s + n / 6 * (full.iteration_time_s - none.iteration_time_s),
            rel=1e-9)
    two = dict(interleave=2, global_batch=1536)
    none, full = _eval(**two), _eval(recompute="full", **two)
    got = _eval(recompute_layers=1, **two)
    assert got.iteration_time_s == pytest.approx(
        none.iteration_time_s + 2 / 6 * (full.iteration_time_s - none.iteration_time_s),
        rel=1e-9)


def test_all_of_a_chunk_is_full_recomputation():
    full = _eval(recompute="full")
    for n in (6, 7, 100):
        got = _eval(recompute_layers=n)
        assert got.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-12)
        assert got.memory_bytes_per_device == pytest.approx(full.memory_bytes_per_device,
                                                            rel=1e-12)


def test_activations_are_the_kept_layers_whole_and_the_recomputed_inputs():
    """First stage, 1F1B: min(p, m) = 16 micro-batches in flight, each holding (6 - N) layers'
    full activations and N layers' inputs; one layer's activations rebuilt in the backward."""
    m, n = load_model("gpt3-175b"), 2
    hw = Hardware.of(load_system("dgx-a100-80gb"), Precision.fp16)
    kept = activation_bytes_per_layer(m, hw, 8, 1, "none", True)
    inputs = activation_bytes_per_layer(m, hw, 8, 1, "full", True)
    want = 16 * ((6 - n) * kept + n * inputs) + kept
    got = _eval(recompute_layers=n).memory_breakdown["activations"]
    assert got == pytest.approx(want, rel=1e-9)


def test_hardware_flops_count_the_recomputed_layers():
    """HFU: the model's FLOPs plus one forward of the recomputed layers' matmuls (SC21 eq. 3
    for all of them): N x pp of the 96 layers."""
    none, full = _eval(), _eval(recompute="full")
    got = _eval(recompute_layers=2)
    extra = full.hardware_flops_per_iteration - none.hardware_flops_per_iteration
    assert got.hardware_flops_per_iteration == pytest.approx(
        none.hardware_flops_per_iteration + extra * 32 / 96, rel=1e-12)


def test_hardware_flops_count_what_each_pinned_stage_recomputes():
    """First stage pinned at 2 layers, last at 10: the 14 others hold 6 each. With N = 5 the
    first recomputes its 2, the others 5 each: 2 + 14 x 5 + 5 = 77 of the 96 layers (even
    stages: 16 x 5 = 80)."""
    none, full = _eval(), _eval(recompute="full")
    pins = {"first_stage_layers": 2, "last_stage_layers": 10}
    got = _eval(recompute_layers=5, **pins)
    extra = full.hardware_flops_per_iteration - none.hardware_flops_per_iteration
    assert got.hardware_flops_per_iteration == pytest.approx(
        none.hardware_flops_per_iteration + extra * 77 / 96, rel=1e-12)


@pytest.mark.parametrize("over, message", [
    ({"recompute": "selective", "recompute_layers": 2}, "full recomputation"),
    ({"recompute_layers": 0}, "positive integer"),
])
def test_partial_recompute_refuses_what_it_is_not(over, message):
    with pytest.raises(SpecError, match=message):
        _eval(**over)


def test_search_refuses_partial_recompute_with_the_all_to_all_overlap_up_front():
    with pytest.raises(SpecError, match="ep_overlap: overlapping the all-to-alls needs no full"):
        HybridSolver(load_model("mixtral-8x7b"), load_system("dgx-h100"), Precision.bf16,
                     Search(global_batch=64, devices_max=64, recompute_layers=1,
                            ep_overlap=True))


def test_partial_recompute_with_offload_is_refused():
    with pytest.raises(SpecError, match="offload"):
        Plan(1, 8, 8, 1, 1, 1, 8, recompute="full", recompute_layers=1,
             offload_activations=True)


def test_cli_partial_recompute_json_and_bad_input(run):
    args = ("evaluate", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices", "1024",
            "--tp", "8", "--pp", "16", "--micro-batch", "1", "--global-batch", "1536",
            "--sequence-parallel", "--recompute-layers", "2")
    code, out, _ = run(*args, "--format", "json")
    assert code == 0
    config = json.loads(out)["config"]
    assert (config["recompute"], config["recompute_layers"]) == ("full", 2)
    code, _, err = run(*args, "--recompute", "selective")
    assert code == 2 and err.count("\n") == 1 and "recompute_layers" in err
    code, _, err = run("limits", "-m", "gpt3-175b", "-H", "dgx-a100-80gb",
                       "--global-batch", "1536", "--recompute-layers", "2")
    assert code == 2 and "recompute_layers" in err


def test_launchers_write_the_block_method_and_every_kth_layer(run):
    """Megatron-LM: --recompute-method block --recompute-num-layers N (arguments.py choices
    uniform / block). torchtitan: layer selective AC every k-th block, k = layers per chunk /
    N, where that is whole."""
    args = ("evaluate", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "64", "--tp", "8",
            "--pp", "4", "--micro-batch", "1", "--global-batch", "64", "--sequence-parallel",
            "--recompute-layers", "5")
    code, out, _ = run(*args, "--format", "megatron")
    assert code == 0
    flags = out.split()
    i = flags.index("--recompute-method")
    assert flags[i + 1] == "block"
    assert flags[flags.index("--recompute-num-layers") + 1] == "5"
    assert flags[flags.index("--recompute-granularity") + 1] == "full"
    from tests.test_launch_torchtitan import torchtitan_config

    # today's torchtitan (b5bcd76) has no every-k-th-layer checkpointing: N short of a
    # stage is refused; N at least a whole chunk (20 layers a stage) recomputes every layer
    code, _, err = run(*args, "--format", "torchtitan")
    assert code == 2
    code, out, _ = run(*args[:-1], "20", "--format", "torchtitan")
    assert code == 0
    assert type(torchtitan_config(out).activation_checkpoint).__name__ == "FullAC.Config"


def test_search_with_pinned_partial_recompute_equals_brute_force():
    m, system = load_model("llama3-8b"), load_system("dgx-h100")
    B, budget, n = 32, 16, 2
    best = fastest_fitting(m, system, B, budget, (
        {"t": t, "p": p, "d": d, "mb": mb} for t, p, d, mb in itertools.product(
            (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4, 8, 16, 32))),
        recompute_layers=n)
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, interleave=1, cp=1,
                              recompute_layers=n)).solve()
    assert sol.status == "optimal"
    assert (sol.plan.recompute.value, sol.plan.recompute_layers) == ("full", n)
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


def test_search_recomputes_the_fewest_layers_that_fit():
    """Llama-3-70B on two DGX H100 at tp 8 x pp 2 (40 layers a stage), one micro-batch: no
    recomputation does not fit, so the search recomputes the fewest layers of each chunk that
    do, N, found by bisection: N - 1 does not fit, and N is faster than full recomputation."""
    m, system = load_model("llama3-70b"), load_system("dgx-h100")
    pins = dict(global_batch=64, devices=16, tp=8, pp=2, cp=1, micro_batch=1)
    sol = HybridSolver(m, system, Precision.bf16, Search(**pins)).solve()
    plan, n = sol.plan, sol.plan.recompute_layers
    assert plan.recompute.value == "full" and 1 < n < 40

    def run(**over):
        return api.evaluate("llama3-70b", "dgx-h100", precision="bf16", devices=16, tp=8,
                            pp=2, micro_batch=1, global_batch=64, zero=plan.zero,
                            interleave=plan.interleave,
                            sequence_parallel=plan.sequence_parallel, **over).prediction
    assert run(recompute_layers=n).fits_memory and not run(recompute_layers=n - 1).fits_memory
    assert not run(recompute="none").fits_memory
    assert run(recompute_layers=n).iteration_time_s < run(recompute="full").iteration_time_s
    assert sol.prediction.iteration_time_s == run(recompute_layers=n).iteration_time_s


@pytest.mark.slow
def test_search_over_recompute_with_partial_equals_brute_force():
    """Free recompute on Llama-3-70B at tp 8 within two DGX H100, where memory binds: the
    search (none, selective, full, and the fewest partial layers that fit, by bisection)
    against brute force over every layer count."""
    m, system = load_model("llama3-70b"), load_system("dgx-h100")
    B, budget = 16, 16
    best = fastest_fitting(m, system, B, budget, (
        {"t": 8, "p": p, "d": d, "mb": mb} for p, d, mb in itertools.product(
            (1, 2), (1, 2), (1, 2, 4, 8, 16))))
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, tp=8, interleave=1,
                              cp=1)).solve()
    assert sol.status == "optimal" and sol.plan.recompute_layers is not None
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("pins, budget", [
    ({"tp": 4, "pp": 8, "first_stage_layers": 3, "last_stage_layers": 11}, 32),
    ({"tp": 4, "pp": 4, "first_stage_layers": 22, "last_stage_layers": 22}, 32),
    ({"tp": 8, "pp": 2, "interleave": 2}, 16),
])
def test_partial_search_on_pinned_stages_and_chunks_equals_brute_force(pins, budget):
    """Llama-3-70B where memory binds and the stages differ (pinned first / last stages: the
    largest stage sets the chunk, the first holds the most micro-batches) or each stage runs
    two chunks: the fewest layers that fit, against brute force over every count."""
    m, system = load_model("llama3-70b"), load_system("dgx-h100")
    B, t, p = 16, pins["tp"], pins["pp"]
    rest = {k: v for k, v in pins.items() if k not in ("tp", "pp")}
    best = fastest_fitting(m, system, B, budget, (
        {"t": t, "p": p, "d": d, "mb": mb} for d, mb in itertools.product(
            (1, 2, 4), (1, 2, 4, 8, 16))), **rest)
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, cp=1,
                              **{"interleave": 1} | pins)).solve()
    assert sol.status == "optimal" and sol.plan.recompute_layers is not None
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)
    # every partial row recomputes less than a whole chunk (a whole chunk is full recompute)
    solver = HybridSolver(m, system, Precision.bf16, Search(
        global_batch=B, devices_max=budget, cp=1, **{"interleave": 1} | pins))
    solver.rows()
    rows = solver.plans
    v = pins.get("interleave", 1)
    chunk = max(stage_layers(m.layers, p, v, pins.get("first_stage_layers"),
                             pins.get("last_stage_layers"))) // v
    partial = rows[rows["rec"] == PARTIAL]
    assert len(partial) and partial["rl"].min() >= 1 and partial["rl"].max() < chunk
