"""Numerics at scale, determinism across runs and hash seeds, and the solver's time limit;
the reproducers of issue 17 (hardening, round 2), one test per class."""

import csv
import io
import json
import math
import os
import resource
import subprocess
import sys

import click
import pytest
import yaml

from planner import api
from planner import calibrate as cal
from planner.catalog import list_models, load_model, load_system, read_file
from planner.cli import DecimalInt, FiniteFloat, cli
from planner.errors import InfeasibleError, SpecError
from planner.expr import collectives as coll
from planner.search import strategy
from planner.search.data_parallel import DataParallelSolver, Problem
from planner.search.strategy import SplitSearch, Strategy
from planner.spec.numbers import decimal_float, decimal_int, loads_json

TIMING_KEYS = {"solve_time_s", "build_time_s"}


def _finite_positive(pred):
    for key in ("iteration_time_s", "throughput_samples_per_s", "compute_time_s",
                "memory_bytes_per_device", "speedup", "efficiency"):
        v = getattr(pred, key)
        assert math.isfinite(v) and v > 0, (key, v)
    assert pred.efficiency <= 1 + 1e-9


@pytest.mark.parametrize("hw", ["dgx-h100", "k80-fdr", "knl-omnipath"])
def test_two_to_the_twenty_devices_give_finite_sensible_numbers(hw):
    ev = api.evaluate("resnet50", hw, devices=2**20, global_batch=2**21)
    assert ev.config.devices == 2**20
    _finite_positive(ev.prediction)
    # strong scaling to a million devices is communication bound: efficiency collapses
    assert ev.prediction.efficiency < 0.5


def test_solve_over_two_to_the_twenty_nodes_is_exact_and_bounded():
    sol = api.solve("alexnet", "dgx-h100", global_batch=2**20, nodes_max=2**20)
    assert sol.status == "optimal"
    _finite_positive(sol.prediction)
    assert sol.config.global_batch == 2**20


def _system_with_link(tmp_path, bandwidth_GBps: float) -> str:
    link = tmp_path / f"link-{bandwidth_GBps:g}.yaml"
    link.write_text(f"kind: link\nname: l\nbandwidth_GBps: {bandwidth_GBps!r}\nlatency_us: 1.0\n"
                    "efficiency: 0.9\nsources: {all: test}\n")
    system = tmp_path / f"sys-{bandwidth_GBps:g}.yaml"
    system.write_text(f"kind: system\nname: s\ndevice: a100-sxm4-80gb\ndevices_per_node: 8\n"
                      f"intra_node: {link}\ninter_node: {{link: {link}, count: 1}}\n"
                      "sources: {layout: test}\n")
    return str(system)


@pytest.mark.parametrize("bw", [1e-9, 1e-3, 1e5, 1e6])
def test_tiny_and_huge_bandwidths_stay_finite_and_ordered(tmp_path, bw):
    hw = _system_with_link(tmp_path, bw)
    ev = api.evaluate("vgg16", hw, nodes=64, global_batch=4096)
    _finite_positive(ev.prediction)
    sol = api.solve("vgg16", hw, global_batch=4096, nodes_max=64)
    _finite_positive(sol.prediction)
    if bw <= 1e-3:  # a crawling network: one node (no inter-node traffic) is best
        assert sol.config.nodes == 1
    if bw >= 1e6:  # communication is free: the largest split wins
        assert sol.config.devices == 512


def _strip(doc):
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in TIMING_KEYS}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


COMMANDS = [
    ["solve", "-m", "resnet50", "-H", "dgx-a100-80gb", "--nodes-max", "16",
     "--global-batch-range", "256:8192", "--top", "3"],
    ["solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024", "--within", "0.05"],
    ["limits", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024", "--no-overlap"],
    ["sweep", "-m", "googlenet", "-H", "titanx-fdr", "--global-batch", "512"],
]


@pytest.mark.slow
@pytest.mark.parametrize("args", COMMANDS, ids=[a[0] for a in COMMANDS])
def test_same_input_gives_identical_json_across_runs_and_hash_seeds(args):
    outs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        res = subprocess.run([sys.executable, "-m", "planner.cli", *args, "--format", "json"],
                             capture_output=True, text=True, env=env, check=True)
        outs.append(json.dumps(_strip(json.loads(res.stdout)), sort_keys=False))
    assert outs[0] == outs[1]


def test_time_limit_is_passed_to_cp_sat_and_an_unfinished_search_is_not_an_answer():
    dp = api.build("resnet50", "dgx-a100-80gb")
    prob = Problem(global_batch_range=(256, 65536), nodes_max=16, time_limit_s=1e-9)
    with pytest.raises(InfeasibleError, match="time-limit"):
        DataParallelSolver(dp, prob).solve()


# --- issue 17: hardening, round 2 ------------------------------------------------------------

LONG = "a" * 300  # a file name over 255 bytes: ENAMETOOLONG


def _one_line_error(code, out, err, want=2):
    assert code == want, (code, out, err)
    assert "Traceback" not in out + err and "internal error" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("planner: "), err


# 1. stride 0 / kernel 0, 2. 5,000-digit YAML integers, 7. non-string types and names: the
# bad-input corpus (tests/bad_inputs/cases.yaml) holds the CLI cases; here the builder itself.

@pytest.mark.parametrize(("layer", "needle"), [
    ({"type": "conv", "out": 4, "kernel": 3, "stride": 0}, "stride"),
    ({"type": "conv", "out": 4, "kernel": 0}, "kernel"),
    ({"type": "avgpool", "kernel": [2, 0]}, "kernel"),
    ({"type": ["conv"], "out": 4, "kernel": 3}, "type"),
    ({"type": {"conv": 1}}, "type"),
    ({"type": "concat", "name": ["x"], "branches": [[{"type": "relu"}]]}, "name"),
    ({"type": "residual", "name": 7, "branch": [{"type": "relu"}]}, "name"),
    ({"type": "relu", "name": float("-inf")}, "name"),
])
def test_bad_layer_fields_are_spec_errors(layer, needle):
    from planner.spec.cnn import build_cnn

    with pytest.raises(SpecError, match=rf"layers\[0\]\.{needle}"):
        build_cnn({"kind": "cnn", "name": "x", "input": [3, 8, 8], "layers": [layer]}, "x.yaml")


def test_yaml_numbers_longer_than_64_characters_are_refused(tmp_path):
    for text in ("1" * 5000, "0x" + "f" * 100, "1" * 70 + ".5", "1:" * 40 + "1"):
        f = tmp_path / "m.yaml"
        f.write_text(f"kind: cnn\nname: m\ninput: [3, 8, 8]\nlayers:\n  - {{type: fc, out: {text}}}\n")
        with pytest.raises(SpecError, match="characters"):
            load_model(str(f))


# 3. and 4.: --batch lines

def test_batch_huge_integer_line_is_an_error_line_and_the_good_lines_still_print(run, tmp_path):
    good = {"model": "alexnet", "hardware": "k80-fdr", "nodes": 2, "global_batch": 64}
    f = tmp_path / "b.jsonl"
    f.write_text(json.dumps(good).replace("2,", "1" * 5000 + ",", 1) + "\n" + json.dumps(good)
                 + "\n" + '{"model": "alexnet", "hardware": "k80-fdr", "nodes": Infinity}\n'
                 + json.dumps(good) + "\n")
    code, out, err = run("evaluate", "--batch", str(f))
    # one line on stderr says how many failed; each failed line carries the error object
    assert code == 2 and err.strip().endswith("2 of 4 lines failed (their JSON lines carry "
                                              "the error)") and len(err.splitlines()) == 1
    docs = [json.loads(line) for line in out.splitlines()]
    assert [d["line"] for d in docs] == [1, 2, 3, 4]
    assert "5000 digits" in docs[0]["error"]["message"]
    assert "Infinity" in docs[2]["error"]["message"]
    assert docs[0]["error"]["kind"] == "bad_input"
    assert docs[1]["prediction"] == docs[3]["prediction"]


def test_batch_null_means_not_given(run, tmp_path):
    """`"servers": null` in a CNN line is the default, as an unset flag (was a TypeError)."""
    base = {"model": "alexnet", "hardware": "k80-fdr", "nodes": 2, "global_batch": 64}
    f = tmp_path / "b.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in (
        {**base, "servers": None}, base, {**base, "collective": None, "overlap": None})))
    code, out, err = run("evaluate", "--batch", str(f))
    assert code == 0, (out, err)
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) == 3
    assert docs[0]["prediction"] == docs[1]["prediction"] == docs[2]["prediction"]


# 5. and 6.: every integer and float parsed from text

@pytest.mark.parametrize("text", ["²", "٣", "1_000", " ", "", "+", "1e3", "0x10", "1" * 19, "nan"])
def test_decimal_int_takes_ascii_decimal_digits_only(text):
    assert decimal_int(text) is None


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1_0", "٣", "²",
                                  "1e999", "0x1p3", "1" * 65, ""])
def test_decimal_float_takes_finite_plain_decimals_only(text):
    assert decimal_float(text) is None


def test_decimal_parsers_keep_the_good_ones():
    assert [decimal_int(x) for x in ("7", " 12 ", "-3", "+4", "9" * 18)] == \
        [7, 12, -3, 4, int("9" * 18)]
    assert [decimal_float(x) for x in ("1e-9", ".5", "5.", "-2.5E+3", "10")] == \
        [1e-9, 0.5, 5.0, -2500.0, 10.0]
    assert loads_json('{"a": [1, 2.5, -3e2]}') == {"a": [1, 2.5, -300.0]}
    for bad in ('{"a": NaN}', '{"a": -Infinity}', '{"a": 1e400}', '{"a": ' + "1" * 19 + "}"):
        with pytest.raises(SpecError):
            loads_json(bad)


@pytest.mark.parametrize("value", ["²:64", "٣:64", "1_0:64", "0:64", "64", "1:2:3", "1" * 30 + ":4"])
def test_global_batch_range_refuses_non_decimal_text(run, value):
    code, out, err = run("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch-range", value)
    _one_line_error(code, out, err)
    assert "global_batch_range" in err


@pytest.mark.parametrize("cell", ["²", "٣", "1" * 5000, "1_6", "nan", "-8"])
def test_calibrate_csv_bad_cells_skip_the_row(tmp_path, cell):
    rows = (cal.default_csv()).read_text(encoding="utf-8").splitlines()
    head = rows[0].split(",")
    keep = [r for r in rows[1:] if "ResNet-50" in r and ",images_per_sec," in r][:1]
    assert keep, "the shipped CSV has a ResNet-50 throughput row"
    f = tmp_path / "runs.csv"
    f.write_text("\n".join([rows[0], *keep, *keep]) + "\n", encoding="utf-8")
    good, _ = cal.read_runs(f)
    # the same row with one cell broken: gpus_total, then the measured value
    for col in ("gpus_total", "value"):
        rec = next(csv.reader(io.StringIO(keep[0])))
        rec[head.index(col)] = cell
        buf = io.StringIO()
        csv.writer(buf).writerow(rec)
        f.write_text(rows[0] + "\n" + keep[0] + "\n" + buf.getvalue(), encoding="utf-8")
        runs, skipped = cal.read_runs(f)
        assert len(runs) == len(good) - 1 and len(skipped) == 1


# 8. and 9.: paths: names too long, special files, directories

@pytest.mark.parametrize("args", [
    ("show", "model", LONG), ("show", "model", LONG + ".yaml"), ("show", "hardware", LONG),
    ("show", "hardware", f"x/{LONG}"),
    ("evaluate", "-m", LONG + ".yaml", "-H", "k80-fdr", "--nodes", "1", "--global-batch", "8"),
    ("evaluate", "-m", "alexnet", "-H", LONG + ".yaml", "--nodes", "1", "--global-batch", "8"),
    ("evaluate", "--batch", LONG), ("calibrate", "--csv", LONG),
    ("solve", "-m", "alexnet", "-H", f"{LONG}/{LONG}.yaml", "--global-batch", "8"),
])
def test_a_file_name_too_long_is_no_such_file(run, args):
    code, out, err = run(*args)
    _one_line_error(code, out, err)
    assert "no such file" in err or "unknown" in err
    assert len(err) < 600  # the name is shortened in the message


def test_a_system_naming_a_device_path_too_long_is_a_spec_error(tmp_path):
    f = tmp_path / "sys.yaml"
    f.write_text(f"kind: system\nname: s\ndevice: {LONG}.yaml\ndevices_per_node: 1\n"
                 "intra_node: nvlink2\ninter_node: {link: fdr-ib, count: 1}\n")
    with pytest.raises(SpecError, match="key 'device'.*no such file"):
        load_system(str(f))


def _cap_memory():  # a regression must fail, not eat the machine
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


@pytest.mark.parametrize("args", [
    ["show", "model", "{fifo}"], ["show", "model", "/dev/zero"], ["show", "model", "/dev/urandom"],
    ["show", "hardware", "{fifo}"], ["evaluate", "-m", "alexnet", "-H", "/dev/zero",
                                      "--nodes", "1", "--global-batch", "8"],
    ["evaluate", "--batch", "{fifo}"], ["evaluate", "--batch", "/dev/urandom"],
    ["calibrate", "--csv", "{fifo}"], ["calibrate", "--csv", "/dev/urandom"],
    ["show", "model", "{dir}"],
], ids=lambda a: " ".join(a[:2]) + " " + a[-1].split("/")[-1])
def test_special_files_are_refused_before_reading(tmp_path, args):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    args = [a.replace("{fifo}", str(fifo)).replace("{dir}", str(tmp_path)) for a in args]
    res = subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                         text=True, timeout=120, preexec_fn=_cap_memory)
    _one_line_error(res.returncode, res.stdout, res.stderr)
    assert "not a regular file" in res.stderr or "directory" in res.stderr


def test_read_file_checks_the_size_before_reading(tmp_path):
    f = tmp_path / "big.yaml"
    with f.open("wb") as fh:
        fh.truncate(5 * 2**20)  # sparse: nothing is read to find out it is too large
    with pytest.raises(SpecError, match="bytes, larger than"):
        read_file(f, 4 * 2**20)
    assert read_file(f, 6 * 2**20) == b"\0" * (5 * 2**20)
    with pytest.raises(SpecError, match="no such file"):
        read_file(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="no such file"):
        read_file("a\0b")


# 10. a collective over one rank costs exactly 0

@pytest.mark.parametrize("fn", [coll.ring_allreduce, coll.halving_doubling_allreduce,
                                coll.tree_allreduce, coll.reduce_scatter, coll.all_gather,
                                coll.all_to_all])
def test_one_rank_collectives_are_exactly_zero(fn):
    for p in (1, 1.0):
        assert fn(p, 1e9, 1e-6, 1e10, 3) == 0
    assert coll.parameter_server(1, 1e9, 1e-6, 1e10, 2, 3) == 0
    assert coll.hierarchical_allreduce(1, 1, 1e9, 1e-6, 1e10, 2e-6, 1e9, 3) == 0
    assert fn(2, 1e9, 1e-6, 1e10, 3) > 0


def test_single_device_plans_exchange_nothing():
    """The fuzz campaign's 240 single-device combinations: communication exactly 0."""
    models = [m for m in list_models() if load_model(m).kind == "cnn"]
    for model in models:
        for hw in ("k80-fdr", "dgx1-v100", "knl-omnipath"):
            for c in ("ring", "halving-doubling", "tree", "parameter-server", "hierarchical"):
                for overlap in (True, False):
                    p = api.evaluate(model, hw, devices=1, global_batch=64, collective=c,
                                     overlap=overlap).prediction
                    assert p.communication_time_s == 0.0, (model, hw, c, overlap)
                    assert p.exposed_communication_time_s == 0.0, (model, hw, c, overlap)


def test_issue_reproducer_has_no_negative_time(run_json):
    doc = run_json("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--devices", "1",
                   "--global-batch", "64", "--collective", "hierarchical", "--no-overlap")
    assert doc["prediction"]["communication_time_s"] == 0.0
    assert doc["prediction"]["exposed_communication_time_s"] == 0.0


# 11. NaN and infinities: one ParamType for every float flag

def _all_options(group):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _all_options(cmd)
            continue
        for param in cmd.params:
            yield name, param


def test_every_float_flag_refuses_nan_and_infinities():
    floats = [(name, p) for name, p in _all_options(cli)
              if isinstance(p.type, click.types.FloatParamType)]
    assert len(floats) >= 10
    for name, param in floats:
        assert isinstance(param.type, FiniteFloat), (name, param.name)
        for bad in ("nan", "NaN", "inf", "-inf", "1_0", "٣"):
            with pytest.raises(click.BadParameter):
                param.type.convert(bad, param, None)


def test_every_integer_flag_takes_decimal_digits_only():
    ints = [(name, p) for name, p in _all_options(cli)
            if isinstance(p.type, click.types.IntParamType)]
    assert len(ints) >= 20
    for name, param in ints:
        assert isinstance(param.type, DecimalInt), (name, param.name)
        for bad in ("٣", "1_0", "²", "9" * 5000, "1e3", "0x10", " "):
            with pytest.raises(click.BadParameter) as exc:
                param.type.convert(bad, param, None)
            assert len(exc.value.message) < 200


@pytest.mark.parametrize("args", [
    ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64", "--critical-batch",
     "100", "--target-steps", "nan"),
    ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64", "--critical-batch",
     "100", "--target-steps", "nan", "--objective", "time-to-train"),
    ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64", "--deadline", "nan"),
    ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64", "--budget", "nan"),
    ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64", "--time-limit", "nan"),
    ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64", "--time-limit", "inf"),
    ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64",
     "--price-per-device-hour", "nan"),
    ("limits", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024", "--at-nodes", "nan"),
    ("limits", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024", "--critical-batch",
     "-inf"),
    ("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64",
     "--price-per-device-hour", "nan"),
    ("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64", "--bandwidth", "nan"),
    ("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64", "--bandwidth", "1,inf"),
])
def test_nan_flags_are_bad_input(run, args):
    code, out, err = run(*args)
    _one_line_error(code, out, err)


# 12. answers never depend on wall time: a deterministic budget; the toy proves optimal fast

TOY = {"kind": "cnn", "name": "toy", "input": [3, 32, 32], "layers": [
    {"type": "conv", "out": 16, "kernel": 3, "padding": 1}, {"type": "relu"},
    {"type": "maxpool", "kernel": 2},
    {"type": "conv", "out": 32, "kernel": 3, "padding": 1}, {"type": "relu"},
    {"type": "fc", "out": 64}, {"type": "fc", "out": 10}]}


def _toy_search(**kw):
    from planner.expr.cnn import DataParallelModel, Options
    from planner.spec.cnn import build_cnn
    from planner.spec.hardware import Precision

    system = load_system("dgx1-v100")
    dp = DataParallelModel(build_cnn(TOY, "toy"), system, Options(Precision.fp32))
    return SplitSearch(dp, Problem(nodes_max=4, **kw))


@pytest.mark.parametrize("strat", [Strategy.pipeline, Strategy.hybrid])
def test_toy_split_search_proves_optimal_with_few_solves(strat):
    """Issue 17's toy: 7 layers, at most 4 DGX-1 nodes. The points' own bounds and the plans
    they suggest settle it: the count of CP-SAT solves is what shows it is fast."""
    sol = _toy_search(global_batch=64).solve(strat)
    assert sol.status == "optimal" and sol.stopped_by is None
    assert sol.search["inner_solves"] <= 5
    again = _toy_search(global_batch=64, time_limit_s=3600).solve(strat)
    assert (again.config, again.objective) == (sol.config, sol.objective)


def test_toy_pipeline_over_a_batch_range_is_proven_within_the_budget():
    sol = _toy_search(global_batch_range=(1, 256)).solve(Strategy.pipeline)
    assert sol.status == "optimal" and sol.stopped_by is None
    assert sol.config["devices"] == 32 and sol.config["global_batch"] == 256


def test_a_search_out_of_budget_says_so_and_is_the_same_every_time(monkeypatch):
    monkeypatch.setattr(strategy, "MAX_POINTS", 3)
    runs = [_toy_search(global_batch_range=(1, 256)).solve(Strategy.hybrid) for _ in range(2)]
    for sol in runs:
        assert sol.status == "feasible" and sol.stopped_by == "budget"
    assert runs[0].config == runs[1].config and runs[0].objective == runs[1].objective


def test_the_wall_clock_guard_says_so(run, tmp_path):
    f = tmp_path / "toy.yaml"
    f.write_text(yaml.safe_dump(TOY))
    code, out, err = run("solve", "-m", str(f), "-H", "dgx1-v100", "--nodes-max", "4",
                         "--global-batch-range", "1:256", "--strategy", "hybrid",
                         "--time-limit", "0.5", "--format", "json")
    assert code == 0 and json.loads(out)["status"] == "feasible"
    notes = [ln for ln in err.strip().splitlines() if not ln.startswith("planner: warning:")]
    assert len(notes) == 1 and "--time-limit" in err and "differ" in err


def test_cli_toy_pipeline_twice_gives_identical_json(run, tmp_path):
    f = tmp_path / "toy.yaml"
    f.write_text(yaml.safe_dump(TOY))
    args = ("solve", "-m", str(f), "-H", "dgx1-v100", "--nodes-max", "4", "--global-batch",
            "64", "--strategy", "pipeline", "--format", "json")
    outs = []
    for _ in range(2):
        code, out, err = run(*args)
        # stderr holds at most the low-efficiency warning (tiny model, 8 devices)
        assert code == 0 and all(ln.startswith("planner: warning:") for ln in err.splitlines())
        doc = json.loads(out)
        doc["search"].pop("time_s")
        outs.append(doc)
    assert outs[0] == outs[1] and outs[0]["status"] == "optimal"
