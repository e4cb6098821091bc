"""`planner evaluate`: one plan's prediction, or one per JSON line with --batch."""

from __future__ import annotations

import json
import sys

import click

from planner import switches
from planner.cli.options import (
    TRANSFORMER_KEYS,
    cnn_options,
    framework_of,
    framework_option,
    headroom_option,
    reject_transformer_flags,
    require,
    spec_options,
    transformer_options,
)
from planner.cli.output import emit, launch_target, precision_used
from planner.cli.params import COLLECTIVES, PLAN_FORMATS, DecimalInt
from planner.errors import PlannerError, SpecError
from planner.report import render
from planner.spec.numbers import loads_json

EVAL_KEYS = {"model", "hardware", "nodes", "devices", "devices_per_node", "global_batch",
             "local_batch", "collective", "overlap", "precision", "optimizer", "servers",
             "memory_headroom", *switches.CNN_ONLY}


@click.command()
@spec_options(formats=PLAN_FORMATS, loads=True)
@click.option("--nodes", type=DecimalInt(1, 2**20), help="Nodes.")
@click.option("--devices", type=DecimalInt(1, 2**23), help="Devices in total (instead of --nodes).")
@click.option("--devices-per-node", type=DecimalInt(1, 1024),
              help="Devices used per node [default: all; a transformer plan uses all].")
@click.option("--global-batch", type=DecimalInt(1, 2**40), help="Global batch (strong scaling).")
@click.option("--local-batch", type=DecimalInt(1, 2**30), help="Local batch (weak scaling).")
@click.option("--collective", type=click.Choice(COLLECTIVES), default=None,
              help="The gradient exchange [default: ring; parameter-server with --softsync].")
@click.option("--batch", "batch_file", type=click.Path(dir_okay=False, allow_dash=True),
              help="Evaluate every JSON line of this file ('-': stdin); prints JSON lines.")
@cnn_options
@transformer_options
@framework_option
@headroom_option
def evaluate(specs, model, hardware, precision, optimizer, servers, overlap, fmt, nodes, devices,
             devices_per_node, global_batch, local_batch, collective, batch_file, framework,
             **hybrid):
    """Predict one data-parallel configuration, or many with --batch.

    With --batch, each input line is a JSON object whose keys are this command's flags,
    underscored ({"model": "alexnet", "hardware": "k80-fdr", "nodes": 4, "global_batch": 1024});
    each output line is the JSON document for it, or {"line": k, "error": {kind, message,
    ...}} as every JSON error is; with any such line, one line on stderr counts them and the
    exit code is 2.

    \b
    Examples:
      planner evaluate -m alexnet -H k80-fdr --nodes 8 --global-batch 1024
      planner evaluate -m resnet50 -H dgx-a100-80gb --devices 64 --local-batch 256 --format json
      planner evaluate --batch configs.jsonl
      planner evaluate -m gpt3-175b -H dgx-a100-80gb --devices 1024 --tp 8 --pp 8
          --micro-batch 1 --global-batch 1536 --recompute selective --sequence-parallel
    """
    from planner import api
    from planner.report import evaluation_doc, evaluation_text

    if batch_file is not None:
        _evaluate_jsonl(batch_file)
        return
    require(model, hardware)
    transformer = specs.family == "transformer"
    if not transformer:
        reject_transformer_flags(hybrid)
    framework = framework_of(framework, fmt, specs.family)
    hybrid.pop("seq_len", None)  # applied to the model's spec (`specs`)
    family = ({"optimizer": optimizer, "framework": framework} if transformer else
              {"collective": collective, "optimizer": optimizer, "servers": servers})
    ev = api.evaluate(specs, nodes=nodes, devices=devices, devices_per_node=devices_per_node,
                      global_batch=global_batch, local_batch=local_batch, overlap=overlap,
                      **family, **hybrid)
    used = precision_used(specs)
    doc = render.document("evaluate", {"model": model, "hardware": hardware, "precision": used,
                                       **({"framework": framework} if framework else {}),
                                       **evaluation_doc(ev.plan, ev.prediction)})
    emit(doc, fmt, lambda: evaluation_text(ev.plan, ev.prediction, used, framework),
         launch_target(specs, fmt))


MAX_BATCH_BYTES = 64 * 2**20


def _read_lines(path: str) -> list[str]:
    """The lines of a --batch file ('-': stdin): a regular file of at most MAX_BATCH_BYTES
    (size checked before reading), or that much of stdin, in UTF-8."""
    from planner.catalog import read_file, shown

    if path == "-":
        text = sys.stdin.read(MAX_BATCH_BYTES + 1)
        if len(text) > MAX_BATCH_BYTES:
            raise SpecError(f"-: more than {MAX_BATCH_BYTES} characters on stdin")
        return text.splitlines()
    raw = read_file(path, MAX_BATCH_BYTES, "JSON-lines file")
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise SpecError(f"{shown(path)}: not UTF-8") from None


def _check_batch_values(req: dict, where: str) -> None:
    """A --batch line's values go through the same types and ranges as evaluate's flags: an
    integer flag takes a JSON integer, a float flag a number, a choice a string, a switch true
    or false; model and hardware are strings."""
    params = {p.name: p for p in evaluate.params}
    for key in ("model", "hardware"):
        if not isinstance(req.get(key), str):
            raise SpecError(f"{where}: key '{key}' must be a string")
    from planner.batch import check_option_value

    for key, value in req.items():
        param = params.get(key)
        if param is not None and key not in ("model", "hardware"):
            check_option_value(where, key, value, param, click)


def _evaluate_jsonl(path: str) -> None:
    from planner import api
    from planner.catalog import shown
    from planner.report import evaluation_doc

    lines = _read_lines(path)
    path = shown(path)
    failed = 0
    for k, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            try:
                req = loads_json(line)  # numbers guarded: digit limit, no NaN / Infinity
            except json.JSONDecodeError as exc:
                raise SpecError(f"{path}:{k}: not JSON ({exc.msg})") from None
            except SpecError as exc:
                raise SpecError(f"{path}:{k}: {exc}") from None
            except RecursionError:
                raise SpecError(f"{path}:{k}: JSON nested too deeply") from None
            if isinstance(req, dict):  # null means "not given", as for an unset flag
                req = {key: v for key, v in req.items() if v is not None}
            if not isinstance(req, dict):
                raise SpecError(f"{path}:{k}: expected a JSON object")
            known = EVAL_KEYS | set(TRANSFORMER_KEYS)
            unknown = sorted(set(req) - known)
            if unknown:
                from planner.spec.base import did_you_mean

                raise SpecError(f"{path}:{k}: unknown key '{unknown[0]}'"
                                f"{did_you_mean(unknown[0], sorted(known))}")
            _check_batch_values(req, f"{path}:{k}")
            model, hardware = req.pop("model"), req.pop("hardware")
            if api.is_transformer(model):
                # devices_per_node: `api.evaluate` takes the whole node (`only_for`)
                cnn_only = sorted(set(req) & {"local_batch", "collective", "servers",
                                             *switches.CNN_ONLY})
                if cnn_only:
                    raise SpecError(f"{path}:{k}: key '{cnn_only[0]}' applies to CNN models only")
                if not isinstance(req.get("global_batch"), int):
                    raise SpecError(f"{path}:{k}: key 'global_batch' is required")
            else:
                reject_transformer_flags(req)
            ev = api.evaluate(model, hardware, **req)
            out = render.document("evaluate", {"line": k,
                                               **evaluation_doc(ev.plan, ev.prediction)})
        except PlannerError as exc:
            from planner.cli.app import error_doc

            failed += 1
            kind = "infeasible" if exc.exit_code == 1 else "bad_input"
            out = {**error_doc("evaluate", kind, str(exc), exc), "line": k}
        click.echo(render.to_jsonl(out))
    if failed:  # every line answered on stdout; stderr says how many failed, as other errors do
        click.echo(f"planner: {path}: {failed} of {sum(1 for x in lines if x.strip())} lines "
                   "failed (their JSON lines carry the error)", err=True)
        sys.exit(2)
