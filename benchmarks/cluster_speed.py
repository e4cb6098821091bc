"""Search speed over clusters of several pools (`planner solve -H <cluster>`): GPT-3 175B at
global batch 1,536 on the two-pool lab-a100-h100 (32 DGX A100 + 16 DGX H100, 384 GPUs) and
on the three-pool mixed-hopper-blackwell (256 DGX A100 + 128 DGX H100 + 128 DGX B200, 4,096
GPUs) at three batches: wall time to the proof (every subset of pools, every shape's CP-SAT
model or a bound that rules it out), the CP-SAT models solved and the shapes priced. The
issue's goal is under 5 s for three pools and 4,096 GPUs.

    python benchmarks/cluster_speed.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from planner import api

# the three-pool batches: B200 alone wins (768), a pipeline over all three (1,536),
# replicas on all three (4,096)
CASES = (("lab-a100-h100", 1536), ("mixed-hopper-blackwell", 768),
         ("mixed-hopper-blackwell", 1536), ("mixed-hopper-blackwell", 4096))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    api.solve("gpt2", "lab-a100-h100", global_batch=64)  # programs built and cached
    print(f"{'cluster':<24} {'batch':>6} {'median s':>9} {'CP-SAT models':>14} {'shapes priced':>14} "
          f"{'best plan':<40}")
    for cluster, batch in CASES:
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            sol = api.solve("gpt3-175b", cluster, global_batch=batch)
            times.append(time.perf_counter() - t)
        best = f"{sol.best.kind} on {' + '.join(sol.best.pools)}"
        print(f"{cluster:<24} {batch:>6} {statistics.median(times):>9.2f} {sol.models_solved:>14} "
              f"{sol.shapes_priced:>14,} {best:<40}")


if __name__ == "__main__":
    main()
