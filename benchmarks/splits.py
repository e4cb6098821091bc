"""Benchmark of the CNN layer-split searches (`solve --strategy hybrid|pipeline`): points,
inner CP-SAT solves, search time, and the gain over the best data-parallel plan.

    python benchmarks/splits.py
"""

from __future__ import annotations

import time

from planner import api

CASES = [
    ("alexnet", "k80-fdr", 256, {"nodes_max": 16}, "hybrid"),
    ("vgg16", "k80-fdr", 256, {"nodes_max": 16}, "hybrid"),
    ("resnet50", "dgx-a100-80gb", 1024, {"nodes_max": 64}, "hybrid"),
    ("googlenet", "dgx-a100-80gb", 1024, {"nodes_max": 64}, "hybrid"),
    ("vgg16", "k80-fdr", 256, {"devices": 8}, "pipeline"),
    ("resnet50", "dgx-a100-80gb", 1024, {"nodes_max": 4}, "pipeline"),
]


def main():
    print(f"{'model':<10} {'hardware':<14} {'strategy':<9} {'points':>6} {'solved':>6} "
          f"{'search_s':>8} {'total_s':>7} {'devices':>7} {'data/split':>10}  status")
    for model, hw, batch, budget, strategy in CASES:
        t0 = time.perf_counter()
        sol = api.solve(model, hw, global_batch=batch, strategy=strategy, **budget)
        total = time.perf_counter() - t0
        gain = sol.data_parallel["objective_value"] / sol.objective["value"] \
            if sol.data_parallel else float("nan")
        s = sol.search
        print(f"{model:<10} {hw:<14} {strategy:<9} {s['candidates']:>6} {s['inner_solves']:>6} "
              f"{s['time_s']:>8.3f} {total:>7.2f} {sol.config['devices']:>7} {gain:>10.3f}  "
              f"{sol.status}")


if __name__ == "__main__":
    main()
