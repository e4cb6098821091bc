"""The `planner` command line (click), one module per command group:

    app            the group, and `main`: every failure to one line and an exit code
    params         the parameter types (decimal, finite, ranged), choices, list and range flags
    options        the options several commands share, and the checks across them
    output         the document in the chosen format; the progress bar
    catalog_cmds   list, show, schema
    evaluate_cmd   evaluate (and --batch JSON lines)
    solve_cmd      solve
    limits_cmds    limits, derive
    sweep_cmd      sweep
    batch_cmd      batch
    calibrate_cmd  calibrate

`planner.cli:main` is the `planner` script; `python -m planner.cli` runs it too.
"""

from planner.cli.app import cli, main
from planner.cli.params import DecimalInt, FiniteFloat

__all__ = ["DecimalInt", "FiniteFloat", "cli", "main"]
