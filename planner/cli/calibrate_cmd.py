"""`planner calibrate`: the devices' compute efficiency fitted to measured runs."""

from __future__ import annotations

import click

from planner.cli.output import emit
from planner.cli.params import FORMATS
from planner.errors import CheckFailed, SpecError
from planner.report import render


@click.command()
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="Measurements with the columns of the built-in file [default: the published "
                   "runs shipped with planner].")
@click.option("--check", is_flag=True,
              help="Exit 1 when a spec's efficiency.compute differs from its fit by more than "
                   "0.005.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def calibrate(csv_path, check, fmt):
    """Fit each device's compute efficiency to single-device measurements and report the
    prediction error row by row (multi-device rows are held out).

    \b
    Examples:
      planner calibrate
      planner calibrate --csv my_runs.csv --format json
    """
    from planner import calibrate as cal
    from planner.catalog import load_device
    from planner.report import calibration_doc, calibration_text

    runs, skipped = cal.read_runs(csv_path)
    if not runs:
        raise SpecError(f"{csv_path or cal.default_csv()}: no row describes a run planner can "
                        f"predict ({len(skipped)} skipped)")
    fitted = cal.fit(runs)
    specs = {d: load_device(d).efficiency.compute for d in fitted}
    results = cal.report(runs)
    stats = cal.summary(results)
    doc = render.document("calibrate", calibration_doc(results, skipped, fitted, specs, stats))
    emit(doc, fmt, lambda: calibration_text(results, skipped, fitted, specs, stats))
    stale = [f"{d} (spec {specs[d]:.3f}, fit {v:.3f})" for d, v in fitted.items()
             if abs(specs[d] - v) > cal.CHECK_TOLERANCE]
    if check and stale:
        raise CheckFailed(f"efficiency.compute out of date with the fit: {', '.join(stale)}")
