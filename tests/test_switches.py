"""The switch registry: each switch declared once reaches the command line, the Python API, the
plan, the search request, the cost model, the schema, the report and the docs table; a value
out of its range is a one-line error naming it; every launcher form writes or refuses each
switch set away from its default."""

from __future__ import annotations

import dataclasses
import json

import click
import pytest

from planner import api, switches
from planner.cli.app import cli
from planner.errors import SpecError
from planner.expr.layer import Choices
from planner.plan import Plan
from planner.schema import CONFIG
from planner.search.hybrid_space import Search


def test_every_switch_is_a_field_of_plan_search_and_choices():
    for cls in (Plan, Search, Choices):
        names = {f.name for f in dataclasses.fields(cls)}
        assert set(switches.NAMES) <= names, cls
    plan = Plan(1, 8, 8, 1, 1, 1, 8)
    assert switches.values(plan) == {s.name: s.default for s in switches.SWITCHES}
    assert set(switches.NAMES) <= set(plan.to_json()) <= set(CONFIG["properties"])


def test_every_switch_is_an_option_of_evaluate_and_solve():
    for name in ("evaluate", "solve", "sweep"):
        cmd = cli.commands[name]
        opts = {p.name: p for p in cmd.params if isinstance(p, click.Option)}
        for s in switches.SWITCHES:
            assert s.name in opts, (name, s.name)
            assert s.flag in opts[s.name].opts, (name, s.name)


@pytest.mark.parametrize("name, bad, message", [
    ("capacity_factor", 0.5, "must be a number in [1, 64]"),
    ("capacity_factor", True, "must be a number"),
    ("rank_capacity", 65, "must be a number in [0, 64]"),
    ("paged_stash", -1, "must be a number in [0, 64]"),
    ("lora_rank", 0, "must be a positive integer"),
    ("dp_shard", 2.5, "must be a non-negative integer"),
    ("kernels", "jit", "unknown value 'jit' (allowed: fused, eager)"),
    ("optimizer", "lion", "unknown value 'lion'"),
    ("tp_overlap", "yes", "must be true or false"),
])
def test_a_bad_value_is_one_line_naming_the_switch(name, bad, message):
    with pytest.raises(SpecError, match=f"^{name}: ") as err:
        Plan(1, 8, 8, 1, 1, 1, 8, **{name: bad})
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SpecError, match=f"^{name}: "):
        Search(global_batch=8, **{name: bad})


def test_choices_read_the_switch_names_and_drop_zero_only_ones_without_zero():
    c = Choices(zero=0, dp_shard=8, fp8_weight_gather=True, lora_rank=0)
    assert c.dp_shard is None and c.fp8_weight_gather is False and c.lora_rank is None
    c = Choices(zero=1, dp_shard=8, fp8_weight_gather=True)
    # dp_shard is a plan argument (d_s): a choice holds only that it is on
    assert c.dp_shard is True and c.fp8_weight_gather is True
    assert Choices().optimizer == "adam" and Choices() == Choices(optimizer="adam")


def test_a_misspelt_cost_key_is_refused_not_priced_as_its_default():
    import numpy as np

    from planner.catalog import load_model, load_system
    from planner.cost.transformer import Hardware, iteration
    from planner.spec.hardware import Precision

    hw = Hardware.of(load_system("dgx-h100"), Precision.bf16)
    cfg = {"t": 1, "p": 1, "d": 1, "mb": 1, "acc": 1, "v": 1, "recompute": 0, "sp": 0,
           "zero": 0, "gpipe": 0}
    m = load_model("gpt2")
    assert np.isfinite(iteration(m, hw, {**cfg, "cuda_graphs": True})["time"]).all()
    with pytest.raises(ValueError, match="graphs"):
        iteration(m, hw, {**cfg, "graphs": True})


def test_the_api_takes_every_switch_and_limits_refuses_the_ones_it_is_not_derived_with():
    base = dict(devices=8, tp=2, global_batch=16, sequence_parallel=True)
    on = api.evaluate("llama3-8b", "dgx-h100", **base, cuda_graphs=True)
    off = api.evaluate("llama3-8b", "dgx-h100", **base)
    assert on.plan.cuda_graphs and not off.plan.cuda_graphs
    assert on.prediction.iteration_time_s < off.prediction.iteration_time_s
    for s in switches.SWITCHES:
        if s.limits or "cnn" in s.families:
            continue
        value = {bool: not s.default, int: 2, float: 1.5}.get(s.kind, "eager")
        with pytest.raises(SpecError, match=f"^{s.name}: the transformer limits are derived "
                                            "without"):
            api.limits("gpt3-175b", "dgx-a100-80gb", global_batch=1536, **{s.name: value})
    lim = api.limits("gpt3-175b", "dgx-a100-80gb", global_batch=1536, grad_reduce_bf16=True)
    assert lim.choices.grad_reduce_bf16


def test_a_cnn_takes_only_the_switches_of_both_families(run):
    code, _, err = run("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "2",
                       "--global-batch", "256", "--cuda-graphs")
    assert code == 2 and "cuda_graphs: --cuda-graphs applies to transformer models only" in err
    code, out, _ = run("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "2",
                       "--global-batch", "256", "--no-overlap", "--format", "json")
    assert code == 0 and json.loads(out)["config"]["overlap"] is False


def test_the_report_names_each_switch_set_and_list_prints_the_registry(run):
    code, out, _ = run("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "64",
                       "--tp", "2", "--sequence-parallel", "--tp-overlap", "--zero", "1",
                       "--dp-shard", "8", "--global-batch", "256", "--grad-reduce-bf16",
                       "--cuda-graphs", "--kernels", "eager")
    options = next(ln for ln in out.splitlines() if ln.startswith("options"))
    for text in ("tp overlap on", "eager kernels", "ZeRO over groups of 8 replicas (HSDP)",
                 "bf16 gradient reduce", "CUDA graphs"):
        assert text in options
    code, out, _ = run("list", "switches", "--format", "json")
    assert code == 0
    assert [r["name"] for r in json.loads(out)["switches"]] == list(switches.NAMES)


def test_the_docs_table_is_the_registry():
    with open(switches.DOC, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith(switches.markdown_table()), "run: python -m planner.switches"


# --- every framework form writes, runs as it is, or refuses each switch ---------------------

DENSE = dict(model="llama2-7b", hardware="dgx-h100", devices=32, tp=2, pp=2, micro_batch=1,
             global_batch=64, sequence_parallel=True, zero=1)
BASES = {"megatron": DENSE, "torchtitan": {**DENSE, "model": "llama3-8b"},
         "deepspeed": {**DENSE, "model": "llama3-8b", "tp": 1, "pp": 1,
                       "sequence_parallel": False, "seq_len": 4096, "zero": 2}}
MOE = dict(model="qwen3-30b-a3b", ep=8, etp=1, pp=1, tp=2, sequence_parallel=True, devices=64,
           global_batch=128, seq_len=4096)
MLA = dict(model="deepseek-v3", devices=2048, tp=4, pp=16, ep=32, etp=None, seq_len=4096,
           global_batch=4096, sequence_parallel=True)
# (the base's changes, the switch's value): a plan each form takes at its default
CASES = {
    "overlap": ({}, False), "flash_attention": ({"seq_len": 2048}, False),
    "tp_overlap": ({"tp": 2}, True), "capacity_factor": (MOE, 1.5), "cp_a2a": ({"cp": 2}, True),
    "first_stage_layers": ({"pp": 2, "zero": 1}, 14),
    "last_stage_layers": ({"pp": 2, "zero": 1}, 14),
    "offload_activations": ({"hardware": "gb200-nvl72", "devices": 36,
                             "global_batch": 72}, True),
    "ep_overlap": (MOE, True), "kernels": ({}, "eager"), "dp_shard": ({}, 4),
    "fp8_weight_gather": ({"precision": "fp8"}, True),
    "fp8_activations": ({"precision": "fp8"}, True),
    "fp8_attention": ({"precision": "fp8"}, True),
    "fp8_current_scaling": ({"precision": "fp8"}, True),
    "fp8_output_proj": ({"precision": "mxfp8", "hardware": "dgx-b200"}, True),
    # a CNN switch: every framework form refuses CNN plans before it (the declared reason is
    # checked in tests/test_async_ps.py)
    "softsync": ({"model": "alexnet", "hardware": "k80-fdr"}, 1),
    "pp_overlap": ({"pp": 2, "interleave": 2, "zero": 1}, False), "grad_reduce_bf16": ({}, True),
    "lora_rank": ({"pp": 1}, 16), "cuda_graphs": ({}, True),
    "optimizer": ({}, "muon"), "grad_accumulation_fusion": ({}, False),
    "host_sync": ({}, False),
    "weight_cache": ({"precision": "fp8"}, False),
    "fp8_activation_input": ({"precision": "fp8"}, True),
    "rank_capacity": (MOE, 4.0), "paged_stash": ({**MOE, "rank_capacity": 4.0}, 1.5),
    "recompute_norms": ({}, True), "recompute_moe_act": (MOE, True),
    "recompute_mla_up": (MLA, True),
}


def _form(fmt: str, changes: dict) -> str:
    from planner.catalog import load_model
    from planner.launch import render_launch
    from planner.launch.common import Target
    from planner.report import evaluation_doc

    args = {**BASES[fmt], **changes}
    model, hardware = args.pop("model"), args.pop("hardware")
    ev = api.evaluate(model, hardware, framework=fmt, **args)
    doc = json.loads(json.dumps({"model": model, "hardware": hardware,
                                 **evaluation_doc(ev.plan, ev.prediction)}, default=str))
    m = load_model(model)
    if args.get("seq_len"):
        m = dataclasses.replace(m, seq_len=args["seq_len"])
    return render_launch(fmt, doc, Target(m, args.get("precision", "bf16")))


def test_every_switch_names_each_framework_form():
    assert set(CASES) == set(switches.NAMES)
    for s in switches.SWITCHES:
        assert set(s.launch) == set(switches.FRAMEWORK_FORMS), s.name


@pytest.mark.parametrize("fmt", switches.FRAMEWORK_FORMS)
@pytest.mark.parametrize("name", switches.NAMES)
def test_each_form_writes_runs_or_refuses_each_switch(fmt, name):
    """Express a plan or refuse it: a form that writes a switch changes its output (or refuses
    where its own condition fails), one that runs so by default or leaves it to the model code
    writes the same output, and one that cannot write it refuses with the declared reason."""
    from planner.errors import SpecError

    changes, value = CASES[name]
    try:
        base = _form(fmt, changes)
    except SpecError:  # the form refuses this base for other reasons (MoE, interleaving, ...)
        how = switches.BY_NAME[name].launch[fmt]
        assert how == switches.WRITES or how not in (switches.AS_DEFAULT, switches.MODEL_CODE)
        return
    how = switches.BY_NAME[name].launch[fmt]
    try:
        out = _form(fmt, {**changes, name: value})
    except SpecError as err:
        assert how not in (switches.AS_DEFAULT, switches.MODEL_CODE), str(err)
        if how != switches.WRITES:
            assert str(err) == f"format: {how}"
        return
    assert how in (switches.WRITES, switches.AS_DEFAULT, switches.MODEL_CODE), out[:200]
    # the comments carry the prediction, which the switch changes
    def written(text):
        return [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]

    assert (written(out) != written(base)) == (how == switches.WRITES), (name, fmt)


@pytest.mark.parametrize("fmt, name, precision, zero", [
    ("torchtitan", "grad_accumulation_fusion", "bf16", 1),
    ("deepspeed", "grad_accumulation_fusion", "bf16", 2),
    ("megatron", "fp8_activations", "fp8", 1),
    ("deepspeed", "grad_reduce_bf16", "bf16", 0),  # only without ZeRO (`runs_where`)
])
def test_a_form_prices_what_its_framework_always_runs_and_refuses_the_other(fmt, name,
                                                                             precision, zero):
    """A switch a framework always runs one way (no flag changes it: `switches.AS_DEFAULT`,
    or `Switch.runs_where` at some stages) is priced that way for that form when left unset,
    and the other value is refused there rather than written as if the framework ran it."""
    from planner.errors import SpecError
    from planner.launch import render_launch
    from planner.launch.common import Target
    from planner.report import evaluation_doc

    s = switches.BY_NAME[name]
    fixed = switches.runs(s, fmt, zero, precision)
    assert fixed is (not s.default)
    assert switches.runs(s, fmt, 1, precision) is fixed or name == "grad_reduce_bf16"
    args = {**BASES[fmt], "precision": precision, "zero": zero}
    if zero == 0:  # whole weights, gradients and Adam state fit one H100 at 1.7B parameters
        args |= {"model": "gpt-1.7b", "seq_len": 2048}
    model, hardware = args.pop("model"), args.pop("hardware")
    framework = api.evaluate(model, hardware, framework=fmt, **args)
    assert getattr(framework.plan, name) is fixed
    # the same as pinning what the form runs (this switch, and any other it always runs)
    ran = {k: getattr(framework.plan, k) for k in switches.NAMES
           if switches.runs(switches.BY_NAME[k], fmt, zero, precision) is not None}
    assert ran[name] is fixed
    assert framework.prediction == api.evaluate(model, hardware, **args, **ran).prediction
    other = api.evaluate(model, hardware, **args, **{**ran, name: not fixed})
    assert other.prediction != framework.prediction
    doc = json.loads(json.dumps({"model": model, "hardware": hardware,
                                 **evaluation_doc(other.plan, other.prediction)}, default=str))
    with pytest.raises(SpecError, match=f"format: {fmt} always runs {s.spelled(fixed)}"):
        render_launch(fmt, doc, Target(api.load_model(model), precision))


def test_solve_for_a_form_searches_what_its_framework_runs(run):
    """`solve --format torchtitan` prices torchtitan's unfused gradient accumulation and its
    training loop without a host sync a step on every plan it searches: its pick is the search
    pinned so, and it writes that plan."""
    args = ["-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--global-batch", "64"]
    pinned = api.solve("llama3-8b", "dgx-h100", devices=16, global_batch=64,
                       grad_accumulation_fusion=False, host_sync=False)
    code, out, err = run("solve", *args, "--format", "torchtitan")
    assert code == 0, err
    assert f"predicted iteration time {pinned.prediction.iteration_time_s:.6g} s" in out
    assert "gradient accumulation unfused" in out and "no host sync a step" in out


def test_framework_prices_a_plan_as_its_form_does_in_every_format(run_json, run):
    """--framework F prices and searches as --format F does, and the JSON names it; a CNN, or a
    framework form other than F, is refused."""
    args = ["-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--global-batch", "64"]
    doc = run_json("solve", *args, "--framework", "torchtitan")
    assert doc["framework"] == "torchtitan"
    assert doc["config"]["grad_accumulation_fusion"] is False
    code, out, err = run("solve", *args, "--format", "torchtitan")
    assert code == 0, err
    assert f"predicted iteration time {doc['prediction']['iteration_time_s']:.6g} s" in out
    assert "framework" not in run_json("solve", *args)
    code, _, err = run("solve", *args, "--framework", "torchtitan", "--format", "megatron")
    assert code == 2 and "give one of the two" in err
    code, _, err = run("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "2",
                       "--global-batch", "256", "--framework", "deepspeed")
    assert code == 2 and "framework:" in err


def test_unfused_gradient_accumulation_moves_two_gradient_widths_per_weight_per_micro_batch():
    """The switch added after the registry (one entry, its physics in
    planner.expr.transformer, this test): unfused, each of the m micro-batches writes every
    weight gradient at the model's width and reads it back to add it (2 vb bytes per weight on
    the device: the layers' and the output layer's), over the device's HBM rate; nothing
    else changes."""
    import numpy as np

    from planner.catalog import load_model, load_system
    from planner.cost.transformer import Hardware, iteration
    from planner.spec.hardware import Precision

    m, hw = load_model("llama3-70b"), Hardware.of(load_system("dgx-h100"), Precision.bf16)
    cfg = {"t": 2, "p": 1, "d": 4, "mb": 1, "acc": 8, "v": 1, "recompute": 0, "sp": 1,
           "zero": 1, "gpipe": 0}
    fused, unfused = (iteration(m, hw, {**cfg, "grad_accumulation_fusion": f})
                      for f in (True, False))
    weights = m.layers * m.layer_params() / 2 + m.vocab * m.hidden / 2  # t = 2
    expected = 8 * 2 * 2 * weights / hw.mem_bw
    # each of a layer's 4 adds moves more than the launch floor's worth: the bytes set the time
    assert 2 * 2 * m.layer_params() / 2 / 4 / hw.mem_bw > 2 * hw.launch_s
    got = float(np.ravel(unfused["compute"])[0] - np.ravel(fused["compute"])[0])
    assert got == pytest.approx(expected, rel=1e-9)
    for key in ("tp_comm", "dp_comm_exposed", "memory", "optimizer"):
        assert float(np.ravel(unfused[key])[0]) == float(np.ravel(fused[key])[0]), key
    # frozen weights (LoRA) accumulate no base-weight gradients: nothing to add
    lora = {**cfg, "lora_rank": 16}
    assert float(np.ravel(iteration(m, hw, {**lora, "grad_accumulation_fusion": False})
                          ["compute"])[0]) == float(np.ravel(iteration(m, hw, lora)
                                                             ["compute"])[0])


def test_batch_lines_take_the_switch_names_and_suggest_a_misspelt_one(run, tmp_path):
    lines = tmp_path / "b.jsonl"
    base = {"model": "llama3-8b", "hardware": "dgx-h100", "devices": 16, "global_batch": 64}
    lines.write_text("\n".join(json.dumps(x) for x in (
        {**base, "grad_accumulation_fusion": False, "cuda_graphs": True},
        {**base, "tp_overlapp": True})))
    code, out, _ = run("evaluate", "--batch", str(lines))
    first, second = (json.loads(x) for x in out.splitlines())
    assert first["config"]["grad_accumulation_fusion"] is False
    assert first["config"]["cuda_graphs"] is True
    assert second["error"]["message"].endswith(
        "unknown key 'tp_overlapp' (did you mean 'tp_overlap'?)")
    assert code == 2
