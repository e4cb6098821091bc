"""Context parallelism (--cp): the sequence split over cp ranks, K/V round a ring overlapped
with attention, gradients reduced over dp x cp; exact scalings, the exposed ring against its
formula, the search against brute force, and the CLI / launcher contract."""

import dataclasses
import itertools
import json
import math

import pytest

from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.search.hybrid import HybridSolver, Search
from planner.spec.hardware import Precision
from planner.spec.transformer import build_transformer, with_seq_len
from tests.brute import fastest_fitting


def _hw(**changes):
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    return dataclasses.replace(hw, launch_s=0.0, gemm_half_dim=0.0, **changes)


def _cfg(**over):
    cfg = {"t": 1, "p": 1, "d": 1, "mb": 1, "acc": 4, "v": 1, "cp": 1, "recompute": 0,
           "sp": 0, "zero": 0, "gpipe": 0, "overlap": True, "flash_attention": True}
    return cfg | over


def test_cp_divides_the_activations_exactly():
    m = with_seq_len(load_model("llama3-8b"), 32768)
    hw = _hw()
    one = iteration(m, hw, _cfg(t=2))["activations"]
    for cp in (2, 4, 8):
        assert float(iteration(m, hw, _cfg(t=2, cp=cp))["activations"]) == pytest.approx(
            float(one) / cp, rel=1e-12)


def test_cp_divides_compute_bound_work_exactly():
    """cp ranks each do 1/cp of the tokens' work (the attention core too: s / cp queries
    against s keys); only the score products' operand traffic does not halve (the keys stay
    whole), so the compute is half to within a percent."""
    m = with_seq_len(load_model("llama3-70b"), 16384)
    hw = _hw()
    one = float(iteration(m, hw, _cfg(t=8))["compute"])
    two = float(iteration(m, hw, _cfg(t=8, cp=2))["compute"])
    assert 0.5 <= two / one < 0.505


def test_exposed_kv_ring_is_its_formula():
    """On a slow link the ring shows: per layer ring - attention core forward and 2 ring -
    its backward, ring = (cp - 1) (alpha + 2 b (s/cp) kv / t x 2 B / beta) (K and V forward;
    K, V and their gradients backward, behind the fused kernel's own backward)."""
    m = with_seq_len(load_model("llama3-8b"), 8192)
    slow = _hw(intra_bw=1e9)
    cp, t = 4, 2
    out = iteration(m, slow, _cfg(t=t, cp=cp, acc=1))
    free = iteration(m, dataclasses.replace(slow, intra_bw=1e18, intra_lat=0.0),
                     _cfg(t=t, cp=cp, acc=1))
    kv_bytes = 2 * (m.seq_len / cp) * m.kv_dim / t * 2
    ring = (cp - 1) * (slow.intra_lat + kv_bytes / slow.intra_bw)
    # a free link hides the ring behind attention (but for the sigma share of its ~0 time)
    assert float(free["cp_comm"]) == pytest.approx(0.0, abs=1e-9)
    from planner.expr import symbols as S
    from planner.expr.transformer import Choices, TransformerExpressions

    ex = TransformerExpressions(m, slow, Choices(), cp=cp)
    parts = ex.parts()
    core, core_bwd = (float(parts[i].subs({S.t: t, S.b: 1})) for i in (1, 6))
    assert core_bwd > 2 * core  # the fused backward: 2.5x the FLOPs at a lower rate
    want = m.layers * ((ring - core) + (2 * ring - core_bwd))
    assert float(out["cp_comm"]) == pytest.approx(want, rel=1e-9)


def test_cp_one_is_the_plan_without_it():
    m = load_model("llama3-8b")
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    cfg = _cfg(t=2, p=2, d=2, mb=2, acc=4, recompute=1, sp=1, zero=1)
    a = iteration(m, hw, cfg)
    b = iteration(m, hw, {k: v for k, v in cfg.items() if k != "cp"})
    for k in a:
        assert float(a[k]) == float(b[k]), k


def test_gradients_are_reduced_and_sharded_over_dp_times_cp():
    """ZeRO-1 shards the optimizer state over the d x cp ranks holding the same weights."""
    m = with_seq_len(load_model("llama3-8b"), 16384)
    hw = _hw()
    four_dp = iteration(m, hw, _cfg(t=2, d=4, zero=1))["optimizer_state"]
    two_by_two = iteration(m, hw, _cfg(t=2, d=2, cp=2, zero=1))["optimizer_state"]
    assert float(two_by_two) == pytest.approx(float(four_dp), rel=1e-12)


def _tiny_long():
    return build_transformer({"kind": "transformer", "name": "tiny-long", "layers": 4,
                              "hidden": 256, "heads": 8, "seq_len": 8192, "vocab": 1024,
                              "ffn_kind": "swiglu", "ffn_hidden": 512, "bias": False,
                              "norm": "rmsnorm", "position_embedding": "rotary"}, "test")


@pytest.mark.slow
def test_search_with_cp_equals_brute_force():
    m, system = _tiny_long(), load_system("dgx-h100")
    B, budget = 8, 16
    best = fastest_fitting(m, system, B, budget, (
        {"t": t, "cp": cp, "p": p, "d": d, "mb": mb} for t, cp, p, d, mb in itertools.product(
            (1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4), (1, 2, 4, 8), (1, 2, 4, 8))))
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, interleave=1)).solve()
    assert sol.status == "optimal"
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


def test_cp_must_split_the_sequence_into_2cp_chunks(run):
    code, out, err = run("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "24",
                         "--cp", "3", "--global-batch", "8")
    assert code == 2 and "2 x cp" in err and "Traceback" not in err


def test_cli_cp_in_json_and_launchers(run, run_json):
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--tp", "2",
            "--cp", "4", "--seq-len", "32768", "--global-batch", "16", "--recompute", "full")
    doc = run_json(*args)
    assert doc["config"]["cp"] == 4 and doc["config"]["dp"] == 2
    assert "cp_comm" in doc["prediction"]["time_breakdown"]
    code, out, _ = run(*args, "--format", "megatron")
    assert code == 0 and "--context-parallel-size 4" in " ".join(out.split())
    from tests.test_launch_torchtitan import torchtitan_config

    # torchtitan shards the weights over dp x cp: priced as ZeRO 1-3, refused at ZeRO 0
    code, _, err = run(*args, "--format", "torchtitan")
    assert code == 2 and "context-parallel" in err
    code, out, _ = run(*args, "--zero", "1", "--format", "torchtitan")
    assert code == 0 and torchtitan_config(out).parallelism.context_parallel_degree == 4
    code, _, err = run(*args, "--format", "deepspeed")
    assert code == 2 and "context parallelism" in err
    code, out, _ = run(*args[:-2], "--format", "json", "--devices", "12")
    assert code == 2 and json.loads(out)["error"]["kind"] == "bad_input"
