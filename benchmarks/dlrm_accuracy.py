"""The table placement's predicted throughput against MLPerf Training's DLRM-DCNv2 runs
(planner/calibration/mlperf_dlrm.csv, from each submission's own logs: see
benchmarks/extract_mlperf_dlrm.py). Nothing is fitted to them: every row is held out.
Per configuration (system, nodes, global batch): the submissions' median measured samples/s,
the prediction, and the error; then the MAPE over every submission.

    python benchmarks/dlrm_accuracy.py [--time-limit 10]
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from planner import api

CSV = Path(__file__).resolve().parents[1] / "planner" / "calibration" / "mlperf_dlrm.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    report(parser.parse_args().time_limit)


def report(time_limit_s: float) -> None:
    """Print every configuration's measured and predicted throughput and the MAPE."""
    with open(CSV, encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        key = (r["system"], int(r["nodes"]) * int(r["accelerators_per_node"]),
               int(r["global_batch"]))
        groups.setdefault(key, []).append(float(r["samples_per_s"]))
    print(f"{'system':<14} {'devices':>7} {'batch':>7} {'runs':>4} {'measured':>12} "
          f"{'predicted':>12} {'error':>7}  placement")
    errors = []
    for (system, devices, batch), measured in sorted(groups.items()):
        p = api.place_tables("dlrm-dcnv2", system, devices=devices, global_batch=batch,
                             time_limit_s=time_limit_s)
        predicted = batch / p.priced.iteration_time_s
        errors += [predicted / m - 1 for m in measured]
        med = statistics.median(measured)
        print(f"{system:<14} {devices:>7} {batch:>7} {len(measured):>4} {med:>12,.0f} "
              f"{predicted:>12,.0f} {predicted / med - 1:>+7.1%}  {p.status}")
    print(f"MAPE over {len(errors)} submissions: "
          f"{statistics.mean(abs(e) for e in errors):.1%} (mean signed {statistics.mean(errors):+.1%})")


if __name__ == "__main__":
    main()
