"""The evaluation step (`forward_time_s`): the forward of one global batch through the plan,
against the layer costs it is built from, the training step's own parts, and the MLPerf
validation steps it is checked on (planner/calibration/mlperf_forward.csv)."""

import csv
import dataclasses
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


def _hw():
    return Hardware.of(load_system("dgx-h100"), Precision.bf16)


def _cfg(**over):
    cfg = {"t": 1, "p": 1, "d": 1, "mb": 1, "acc": 4, "v": 1, "cp": 1, "recompute": 0,
           "sp": 0, "zero": 0, "gpipe": 0, "overlap": True, "flash_attention": True}
    return cfg | over


def _at(value, **plan):
    return float(G.substitute(value, {t: plan.get("t", 1), b: plan.get("b", 1),
                                      c_p: 1, e_p: 1, e_t: 1}).subs({}))


def _layer(m, hw, **plan):
    """(one layer's forward compute, its every-pass tp collectives, the LM head's forward)."""
    lc = LayerCosts(m, hw, Choices(flash_attention=True))
    parts = lc.parts()
    head = lc._matmul(lc.tokens, m.hidden, G.Integer(m.vocab) / t, sixteen=True)
    return (_at(parts.proj + parts.core + parts.elem, **plan), _at(parts.tp, **plan),
            _at(head, **plan))


def test_one_device_forward_is_every_micro_batch_through_every_layer_and_the_head():
    m = load_model("llama3-8b")
    hw = _hw()
    layer, _, head = _layer(m, hw)
    got = float(iteration(m, hw, _cfg(acc=4))["forward"])
    assert got == pytest.approx(4 * (m.layers * layer + head), rel=1e-9)


def test_the_forward_holds_half_of_every_pass_tensor_parallel_collectives():
    """Without overlap or recomputation a block's forward and backward collectives are the
    same ring, so the evaluation step carries exactly half of a layer's `tp`."""
    m = load_model("llama3-8b")
    hw = _hw()
    layer, tp, head = _layer(m, hw, t=4)
    got = float(iteration(m, hw, _cfg(t=4, acc=2))["forward"])
    assert got == pytest.approx(2 * (m.layers * (layer + tp / 2) + head), rel=1e-9)


def test_a_pipelined_forward_fills_the_pipeline_once_and_sends_half_the_training_step_sends():
    m = load_model("llama3-8b")  # 32 layers: 4 a stage at pp 8
    hw = _hw()
    layer, _, head = _layer(m, hw)
    out = iteration(m, hw, _cfg(p=8, acc=16))
    slots = 16 + 7
    want = slots * (m.layers / 8 * layer + head) + float(out["pp_comm"]) / 2
    assert float(out["forward"]) == pytest.approx(want, rel=1e-9)


def test_the_forward_is_shorter_than_the_training_step_and_its_compute():
    m = with_seq_len(load_model("llama3-70b"), 8192)
    hw = Hardware.of(load_system("dgx-h100"), Precision.fp8)
    for cfg in (_cfg(t=8, sp=1, acc=8), _cfg(t=4, p=4, v=5, sp=1, acc=16, zero=1),
                _cfg(t=2, cp=4, sp=1, acc=4, recompute=2)):
        out = iteration(m, hw, cfg)
        assert 0 < float(out["forward"]) < float(out["compute"]) < float(out["time"])


def test_multi_token_prediction_depths_run_in_the_forward_too():
    m = load_model("deepseek-v3")
    hw = Hardware.of(load_system("dgx-h100"), Precision.fp8)
    without = dataclasses.replace(m, mtp_layers=0)
    cfg = _cfg(t=8, p=8, acc=16, sp=1, ep=8, zero=1)
    assert float(iteration(m, hw, cfg)["forward"]) > float(iteration(without, hw, cfg)["forward"])


def test_evaluate_reports_the_evaluation_step(runner):
    run, cli = runner
    args = ["evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--tp", "2",
            "--pp", "2", "--micro-batch", "1", "--global-batch", "64", "--format", "json"]
    res = run.invoke(cli, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    pred = doc.get("prediction", doc)
    assert 0 < pred["forward_time_s"] < pred["iteration_time_s"]
    text = run.invoke(cli, args[:-2])
    assert "evaluation step" in text.output


def test_every_logged_validation_step_reaches_its_submission():
    """Each forward row names one non-duplicate training row (47 of them: v5.0 / v5.1 Llama
    3.1 pretraining), and the 39 the planner prices carry both errors."""
    with open(mlperf.FORWARD_CSV, newline="", encoding="utf-8") as fh:
        forward = list(csv.DictReader(fh))
    assert len(forward) == 47
    runs = [r for r in mlperf.read() if r.forward_s is not None]
    assert len(runs) == 47
    assert {float(r["forward_step_s"]) for r in forward} == {r.forward_s for r in runs}
    rows = [r for r in mlperf.rows() if r["forward_error"] is not None]
    assert len(rows) == 39
    for r in rows:
        assert r["run"].forward_s < r["measured_s"]
        assert r["rest_error"] is not None


def test_an_evaluation_step_runs_its_expert_exchanges_unoverlapped():
    """Megatron-LM overlaps the all-to-all only in its training schedule (the combined 1F1B
    runs `not forward_only`), so --ep-overlap leaves the evaluation step as it is."""
    m = load_model("qwen3-30b-a3b")
    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    cfg = _cfg(t=2, d=8, ep=8, sp=1, acc=4, zero=1)
    off, on = (iteration(m, hw, {**cfg, "ep_overlap": x}) for x in (False, True))
    assert float(on["forward"]) == pytest.approx(float(off["forward"]), rel=1e-12)
    assert float(on["time"]) < float(off["time"])


def test_zero_3_gathers_the_weights_in_the_forward_as_in_training():
    """Unoverlapped, an evaluation step at ZeRO 3 adds one all-gather of the stage's weights a
    micro-batch. Independently, training's exposed sync: ZeRO 2 reduce-scatters the gradients
    and gathers the weights once (A), ZeRO 3 reduce-scatters and gathers twice a micro-batch
    (B); with latency-free links the collectives are linear in bytes, so one gather is
    (B - A) / (2 m - 1)."""
    m = with_seq_len(load_model("llama3-8b"), 4096)
    hw = dataclasses.replace(Hardware.of(load_system("dgx-h100"), Precision.bf16),
                             intra_lat=0.0, inter_lat=0.0)
    acc = 4
    cfg = _cfg(d=16, acc=acc, overlap=False)
    z1, z2, z3 = (iteration(m, hw, {**cfg, "zero": z}) for z in (1, 2, 3))
    one = (float(z3["dp_comm_exposed"]) - float(z2["dp_comm_exposed"])) / (2 * acc - 1)
    assert one > 0
    assert float(z3["forward"]) - float(z1["forward"]) == pytest.approx(acc * one, rel=1e-9)
    # overlapped, the gathers hide behind each micro-batch's forward but for the first layer's
    over = {**cfg, "overlap": True}
    hidden = float(iteration(m, hw, {**over, "zero": 3})["forward"]) - float(
        iteration(m, hw, {**over, "zero": 1})["forward"])
    assert 0 < hidden < acc * one


def test_the_extraction_drops_the_first_step_of_each_evaluation():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "extract_mlperf_forward.py"
    spec = importlib.util.spec_from_file_location("extract_mlperf_forward", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def line(key, value=None, step=0):
        return ":::MLLOG " + json.dumps({"key": key, "value": value, "metadata": {"step": step}})

    log = "\n".join([
        line("tracked_stats", {"train_step_time": 0.2}, 31), line("eval_start", None, 384),
        line("tracked_stats", {"validation_step_time": 0.28}, 768),
        line("tracked_stats", {"validation_step_time": 0.05}, 769),
        line("tracked_stats", {"validation_step_time": 0.06}, 770), line("eval_stop"),
        line("eval_start", None, 768), line("tracked_stats", {"validation_step_time": 0.4}, 0),
        line("tracked_stats", {"validation_step_time": 0.05}, 1), "not a log line"])
    assert mod.validation_steps(log) == [0.05, 0.06, 0.05]
