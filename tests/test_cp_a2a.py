"""All-to-all context parallelism (`--cp-a2a`, Megatron-LM's --cp-comm-type a2a, Transformer
Engine's AttnFuncWithCPAndQKVOA2A, DeepSpeed Ulysses): the exchanges against their formula,
one attention call over the whole sequence against the curve, cp 1 as the plan without it,
the heads rule and attention sinks, the search against brute force, the pick for the vendor's
LoRA job, and the CLI / launcher contract."""

import dataclasses
import itertools
import math

import pytest

from planner import api
from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.expr import symbols as S
from planner.expr.transformer import Choices, TransformerExpressions
from planner.search.hybrid import HybridSolver, Search
from planner.spec.hardware import Precision
from planner.spec.transformer import build_transformer, with_seq_len
from tests.brute import fastest_fitting
from tests.test_context_parallel import _cfg as ring_cfg
from tests.test_context_parallel import _hw
from tests.test_launch import _megatron_flags, _out


def _cfg(**over):
    return ring_cfg(**{"acc": 1, **over})  # one micro-batch: nothing overlaps the next


def test_the_exchanges_are_their_formula():
    """Per layer and pass four all-to-alls over the cp ranks, in line: Q, K, V and O (dO, dQ,
    dK, dV backward), each rank sending (cp - 1) / cp of its s / cp tokens' values of each:
    cp_comm = L x 2 x sum_x (alpha + x (cp - 1) / cp / beta), at any link speed (nothing
    hides them, unlike the ring)."""
    m = with_seq_len(load_model("llama3-8b"), 8192)
    cp, t = 4, 2
    for bw in (1e9, 450e9):
        hw = _hw(intra_bw=bw)
        out = iteration(m, hw, _cfg(t=t, cp=cp, sp=1, cp_a2a=True))
        tok = m.seq_len / cp
        widths = (m.q_dim, m.kv_dim, m.kv_dim, m.q_dim)  # Llama: v and qk heads alike
        one = sum(hw.intra_lat + tok * w / t * 2 * (cp - 1) / cp / hw.intra_bw
                  for w in widths)
        assert float(out["cp_comm"]) == pytest.approx(m.layers * 2 * one, rel=1e-9)


def test_cp_one_prices_the_switch_as_off():
    m = load_model("llama3-8b")
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    cfg = _cfg(t=2, p=2, d=2, mb=2, acc=4, recompute=1, sp=1, zero=1)
    a, b = iteration(m, hw, cfg | {"cp_a2a": True}), iteration(m, hw, cfg)
    for k in a:
        assert float(a[k]) == float(b[k]), k


def _core(m, hw, cp, a2a):
    ex = TransformerExpressions(m, hw, Choices(cp_a2a=a2a), cp=cp)
    return float(ex.parts()[1].subs({S.t: 1, S.b: 1}))


def test_one_attention_call_runs_at_the_whole_sequence_rate():
    """The same FLOPs either way (s / cp queries on every head, or s queries on 1 / cp of
    them); the ring's cp calls of s / cp keys each, one of them masked, run at the curve's
    rate for s / cp keys, the all-to-all's one causal call at its rate for s keys."""
    m = with_seq_len(load_model("llama2-70b"), 8192)
    hw = _hw()
    cp, s, width = 8, m.seq_len, m.head_dim
    ring, a2a = _core(m, hw, cp, False), _core(m, hw, cp, True)
    rate = lambda keys, masked: hw.flash.achieved("fwd", width, keys, masked)  # noqa: E731
    assert a2a / ring == pytest.approx(rate(s / cp, 1 / cp) / rate(s, 1), rel=1e-9)
    assert a2a < ring
    # cp 1: one call either way
    assert _core(m, hw, 1, True) == pytest.approx(_core(m, hw, 1, False), rel=1e-12)


def _tiny_long():
    return build_transformer({"kind": "transformer", "name": "tiny-long", "layers": 4,
                              "hidden": 256, "heads": 8, "seq_len": 16384, "vocab": 1024,
                              "ffn_kind": "swiglu", "ffn_hidden": 512, "bias": False,
                              "norm": "rmsnorm", "position_embedding": "rotary"}, "test")


def test_search_with_cp_a2a_equals_brute_force():
    """The search tries the exchange on and off where cp > 1 and keeps it only where the heads
    split: its pick is the fastest of every split with either, by brute force."""
    m, system = _tiny_long(), load_system("dgx-h100")
    B, budget = 4, 16
    splits = [{"t": t, "cp": cp, "p": 1, "d": d, "mb": mb}
              for t, cp, d, mb in itertools.product((1, 2, 4), (1, 2, 4, 8), (1, 2, 4),
                                                    (1, 2, 4))]
    ring = fastest_fitting(m, system, B, budget, splits)
    a2a = fastest_fitting(m, system, B, budget, [s for s in splits if s["cp"] > 1],
                          cp_a2a=True)
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, pp=1,
                              searched=("cp_a2a",))).solve()
    assert sol.status == "optimal"
    assert math.isclose(sol.prediction.iteration_time_s, min(ring, a2a), rel_tol=1e-12)
    assert sol.plan.cp_a2a == (a2a < ring)


def test_the_lora_pick_is_the_vendors_recipe():
    """Llama 2 70B LoRA on 72 GB300 (MLPerf's job): the search takes NVIDIA's own recipe, tp 1
    x cp 8 with the all-to-all (faster than cp 8 by the ring: one attention call of 8,192 keys,
    no merge of the ring's steps)."""
    kw = dict(devices=72, global_batch=9, seq_len=8192, precision="fp8", lora_rank=16,
              fp8_attention=True, cuda_graphs=True, host_sync=False)
    sol = api.solve("llama2-70b", "gb300-nvl72", **kw)
    assert (sol.plan.tp, sol.plan.cp, sol.plan.cp_a2a) == (1, 8, True)
    ring = api.evaluate("llama2-70b", "gb300-nvl72", tp=1, cp=8, **kw)
    assert sol.prediction.iteration_time_s < ring.prediction.iteration_time_s


def test_the_heads_must_split_over_tp_x_cp(run):
    code, _, err = run("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16",
                       "--tp", "2", "--cp", "8", "--cp-a2a", "--global-batch", "8")
    assert code == 2 and "cp_a2a:" in err and "8 key-value heads" in err
    assert "Traceback" not in err


def test_attention_sinks_run_context_parallelism_by_all_to_all_only(run, run_json):
    args = ("-m", "gpt-oss-20b", "-H", "gb300-nvl72", "--devices", "72", "--global-batch",
            "36", "--seq-len", "8192", "--precision", "mxfp8", "--cp", "2")
    code, _, err = run("evaluate", *args, "--tp", "1", "--no-cp-a2a")
    assert code == 2 and "attention sinks" in err
    assert run_json("solve", *args)["config"]["cp_a2a"] is True


def test_megatron_writes_the_exchange_and_torchtitan_refuses_it(run, run_json):
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--cp", "4",
            "--seq-len", "32768", "--global-batch", "4", "--cp-a2a", "--zero", "1",
            "--recompute", "full")
    assert run_json(*args)["config"]["cp_a2a"] is True
    flags = _megatron_flags(_out(run, *args, "--format", "megatron"))
    assert flags["--cp-comm-type"] == ["a2a"] and flags["--context-parallel-size"] == ["4"]
    code, _, err = run(*args, "--format", "torchtitan")
    assert code == 2 and "ring attention" in err


def test_the_mlperf_rows_price_the_exchange_their_recipes_set():
    """The LoRA recipes' YAML defaults CP_COMM_TYPE to a2a from v5.0 on (extracted into
    `cp_comm_type`); v4.x's had no such key (Megatron-LM's p2p ring); gpt-oss's attention
    sinks run it by all-to-all only; pretraining recipes keep the ring."""
    from planner import mlperf

    def plan(round_, system, bench):
        run = next(r for r in mlperf.read() if (r.row["round"], r.row["system"],
                                                 r.row["benchmark"]) == (round_, system, bench))
        return mlperf.plan_of(run)

    assert plan("v5.1", "theia_ngpu72_ngc25.09_nemo", "llama2_70b_lora").cp_a2a
    assert plan("v6.0", "theia_ngpu72_ngc26.04_nemo", "gpt_oss_20b").cp_a2a
    assert not plan("v4.1", "512xBM.GPU.H100.8", "llama2_70b_lora").cp_a2a
    assert not plan("v5.1", "theia_ngpu512_ngc25.09_nemo", "llama31_8b").cp_a2a
    assert not plan("v5.1", "theia_ngpu8_ngc25.09_nemo", "llama2_70b_lora").cp_a2a  # cp 1


def test_each_ring_step_is_a_kernel_call():
    """Issued by the host (no CUDA graphs), ring attention's c_p calls a pass each take at
    least the host's issue time, the all-to-all's one call once: on a short sequence, where
    every call is issue-bound, the cores are exactly c_p and 1 issue times."""
    m = with_seq_len(load_model("llama3-8b"), 1024)
    hw = dataclasses.replace(Hardware.of(load_system("dgx-h100"), Precision.bf16),
                             launch_s=1e-3)
    assert _core(m, hw, 4, False) == pytest.approx(4 * hw.launch_s, rel=1e-12)
    assert _core(m, hw, 4, True) == pytest.approx(hw.launch_s, rel=1e-12)
