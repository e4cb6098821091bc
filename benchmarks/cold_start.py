"""Cold start of the command line against the bare import of what it needs (numpy, SymPy,
OR-Tools): `planner solve -m llama3-70b -H dgx-h100 --devices 64 --global-batch 256` with an
empty program cache and with it filled, and `planner --help`. Each run is a fresh process; the
three are run in turn (alternating, so a busy machine slows them alike), five times, and the
medians compared. Each command runs once untimed first with bytecode writing on (whatever
PYTHONDONTWRITEBYTECODE says), so that planner's modules are byte-compiled as an installed
package's are (pip compiles them at install) and as the libraries' already are.

    python benchmarks/cold_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SOLVE = ["solve", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "64",
         "--global-batch", "256"]
BARE = [sys.executable, "-c", "import numpy, sympy, ortools.sat.python.cp_model"]
PLANNER = [sys.executable, "-c", "from planner.cli import main; main()"]


def wall(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    cache = tempfile.mkdtemp(prefix="planner-cache-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PLANNER_CACHE_DIR"] = cache
    times: dict[str, list[float]] = {"bare": [], "empty": [], "filled": [], "help": []}
    try:
        for cmd in (BARE, PLANNER + SOLVE, PLANNER + ["--help"]):  # byte-compile, untimed
            wall(cmd, env)
        for _ in range(runs):
            times["bare"].append(wall(BARE, env))
            shutil.rmtree(cache, ignore_errors=True)
            times["empty"].append(wall(PLANNER + SOLVE, env))
            times["filled"].append(wall(PLANNER + SOLVE, env))
            times["help"].append(wall(PLANNER + ["--help"], env))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median of {runs}: bare import {med['bare']:.2f} s")
    for k, what in (("empty", "solve, empty cache"), ("filled", "solve, cache filled")):
        print(f"  {what:20} {med[k]:.2f} s  ratio {med[k] / med['bare']:.2f}")
    print(f"  {'--help':20} {med['help']:.2f} s")


if __name__ == "__main__":
    main()
