"""A full-iteration CUDA graph (`--full-iteration-graph`, Megatron-LM --cuda-graph-impl
full_iteration): its kernels priced as the per-layer graphs', the gradients' reduce-scatter
after the backward (DDP's hooks do nothing while the graph is captured), the weights'
all-gather still overlapped; the exclusion, the launcher's flags and the MLPerf rows that ran it."""

import dataclasses

import pytest

from planner import mlperf
from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.errors import SpecError
from planner.plan import Plan
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len
from tests.test_launch import _megatron_flags


def _hw():
    return Hardware.of(load_system("dgx-b200"), Precision.bf16)


def _cfg(**over):
    cfg = {"t": 1, "p": 1, "d": 16, "mb": 1, "acc": 8, "v": 1, "cp": 1, "recompute": 0,
           "sp": 0, "zero": 1, "gpipe": 0, "overlap": True, "flash_attention": True,
           "grad_reduce_bf16": True}
    return cfg | over


def _out(**over):
    m = with_seq_len(load_model("llama3-8b"), 8192)
    return {k: float(v) for k, v in iteration(m, _hw(), _cfg(**over)).items()}


def test_its_kernels_are_priced_as_the_per_layer_graphs():
    full, layer = _out(full_iteration_graph=True), _out(cuda_graphs=True)
    assert full["compute"] == pytest.approx(layer["compute"], rel=1e-12)
    assert full["forward"] == pytest.approx(layer["forward"], rel=1e-12)
    assert full["dp_comm_exposed"] > layer["dp_comm_exposed"]


def test_at_zero_0_the_whole_allreduce_runs_after_the_backward():
    full = _out(zero=0, full_iteration_graph=True)
    after = _out(zero=0, cuda_graphs=True, overlap=False)
    assert full["dp_comm_exposed"] == pytest.approx(after["dp_comm_exposed"], rel=1e-12)


def test_at_zero_1_the_reduce_scatter_shows_and_the_all_gather_hides():
    """bf16 gradients and weights: the reduce-scatter is half the sync. Behind a long backward
    the all-gather's half pays only the sigma / (1 + sigma) of the slowed compute beside it,
    so the exposed sync is (1 + sigma / (1 + sigma)) / 2 of the sync that nothing hides."""
    sigma = _hw().overlap_slowdown
    full = _out(full_iteration_graph=True)
    after = _out(cuda_graphs=True, overlap=False)
    assert full["dp_comm_exposed"] == pytest.approx(
        after["dp_comm_exposed"] * (1 + sigma / (1 + sigma)) / 2, rel=1e-12)


def test_an_fp8_weight_gather_leaves_the_reduce_scatter_share_exposed():
    """fp8 weights gathered (1 byte; the embedding and output layer at 2) against bf16
    gradients reduced (2 bytes): gamma_g / (gamma_g + delta) of the sync shows."""
    m = with_seq_len(load_model("llama3-8b"), 8192)
    hw = Hardware.of(load_system("dgx-b200"), Precision.fp8)
    sigma = hw.overlap_slowdown
    outer = m.embedding_params() + m.head_params()
    local = m.layers * m.layer_params() + outer
    delta = (local - outer + 2 * outer) / local
    shown = 2 / (2 + delta)
    full = float(iteration(m, hw, _cfg(full_iteration_graph=True, fp8_weight_gather=True))
                 ["dp_comm_exposed"])
    after = float(iteration(m, hw, _cfg(cuda_graphs=True, overlap=False,
                                         fp8_weight_gather=True))["dp_comm_exposed"])
    assert full == pytest.approx(after * (shown + (1 - shown) * sigma / (1 + sigma)), rel=1e-12)


def test_it_is_not_priced_with_the_per_layer_graphs():
    plan = Plan.split(1, 1, 8, 1, 64, node_size=8, zero=1)
    with pytest.raises(SpecError, match="full_iteration_graph"):
        from planner import switches
        switches.check_exclusions(dataclasses.replace(plan, full_iteration_graph=True,
                                                      cuda_graphs=True))


def test_the_cli_refuses_both_in_one_line(run):
    code, _, err = run("evaluate", "-m", "llama3-8b", "-H", "dgx-b200", "--devices", "16",
                       "--global-batch", "32", "--micro-batch", "1", "--cuda-graphs",
                       "--full-iteration-graph")
    assert code == 2
    assert err.strip().count("\n") == 0 and "full_iteration_graph" in err


def test_megatron_form_writes_the_impl_and_the_nan_check_megatron_requires(runner):
    run, cli = runner
    res = run.invoke(cli, ["evaluate", "-m", "llama3-8b", "-H", "dgx-b200", "--devices", "16",
                           "--global-batch", "32", "--micro-batch", "1", "--zero", "1",
                           "--full-iteration-graph", "--format", "megatron"])
    assert res.exit_code == 0, res.output
    flags = _megatron_flags(res.output)  # parsed by Megatron-LM's own parser, from data
    assert flags["--cuda-graph-impl"] == ["full_iteration"]
    # validate_args at d98e8a6: full_iteration needs the NaN check off
    assert "--no-check-for-nan-in-loss-and-grad" in flags


@pytest.mark.parametrize("form", ["torchtitan", "deepspeed"])
def test_other_framework_forms_refuse_it(run, form):
    code, _, err = run("evaluate", "-m", "llama3-8b", "-H", "dgx-b200", "--devices", "16",
                       "--global-batch", "32", "--micro-batch", "1", "--zero", "1",
                       "--full-iteration-graph", "--format", form)
    assert code == 2 and ("--cuda-graphs" in err if form == "torchtitan"
                          else "does not capture CUDA graphs" in err)


def test_the_mlperf_runs_that_captured_the_whole_step_are_priced_so():
    """NeMo's FULL_CUDA_GRAPH rows (18 priced: the v5.x Llama 3.1 recipes) take the
    full-iteration graph, the per-layer graphs' rows the per-layer one."""
    full = [r for r in mlperf.read() if not r.why_not
            and "FULL_CUDA_GRAPH" in r.row["cuda_graph"]]
    assert len(full) == 18
    for run in full:
        plan = mlperf.plan_of(run)
        assert plan.full_iteration_graph and not plan.cuda_graphs
    layer = [r for r in mlperf.read() if not r.why_not
             and r.row["cuda_graph"] in ("MCORE_CUDA_GRAPH", "LAYER_CUDA_GRAPH")]
    assert layer and all(mlperf.plan_of(r).cuda_graphs
                         and not mlperf.plan_of(r).full_iteration_graph for r in layer)
