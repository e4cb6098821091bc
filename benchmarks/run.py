"""Benchmarks: solve time by node budget, cold `planner solve` vs a bare import, calibration error,
the transformer ones (`benchmarks/transformer_runs.py`: SC21 accuracy, hybrid solve time) and
the GPT-3 175B search speed on 4,096 and 65,536 GPUs, five runs each
(`benchmarks/search_speed.py`).

    python benchmarks/run.py
"""

from __future__ import annotations

import subprocess
import sys
import time

from planner import api


def solve_times():
    print("data-parallel solve time (alexnet on k80-fdr, global batch 1024, all collectives)")
    print(f"{'nodes_max':>9}  {'points':>7}  {'build_s':>8}  {'cp-sat_s':>8}  status")
    for nmax in (8, 64, 256, 1024):
        sol = api.solve("alexnet", "k80-fdr", global_batch=1024, nodes_max=nmax)
        print(f"{nmax:>9}  {sol.points:>7}  {sol.build_time_s:>8.3f}  {sol.solve_time_s:>8.4f}  "
              f"{sol.status}")


def cold_start():
    def wall(cmd):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            best = min(best, time.perf_counter() - t)
        return best

    bare = wall([sys.executable, "-c", "import sympy, numpy, ortools.sat.python.cp_model"])
    cold = wall([sys.executable, "-m", "planner.cli", "solve", "-m", "alexnet", "-H", "k80-fdr",
                 "--global-batch", "256"])
    print(f"\ncold start: bare import {bare:.2f} s, planner solve {cold:.2f} s, "
          f"ratio {cold / bare:.2f}")


def calibration():
    from planner import calibrate as cal

    results = cal.report(cal.read_runs()[0])
    s = cal.summary(results)
    print(f"\ncalibration (planner calibrate): MAPE {s['mape_all_pct']:.1f}% over {s['rows']} rows, "
          f"{s['mape_held_out_pct']:.1f}% over the {s['held_out_rows']} held-out rows")


if __name__ == "__main__":
    import search_speed
    import transformer_runs

    solve_times()
    cold_start()
    calibration()
    print()
    transformer_runs.sc21_table()
    transformer_runs.bert_table()
    transformer_runs.solve_times()
    print()
    search_speed.main()
