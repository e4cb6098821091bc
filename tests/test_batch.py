"""planner batch (many solves from a scenario file) and the parallel runs of batch and sweep:
local processes (--jobs) and a Dask cluster (--scheduler), each identical to the serial run."""

import json
import os
import sys
import time

import pytest

from planner.batch import WALL_CLOCK_KEYS, ClusterError, parallel_map, without_wall_clock

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


def _plan(line: dict) -> dict:
    """A line without its `scenario` key: the solve document."""
    return {k: v for k, v in line.items() if k != "scenario"}


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
        assert _plan(lines[k]) == without_wall_clock(json.loads(solve_out)), k
        assert ("error" in lines[k]) == (solve_code != 0)
        # each line names its scenario: index, the line it starts on, its options as given
        assert lines[k]["scenario"]["index"] == k + 1 and lines[k]["scenario"]["line"] == k + 1
    assert lines[4]["scenario"]["input"]["target_samples"] == 1.2e8
    assert list(lines[0])[:3] == ["schema_version", "command", "scenario"]
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


def test_each_line_validates_against_the_line_schema(serial):
    """A line is the solve document (its schema) with the scenario key."""
    jsonschema = pytest.importorskip("jsonschema")
    from planner.batch import line_schema
    from planner.schema import schemas

    for line in serial[1].splitlines():
        jsonschema.validate(json.loads(line), line_schema())
        jsonschema.validate(_plan(json.loads(line)), schemas()["solve"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_plan(json.loads(serial[1].splitlines()[0])), line_schema())


# --- streaming, output, resume, empty inputs, bad addresses -----------------------------------


def test_as_finished_lines_are_the_serial_lines_in_some_order(serial, scenario_file, run):
    code, out, _ = run("batch", scenario_file, "--jobs", "2", "--as-finished")
    assert code == serial[0]
    by_index = {line["scenario"]["index"]: line for line in _lines(out)}
    assert [by_index[k] for k in sorted(by_index)] == _lines(serial[1])


def test_output_file_is_written_and_stdout_left_empty(serial, scenario_file, run, tmp_path):
    path = tmp_path / "plans.jsonl"
    code, out, _ = run("batch", scenario_file, "-o", str(path))
    assert (code, out) == (serial[0], "")
    assert _lines(path.read_text()) == _lines(serial[1])


@pytest.mark.parametrize(("name", "text"), [
    ("e.jsonl", ""), ("e.jsonl", "\n  \n"), ("e.yaml", ""), ("e.yaml", "# nothing\n"),
    ("e.yml", "[]\n"), ("e.yaml", "scenarios: []\n"), ("e.yaml", "scenarios:\n"),
    ("e.json", ""), ("e.json", "[]"),
])
def test_empty_inputs_are_one_message_and_exit_2(tmp_path, run, name, text):
    path = tmp_path / name
    path.write_text(text)
    code, out, err = run("batch", str(path))
    assert (code, out) == (2, "")
    assert err == f"planner: {path}: no scenarios (the file is empty)\n"


def test_resume_skips_the_answered_scenarios(serial, scenario_file, run, tmp_path,
                                             monkeypatch):
    from planner import batch as batch_mod

    lines = serial[1].splitlines()
    lost = {k: v for k, v in json.loads(lines[1]).items()
            if k in ("schema_version", "command", "scenario")}
    lost["error"] = {"kind": "cluster_lost", "message": "not run", "constraints": [],
                     "file": None, "key": None, "value": None}
    partial = tmp_path / "plans.jsonl"
    # scenario 4 and 1 answered (any order), 2 lost, a last line cut short by a kill
    partial.write_text(lines[3] + "\n" + lines[0] + "\n" + json.dumps(lost) + "\n"
                       + lines[2][:40])
    ran = []
    real = batch_mod.run_scenario
    monkeypatch.setattr(batch_mod, "run_scenario", lambda argv: ran.append(argv) or real(argv))
    code, out, _ = run("batch", scenario_file, "--resume", str(partial))
    assert code == serial[0]
    assert _lines(out) == _lines(serial[1])
    assert out.splitlines()[0] == lines[0] and out.splitlines()[3] == lines[3]  # copied
    assert len(ran) == 3  # scenarios 2, 3, 5
    # the same file as output: rewritten whole once the run ends
    code, out, _ = run("batch", scenario_file, "--resume", str(partial), "-o", str(partial))
    assert (code, out) == (serial[0], "")
    assert _lines(partial.read_text()) == _lines(serial[1])
    assert not (tmp_path / "plans.jsonl.partial").exists()
    # everything answered: nothing runs
    ran.clear()
    code, out, _ = run("batch", scenario_file, "--resume", str(partial))
    assert ran == [] and _lines(out) == _lines(serial[1])


def test_resume_from_a_missing_file_runs_everything(serial, scenario_file, run, tmp_path):
    code, out, _ = run("batch", scenario_file, "--resume", str(tmp_path / "none.jsonl"))
    assert code == serial[0] and _lines(out) == _lines(serial[1])


@pytest.mark.parametrize(("content", "message"), [
    ("not json\n{}\n", "line 1: not JSON"),
    ('{"schema_version": 1}\n', "line 1: names no scenario"),
    ('{"scenario": {"index": 9, "input": {}}}\n', "line 1: scenario 9, but the input has 5"),
    ('{"scenario": {"index": 2, "input": {"model": "vgg16"}}}\n',
     "line 1: scenario 2 was run with other options than"),
])
def test_a_resume_file_that_does_not_fit_is_exit_2(scenario_file, run, tmp_path, content,
                                                   message):
    path = tmp_path / "old.jsonl"
    path.write_text(content)
    code, out, err = run("batch", scenario_file, "--resume", str(path))
    assert (code, out) == (2, "") and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:notaport", "127.0.0.1:8786",
                                     "tcp://127.0.0.1", "tcp://127.0.0.1:0",
                                     "tcp://127.0.0.1:70000", "http://127.0.0.1:8786", ""])
def test_a_bad_scheduler_address_is_exit_2_at_once(scenario_file, run, address):
    start = time.monotonic()
    code, out, err = run("batch", scenario_file, "--scheduler", address)
    assert (code, out) == (2, "") and time.monotonic() - start < 2
    assert err.startswith("planner: scheduler: ") and len(err.splitlines()) == 1
    code, _, err = run("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
                       "--scheduler", address)
    assert code == 2 and err.startswith("planner: scheduler: ")


def test_an_unreachable_scheduler_is_exit_4_and_leaves_the_output_alone(scenario_file, run,
                                                                        tmp_path):
    pytest.importorskip("distributed")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_file = tmp_path / "plans.jsonl"
    out_file.write_text("kept\n")
    start = time.monotonic()
    code, out, err = run("batch", scenario_file, "--scheduler", f"tcp://127.0.0.1:{port}",
                         "--connect-timeout", "1", "-o", str(out_file))
    assert (code, out) == (4, "") and time.monotonic() - start < 10
    assert err.startswith("planner: scheduler: cannot connect to") and len(err.splitlines()) == 1
    assert out_file.read_text() == "kept\n"


def _die_on_3(x):
    if x == 3:
        os._exit(1)  # a native crash, an out-of-memory kill
    return x * x


def test_a_local_process_that_dies_loses_only_its_item():
    from planner.parallel import Run

    done = sorted(Run(_die_on_3, [1, 2, 3, 4, 5, 6], jobs=2), key=lambda d: d.index)
    assert [d.value for d in done if d.ok] == [1, 4, 16, 25, 36]
    assert [(d.index, d.lost) for d in done if not d.ok] == [(2, "worker_lost")]
    with pytest.raises(ClusterError, match="task 3: its worker died"):
        parallel_map(_die_on_3, [1, 2, 3, 4], jobs=2)


def test_held_back_lines_are_given_when_the_run_is_interrupted(scenario_file):
    """Ordered output holds back what is not yet in order; an interrupt (Ctrl-C, SIGTERM at a
    time limit) still gets every finished line out before it ends the run."""
    from planner.batch import _error_result, batch

    run = batch(scenario_file)

    def results():
        for k in (3, 2):
            yield _error_result(run.scenarios[k - 1], "internal", "x")
        raise KeyboardInterrupt

    run._results = results
    got = []
    with pytest.raises(KeyboardInterrupt):
        for r in run:
            got.append(r.scenario.index)
    assert got == [2, 3]


def test_progress_lines_say_done_running_and_waiting():
    from planner.parallel import Progress

    assert Progress(10, 3, 1, 2, 5, 2).line("batch") == (
        "batch: 3 of 10 done (1 failed), 2 running, 5 waiting; 2 workers")
    assert Progress(10, 3, 0, 2, 5, 0, 12.4, 120).line("batch") == (
        "batch: 3 of 10 done, 7 waiting for workers (no workers for 12 s; "
        "--stall-timeout 120 s)")
    assert Progress(4, 1, 0, 1, 2).line("sweep") == "sweep: 1 of 4 done, 1 running, 2 waiting"


def test_a_progress_line_every_n_seconds_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    import types

    from planner.cli import batch_cmd
    from planner.cli.batch_cmd import Reporter
    from planner.parallel import Progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    clock = iter([0.0, 0.5, 1.2, 1.4, 2.5])
    # the reporter's clock only: the global time.monotonic also serves the threads of the
    # module's Dask cluster, which would eat the readings (and fail on the last one)
    monkeypatch.setattr(batch_cmd, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    reporter = Reporter("batch", 10, 1.0)  # reads the clock once: 0.0
    for done in (1, 2, 3, 4):  # at 0.5, 1.2, 1.4, 2.5 s
        reporter(Progress(10, done, 0, 1, 9 - done))
    assert capsys.readouterr().err.splitlines() == [
        "planner: batch: 2 of 10 done, 1 running, 7 waiting (1 s)",
        "planner: batch: 4 of 10 done, 1 running, 5 waiting (2 s)"]


def test_sigterm_writes_what_finished_and_exits_130(tmp_path):
    """A batch system's time limit (SIGTERM) during a solve in this process: the finished
    lines are out, the interrupted scenario gets no line, one message, exit 130."""
    import signal
    import subprocess

    path = tmp_path / "s.jsonl"
    path.write_text("".join(
        json.dumps({"model": m, "hardware": "dgx-h100", "global_batch": 1024,
                    "devices_max": 4096}) + "\n"
        for m in ("llama3-8b", "llama3-70b", "llama3-70b", "llama3-405b", "llama3-405b")))
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "batch", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    lines = [first, *rest.splitlines()]
    assert 1 <= len(lines) < 5
    assert all("error" not in json.loads(x) for x in lines)
    assert err.splitlines()[-1].startswith(f"planner: batch: terminated; {len(lines)} of 5 "
                                           "lines written; finish with --resume FILE")
    assert "Traceback" not in err


def test_an_interrupt_thrown_in_while_lines_are_held_gets_them_out(scenario_file):
    """The CLI defers a SIGTERM that comes while it writes a line, then throws it into the
    run: the lines held back for order still come out before it ends the run."""
    from planner.batch import _error_result, batch

    run = batch(scenario_file)

    def results():
        for k in (3, 1, 2):
            yield _error_result(run.scenarios[k - 1], "internal", "x")

    run._results = results
    lines = iter(run)
    assert next(lines).scenario.index == 1  # 3 is held back
    assert lines.throw(KeyboardInterrupt()).scenario.index == 3
    with pytest.raises(KeyboardInterrupt):
        next(lines)
