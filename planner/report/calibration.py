"""What `calibrate` prints: the measured and predicted rate row by row, and each device's fitted
compute efficiency beside its spec's (`planner.calibrate`)."""

from __future__ import annotations

from planner.report.render import table


def calibration_doc(results, skipped, fitted: dict, specs: dict, stats: dict) -> dict:
    return {
        "rows": [
            {"row": r.run.row, "label": r.run.label, "role": r.role, "model": r.run.model,
             "system": r.run.system, "devices": r.run.devices,
             "global_batch": r.run.global_batch, "precision": r.run.precision.value,
             "measured_samples_per_s": r.run.measured, "predicted_samples_per_s": r.predicted,
             "error": r.error, "citation": r.run.citation}
            for r in results
        ],
        "skipped": [{"row": s.row, "label": s.label, "reason": s.reason} for s in skipped],
        "efficiency_compute": [
            {"device": d, "spec": specs[d], "fitted": v} for d, v in fitted.items()
        ],
        "summary": stats,
    }


def calibration_text(results, skipped, fitted: dict, specs: dict, stats: dict) -> str:
    rows = [[r.run.row, r.run.label[:48], r.role, r.run.system, f"{r.run.measured:.0f}",
             f"{r.predicted:.0f}", f"{100 * r.error:+.1f}%"] for r in results]
    out = [table(["row", "run", "role", "system", "measured/s", "predicted/s", "error"], rows)]
    out.append("\n" + table(["device", "efficiency.compute in spec", "fitted"],
                            [[d, f"{specs[d]:.3f}", f"{v:.3f}"] for d, v in fitted.items()]))
    held = stats["mape_held_out_pct"]
    out.append(f"\nMAPE {stats['mape_all_pct']:.1f}% over {stats['rows']} rows"
               + (f"; {held:.1f}% over the {stats['held_out_rows']} held-out rows"
                  if held is not None else ""))
    if skipped:
        out.append(f"skipped {len(skipped)} rows (--format json lists why)")
    return "\n".join(out)
