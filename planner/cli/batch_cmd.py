"""`planner batch`: many solves from one file of scenarios, locally or on a Dask cluster."""

from __future__ import annotations

import sys

import click

from planner.cli.options import parallel_check, parallel_options
from planner.cli.output import progress
from planner.cli.solve_cmd import solve
from planner.report import render


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@parallel_options
def batch(file, jobs, scheduler):
    """Many solves from FILE: a YAML list of scenarios (.yaml / .yml), a JSON list (.json) or
    one JSON object per line (.jsonl; '-' reads stdin). A scenario's keys are solve's options,
    underscored ({model: llama3-8b, hardware: dgx-h100, global_batch: 512, devices_max: 64};
    switches true / false). Every scenario is checked before any runs; an unknown key or a bad
    value is exit 2, naming the scenario and the key.

    Prints one JSON line per scenario, in input order: the document `planner solve --format
    json` prints for it, or the JSON error document it prints (each scenario's stderr lines
    follow on stderr, prefixed by 'scenario K'). Exits with the worst scenario's exit code.

    \b
    Examples:
      planner batch scenarios.yaml
      planner batch scenarios.jsonl --jobs 0 > plans.jsonl
      planner batch scenarios.yaml --scheduler tcp://10.0.0.5:8786
    """
    from planner.batch import parallel_map, run_scenario, scenarios

    parallel_check(jobs, scheduler)
    todo = scenarios(file, solve)
    with progress(len(todo), "batch") as bar:
        results = parallel_map(run_scenario, [s.argv for s in todo], jobs=jobs,
                               scheduler=scheduler, on_done=bar and (lambda: bar.update(1)))
    worst = 0
    for scenario, (code, doc, err) in zip(todo, results, strict=True):
        for line in err:
            click.echo(f"planner: scenario {scenario.index}: {line.removeprefix('planner: ')}",
                       err=True)
        click.echo(render.to_jsonl(doc))
        worst = max(worst, code)
    if worst:
        sys.exit(worst)
