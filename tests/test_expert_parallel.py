"""Expert parallelism (--ep): experts split over ep ranks within dp x cp, tokens dispatched
and combined by all-to-all; exact memory and traffic against their formulas, the search
against brute force, and the CLI / launcher contract."""

import dataclasses
import itertools
import math

import pytest

from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.search.hybrid import HybridSolver, Search
from planner.spec.hardware import Precision
from planner.spec.transformer import build_transformer
from tests.brute import fastest_fitting


def _hw(**changes):
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    return dataclasses.replace(hw, launch_s=0.0, gemm_half_dim=0.0, **changes)


def _cfg(**over):
    cfg = {"t": 1, "p": 1, "d": 8, "mb": 1, "acc": 2, "v": 1, "cp": 1, "ep": 1, "recompute": 0,
           "sp": 0, "zero": 0, "gpipe": 0, "overlap": True, "flash_attention": True}
    return cfg | over


def _moe():
    return build_transformer({"kind": "transformer", "name": "moe", "layers": 4, "hidden": 512,
                              "heads": 8, "seq_len": 1024, "vocab": 1000, "ffn_kind": "swiglu",
                              "ffn_hidden": 1024, "bias": False, "norm": "rmsnorm",
                              "position_embedding": "rotary",
                              "moe": {"experts": 8, "top_k": 2}}, "test")


def test_ep_divides_the_routed_experts_weights_exactly():
    m, hw = load_model("mixtral-8x7b"), _hw()
    one = float(iteration(m, hw, _cfg(t=2))["weights"])
    experts = m.layers * m.experts * m.expert_params() / 2 * hw.value_bytes  # over t = 2
    for ep in (2, 4, 8):
        got = float(iteration(m, hw, _cfg(t=2, ep=ep))["weights"])
        assert got == pytest.approx(one - experts * (1 - 1 / ep), rel=1e-12)


def test_zero_shards_expert_state_over_the_expert_data_parallel_ranks():
    """ZeRO-1 with d = 8, ep = 4: dense optimizer state / 8, expert state / (8 / 4)."""
    m, hw = load_model("mixtral-8x7b"), _hw()
    got = float(iteration(m, hw, _cfg(ep=4, zero=1))["optimizer_state"])
    experts = m.layers * m.experts * m.expert_params()
    dense = m.params() - experts  # embeddings and head: the one stage holds both
    dense_local = (m.layers * (m.layer_params() - m.experts * m.expert_params())
                   + m.embedding_params() + m.head_params())
    assert dense_local == dense
    assert got == pytest.approx((dense_local / 8 + experts / 4 / 2) * 12, rel=1e-12)


def test_all_to_all_inside_the_node_is_its_formula():
    """ep = 4 on one node: per MoE layer four all-to-alls (dispatch and combine, forward and
    backward) of b s top_k h values, (ep - 1) / ep of them leaving each rank."""
    m, hw = _moe(), _hw()
    out = iteration(m, hw, _cfg(ep=4, d=4, acc=1))
    routed = m.seq_len * m.top_k * m.hidden * hw.value_bytes
    a2a = hw.intra_lat + routed * 3 / 4 / hw.intra_bw
    assert float(out["ep_comm"]) == pytest.approx(m.layers * 4 * a2a, rel=1e-9)
    assert float(iteration(m, hw, _cfg(d=4, acc=1))["ep_comm"]) == 0.0


def test_ep_one_is_the_plan_without_it():
    m = load_model("mixtral-8x7b")
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    cfg = _cfg(t=2, p=2, d=2, mb=1, acc=4, recompute=1, sp=1, zero=1)
    a = iteration(m, hw, cfg)
    b = iteration(m, hw, {k: v for k, v in cfg.items() if k not in ("cp", "ep")})
    for k in a:
        assert float(a[k]) == float(b[k]), k


@pytest.mark.slow
def test_search_with_ep_equals_brute_force():
    m, system = _moe(), load_system("dgx-h100")
    B, budget = 16, 16
    best = fastest_fitting(m, system, B, budget, (
        {"t": t, "ep": ep, "p": p, "d": d, "mb": mb} for t, ep, p, d, mb in itertools.product(
            (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4), (1, 2, 4, 8, 16), (1, 2, 4, 8, 16))))
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, interleave=1)).solve()
    assert sol.status == "optimal"
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


def test_cli_ep(run, run_json):
    code, _, err = run("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "8",
                       "--ep", "2", "--global-batch", "8")
    assert code == 2 and "ep" in err and "dense" in err
    code, _, err = run("evaluate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "--devices", "8",
                       "--ep", "16", "--global-batch", "16", "--seq-len", "4096")
    assert code == 2 and "ep" in err
    args = ("evaluate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "--devices", "64", "--tp",
            "2", "--ep", "8", "--seq-len", "4096", "--global-batch", "256", "--zero", "1",
            "--recompute", "full", "--sequence-parallel")
    doc = run_json(*args)
    assert doc["config"]["ep"] == 8 and doc["prediction"]["time_breakdown"]["ep_comm"] > 0
    code, out, _ = run(*args, "--format", "megatron")
    assert code == 0 and "--expert-model-parallel-size 8" in " ".join(out.split())
    code, _, err = run(*args, "--format", "deepspeed")
    assert code == 2 and "expert-parallel" in err
