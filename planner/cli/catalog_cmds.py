"""`planner list`, `show` and `schema`: the built-in models and hardware, one spec as understood,
and the JSON Schemas of the outputs."""

from __future__ import annotations

import click

from planner.cli.output import emit
from planner.cli.params import FORMATS
from planner.report import render


@click.command("list")
@click.argument("what", type=click.Choice(["models", "hardware", "systems", "devices", "links",
                                           "clusters", "switches"]))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def list_cmd(what, fmt):
    """List built-in models or hardware (systems, devices, links, clusters; or one of those
    kinds alone), or the plan switches (docs/switches.md)."""
    from planner.catalog import list_hardware, list_models

    if what == "switches":
        from planner import switches

        rows = [switches.to_json(s) for s in switches.SWITCHES]
        text = render.table(["switch", "default", "solve", "limits", "what it sets"],
                            [[r["flag"], str(r["default"]), r["solve"],
                              "taken" if r["limits"] else "refused", r["what"]] for r in rows])
        emit(render.document("list", {"switches": rows}), fmt, text)
        return
    if what == "models":
        names = list_models()
        emit(render.document("list", {"models": names}), fmt, "\n".join(names))
        return
    hw = list_hardware()
    if what != "hardware":  # one kind: a name a line, as the models
        emit(render.document("list", {"hardware": {what: hw[what]}}), fmt, "\n".join(hw[what]))
        return
    text = "\n".join(f"{kind}: {', '.join(names)}" for kind, names in hw.items())
    emit(render.document("list", {"hardware": hw}), fmt, text)


@click.command()
@click.argument("what", type=click.Choice(["model", "hardware"]))
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def show(what, name, fmt):
    """Show a model's per-layer table and totals, or a hardware spec (a system, device, link
    or cluster of pools). NAME is a built-in, a YAML path, or a Hugging Face config.json (or a
    folder holding one): shown as understood; the yaml / json form of a spec loads back.

    \b
    Examples:
      planner show model alexnet
      planner show model path/to/config.json
      planner show hardware dgx-a100-80gb --format json
      planner show hardware lab-a100-h100
    """
    from planner.catalog import load_hardware_any, load_model
    from planner.report import (
        hardware_doc,
        hardware_text,
        model_doc,
        model_text,
        transformer_details,
        transformer_doc,
    )
    from planner.spec.recommendation import Recommendation
    from planner.spec.transformer import Transformer

    if what == "model":
        model = load_model(name)
        if isinstance(model, Recommendation):
            from planner.report.recommendation import recommendation_doc, recommendation_text

            emit(render.document("show", recommendation_doc(model)), fmt,
                 recommendation_text(model))
            return
        if isinstance(model, Transformer):
            doc = transformer_doc(model)
            emit(render.document("show", doc), fmt, render.key_values(
                [(k, f"{v:,}" if isinstance(v, int) else str(v)) for k, v in doc.items()]
                + transformer_details(model)))
            return
        emit(render.document("show", model_doc(model)), fmt, model_text(model))
    else:
        spec = load_hardware_any(name)
        emit(render.document("show", hardware_doc(spec)), fmt, hardware_text(spec))


@click.command()
@click.argument("command", required=False,
                type=click.Choice(["evaluate", "solve", "limits", "sweep", "derive", "show", "list",
                                   "calibrate"]))
def schema(command):
    """Print the JSON Schema of the JSON output of COMMAND (all of them without one).

    \b
    Examples:
      planner schema solve > solve.schema.json
    """
    from planner.schema import schemas

    docs = schemas()
    click.echo(render.to_json(docs[command] if command else docs))
