"""Transformer search speed: GPT-3 175B on up to 4,096 and 65,536 GPUs of dgx-a100-80gb at
global batch 1,536, every choice free (search build + CP-SAT solve), several runs each because
this machine is noisy. The goal is 0.3 s and 1 s.

    python benchmarks/search_speed.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from planner import api

BUDGETS = (4096, 65536)


def measure(runs: int) -> dict[int, list[float]]:
    api.solve_transformer("gpt3-175b", "dgx-a100-80gb", global_batch=1536, devices_max=64)
    out = {}
    for budget in BUDGETS:
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            api.solve_transformer("gpt3-175b", "dgx-a100-80gb", global_batch=1536,
                                  devices_max=budget)
            times.append(time.perf_counter() - t)
        out[budget] = times
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_known_args()[0].runs
    print(f"gpt3-175b search on dgx-a100-80gb, global batch 1536 ({runs} runs each)")
    print(f"{'devices_max':>11} {'min_s':>7} {'median_s':>8} {'max_s':>7}")
    for budget, times in measure(runs).items():
        print(f"{budget:>11} {min(times):>7.3f} {statistics.median(times):>8.3f} "
              f"{max(times):>7.3f}")


if __name__ == "__main__":
    main()
