"""1,000 small `planner batch` scenarios: serially, in two local processes, and on a Dask
cluster of two single-thread workers on this machine (a `dask scheduler` and two `dask worker`
processes started here), each run as a user runs it (`python -m planner.cli batch ...`, its
wall clock from start to exit). The cluster runs twice: on fresh workers (each imports planner
and compiles its programs on its first tasks) and again on the same, warm workers. A last pair
of runs on fresh workers leaves out planner's fix for Dask's allocator setting
(`planner.parallel._tune_worker`), to show what it is worth. Every run's lines are checked
against the serial run's (wall-clock keys aside).

    python benchmarks/batch_dask.py [--scenarios 1000] [--skip-untuned]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def scenarios(count: int) -> list[dict]:
    """Small solves (a few ms to a few tens of ms each once compiled) over four models."""
    out = []
    for k in range(count):
        gb = (128, 256, 512, 1024)[k % 4]
        kind = k % 4
        if kind == 0:
            out.append({"model": "alexnet", "hardware": "k80-fdr", "global_batch": gb,
                        "nodes_max": 1 + k % 7})
        elif kind == 1:
            out.append({"model": "resnet50", "hardware": "dgx-a100-80gb", "global_batch": 4 * gb,
                        "nodes_max": 1 + k % 9})
        elif kind == 2:
            out.append({"model": "llama3-8b", "hardware": "dgx-h100", "global_batch": gb,
                        "devices_max": 8 * (1 + k % 6)})
        else:
            out.append({"model": "vgg16", "hardware": "k80-fdr", "global_batch": gb,
                        "nodes_max": 1 + k % 5})
    return out


def timed_batch(path: str, *args: str) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "batch", path, *args],
                          capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1, 2):
        raise RuntimeError(f"batch exited {proc.returncode}: {proc.stderr[-2000:]}")
    from planner.batch import without_wall_clock

    return elapsed, [without_wall_clock(json.loads(x)) for x in proc.stdout.splitlines()]


class Cluster:
    def __init__(self, workdir: Path):
        self.workdir, self.procs, self.workers = workdir, [], []
        self.env = {**os.environ, "PYTHONWARNINGS": "ignore"}

    def _start(self, *args: str) -> subprocess.Popen:
        log = open(self.workdir / "cluster.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=log,
                                env=self.env, cwd=self.workdir, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self) -> str:
        file = self.workdir / "scheduler.json"
        self._start("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                    "--no-dashboard", "--scheduler-file", str(file))
        while not file.exists() or not file.read_text().strip():
            time.sleep(0.1)
        time.sleep(0.2)
        self.address = json.loads(file.read_text())["address"]
        return self.address

    def fresh_workers(self, n: int = 2) -> None:
        for proc in self.workers:
            self.kill(proc)
        self.workers = [self._start("distributed.cli.dask_worker", self.address, "--nthreads",
                                    "1", "--nworkers", "1", "--no-dashboard")
                        for _ in range(n)]
        from distributed import Client

        with Client(self.address, set_as_default=False) as client:
            while len(client.scheduler_info()["workers"]) != n:
                time.sleep(0.1)

    @staticmethod
    def kill(proc) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)


def _skip_tuning() -> bool:
    import planner.parallel

    planner.parallel._TUNED = True  # as if tuned already: the allocator stays as Dask set it
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=1000)
    parser.add_argument("--skip-untuned", action="store_true")
    args = parser.parse_args()
    from distributed import Client

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenarios.jsonl"
        path.write_text("".join(json.dumps(s) + "\n" for s in scenarios(args.scenarios)))
        rows = []
        serial_s, serial = timed_batch(str(path))
        rows.append(("serial (one process)", serial_s))
        local_s, local = timed_batch(str(path), "--jobs", "2")
        assert local == serial
        rows.append(("--jobs 2 (local processes)", local_s))
        cluster = Cluster(Path(tmp))
        try:
            address = cluster.start()
            cluster.fresh_workers()
            for label in ("2 Dask workers, fresh", "2 Dask workers, warm"):
                elapsed, lines = timed_batch(str(path), "--scheduler", address)
                assert lines == serial, label
                rows.append((label, elapsed))
            if not args.skip_untuned:
                cluster.fresh_workers()
                with Client(address, set_as_default=False) as client:
                    client.run(_skip_tuning)
                for label in ("2 Dask workers, fresh, allocator not tuned",
                              "2 Dask workers, warm, allocator not tuned"):
                    elapsed, lines = timed_batch(str(path), "--scheduler", address)
                    assert lines == serial, label
                    rows.append((label, elapsed))
        finally:
            cluster.close()
    print(f"{args.scenarios} scenarios on {os.cpu_count()} cores; wall clock of the whole "
          f"command (Python start, import, reading, solving, writing)")
    for label, seconds in rows:
        print(f"  {label:45s} {seconds:7.2f} s   {serial_s / seconds:5.2f}x serial")


if __name__ == "__main__":
    main()
