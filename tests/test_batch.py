"""planner batch (many solves from a scenario file) and the parallel runs of batch and sweep:
local processes (--jobs) and a Dask cluster (--scheduler), each identical to the serial run."""

import json
import sys

import pytest

from planner.batch import WALL_CLOCK_KEYS, parallel_map, without_wall_clock

SCENARIOS = """\
- {model: llama3-8b, hardware: dgx-h100, global_batch: 512, devices_max: 64}
- {model: alexnet, hardware: k80-fdr, global_batch: 256, top: 2}
- {model: alexnet, hardware: k80-fdr, global_batch: 256, nodes: 3, overlap: false}
- {model: no-such-model, hardware: k80-fdr, global_batch: 256}
- {model: resnet50, hardware: dgx-a100-80gb, nodes_max: 4, global_batch_range: "256:2048",
   critical_batch: 4096, target_samples: 1.2e+8, objective: time-to-train, deadline: 36000.0}
"""
# the same scenarios as `planner solve` flags
AS_FLAGS = [
    ["-m", "llama3-8b", "-H", "dgx-h100", "--global-batch", "512", "--devices-max", "64"],
    ["-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--top", "2"],
    ["-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--nodes", "3", "--no-overlap"],
    ["-m", "no-such-model", "-H", "k80-fdr", "--global-batch", "256"],
    ["-m", "resnet50", "-H", "dgx-a100-80gb", "--nodes-max", "4", "--global-batch-range",
     "256:2048", "--critical-batch", "4096", "--target-samples", "1.2e8", "--objective",
     "time-to-train", "--deadline", "36000"],
]


@pytest.fixture
def scenario_file(tmp_path):
    path = tmp_path / "scenarios.yaml"
    path.write_text(SCENARIOS)
    return str(path)


def _lines(out: str) -> list[dict]:
    return [without_wall_clock(json.loads(line)) for line in out.splitlines()]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The serial batch's (exit code, lines, stderr), run once for the module."""
    import contextlib
    import io

    from planner.cli import main

    path = tmp_path_factory.mktemp("serial") / "scenarios.yaml"
    path.write_text(SCENARIOS)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["batch", str(path)])
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_each_line_is_the_solve_document_in_input_order(serial, run):
    code, out, err = serial
    lines = _lines(out)
    assert len(lines) == len(AS_FLAGS)
    for k, flags in enumerate(AS_FLAGS):
        solve_code, solve_out, _ = run("solve", *flags, "--format", "json")
        assert lines[k] == without_wall_clock(json.loads(solve_out)), k
        assert ("error" in lines[k]) == (solve_code != 0)
    assert lines[0]["config"]["devices"] <= 64 and lines[1]["model"] == "alexnet"
    assert lines[2]["error"]["kind"] == "infeasible"
    assert lines[3]["error"]["kind"] == "bad_input" and lines[3]["error"]["value"] == "no-such-model"
    assert lines[4]["objective"]["name"] == "time-to-train"
    assert lines[4]["objective"]["value"] <= 36000
    # the worst scenario's exit code (bad input); each failure's line on stderr, by scenario
    assert code == 2
    scenarios = [ln.split(":")[1].strip() for ln in err.splitlines()]
    assert all(ln.startswith("planner: scenario ") for ln in err.splitlines())
    assert {"scenario 3", "scenario 4"} <= set(scenarios) and "scenario 5" not in scenarios


def test_wall_clock_keys_are_the_only_difference_between_two_runs(serial, run):
    _, out, _ = serial
    first = json.loads(out.splitlines()[1])
    assert set(WALL_CLOCK_KEYS) <= set(first)
    assert without_wall_clock(first)["search"].keys() == first["search"].keys() - set(
        WALL_CLOCK_KEYS)


def test_jobs_2_is_identical_to_serial(serial, scenario_file, run):
    code, out, err = run("batch", scenario_file, "--jobs", "2")
    assert (code, _lines(out), err) == (serial[0], _lines(serial[1]), serial[2])


def test_jsonl_input_and_stdin(tmp_path, run):
    path = tmp_path / "s.jsonl"
    path.write_text('{"model": "alexnet", "hardware": "k80-fdr", "global_batch": 256}\n\n'
                    '{"model": "alexnet", "hardware": "k80-fdr", "global_batch": 512, '
                    '"collective": "ring", "time_limit": 5.0}\n')
    code, out, err = run("batch", str(path))
    assert code == 0
    # not a terminal: no progress bar, only the scenarios' own notes
    assert all(ln.startswith("planner: scenario ") for ln in err.splitlines())
    lines = _lines(out)
    assert [ln["config"]["global_batch"] for ln in lines] == [256, 512]
    assert lines[1]["config"]["collective"] == "ring"


@pytest.mark.parametrize(("scenario", "message"), [
    ("{model: alexnet, hardware: k80-fdr, global_batch: 256, devces_max: 4}",
     "scenario 2: unknown key 'devces_max' (did you mean 'devices_max'?)"),
    ("{model: alexnet, hardware: k80-fdr, global_batch: '256'}",
     "scenario 2: key 'global_batch' must be an integer, got '256'"),
    ("{model: alexnet, hardware: k80-fdr, global_batch: 0}",
     "scenario 2: key 'global_batch': 0 is not in the range"),
    ("{model: alexnet, hardware: k80-fdr, overlap: 'no'}",
     "scenario 2: key 'overlap' must be true or false"),
    ("{model: alexnet, global_batch: 256}", "scenario 2: key 'hardware' is required"),
    ("{model: alexnet, hardware: k80-fdr, deadline: 5.0, deadline_s: 6.0}",
     "scenario 2: key 'deadline_s' repeats 'deadline'"),
    ("[model, alexnet]", "scenario 2: expected a mapping of solve options"),
    ("{model: alexnet, hardware: k80-fdr, format: table}", "scenario 2: unknown key 'format'"),
])
def test_a_bad_scenario_is_exit_2_naming_its_index_and_key(tmp_path, run, scenario, message):
    path = tmp_path / "s.yaml"
    path.write_text(f"- {{model: alexnet, hardware: k80-fdr, global_batch: 256}}\n- {scenario}\n")
    code, out, err = run("batch", str(path))
    assert code == 2 and out == ""  # checked before any scenario runs
    assert message in err and len(err.strip().splitlines()) == 1


def test_values_are_option_text_never_code(tmp_path, run):
    path = tmp_path / "s.yaml"
    path.write_text("- {model: \"__import__('os').system('false')\", hardware: k80-fdr, "
                    "global_batch: 256}\n"
                    "- {model: --help, hardware: k80-fdr, global_batch: 256}\n"
                    "- {model: alexnet --top 3, hardware: k80-fdr, global_batch: 256}\n")
    code, out, _ = run("batch", str(path))
    lines = _lines(out)
    assert code == 2 and len(lines) == 3
    assert "unknown model" in lines[0]["error"]["message"]
    assert lines[1]["error"]["kind"] == "bad_input" and "--help" in lines[1]["error"]["message"]
    assert lines[2]["error"]["value"] == "alexnet --top 3"


def test_a_file_that_is_not_a_list_is_exit_2(tmp_path, run):
    path = tmp_path / "s.yaml"
    path.write_text("model: alexnet\n")
    code, _, err = run("batch", str(path))
    assert code == 2 and "expected a list of scenarios" in err
    code, _, err = run("batch", str(tmp_path / "missing.yaml"))
    assert code == 2 and "no such file" in err


def test_scheduler_without_dask_is_one_line_exit_2(scenario_file, run, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed raises
    code, out, err = run("batch", scenario_file, "--scheduler", "tcp://127.0.0.1:8786")
    assert code == 2 and out == ""
    assert err.strip() == ("planner: scheduler: --scheduler needs Dask; "
                           "pip install 'planner[dask]'")
    code, _, err = run("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
                       "--scheduler", "tcp://127.0.0.1:8786")
    assert code == 2 and "pip install 'planner[dask]'" in err


def test_jobs_with_scheduler_is_exit_2(scenario_file, run):
    code, _, err = run("batch", scenario_file, "--jobs", "2", "--scheduler", "tcp://h:1")
    assert code == 2 and "--jobs applies to local processes" in err


def _square(x):
    if x == 3:
        raise ValueError("three")
    return x * x


def test_parallel_map_keeps_order_and_raises_the_earliest_failure():
    done = []
    assert parallel_map(_square, [4, 1, 2], jobs=2, on_done=lambda: done.append(1)) == [16, 1, 4]
    assert len(done) == 3
    assert parallel_map(_square, [5], jobs=0) == [25]
    with pytest.raises(ValueError, match="three"):
        parallel_map(_square, [1, 3, 2], jobs=2)


def test_progress_bar_only_on_a_terminal(monkeypatch):
    import contextlib

    from planner.cli.output import progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert isinstance(progress(3, "batch"), contextlib.nullcontext)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert not isinstance(progress(3, "batch"), contextlib.nullcontext)


# --- sweep in parallel ----------------------------------------------------------------------

SWEEPS = [
    ["-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256,1024", "--nodes", "1,2,4,8",
     "--bandwidth", "6.25,25", "--critical-batch", "512", "--target-steps", "1000"],
    ["-m", "llama3-8b", "-H", "dgx-h100", "--global-batch", "512", "--nodes", "1,2,4"],
]


@pytest.mark.parametrize("flags", SWEEPS, ids=["cnn", "transformer"])
def test_sweep_jobs_2_is_identical_to_serial(run, flags):
    code, serial_out, _ = run("sweep", *flags, "--format", "json")
    assert code == 0
    code, out, err = run("sweep", *flags, "--format", "json", "--jobs", "2")
    assert code == 0, err
    assert json.loads(out) == json.loads(serial_out)


# --- on a Dask cluster ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def test_batch_on_a_dask_cluster_is_identical_to_serial(dask_cluster, serial, scenario_file,
                                                         run):
    code, out, err = run("batch", scenario_file, "--scheduler", dask_cluster)
    assert (code, _lines(out), err) == (serial[0], _lines(serial[1]), serial[2])


def test_sweep_on_a_dask_cluster_is_identical_to_serial(dask_cluster, run):
    flags = [*SWEEPS[0], "--format", "json"]
    _, serial_out, _ = run("sweep", *flags)
    code, out, err = run("sweep", *flags, "--scheduler", dask_cluster)
    assert code == 0, err
    assert json.loads(out) == json.loads(serial_out)


def test_each_line_validates_against_the_solve_schema(serial):
    jsonschema = pytest.importorskip("jsonschema")
    from planner.schema import schemas

    schema = schemas()["solve"]
    for line in serial[1].splitlines():
        jsonschema.validate(json.loads(line), schema)
