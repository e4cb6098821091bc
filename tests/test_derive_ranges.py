"""`planner derive --format python`: each function is the full model wherever its defaults hold,
and refuses (unless told) where they do not."""

import numpy as np
import pytest

from planner import api
from planner import formulas as der
from planner.inputs import Specs


def _module(formulas) -> dict:
    ns: dict = {}
    exec(compile(der.python_module(formulas), "derived", "exec"), ns)  # noqa: S102 (our own output)
    return ns


def test_cnn_iteration_time_is_the_full_model_across_its_roofline_piece():
    specs = Specs.load("alexnet", "k80-fdr")
    lim = api.limits(specs, global_batch=1024)
    (f,) = api.derive(specs, global_batch=1024, names=("iteration_time",))
    (h,) = f.holds
    lo_n = 1024 / (2 * h.high)  # B / (g n) = b: the piece's batches as node counts
    hi_n = 1024 / (2 * h.low)
    assert lo_n < lim.optimum[0] < hi_n
    fn = _module([f])["iteration_time"]
    for n in np.geomspace(lo_n * 1.001, hi_n * 0.999, 7):
        assert fn(n=n) == pytest.approx(lim.iteration_time(n), rel=1e-12)
    outside = lo_n / 2  # a larger local batch: another roofline piece
    with pytest.raises(ValueError, match="the defaults hold for"):
        fn(n=outside)
    # as written it is the seed paper's model with this piece's c, t_0: not the full model
    assert fn(n=outside, strict=False) != pytest.approx(lim.iteration_time(outside), rel=1e-3)


def test_cnn_memory_holds_everywhere():
    (f,) = api.derive(Specs.load("alexnet", "k80-fdr"), global_batch=1024, names=("memory",))
    assert f.holds == ()
    assert "strict" not in der.python_module([f])


@pytest.mark.parametrize("model,hw,seq,tp,pp", [
    ("gpt3-175b", "dgx-a100-80gb", None, 8, 8),
    ("llama3-8b", "dgx-h100", 2048, 1, 1),  # r = min(d, 8): replicas share a node below 8
    ("llama3-8b", "dgx-h100", 2048, 2, 1),
])
def test_transformer_time_and_mfu_follow_d(model, hw, seq, tp, pp):
    """m = B / (d b) and r = min(d, u / (t p)) are written as functions of d, so the time is
    the full model's at every d (before: m and r stayed at the plan's values)."""
    specs = Specs.load(model, hw, seq_len=seq)
    lim = api.limits(specs, global_batch=512, tp=tp, pp=pp)
    formulas = api.derive(specs, global_batch=512, tp=tp, pp=pp, names=("iteration_time", "mfu"))
    ns = _module(formulas)
    mfu_at_plan = formulas[1].value
    for d in (1, 2, 4, 8, 16, 64, 256, 512):
        t = float(lim.d_time(float(d)))
        assert ns["iteration_time"](d=d) == pytest.approx(t, rel=1e-12)
        assert ns["mfu"](d=d) == pytest.approx(
            mfu_at_plan * float(lim.d_time(float(lim.dp))) * lim.dp / (t * d), rel=1e-12)


def test_transformer_memory_holds_while_the_pipeline_warm_up_is_full():
    specs = Specs.load("gpt3-175b", "dgx-a100-80gb")
    lim = api.limits(specs, global_batch=512, tp=8, pp=8)
    (f,) = api.derive(specs, global_batch=512, tp=8, pp=8, names=("memory",))
    (h,) = f.holds
    assert (h.low, h.high) == (8.0, float("inf"))  # 1F1B: p micro-batches in flight
    fn = _module([f])["memory"]
    for d in (1, 8, 64):  # m = 512, 64, 8
        assert fn(d=d) == pytest.approx(float(np.asarray(lim.run(d=float(d))["memory"])))
    with pytest.raises(ValueError, match="micro-batches in flight"):
        fn(d=128)  # m = 4 < p: fewer activations held


def test_json_names_where_the_values_hold(run_json):
    doc = run_json("derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024")
    by = {f["name"]: f for f in doc["formulas"]}
    (h,) = by["iteration_time"]["holds"]
    assert h["expression"] == "B/(g*n)" and 0 < h["low"] < 1024 / (2 * 120.84) < h["high"]
    assert by["memory"]["holds"] == [] and by["optimal_nodes"]["holds"] == []


def test_the_plan_derive_names_is_the_plan_evaluate_prices(run_json):
    """`derive` names the plan its formulas are read at (limits' defaults: selective
    recompute, sequence parallel, ZeRO 1, not evaluate's); evaluate given those flags prices
    the plan at the formula's value."""
    from planner.report.limits import plan_flags

    args = ("-m", "llama3-8b", "-H", "dgx-h100", "--seq-len", "2048", "--global-batch", "512",
            "--tp", "2", "--pp", "2")
    doc = run_json("derive", *args, "--formula", "iteration_time")
    plan, (f,) = doc["plan"], doc["formulas"]
    assert (plan["recompute"], plan["sequence_parallel"], plan["zero"]) == ("selective", True, 1)
    flags = plan_flags(plan).split()
    assert "--sequence-parallel" in flags and "--zero" in flags
    priced = run_json("evaluate", *args[:8], *flags)
    assert priced["prediction"]["iteration_time_s"] == pytest.approx(f["value"], rel=1e-9)


def test_formulas_left_out_are_named_with_why(run_json, run):
    doc = run_json("derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024",
                   "--no-overlap")
    printed = {f["name"] for f in doc["formulas"]}
    assert "required_bandwidth" not in printed
    assert doc["left_out"] == {
        "required_bandwidth": "compute and latency alone miss the target efficiency: "
                              "no bandwidth reaches it",
        "time_to_train_batch": "needs --critical-batch"}
    code, out, _ = run("derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024",
                       "--no-overlap")
    assert code == 0 and out.rstrip().endswith("left out: time_to_train_batch: needs "
                                               "--critical-batch")
    named = run_json("derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024",
                     "--formula", "memory")
    assert named["left_out"] == {}
