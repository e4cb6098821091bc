"""What a command prints besides its own text: the document in the chosen format (table, JSON,
YAML or a launcher form), and a progress bar on stderr."""

from __future__ import annotations

import contextlib
import sys

import click

from planner.cli.params import LAUNCH_FORMATS
from planner.report import render


def emit(doc: dict, fmt: str, text: str, target=None) -> None:
    """Print `doc` in `fmt`; a launcher form takes `target` (a `planner.launch.Target`)."""
    if fmt in LAUNCH_FORMATS:
        from planner.launch import render_launch

        click.echo(render_launch(fmt, doc, target))
    elif fmt == "json":
        click.echo(render.to_json(doc))
    elif fmt == "yaml":
        click.echo(render.to_yaml(doc), nl=False)
    else:
        click.echo(text)


def launch_target(model: str, hardware: str, precision: str | None, seq_len: int | None,
                  fmt: str):
    """What a launcher form needs beyond the plan (None for the other formats): the transformer
    spec at the trained sequence length, and the precision the plan was priced at."""
    if fmt not in LAUNCH_FORMATS:
        return None
    from planner.catalog import load_model, load_system
    from planner.launch import Target
    from planner.spec.transformer import Transformer, with_seq_len

    m = load_model(model)
    m = with_seq_len(m, seq_len) if isinstance(m, Transformer) else None
    return Target(m, precision or load_system(hardware).device.default_precision)


def progress(total: int, label: str):
    """A bar on stderr when it is a terminal; pipes and files get nothing at all."""
    if sys.stderr.isatty():
        return click.progressbar(length=total, label=label, file=sys.stderr)
    return contextlib.nullcontext()
