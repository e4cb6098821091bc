"""Megatron-LM's sync-free MoE buffers (`--rank-capacity F`: --moe-expert-rank-capacity-factor)
and paged stash (`--paged-stash F`: --moe-paged-stash --moe-paged-stash-buffer-size-factor-cuda):
the routed experts' saved activations counted by hand and held at each factor, the stash's
budget-sized layer beside its pages, its copies as overlapped traffic, no token-count sync,
the refusals, the MLPerf v6.0 rows read with them, and the Megatron-LM flags through its own
parser."""

import json

import pytest

from planner import mlperf
from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.expr import graph as G
from planner.expr.choices import Choices
from planner.expr.layer import LayerCosts
from planner.expr.vocab import b, c_p, e_p, e_t, t
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len
from tests.test_launch import _megatron_flags, _out

S = 4096  # tokens of the one micro-batch


def _deepseek():
    m = with_seq_len(load_model("deepseek-v3"), S)
    return m, Hardware.of(load_system("gb300-nvl72"), Precision.bf16)


def _at(value, ep=32) -> float:
    """An expression of one layer at one sequence a micro-batch, tp 1, cp 1, etp 1."""
    return float(G.substitute(value, {t: 1, b: 1, c_p: 1, e_p: ep, e_t: 1}).subs({}))


def _run(m, hw, **switch):
    """One micro-batch on one pipeline stage at tp 1: every layer (and the MTP depth) in
    flight once."""
    cfg = {"t": 1, "p": 1, "d": 1, "mb": 1, "acc": 1, "v": 1, "cp": 1, "ep": 1, "etp": 1,
           "recompute": 0, "sp": 0, "zero": 0, "gpipe": 0, **switch}
    return {k: float(v) for k, v in iteration(m, hw, cfg).items()}


# DeepSeek-V3 in bf16, per token of a MoE layer at tp 1: each of the top_k 8 routed copies
# keeps fc1's input (h = 7,168 values), fc1's output (2 f = 4,096, SwiGLU's two halves) and
# the activation's output (f = 2,048, fc2's input), 2 bytes each
ROUTED_PER_TOKEN = 8 * (7168 + 2 * 2048 + 2048) * 2


def test_routed_saved_activations_counted_by_hand():
    m, hw = _deepseek()
    layer = LayerCosts(m, hw, Choices())
    routed = _at(layer.routed_saved_bytes())
    assert ROUTED_PER_TOKEN == 212_992
    assert routed == S * ROUTED_PER_TOKEN


@pytest.mark.parametrize("switch, factor", [({"rank_capacity": 4.0}, 4),
                                            ({"rank_capacity": 1.5}, 1.5)])
def test_rank_capacity_holds_the_routed_tensors_in_budget_sized_buffers(switch, factor):
    """Without the stash every routed tensor saved for the backward sits in the buffers sized
    at the rank's budget: (F - 1) x the routed bytes more, in each of the 58 MoE layers and
    the MTP depth's."""
    m, hw = _deepseek()
    moe = 58 + m.mtp_layers
    extra = _run(m, hw, **switch)["activations"] - _run(m, hw)["activations"]
    assert extra == pytest.approx((factor - 1) * moe * S * ROUTED_PER_TOKEN, rel=1e-12)


def test_the_paged_stash_holds_its_factor_and_one_layer_at_the_budget():
    """With the stash the routed tensors take its pages (1.5 x their balanced size) and the
    layer running holds its own in the budget-sized buffers (4 x) before they are copied in."""
    m, hw = _deepseek()
    moe = 58 + m.mtp_layers
    extra = (_run(m, hw, rank_capacity=4.0, paged_stash=1.5)["activations"]
             - _run(m, hw)["activations"])
    assert extra == pytest.approx((0.5 * moe + 4) * S * ROUTED_PER_TOKEN, rel=1e-12)


def test_the_stash_copies_are_traffic_beside_the_layers_gemms():
    """Each pass copies the routed tensors once (read and write), on the stash's streams:
    beside GEMMs longer than the copy it adds the copy's time x slowdown / (1 + slowdown)."""
    m, hw = _deepseek()
    kind = next(k for k, _ in m.layer_kinds() if k.ffn == "moe")
    off = LayerCosts(m, hw, Choices(rank_capacity=4.0))._kind_parts(kind)
    on = LayerCosts(m, hw, Choices(rank_capacity=4.0, paged_stash=1.5))._kind_parts(kind)
    copy = 2 * S * ROUTED_PER_TOKEN / hw.mem_bw
    assert copy > 3 * hw.launch_s  # above the kernels' floor: the traffic prices it
    proj = _at(off.proj)
    sigma = hw.overlap_slowdown
    assert copy < proj and 0 < sigma < 1
    for field, window in (("elem", proj), ("elem_bwd", 2 * proj)):
        added = _at(getattr(on, field)) - _at(getattr(off, field))
        assert added == pytest.approx(max(copy * sigma / (1 + sigma), copy - window), rel=1e-9)
        assert added == pytest.approx(copy * sigma / (1 + sigma), rel=1e-9)


def test_the_rank_capacity_drops_the_token_count_sync():
    """The dropless dispatcher waits for the tokens-per-expert count on the host (2 kernels);
    the sync-free buffers are sized before the step, so a MoE layer runs 2 kernels fewer."""
    m, hw = _deepseek()
    kind = next(k for k, _ in m.layer_kinds() if k.ffn == "moe")
    def kernels(kind, **switch):
        return _at(G.of(LayerCosts(m, hw, Choices(**switch)).elementwise_kernels(kind)))

    assert kernels(kind, rank_capacity=4.0) == kernels(kind) - 2
    dense = next(k for k, _ in m.layer_kinds() if k.ffn == "dense")
    assert kernels(dense, rank_capacity=4.0) == kernels(dense)


@pytest.mark.parametrize("args, message", [
    (["-m", "llama3-8b", "--rank-capacity", "2"], "rank_capacity: 'llama3-8b' is a dense"),
    (["-m", "qwen3-30b-a3b", "--paged-stash", "1.5"], "paged_stash: the paged stash needs "
                                                      "--rank-capacity"),
    (["-m", "qwen3-30b-a3b", "--rank-capacity", "0.5"], "rank_capacity: must be 0 (off) or "
                                                        "at least 1"),
    (["-m", "qwen3-30b-a3b", "--rank-capacity", "2", "--capacity-factor", "1.5"],
     "rank_capacity: --rank-capacity (a dropless budget per rank) is not priced with"),
    (["-m", "qwen3-30b-a3b", "--rank-capacity", "2", "--paged-stash", "1.5",
      "--offload-activations", "-H", "gb200-nvl72"],
     "paged_stash: --paged-stash is not priced with --offload-activations"),
])
@pytest.mark.parametrize("command", ["evaluate", "solve"])
def test_what_megatron_refuses_is_one_line_exit_2(run, command, args, message):
    base = [command, "-H", "dgx-h100", "--devices", "8", "--global-batch", "64",
            "--seq-len", "4096"] + (["--micro-batch", "1"] if command == "evaluate" else [])
    if "-H" in args:
        base = base[:1] + base[3:]
    code, _, err = run(*base, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"planner: {message}")


def test_solve_keeps_the_pinned_buffers(run):
    """The search prices every plan with the pinned buffers: its pick carries them and fits."""
    args = ["-m", "qwen3-30b-a3b", "-H", "dgx-h100", "--seq-len", "4096",
            "--rank-capacity", "4", "--paged-stash", "1.5", "--format", "json"]
    code, out, err = run("solve", "--devices", "16", "--global-batch", "256", *args)
    assert code == 0, err
    doc = json.loads(out)
    config = doc["config"]
    assert config["rank_capacity"] == 4 and config["paged_stash"] == 1.5
    assert doc["prediction"]["fits_memory"] is True


def test_megatron_writes_the_sync_free_path_its_parser_takes(run):
    """The flex dispatcher with HybridEP, the fused grouped experts (Transformer Engine's op
    fuser) and the two factors, parsed by Megatron-LM's parser (d98e8a6); expert tensor
    parallelism refused (the fused grouped experts run without it)."""
    base = ["evaluate", "-m", "deepseek-v3", "-H", "gb300-nvl72", "--devices", "512",
            "--tp", "1", "--pp", "8", "--ep", "32", "--micro-batch", "1", "--zero", "1",
            "--global-batch", "1024", "--seq-len", "4096", "--rank-capacity", "4",
            "--paged-stash", "1.5", "--format", "megatron"]
    flags = _megatron_flags(_out(run, *base))
    assert flags["--moe-token-dispatcher-type"] == ["flex"]
    assert flags["--moe-flex-dispatcher-backend"] == ["hybridep"]
    assert flags["--moe-expert-rank-capacity-factor"] == ["4.0"]
    assert flags["--moe-paged-stash-buffer-size-factor-cuda"] == ["1.5"]
    assert "--moe-paged-stash" in flags and "--use-transformer-engine-op-fuser" in flags
    assert "--moe-grouped-gemm" in flags
    tp2 = [a if a != "1" or base[i - 1] != "--tp" else "2" for i, a in enumerate(base)]
    code, _, err = run(*tp2, "--sequence-parallel")
    assert code == 2 and "need --etp 1" in err


def test_megatron_runs_squared_relu_experts_with_the_weighted_fusion(run, tmp_path):
    """Squared-ReLU experts (Nemotron 3's FFN) run in the fused grouped experts with
    Megatron-LM's weighted squared-ReLU fusion (`_is_fused_impl_supported`); the flag is
    Megatron's own (d98e8a6). Qwen3-30B-A3B with its FFN made squared ReLU."""
    from planner.catalog import MODELS

    text = (MODELS / "qwen3-30b-a3b.yaml").read_text()
    assert "ffn_kind: swiglu" in text
    spec = tmp_path / "relu2-moe.yaml"
    spec.write_text(text.replace("ffn_kind: swiglu", "ffn_kind: relu2"))
    flags = _megatron_flags(_out(run, "evaluate", "-m", str(spec), "-H", "dgx-h100",
                                 "--devices", "16", "--ep", "8", "--micro-batch", "1",
                                 "--global-batch", "64", "--zero", "1", "--rank-capacity", "2",
                                 "--format", "megatron"))
    assert "--squared-relu" in flags and "--use-fused-weighted-squared-relu" in flags
    assert flags["--moe-expert-rank-capacity-factor"] == ["2.0"]


def test_the_v6_moe_rows_run_with_their_buffers():
    """NVIDIA's, CoreWeave's and Google's DeepSeek-V3 recipes set a rank capacity of 4 and a
    paged stash of 1.5; the gpt-oss-20b recipes a rank capacity without the stash; Cisco's
    H100 runs a per-expert capacity (MOE_EXPERT_CAPACITY_FACTOR) and none."""
    rows = [r for r in mlperf.read() if r.moe and not r.why_not]
    plans = {(r.row["benchmark"], r.row["submitter"], r.row["system"]): mlperf.plan_of(r)
             for r in rows}
    deepseek = [p for (b, _, _), p in plans.items() if b == "deepseekv3_671b"]
    assert len(deepseek) == 10
    assert all((p.rank_capacity, p.paged_stash) == (4, 1.5) for p in deepseek)
    cisco = [p for (_, s, system), p in plans.items() if s == "Cisco" and "H100" in system]
    assert cisco and all(p.rank_capacity == 0 for p in cisco)
    nvidia_512 = plans[("gpt_oss_20b", "NVIDIA", "theia_ngpu512_ngc26.04_nemo")]
    assert (nvidia_512.rank_capacity, nvidia_512.paged_stash) == (7, 0)
