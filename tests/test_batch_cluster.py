"""planner batch on a real Dask cluster: `dask scheduler` and `dask worker` processes on
127.0.0.1, started here and killed mid-run as a node failure would kill them. A killed worker
changes nothing; a killed scheduler keeps every finished line (identical to the serial run's),
gives an error line for each unfinished scenario and exit 4 within a minute, and --resume then
completes the batch identical to the serial run; a cluster with no workers stops within the
stall timeout; a scenario that kills its worker is one error line; workers keep their
compiled programs between tasks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.batch import line_schema, without_wall_clock

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.slow


# --- a cluster of processes ---------------------------------------------------------------------


class Cluster:
    """`dask scheduler` and `dask worker` processes on 127.0.0.1, each in its own session so a
    test can kill one (a worker's nanny and worker together) with SIGKILL, as a node failure
    would."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.file = workdir / "scheduler.json"
        self.procs: list[subprocess.Popen] = []
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.address = ""

    def _start(self, *args: str, log: str) -> subprocess.Popen:
        # one task per worker thread (precise blame when a worker dies), and a task that
        # killed two workers is given up (KilledWorker); the repository importable by workers
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1",
               "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0",
               "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
               "PYTHONWARNINGS": "ignore"}
        out = open(self.workdir / log, "ab")  # noqa: SIM115 - kept open for the process
        proc = subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=out, env=env,
                                cwd=self.workdir, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start_scheduler(self) -> str:
        self.file.unlink(missing_ok=True)
        self.scheduler = self._start("distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                     "--port", "0", "--no-dashboard", "--scheduler-file",
                                     str(self.file), log="scheduler.log")
        deadline = time.monotonic() + 60
        while not self.file.exists() or not self.file.read_text().strip():
            if time.monotonic() > deadline or self.scheduler.poll() is not None:
                raise RuntimeError("dask scheduler did not start: "
                                   + (self.workdir / "scheduler.log").read_text()[-2000:])
            time.sleep(0.1)
        time.sleep(0.1)
        self.address = json.loads(self.file.read_text())["address"]
        return self.address

    def add_worker(self, name: str) -> subprocess.Popen:
        proc = self._start("distributed.cli.dask_worker", self.address, "--nthreads", "1",
                           "--nworkers", "1", "--no-dashboard", "--name", name,
                           "--death-timeout", "20", log=f"{name}.log")
        self.workers.append(proc)
        return proc

    def wait_for_workers(self, n: int, timeout_s: float = 60) -> None:
        from distributed import Client

        with Client(self.address, timeout=10, set_as_default=False) as client:
            client.wait_for_workers(n, timeout=timeout_s)

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        """SIGKILL the process's whole session (a worker's nanny and worker alike)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)


def crash_on_marker(argv):
    """`planner.batch.run_scenario`, except that a scenario whose model is 'vgg16' with
    --top=7 ends its worker process at once (a native crash, an out-of-memory kill)."""
    from planner.batch import run_scenario

    if "--model=vgg16" in argv and "--top=7" in argv:
        os._exit(1)
    return run_scenario(argv)


# --- the tests ----------------------------------------------------------------------------------

# Scenarios of about 0.2 s each once compiled, so that a run lasts long enough to kill
# something in the middle of it.
MODELS = [("llama3-70b", "dgx-h100", 1024), ("gpt3-175b", "dgx-a100-80gb", 1536),
          ("mixtral-8x7b", "dgx-h100", 512)]
SCENARIOS = [{"model": m, "hardware": h, "global_batch": gb, "devices_max": 1024 * (1 + k % 4)}
             for k in range(24) for m, h, gb in [MODELS[k % 3]]]


def _jsonl(path) -> str:
    path.write_text("".join(json.dumps(s) + "\n" for s in SCENARIOS))
    return str(path)


def _by_index(text: str) -> dict[int, dict]:
    out = {}
    for line in text.splitlines():
        doc = json.loads(line)
        out[doc["scenario"]["index"]] = without_wall_clock(doc)
    return out


def _main(*args) -> tuple[int, str, str]:
    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory):
    return _jsonl(tmp_path_factory.mktemp("scenarios") / "s.jsonl")


@pytest.fixture(scope="module")
def serial(scenario_file):
    """The serial run in this process: (exit code, lines, lines by index)."""
    code, out, _ = _main("batch", scenario_file)
    assert code == 0 and len(out.splitlines()) == len(SCENARIOS)
    return code, out, _by_index(out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start_scheduler()
        c.add_worker("w1")
        c.add_worker("w2")
        c.wait_for_workers(2)
        yield c
    finally:
        c.close()


def _batch_process(*args) -> subprocess.Popen:
    """`planner batch ...` as its own process, as a user runs it (stderr is not a terminal)."""
    return subprocess.Popen([sys.executable, "-m", "planner.cli", "batch", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_then(proc: subprocess.Popen, after: int, action) -> tuple[list[str], int]:
    """The process's stdout lines; `action()` once `after` lines have arrived. Also how many
    lines had arrived then."""
    lines, seen = [], -1
    for line in proc.stdout:
        lines.append(line)
        if len(lines) == after:
            seen = len(lines)
            action()
    return lines, seen


@pytest.mark.slow
def test_killing_a_worker_mid_run_changes_nothing(cluster, serial, scenario_file):
    victim = cluster.workers[0]
    proc = _batch_process(scenario_file, "--scheduler", cluster.address)
    lines, seen = _read_then(proc, 1, lambda: cluster.kill(victim))
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert 0 < seen < len(SCENARIOS)  # killed mid-run
    # ordered (the default): the serial run's lines, in its order, wall clock aside
    assert [without_wall_clock(json.loads(x)) for x in lines] == [
        without_wall_clock(json.loads(x)) for x in serial[1].splitlines()]
    assert "Traceback" not in err and "distributed" not in err
    cluster.workers.remove(victim)
    cluster.add_worker("w3")
    cluster.wait_for_workers(2)


def test_a_scenario_that_kills_its_worker_is_one_error_line(cluster, serial):
    """KilledWorker (Dask gave up on a task that killed two workers): that scenario's line is
    `worker_lost`, exit code 4; the others are the serial run's."""
    from planner.batch import batch

    crash = {"model": "vgg16", "hardware": "k80-fdr", "global_batch": 256, "top": 7}
    scenarios = [SCENARIOS[0], crash, SCENARIOS[1]]
    run = batch(scenarios, scheduler=cluster.address, stall_timeout_s=60)
    run._run.fn = crash_on_marker
    results = list(run)
    assert [r.scenario.index for r in results] == [1, 2, 3]
    assert results[1].kind == "worker_lost" and results[1].code == 4
    assert "KilledWorker" in results[1].doc["error"]["message"]
    for r, k in ((results[0], 1), (results[2], 2)):
        doc = without_wall_clock(r.doc)
        assert {**doc, "scenario": None} == {**serial[2][k], "scenario": None}
    assert run.exit_code == 4 and run.lost is None
    cluster.wait_for_workers(2)


def test_workers_keep_compiled_programs_between_tasks(cluster):
    """Three batches of one scenario (at least three tasks over two workers: some worker runs
    two or more) build its model once per worker at most: `planner.inputs.build` keeps each
    model it builds per process, and each task runs in the worker's own process (no
    re-import, no rebuild)."""
    from planner.batch import batch

    def builds():
        from planner.inputs import _BUILT

        return len(_BUILT)

    with distributed.Client(cluster.address, set_as_default=False) as client:
        scenario = {"model": "googlenet", "hardware": "k80-fdr", "global_batch": 512}
        before = client.run(builds)
        for _ in range(3):
            results = list(batch([scenario] * 4, scheduler=client))
            assert [r.code for r in results] == [0] * 4
        after = client.run(builds)
        grown = {w: after[w] - before.get(w, 0) for w in after}
        assert sum(grown.values()) >= 1 and max(grown.values()) <= 1, grown
        # the allocator fix ran in each worker that took a task
        assert any(client.run(lambda: __import__("planner.parallel").parallel._TUNED).values())


def test_sweep_takes_a_client(cluster, run):
    from planner import api

    flags = dict(nodes=[1, 2, 4, 8], global_batch=[256, 1024], bandwidths_GBps=[6.25, 25.0])
    serial = api.sweep("alexnet", "k80-fdr", **flags)
    with distributed.Client(cluster.address, set_as_default=False) as client:
        parallel = api.sweep("alexnet", "k80-fdr", scheduler=client, **flags)
        assert client.status == "running"  # a client given is left open
    assert parallel == serial


@pytest.mark.slow
def test_killing_the_scheduler_keeps_what_finished_and_resume_completes(
        cluster, serial, scenario_file, tmp_path):
    out = tmp_path / "plans.jsonl"
    proc = _batch_process(scenario_file, "--scheduler", cluster.address, "--as-finished",
                          "-o", str(out), "--stall-timeout", "30")
    # the lines go to the file: wait for the first to be flushed there, then kill
    deadline = time.monotonic() + 90
    while not (out.exists() and out.read_text().count("\n") >= 2):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    cluster.kill(cluster.scheduler)
    killed = time.monotonic()
    code = proc.wait(timeout=60)
    err = proc.stderr.read()
    assert code == 4, err
    assert time.monotonic() - killed < 60
    lines = out.read_text().splitlines()
    assert len(lines) == len(SCENARIOS)  # one per scenario, finished or not
    done = _by_index("\n".join(x for x in lines if '"cluster_lost"' not in x))
    lost = [json.loads(x) for x in lines if '"cluster_lost"' in x]
    assert done and lost, (len(done), len(lost))
    for k, doc in done.items():
        assert doc == serial[2][k]
    assert all(d["error"]["message"].startswith("not run: the cluster was lost") for d in lost)
    # one message, never a Dask traceback (a scenario's own warnings are its own lines)
    message = [x for x in err.splitlines() if (not x.startswith("planner: batch: ")
               or "cluster lost" in x) and not x.startswith("planner: scenario ")]
    assert len(message) == 1 and "cluster lost" in message[0], err
    assert f"{len(lost)} of {len(SCENARIOS)} scenarios not answered" in message[0]
    assert "Traceback" not in err
    jsonschema = pytest.importorskip("jsonschema")
    for x in lines:
        jsonschema.validate(json.loads(x), line_schema())

    # --resume: the answered lines are kept, the rest run (here, locally); the file ends as
    # the serial run's output
    code, stdout, _ = _main("batch", scenario_file, "-o", str(out), "--resume", str(out))
    assert code == 0 and stdout == ""
    assert [without_wall_clock(json.loads(x)) for x in out.read_text().splitlines()] == [
        without_wall_clock(json.loads(x)) for x in serial[1].splitlines()]
    kept = {json.dumps(json.loads(x)) for x in lines if '"cluster_lost"' not in x}
    assert kept <= {json.dumps(json.loads(x)) for x in out.read_text().splitlines()}


@pytest.mark.slow
def test_no_workers_stops_within_the_stall_timeout(tmp_path, scenario_file):
    c = Cluster(tmp_path)
    try:
        address = c.start_scheduler()
        start = time.monotonic()
        proc = _batch_process(scenario_file, "--scheduler", address, "--stall-timeout", "3",
                              "--progress-every", "1")
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - start
        # a sweep too: one line, its JSON error document, exit 4
        code, sweep_out, sweep_err = _main(
            "sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--nodes",
            "1,2", "--scheduler", address, "--stall-timeout", "2", "--format", "json")
    finally:
        c.close()
    assert code == 4 and sweep_err.startswith("planner: cluster lost: no workers")
    assert len(sweep_err.splitlines()) == 1
    assert json.loads(sweep_out)["error"]["kind"] == "cluster_lost"
    assert proc.returncode == 4
    assert elapsed < 3 + 15  # the stall timeout, and starting Python
    lines = [json.loads(x) for x in out.splitlines()]
    assert len(lines) == len(SCENARIOS)
    assert {d["error"]["kind"] for d in lines} == {"cluster_lost"}
    progress = [x for x in err.splitlines() if "waiting for workers" in x]
    assert progress and "no workers" in progress[0] and f"0 of {len(SCENARIOS)} done" in \
        progress[0]
    last = err.splitlines()[-1]
    assert last.startswith("planner: batch: cluster lost: no workers and no progress for 3 s")
    assert "Traceback" not in err
