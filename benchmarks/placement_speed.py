"""Speed of the table placement (`planner solve -m dlrm-dcnv2 -H dgx-h100 --devices D`):
wall time, whether CP-SAT proved the placement optimal within the time limit, and the gap to
its bound when it did not, for DLRM-DCNv2 (26 tables, MLPerf's) on 8 to 128 H100 at the
global batches MLPerf's submissions run (55,296 on one or two nodes, 135,168 beyond; and 64
at 55,296, the issue's case).

    python benchmarks/placement_speed.py [--time-limit 30]
"""

from __future__ import annotations

import argparse
import time

from planner import api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0)
    args = parser.parse_args()
    print(f"{'devices':>7} {'status':>9} {'seconds':>8} {'busiest ms':>11} {'bound ms':>9} "
          f"{'samples/s':>12}")
    for devices, batch in ((8, 55296), (16, 55296), (64, 55296), (64, 135168), (128, 135168)):
        t = time.perf_counter()
        p = api.place_tables("dlrm-dcnv2", "dgx-h100", devices=devices, global_batch=batch,
                             time_limit_s=args.time_limit)
        wall = time.perf_counter() - t
        print(f"{devices:>7} {p.status:>9} {wall:>8.2f} {p.priced.embedding_time_s * 1e3:>11.3f} "
              f"{p.bound_s * 1e3:>9.3f} {p.global_batch / p.priced.iteration_time_s:>12,.0f}")


if __name__ == "__main__":
    main()
