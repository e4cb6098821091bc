"""Answers in the user's terms (issue 26, the new-user trial): a token budget's time in days
and its cost at the price shown; the plan's precision and where it came from; `show` output
that loads back as a spec; --optimizer refused where it is not modelled; `limits` saying what
`solve` picks on the same case and why; LaTeX that fits a two-column paper; plots with the
chosen plan marked and one memory unit; implausible hardware numbers refused in one line."""

import json
import math
import re
from pathlib import Path

import jsonschema
import pytest

from planner import api
from planner.report.render import duration, span, usd
from planner.schema import schemas

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ["-m", "llama3-8b", "-H", "dgx-h100", "--global-batch", "512", "--devices-max", "64"]


# --- units people read -------------------------------------------------------------------------

def test_durations_and_dollars_in_the_units_people_plan_in():
    assert duration(12.2e6) == "141 days" and "Ms" not in span(12.2e6)
    assert duration(5 * 3600) == "5 h" and span(0.0068) == "6.8 ms"
    assert duration(3e9) == "34,722 days"
    assert usd(12.29) == "$12.29"
    assert usd(123_456.7) == "$123,457"
    assert usd(42.7e6) == "$42.7 M"  # no cents on a $40 M figure


# --- a token budget ----------------------------------------------------------------------------

def test_token_budget_prints_days_and_cost_at_the_device_price(run, run_json):
    code, out, err = run("solve", *LLAMA, "--tokens", "1e12")
    assert code == 0, err
    assert re.search(r"token budget +1e12 tokens in [\d,]+ steps: [\d.]+ days to train", out)
    assert "per GPU-hour" in out and "$12.29" in out
    assert not re.search(r"\d Ms\b", out)  # no SI seconds on a long time
    doc = run_json("solve", *LLAMA, "--tokens", "1e12")
    jsonschema.validate(doc, schemas()["solve"])
    tb, pred = doc["token_budget"], doc["prediction"]
    assert doc["objective"]["name"] == "token-budget"  # the default with --tokens
    # whole steps (the tokens over a step's, rounded up), each an iteration
    tokens_per_step = pred["tokens_per_s"] * pred["iteration_time_s"]
    assert tb["steps"] == math.ceil(1e12 / tokens_per_step) and isinstance(tb["steps"], int)
    assert tb["time_to_train_s"] == pytest.approx(tb["steps"] * pred["iteration_time_s"],
                                                  rel=1e-12)
    # the time the search ranked plans by is the time printed
    assert tb["time_to_train_s"] == pytest.approx(doc["objective"]["value"], rel=1e-9)
    assert tb["time_to_train_days"] == pytest.approx(tb["time_to_train_s"] / 86400)
    devices = doc["config"]["devices"]
    assert tb["device_hours"] == pytest.approx(tb["time_to_train_s"] / 3600 * devices)
    assert tb["price_per_device_hour_usd"] == 12.29
    assert tb["cost_usd"] == pytest.approx(tb["device_hours"] * 12.29)
    assert "h100-sxm5-80gb" in tb["price_source"]
    assert tb["steps"] == math.ceil(1e12 / (doc["config"]["global_batch"] * 8192))


def test_a_token_budget_takes_a_deadline_a_budget_and_the_cost_objective(run, run_json):
    """--tokens fixes the samples, so the time and cost to train are known without
    --critical-batch: --deadline and --budget gate them and --objective cost / time-to-train
    and --pareto rank them (all had been refused as needing --critical-batch)."""
    tokens = ["--tokens", "1e11"]
    fastest = run_json("solve", *LLAMA, *tokens)
    cost, days = fastest["token_budget"]["cost_usd"], fastest["token_budget"]["time_to_train_s"]
    # the token-budget objective is the time to train on the budget
    same = run_json("solve", *LLAMA, *tokens, "--objective", "time-to-train")
    assert same["config"] == fastest["config"]
    assert same["objective"]["value"] == pytest.approx(days, rel=1e-12)
    # the cheapest plan within twice the fastest's time: no dearer, no slower than allowed
    cheap = run_json("solve", *LLAMA, *tokens, "--objective", "cost", "--deadline",
                     str(2 * days))
    tb = cheap["token_budget"]
    assert tb["cost_usd"] <= cost and tb["time_to_train_s"] <= 2 * days
    assert cheap["objective"]["value"] == pytest.approx(tb["cost_usd"], rel=1e-12)
    assert "training" not in cheap  # the token budget is the report
    # a budget under the cheapest plan's cost: infeasible, naming the budget
    code, _, err = run("solve", *LLAMA, *tokens, "--budget", str(tb["cost_usd"] / 2))
    assert code == 1 and "cost to train" in err
    code, _, err = run("solve", *LLAMA, *tokens, "--budget", str(cost * 1.01))
    assert code == 0, err
    front = run_json("solve", *LLAMA, *tokens, "--pareto")["pareto"]
    assert len(front) >= 2
    # what still needs the statistical-efficiency model says so
    code, _, err = run("solve", *LLAMA, *tokens, "--target-steps", "1000")
    assert code == 2 and "--critical-batch" in err


def test_token_budget_honours_the_price_flag(run, run_json):
    doc = run_json("solve", *LLAMA, "--tokens", "1e12", "--price-per-device-hour", "2")
    tb = doc["token_budget"]
    assert tb["price_per_device_hour_usd"] == 2.0
    assert tb["price_source"] == "--price-per-device-hour"
    assert tb["cost_usd"] == pytest.approx(tb["device_hours"] * 2.0)
    code, out, _ = run("solve", *LLAMA, "--tokens", "1e12", "--price-per-device-hour", "2")
    assert code == 0 and "x $2.00 per GPU-hour (--price-per-device-hour)" in out


def test_a_price_with_nothing_to_price_is_refused(run):
    code, _, err = run("solve", *LLAMA, "--price-per-device-hour", "2")
    assert code == 2 and "--tokens" in err and len(err.strip().splitlines()) == 1


def test_time_to_train_cost_has_no_cents_and_shows_its_price(run):
    code, out, err = run("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "64",
                         "--global-batch-range", "64:4096", "--critical-batch", "512",
                         "--target-tokens", "1e12", "--objective", "time-to-train")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("time to train"))
    assert "per GPU-hour" in line and not re.search(r"\$[\d,]{5,}\.\d\d", line)


# --- precision ---------------------------------------------------------------------------------

def test_the_plan_shows_its_precision_and_where_it_came_from(run, run_json):
    doc = run_json("solve", *LLAMA)
    assert doc["precision"] == {"name": "bf16",
                                "source": "the default_precision of device 'h100-sxm5-80gb'"}
    doc = run_json("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "8",
                   "--global-batch", "64", "--precision", "fp8")
    assert doc["precision"] == {"name": "fp8", "source": "--precision"}
    jsonschema.validate(doc, schemas()["evaluate"])
    code, out, _ = run("solve", *LLAMA)
    assert re.search(r"^precision +bf16 \(the default_precision", out, re.M)


def test_a_device_without_default_precision_says_fp32_and_why(run, run_json):
    # the P100 offers fp16 but its spec names no default: fp32, said on stderr and in the plan
    code, out, err = run("solve", "-m", "alexnet", "-H", "p100-dgx1", "--global-batch", "256")
    assert code == 0
    assert "names no default_precision: priced in fp32, though it offers fp16" in err
    assert re.search(r"^precision +fp32 \(device 'p100-sxm2-16gb' names no default_precision",
                     out, re.M)
    # a K80 offers no 16-bit format: fp32 is said in the plan, no note
    code, out, err = run("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256")
    assert code == 0 and "default_precision" not in err
    assert "fp32 assumed" in out
    doc = run_json("evaluate", "-m", "alexnet", "-H", "p100-dgx1", "--nodes", "1",
                   "--global-batch", "256", "--precision", "fp16")
    assert doc["precision"]["name"] == "fp16"


# --- show output loads back --------------------------------------------------------------------

def _names(kind: str) -> list[str]:
    from planner.catalog import list_hardware

    return list_hardware()[kind]


@pytest.mark.parametrize("name", _names("systems") + ["h100-sxm5-80gb", "gb200", "ndr-ib"])
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_show_output_is_a_spec_that_shows_the_same(tmp_path, run, name, fmt):
    code, first, err = run("show", "hardware", name, "--format", fmt)
    assert code == 0, err
    path = tmp_path / f"spec.{fmt}"
    path.write_text(first)
    code, again, err = run("show", "hardware", str(path), "--format", fmt)
    assert code == 0, err
    assert again == first


def test_a_shown_system_prices_plans_as_the_built_in(tmp_path, run):
    for name in ("dgx-h100", "gb200-nvl72"):
        code, text, _ = run("show", "hardware", name, "--format", "yaml")
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        args = dict(global_batch=512, devices_max=64)
        a = api.solve("llama3-8b", name, **args)
        b = api.solve("llama3-8b", str(path), **args)
        assert b.plan == a.plan
        assert b.prediction.iteration_time_s == a.prediction.iteration_time_s


def test_show_prints_the_scale_up_domain_and_host_link(run_json):
    doc = run_json("show", "hardware", "gb200-nvl72")
    assert doc["devices_per_scale_up_domain"] == 72
    assert doc["host_offload"]["devices_per_link"] == 2
    assert doc["host_offload"]["link"]["name"] == "nvlink-c2c"
    jsonschema.validate(doc, schemas()["show"])


def test_missing_kind_says_missing(tmp_path, run):
    path = tmp_path / "s.yaml"
    path.write_text("name: x\ndevice: h100-sxm5-80gb\ndevices_per_node: 8\n")
    code, _, err = run("show", "hardware", str(path))
    assert code == 2 and "missing key 'kind'" in err
    code, _, err = run("evaluate", "-m", "alexnet", "-H", str(path), "--nodes", "1",
                       "--global-batch", "8")
    assert code == 2 and "missing key 'kind'" in err and len(err.strip().splitlines()) == 1


def test_inline_parts_are_checked_like_files(tmp_path, run):
    code, text, _ = run("show", "hardware", "dgx-h100", "--format", "yaml")
    bad = text.replace("nics_per_node: 8\n", "")
    path = tmp_path / "s.yaml"
    path.write_text(bad)
    code, _, err = run("show", "hardware", str(path))
    assert code == 2 and "missing key 'nics_per_node'" in err
    path.write_text(text.replace("  memory_GiB: 80.0\n", ""))
    code, _, err = run("show", "hardware", str(path))
    assert code == 2 and "missing key 'device.memory_GiB'" in err
    path.write_text(text.replace("command: show", "command: solve"))
    code, _, err = run("show", "hardware", str(path))
    assert code == 2 and "key 'command'" in err


def test_the_docs_complete_system_yaml_loads_and_evaluates(tmp_path, run_json):
    page = (ROOT / "docs" / "hardware-yaml.md").read_text()
    block = re.search(r"```yaml\n(kind: system\n.*?)```", page, re.S).group(1)
    path = tmp_path / "my-h100-cluster.yaml"
    path.write_text(block)
    shown = run_json("show", "hardware", str(path))
    assert shown["name"] == "my-h100-cluster" and shown["nics_per_node"] == 8
    assert shown["device"]["default_precision"] == "bf16"
    doc = run_json("evaluate", "-m", "llama3-8b", "-H", str(path), "--devices", "16",
                   "--global-batch", "64", "--tp", "2")
    assert doc["config"]["nodes"] == 2 and doc["prediction"]["iteration_time_s"] > 0


# --- --optimizer -------------------------------------------------------------------------------

def test_optimizer_changes_a_transformer_or_is_refused_where_not_modelled(run, run_json):
    """Transformers price sgd, momentum, adam, adafactor and muon (their state and step); the
    transformer limits are derived with Adam only, and a CNN knows no adafactor / muon."""
    sgd = run_json("solve", *LLAMA, "--optimizer", "sgd", "--format", "json")
    adam = run_json("solve", *LLAMA, "--format", "json")
    assert sgd["config"]["optimizer"] == "sgd" and adam["config"]["optimizer"] == "adam"
    assert (sgd["prediction"]["memory_breakdown"]["optimizer"]
            < adam["prediction"]["memory_breakdown"]["optimizer"])
    code, _, err = run("limits", *LLAMA[:6], "--optimizer", "sgd")
    assert code == 2 and "derived with Adam" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run("solve", "--help")
    assert "momentum" in out and "transformers only" in " ".join(out.split())


def test_optimizer_still_changes_a_cnn(run_json):
    args = ["evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "1", "--global-batch", "64"]
    sgd = run_json(*args, "--optimizer", "sgd")["prediction"]["memory_breakdown"]["optimizer"]
    adam = run_json(*args, "--optimizer", "adam")["prediction"]["memory_breakdown"]["optimizer"]
    default = run_json(*args)["prediction"]["memory_breakdown"]["optimizer"]
    momentum = run_json(*args, "--optimizer", "momentum")
    assert sgd < default == momentum["prediction"]["memory_breakdown"]["optimizer"] < adam


# --- limits and solve on the same case -----------------------------------------------------------

def test_limits_says_what_solve_picks_and_why(run, run_json):
    args = ["-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256"]
    doc = run_json("limits", *args)
    jsonschema.validate(doc, schemas()["limits"])
    sv = doc["solve"]
    ring = api.solve("alexnet", "k80-fdr", global_batch=256, collective="ring")
    free = api.solve("alexnet", "k80-fdr", global_batch=256)
    assert sv["same_collective"]["nodes"] == ring.plan.nodes
    assert sv["same_collective"]["collective"] == "ring"
    assert sv["any_collective"]["nodes"] == free.plan.nodes
    assert sv["any_collective"]["collective"] == free.plan.collective.value
    # the smallest efficient local batch as --local-batch-min gives the max useful nodes
    assert sv["local_batch_min"] == 8
    assert sv["with_local_batch_min"]["nodes"] == doc["max_useful_nodes"] == 16
    code, out, _ = run("limits", *args)
    assert code == 0
    assert "solve chooses the collective (limits holds --collective ring)" in out
    assert "the optimal nodes above are continuous (50.83)" in out
    assert "--local-batch-min 8" in out


# --- LaTeX for a two-column paper ----------------------------------------------------------------

def _max_spans(tex: str):
    """The text inside each \\max( ... ) / \\max\\left( ... \\right) of `tex`."""
    for m in re.finditer(r"\\max(\\left\(|\\Bigl\()", tex):
        depth, i = 1, m.end()
        while depth and i < len(tex):
            if tex.startswith(("\\left(", "\\Bigl("), i):
                depth, i = depth + 1, i + 6
            elif tex.startswith(("\\right)", "\\Bigr)"), i):
                depth, i = depth - 1, i + 7
            else:
                i += 1
        yield tex[m.end():i]


@pytest.fixture(scope="module")
def transformer_latex():
    import contextlib
    import io

    from planner.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        main(["derive", "-m", "llama3-8b", "-H", "dgx-h100", "--global-batch", "512",
              "--format", "latex"])
    return buf.getvalue()


def test_derive_latex_fits_a_column(transformer_latex):
    from planner.latex import COLUMN_CHARS, width

    body = transformer_latex.split("\\begin{align}\n", 1)[1].split("\\end{align}")[0]
    lines = [ln for ln in body.splitlines() if ln.strip()]
    assert len(lines) > 10  # the long sums run over several lines
    # every line fits a column, but for one indivisible term (none here)
    rhs = [ln.split("&", 1)[1] for ln in lines]
    assert max(width(r) for r in rhs) <= COLUMN_CHARS + 12
    assert not any(re.search(r"\\lceil\{?[A-Za-z]\}?\\right\\rceil", ln) for ln in lines)
    for inside in _max_spans(body):
        assert "cases" not in inside  # no case split nested inside a max
    assert "\\label{eq:iteration_time}" in body and "Q_{1} &=" in body
    assert "% named parts" in transformer_latex


def test_derive_latex_named_parts_write_back_to_the_formulas():
    """The fitted rows with their named parts written back out are the formulas' own
    right-hand sides, value for value."""
    from planner.analysis import transformer_formulas as tf
    from planner.expr import symbols as S
    from planner.latex import _COUNT_UNITS, expand_names, fitted_rows
    from planner.tidy import evaluate

    lim = api.limits("llama3-8b", "dgx-h100", global_batch=512)
    formulas = tf.derive(lim, ())
    counts = {s for s, m in S.GLOSSARY.items() if m.unit in _COUNT_UNITS}
    rows = [("x", d.shown()[0], d.name) for d in formulas if not d.shown()[1]]
    fitted, named = fitted_rows(rows, counts)
    assert named  # something was named
    for d, (_, e, _) in zip([d for d in formulas if not d.shown()[1]], fitted, strict=True):
        back = expand_names(e, named)
        want, got = evaluate(d.shown()[0], d.values), evaluate(back, d.values)
        assert got.real == pytest.approx(want.real, rel=1e-9), d.name


# --- plots -------------------------------------------------------------------------------------

def test_plot_marks_the_chosen_plan_keeps_the_capacity_line_clear(tmp_path):
    pytest.importorskip("matplotlib")
    from planner.plot import plan_plot

    sol = api.solve("gpt2", "dgx-a100-80gb", devices_max=64, global_batch_range=(64, 4096),
                    critical_batch=512, target_tokens=1e10, objective="time-to-train",
                    pareto=True)
    fig = plan_plot(sol.prediction, str(tmp_path / "p.png"), "t", front=sol.pareto,
                    chosen=sol.training)
    ax_mem, ax_front = fig.axes[1], fig.axes[2]
    (star,) = [ln for ln in ax_front.lines if ln.get_label() == "chosen plan"]
    hours = sol.training["time_to_train_s"] / 3600
    assert star.get_xdata()[0] == pytest.approx(hours)
    assert star.get_ydata()[0] == pytest.approx(sol.training["cost_usd"])
    # the memory legend sits below the bar, clear of the capacity line
    fig.canvas.draw()
    legend = ax_mem.get_legend().get_window_extent()
    assert legend.y1 <= ax_mem.get_window_extent().y0 + 1
    # ticks read as plain numbers and dollars, not 10^0
    labels = [t.get_text() for t in ax_front.get_xticklabels() + ax_front.get_yticklabels()]
    assert labels and not any("10^" in x for x in labels)
    assert any(x.startswith("$") for x in labels)


# --- implausible hardware numbers ----------------------------------------------------------------

@pytest.mark.parametrize("edit, key", [
    (("compute: 0.61", "compute: 1e-320"), "efficiency.compute"),
    (("  fp64: 34.0", "  fp64: 1.0e-320"), "peak_tflops.fp64"),
    (("memory_bandwidth_GBps: 3350.0", "memory_bandwidth_GBps: 1.0e-300"),
     "memory_bandwidth_GBps"),
])
def test_an_absurd_hardware_number_is_one_clear_line(tmp_path, run, edit, key):
    code, text, _ = run("show", "hardware", "dgx-h100", "--format", "yaml")
    assert edit[0] in text
    path = tmp_path / "s.yaml"
    path.write_text(text.replace(edit[0], edit[1]))
    for fmt in ("table", "json"):
        code, out, err = run("evaluate", "-m", "alexnet", "-H", str(path), "--nodes", "1",
                             "--global-batch", "64", "--format", fmt)
        assert code == 2
        assert len(err.strip().splitlines()) == 1 and key in err
        assert "Warning" not in err and "overflow" not in err
        if fmt == "json":
            assert json.loads(out)["error"]["kind"] == "bad_input"


def test_the_api_solution_carries_the_token_budget_the_json_prints(run_json):
    """`planner.solve(..., tokens=)` answers with the same token budget as the command line's
    JSON (steps, time, device-hours and cost at the device's price or the one given)."""
    import planner.api as planner

    args = dict(devices_max=64, global_batch=512)
    for price in (None, 2.0):
        sol = planner.solve("llama3-8b", "dgx-h100", tokens=1e12, price_per_device_hour=price,
                            **args)
        flags = [] if price is None else ["--price-per-device-hour", "2"]
        doc = run_json("solve", "-m", "llama3-8b", "-H", "dgx-h100", "--devices-max", "64",
                       "--global-batch", "512", "--tokens", "1e12", *flags)
        assert dict(sol.token_budget) == doc["token_budget"]
        assert sol.token_budget.steps == doc["token_budget"]["steps"]
    assert planner.solve("llama3-8b", "dgx-h100", **args).token_budget is None
