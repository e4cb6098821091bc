"""Accuracy on every calibration set, per group: MAPE and signed bias in sample and
leave-one-group-out (refit without the group, predict it).

    python benchmarks/accuracy.py

Transformers: the four A100 constants of `planner.fit_transformer` as the specs ship them,
against vTrain's single-node runs, SC21 Table 1 and BERT-Large; the out-of-sample column refits
them without the group. CNNs: `planner calibrate`'s rows grouped by source, where only the
single-device rows are fitted (one compute efficiency per device), so every multi-device row is
already out of sample.
"""

from __future__ import annotations

from collections import defaultdict

from planner import calibrate as cal
from planner import fit_transformer as ft


def transformers() -> None:
    print("Transformers (dgx-a100-80gb): in sample with the shipped constants; leave-one-"
          "group-out refits the four constants without the group")
    c, gs = ft.Constants.shipped(), ft.groups()
    ft.print_table(c, ft.table(c, gs))


def cnns() -> None:
    print("\nCNNs (planner calibrate): per source; fitted = the single-device rows")
    by_source: dict[str, list] = defaultdict(list)
    for r in cal.report(cal.read_runs()[0]):
        by_source[r.run.citation.split(",")[0][:40]].append(r)
    print(f"{'source':<42} {'rows':>4} {'fitted':>6} {'MAPE':>7} {'bias':>7} "
          f"{'held-out MAPE':>13}")
    for source, rows in sorted(by_source.items()):
        held = [r for r in rows if r.role == "held-out"]
        mape = sum(abs(r.error) for r in rows) / len(rows)
        bias = sum(r.error for r in rows) / len(rows)
        held_mape = f"{sum(abs(r.error) for r in held) / len(held):.1%}" if held else "-"
        print(f"{source:<42} {len(rows):>4} {len(rows) - len(held):>6} {mape:>7.1%} "
              f"{bias:>+7.1%} {held_mape:>13}")


if __name__ == "__main__":
    transformers()
    cnns()
