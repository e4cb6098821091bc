"""What a command prints besides its own text: the document in the chosen format (table, JSON,
YAML or a launcher form), and a progress bar on stderr."""

from __future__ import annotations

import contextlib
import sys

import click

from planner.cli.params import LAUNCH_FORMATS
from planner.report import render


def emit(doc: dict, fmt: str, text, target=None) -> None:
    """Print `doc` in `fmt`; a launcher form takes `target` (a `planner.launch.Target`).
    `text`: the table form, or a function making it (rendered only when asked for)."""
    if fmt in LAUNCH_FORMATS:
        from planner.launch import render_launch

        click.echo(render_launch(fmt, doc, target))
    elif fmt == "json":
        click.echo(render.to_json(doc))
    elif fmt == "yaml":
        click.echo(render.to_yaml(doc), nl=False)
    else:
        click.echo(text() if callable(text) else text)


def launch_target(specs, fmt: str):
    """What a launcher form needs beyond the plan (None for the other formats): the transformer
    spec at the trained sequence length, and the precision the plan was priced at (the
    request's `planner.inputs.Specs`)."""
    if fmt not in LAUNCH_FORMATS:
        return None
    from planner.launch import Target

    return Target(specs.model if specs.family == "transformer" else None, specs.precision)


SIXTEEN_BIT = ("bf16", "fp16")


def precision_used(specs, warn: bool = True) -> dict:
    """{"name", "source"}: the precision a plan of the request (`planner.inputs.Specs`) is
    priced at and why. A device spec without `default_precision` trains in fp32 (the spec's
    fallback), which is said here, and on stderr (`warn`) when the device offers a 16-bit
    format a user would more likely train in."""
    if specs.given_precision is not None:
        return {"name": specs.given_precision.value, "source": "--precision"}
    device = specs.system.device
    if "default_precision" in device.model_fields_set:
        return {"name": device.default_precision.value,
                "source": f"the default_precision of device '{device.name}'"}
    offered = [p.value for p in device.peak_tflops if p.value in SIXTEEN_BIT]
    if warn and offered:
        click.echo(f"planner: note: device '{device.name}' names no default_precision: priced "
                   f"in fp32, though it offers {' and '.join(offered)} (give --precision "
                   f"{offered[0]}, or set default_precision in its spec)", err=True)
    return {"name": "fp32", "source": f"device '{device.name}' names no default_precision; "
                                      "fp32 assumed (--precision to change)"}


def progress(total: int, label: str):
    """A bar on stderr when it is a terminal; pipes and files get nothing at all."""
    if sys.stderr.isatty():
        return click.progressbar(length=total, label=label, file=sys.stderr)
    return contextlib.nullcontext()
