"""The `planner` command. One function per command; the docstring is the help.

Exit codes: 0 success; 1 a well-formed problem with no feasible answer; 2 bad input (unknown
name, malformed or invalid spec, bad flag); 3 an internal error (a bug: please report it).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import sys

import click

from planner import render
from planner.errors import CheckFailed, InfeasibleError, PlannerError, SpecError
from planner.search.objective import Objective
from planner.spec.numbers import decimal_float, decimal_int, loads_json, short

FORMATS = ["table", "json", "yaml"]
LAUNCH_FORMATS = ["env", "slurm", "torchrun", "megatron", "deepspeed", "torchtitan"]
PLAN_FORMATS = FORMATS + LAUNCH_FORMATS
COLLECTIVES = ["ring", "halving-doubling", "tree", "parameter-server", "hierarchical"]
PRECISIONS = ["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4", "fp4"]


class FiniteFloat(click.FloatRange):
    """A float flag: plain decimal text ('0.05', '1e-9'), finite, within the range. click's
    FloatRange lets 'nan' through (it compares false both ways) and float() takes 'inf',
    '1_000' and non-ASCII digits; every float flag of planner uses this type instead."""

    name = "float"

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            number = decimal_float(value)
            if number is None:
                self.fail(f"{short(value, 40)} is not a finite decimal number", param, ctx)
            value = number
        elif isinstance(value, float) and not math.isfinite(value):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(value, param, ctx)


class DecimalInt(click.IntRange):
    """An integer flag: plain ASCII decimal digits of bounded length, within the range. int()
    takes '٣', '1_000' and ' 7 ', and refuses more than 4,300 digits with a message quoting them
    all; every integer flag of planner uses this type instead."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            number = decimal_int(value)
            if number is None:
                self.fail(f"{short(value, 40)} is not a whole number in decimal digits", param,
                          ctx)
            value = number
        return super().convert(value, param, ctx)


def _emit(doc: dict, fmt: str, text: str, target=None) -> None:
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


def _with_options(f, opts: list):
    """Apply click options so that they show in the order listed."""
    for opt in reversed(opts):
        f = opt(f)
    return f


def spec_options(f=None, *, formats=FORMATS):
    """--model / --hardware and the training options every prediction needs."""
    if f is None:
        return functools.partial(spec_options, formats=formats)
    opts = [
        click.option("--model", "-m", help="Built-in model name or YAML path (required)."),
        click.option("--hardware", "-H", help="Built-in system name or YAML path (required)."),
        click.option("--precision", type=click.Choice(PRECISIONS), default=None,
                     help="Compute precision [default: the device's default_precision]."),
        click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]),
                     default="momentum", show_default=True),
        click.option("--servers", type=DecimalInt(1, 1_000_000), default=1, show_default=True,
                     help="Parameter servers (for --collective parameter-server)."),
        click.option("--overlap/--no-overlap", default=True, show_default=True,
                     help="Overlap gradient allreduce with the backward pass."),
        click.option("--format", "fmt", type=click.Choice(formats), default=formats[0],
                     show_default=True),
    ]
    return _with_options(f, opts)


TRANSFORMER_KEYS = ("tp", "cp", "ep", "pp", "dp", "micro_batch", "interleave", "recompute",
                    "sequence_parallel", "zero", "schedule", "flash_attention", "seq_len")


def transformer_options(f):
    """Hybrid-parallel choices (transformer models only). Unset means: evaluate uses the
    default shown, solve lets the solver choose."""
    opts = [
        click.option("--tp", type=DecimalInt(1, 2**20), help="Tensor-parallel degree."),
        click.option("--cp", type=DecimalInt(1, 1024),
                     help="Context-parallel degree: ranks sharing each sequence (Megatron-LM "
                          "ring attention); solve tries 2-16 for sequences of 8k and more."),
        click.option("--ep", type=DecimalInt(1, 2**20),
                     help="Expert-parallel degree (MoE models): ranks sharing each MoE layer's "
                          "experts, within dp x cp; tokens reach them by all-to-all."),
        click.option("--pp", type=DecimalInt(1, 2**20), help="Pipeline stages."),
        click.option("--dp", type=DecimalInt(1, 2**23), help="Data-parallel replicas."),
        click.option("--micro-batch", "micro_batch", type=DecimalInt(1, 2**30),
                     help="Sequences per micro-batch."),
        click.option("--interleave", type=DecimalInt(1, 1024),
                     help="Virtual stages per pipeline stage (interleaved 1F1B)."),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]),
                     help="Activation recomputation."),
        click.option("--sequence-parallel/--no-sequence-parallel", "sequence_parallel",
                     default=None, help="Megatron sequence parallelism (with tp > 1)."),
        click.option("--zero", type=DecimalInt(0, 3), help="ZeRO / FSDP sharding stage."),
        click.option("--schedule", type=click.Choice(["1f1b", "gpipe"]),
                     help="Pipeline schedule."),
        click.option("--flash-attention/--no-flash-attention", "flash_attention", default=True,
                     show_default=True, help="Attention scores stay on chip (FlashAttention)."),
        click.option("--seq-len", "seq_len", type=DecimalInt(1, 10_000_000),
                     help="Train at this sequence length [default: the model's seq_len]."),
    ]
    return _with_options(f, opts)


def headroom_option(f):
    """--memory-headroom: how full a device may be (evaluate, solve, sweep)."""
    from planner.search.memory_fit import DEFAULT_MEMORY_HEADROOM

    return click.option(
        "--memory-headroom", "memory_headroom", type=FiniteFloat(0, 1, max_open=True),
        default=DEFAULT_MEMORY_HEADROOM, show_default=True,
        help="Fraction of each device's memory kept free (CUDA context, NCCL buffers, "
             "fragmentation): a plan fits when it needs at most (1 - FRACTION) x the device "
             "memory. 0.05 keeps 5 % free.")(f)


def _reject_transformer_flags(kw: dict) -> None:
    for key in TRANSFORMER_KEYS:
        if key != "flash_attention" and kw.get(key) is not None:
            raise SpecError(f"{key}: --{key.replace('_', '-')} applies to transformer models "
                            "only")


def training_options(f):
    """Statistical efficiency (McCandlish et al. 2018): the critical batch and the target."""
    opts = [
        click.option("--critical-batch", type=FiniteFloat(min=0, min_open=True, max=1e15),
                     help="B_noise: steps to the target S(B) = S_min (1 + B_noise / B)."),
        click.option("--target-steps", type=FiniteFloat(min=0, min_open=True, max=1e15),
                     help="S_min: steps to the target at a very large batch."),
        click.option("--target-samples", type=FiniteFloat(min=0, min_open=True, max=1e18),
                     help="E_min: samples to the target at a very small batch "
                          "(S_min = E_min / B_noise)."),
        click.option("--target-tokens", type=FiniteFloat(min=0, min_open=True, max=1e21),
                     help="E_min in tokens (transformers: target samples = tokens / sequence "
                          "length)."),
    ]
    return _with_options(f, opts)


MAX_LIST_TEXT = 10_000  # characters of a list flag ('1,2,4', '6.25,12.5')
MAX_LIST_ITEMS = 100_000


def batch_range(value: str | None) -> tuple[int, int] | None:
    """'A:B': two positive decimal integers (sizes are checked by the solver)."""
    if value is None:
        return None
    parts = value.split(":") if len(value) <= 100 else []
    ints = [decimal_int(p) for p in parts]
    if len(ints) != 2 or any(x is None or x < 1 for x in ints):
        raise SpecError(f"global_batch_range: expected A:B with positive integers, got "
                        f"{short(value)}")
    return ints[0], ints[1]


def float_list(value: str | None, key: str) -> list[float] | None:
    """'6.25,12.5,25': positive finite decimal numbers."""
    if value is None:
        return None
    out = [decimal_float(x) for x in value.split(",")] if len(value) <= MAX_LIST_TEXT else []
    if not out or not all(x is not None and x > 0 for x in out):
        raise SpecError(f"{key}: expected positive numbers like '6.25,12.5,25', got "
                        f"{short(value)}")
    return out


def int_list(value: str | None, key: str) -> list[int] | None:
    """'1,2,4' or 'A:B' (every integer) or 'A:B:x2' (doubling): positive decimal integers
    (a range within 1..1,000,000 and of at most 100,000 values; listed values up to 2^40)."""
    if value is None:
        return None
    bad = SpecError(f"{key}: expected '1,2,4', 'A:B' or 'A:B:x2' with positive integers, "
                    f"got {short(value)}")
    if len(value) > MAX_LIST_TEXT:
        raise bad
    if ":" in value:
        parts = value.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "x2"):
            raise bad
        lo, hi = decimal_int(parts[0]), decimal_int(parts[1])
        if lo is None or hi is None or not 1 <= lo <= hi <= 1_000_000:
            raise bad
        if len(parts) == 3:
            out, x = [], lo
            while x <= hi:
                out.append(x)
                x *= 2
            return out
        if hi - lo >= MAX_LIST_ITEMS:
            raise bad
        return list(range(lo, hi + 1))
    out = [decimal_int(x) for x in value.split(",")]
    if not all(x is not None and 1 <= x <= 2**40 for x in out):
        raise bad
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="planner")
def cli():
    """Plan distributed deep-learning training before it runs: how many nodes, which batch and
    split, how fast, and where scaling stops.

    Exit codes: 0 ok, 1 infeasible (the message names the conflicting constraints),
    2 bad input, 3 internal error.
    """


# --- list / show ----------------------------------------------------------------------------

@cli.command("list")
@click.argument("what", type=click.Choice(["models", "hardware"]))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def list_cmd(what, fmt):
    """List built-in models or hardware (systems, devices, links)."""
    from planner.catalog import list_hardware, list_models

    if what == "models":
        names = list_models()
        _emit(render.document("list", {"models": names}), fmt, "\n".join(names))
        return
    hw = list_hardware()
    text = "\n".join(f"{kind}: {', '.join(names)}" for kind, names in hw.items())
    _emit(render.document("list", {"hardware": hw}), fmt, text)


@cli.command()
@click.argument("what", type=click.Choice(["model", "hardware"]))
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def show(what, name, fmt):
    """Show a model's per-layer table and totals, or a hardware spec. NAME is a built-in, a
    YAML path, or a Hugging Face config.json (or a folder holding one): shown as understood.

    \b
    Examples:
      planner show model alexnet
      planner show model path/to/config.json
      planner show hardware dgx-a100-80gb --format json
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
    from planner.spec.transformer import Transformer

    if what == "model":
        model = load_model(name)
        if isinstance(model, Transformer):
            doc = transformer_doc(model)
            _emit(render.document("show", doc), fmt, render.key_values(
                [(k, f"{v:,}" if isinstance(v, int) else str(v)) for k, v in doc.items()]
                + transformer_details(model)))
            return
        _emit(render.document("show", model_doc(model)), fmt, model_text(model))
    else:
        spec = load_hardware_any(name)
        _emit(render.document("show", hardware_doc(spec)), fmt, hardware_text(spec))


# --- evaluate -------------------------------------------------------------------------------

EVAL_KEYS = {"model", "hardware", "nodes", "devices", "devices_per_node", "global_batch",
             "local_batch", "collective", "overlap", "precision", "optimizer", "servers",
             "memory_headroom"}


@cli.command()
@spec_options(formats=PLAN_FORMATS)
@click.option("--nodes", type=DecimalInt(1, 2**20), help="Nodes.")
@click.option("--devices", type=DecimalInt(1, 2**23), help="Devices in total (instead of --nodes).")
@click.option("--devices-per-node", type=DecimalInt(1, 1024),
              help="Devices used per node [default: all].")
@click.option("--global-batch", type=DecimalInt(1, 2**40), help="Global batch (strong scaling).")
@click.option("--local-batch", type=DecimalInt(1, 2**30), help="Local batch (weak scaling).")
@click.option("--collective", type=click.Choice(COLLECTIVES), default="ring", show_default=True)
@click.option("--batch", "batch_file", type=click.Path(dir_okay=False, allow_dash=True),
              help="Evaluate every JSON line of this file ('-': stdin); prints JSON lines.")
@transformer_options
@headroom_option
def evaluate(model, hardware, precision, optimizer, servers, overlap, fmt, nodes, devices,
             devices_per_node, global_batch, local_batch, collective, batch_file, **hybrid):
    """Predict one data-parallel configuration, or many with --batch.

    With --batch, each input line is a JSON object whose keys are this command's flags,
    underscored ({"model": "alexnet", "hardware": "k80-fdr", "nodes": 4, "global_batch": 1024});
    each output line is the JSON document for it, or {"line": k, "error": ...} (exit code 2).

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
    _require(model, hardware)
    transformer = api.is_transformer(model)
    if not transformer:
        _reject_transformer_flags(hybrid)
    family = {} if transformer else {"collective": collective, "optimizer": optimizer,
                                     "servers": servers}
    ev = api.evaluate(model, hardware, nodes=nodes, devices=devices,
                      devices_per_node=devices_per_node, global_batch=global_batch,
                      local_batch=local_batch, overlap=overlap, precision=precision,
                      **family, **hybrid)
    doc = render.document("evaluate", {"model": model, "hardware": hardware,
                                       **evaluation_doc(ev.plan, ev.prediction)})
    _emit(doc, fmt, evaluation_text(ev.plan, ev.prediction),
          _target(model, hardware, precision, hybrid.get("seq_len"), fmt))


def _target(model: str, hardware: str, precision: str | None, seq_len: int | None,
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


def _require(model, hardware) -> None:
    if not model:
        raise SpecError("model: --model is required (a built-in name or a YAML path)")
    if not hardware:
        raise SpecError("hardware: --hardware is required (a built-in name or a YAML path)")


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
    failed = False
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
            unknown = sorted(set(req) - EVAL_KEYS - set(TRANSFORMER_KEYS))
            if unknown:
                raise SpecError(f"{path}:{k}: unknown key '{unknown[0]}'")
            _check_batch_values(req, f"{path}:{k}")
            model, hardware = req.pop("model"), req.pop("hardware")
            if api.is_transformer(model):
                cnn_only = sorted(set(req) & {"devices_per_node", "local_batch", "collective",
                                             "optimizer", "servers"})
                if cnn_only:
                    raise SpecError(f"{path}:{k}: key '{cnn_only[0]}' applies to CNN models only")
                if not isinstance(req.get("global_batch"), int):
                    raise SpecError(f"{path}:{k}: key 'global_batch' is required")
            else:
                _reject_transformer_flags(req)
            ev = api.evaluate(model, hardware, **req)
            out = render.document("evaluate", {"line": k,
                                               **evaluation_doc(ev.plan, ev.prediction)})
        except PlannerError as exc:
            failed = True
            out = render.document("evaluate", {"line": k, "error": str(exc)})
        click.echo(render.to_jsonl(out))
    if failed:
        sys.exit(2)


# --- solve ----------------------------------------------------------------------------------

@cli.command()
@spec_options(formats=PLAN_FORMATS)
@click.option("--nodes", type=DecimalInt(1, 2**20), help="Pin the node count.")
@click.option("--nodes-max", type=DecimalInt(1, 2**20), help="Node budget.")
@click.option("--devices", type=DecimalInt(1, 2**23), help="Pin the device count.")
@click.option("--devices-max", type=DecimalInt(1, 2**23), help="Device budget.")
@click.option("--devices-per-node", type=DecimalInt(1, 1024), help="Pin devices used per node.")
@click.option("--global-batch", type=DecimalInt(1, 2**40), help="Fixed global batch.")
@click.option("--global-batch-max", type=DecimalInt(1, 2**40),
              help="Global batch up to this (same as --global-batch-range 1:MAX).")
@click.option("--global-batch-range", help="Let the solver choose the global batch in A:B.")
@click.option("--local-batch", type=DecimalInt(1, 2**30), help="Pin the local batch.")
@click.option("--local-batch-min", type=DecimalInt(1, 2**30),
              help="Smallest local batch allowed (keep devices efficient).")
@click.option("--collective", type=click.Choice(COLLECTIVES), default=None,
              help="Pin the collective [default: the solver chooses].")
@click.option("--objective", type=click.Choice([o.value for o in Objective]),
              default=Objective.throughput.value, show_default=True,
              help="throughput (the default): the fastest plan, most samples per second on "
                   "the devices allowed (the knee line says how few devices come close); "
                   "time-to-train / cost: with --critical-batch and a target; token-budget: "
                   "time to train on --tokens tokens (transformers); efficiency: CNNs.")
@training_options
@click.option("--price-per-device-hour", type=FiniteFloat(min=0, min_open=True, max=1e6),
              help="USD per device-hour [default: the device spec's price].")
@click.option("--deadline", "deadline_s", type=FiniteFloat(min=0, min_open=True, max=1e12),
              help="Constraint: time to train at most this many seconds.")
@click.option("--budget", "budget_usd", type=FiniteFloat(min=0, min_open=True, max=1e15),
              help="Constraint: cost to train at most this many USD.")
@click.option("--pareto", is_flag=True,
              help="Also return the (time-to-train, cost) Pareto front of feasible plans.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a picture of the chosen plan (.png or .svg): its iteration time "
                   "part by part and its memory against the device's capacity (with --pareto, "
                   "also the front).")
@click.option("--strategy", type=click.Choice(["data", "hybrid", "pipeline", "auto"]),
              default=None, help="CNNs: data parallel [default], per-layer data/model modes "
                                 "(hybrid), pipeline stages, or the best of them (auto).")
@click.option("--stages", type=DecimalInt(2, 100_000),
              help="With --strategy pipeline: pin the number of stages.")
@click.option("--within", "fewest_nodes_within", type=FiniteFloat(0, 10),
              help="Return the fewest nodes whose objective is within this fraction of the best "
                   "(0.05 = 5%; every model family).")
@click.option("--knee-tolerance", type=FiniteFloat(0, 10), default=0.10, show_default=True,
              help="The knee reported with the plan: the fewest devices whose time is within "
                   "this fraction of the best plan's (0.10 = 10%).")
@click.option("--top", type=DecimalInt(0, 100), default=0, show_default=True,
              help="Also return this many runners-up, each a different split, device count or "
                   "batch (not the same plan with another collective or micro-batch).")
@click.option("--time-limit", "time_limit_s", type=FiniteFloat(0.01, 3600), default=10.0,
              show_default=True, help="Wall-clock guard against runaway searches, in seconds "
                                      "(searches stop on a deterministic budget; one this "
                                      "guard stops says so).")
@transformer_options
@headroom_option
@click.option("--tokens", "token_budget", type=FiniteFloat(1, 1e18),
              help="Token budget (transformers; with --objective token-budget).")
def solve(model, hardware, precision, optimizer, servers, overlap, fmt, collective, objective,
          global_batch_max, global_batch_range, token_budget, critical_batch, target_steps,
          target_samples, target_tokens, price_per_device_hour, deadline_s, budget_usd, pareto, plot_path,
          strategy, stages, **problem):
    """The proven-optimal plan: nodes, devices per node, batch and collective for CNNs
    (per-layer splits with --strategy); tp x pp x dp, micro-batch, recompute and ZeRO for
    transformers.

    Every plan of the space is priced from the cost expressions and CP-SAT takes the minimum
    of that priced table (exact; it names the conflicting constraints when nothing is
    feasible); --top, --within and --pareto read the same table for every model family. The
    CNN --strategy hybrid and pipeline searches are real CP-SAT searches over the per-layer
    modes and the pipeline stage cuts.

    \b
    Examples:
      planner solve -m alexnet -H k80-fdr --global-batch 256
      planner solve -m resnet50 -H dgx-a100-80gb --nodes-max 64 --global-batch-range 256:65536
      planner solve -m vgg16 -H k80-fdr --global-batch 1024 --within 0.05 --top 3 --format json
      planner solve -m gpt3-175b -H dgx-a100-80gb --devices-max 4096 --global-batch 1536
      planner solve -m gpt2 -H dgx-a100-80gb --devices-max 64 --global-batch-range 64:4096
          --critical-batch 512 --target-tokens 1e10 --objective time-to-train --pareto
    """
    from planner import api
    from planner.report import solution_doc, solution_text

    _require(model, hardware)
    hybrid = {k: problem.pop(k) for k in TRANSFORMER_KEYS}
    training = {"critical_batch": critical_batch, "target_steps": target_steps,
                "target_samples": target_samples, "price_per_device_hour": price_per_device_hour,
                "deadline_s": deadline_s, "budget_usd": budget_usd}
    rng = batch_range(global_batch_range)
    if global_batch_max is not None:
        if rng is not None:
            raise SpecError("global_batch_max: give either --global-batch-max or "
                            "--global-batch-range")
        rng = (1, global_batch_max)
    if rng is not None and problem["global_batch"] is not None:
        raise SpecError("global_batch: give either --global-batch or a batch range")
    transformer = api.is_transformer(model)
    if transformer:
        if strategy is not None or stages is not None:
            raise SpecError("strategy: --strategy applies to CNN models (transformers search "
                            "tp x pp x dp with the hybrid flags)")
        if problem.get("global_batch") is None and rng is None:
            raise SpecError("global_batch: give --global-batch or --global-batch-range for "
                            "transformer models")
        family = {"target_tokens": target_tokens, "token_budget": token_budget, **hybrid}
    else:
        _reject_transformer_flags(hybrid)
        if token_budget is not None or objective == "token-budget":
            raise SpecError("token_budget: --tokens and --objective token-budget apply to "
                            "transformer models only")
        if target_tokens is not None:
            raise SpecError("target_tokens: --target-tokens applies to transformer models "
                            "(CNNs: --target-samples)")
        family = {"optimizer": optimizer, "servers": servers, "collective": collective,
                  "strategy": strategy or "data", "stages": stages}
    sol = api.solve(model, hardware, precision=precision, objective=objective, overlap=overlap,
                    pareto=pareto, **training, global_batch_range=rng, **problem, **family)
    doc = render.document("solve", {"model": model, "hardware": hardware, **solution_doc(sol)})
    if plot_path:
        _plan_plot(sol, doc.get("config") or {}, plot_path, model, hardware)
    _emit(doc, fmt, solution_text(sol), _target(model, hardware, precision,
                                                hybrid.get("seq_len"), fmt))
    _search_note(sol, problem.get("time_limit_s"))
    _efficiency_warning(sol)


LOW_EFFICIENCY = 0.5  # below this scaling efficiency `solve` warns on stderr


def _efficiency_warning(sol) -> None:
    """One line on stderr when the chosen plan scales at under LOW_EFFICIENCY: a CNN's
    speed-up over one device per device, a transformer's throughput per device against the
    smallest plan that fits (the knee's scaling efficiency; MFU is reported, not judged)."""
    knee = getattr(sol, "knee", None)
    devices = getattr(sol.plan, "devices", None) or sol.config["devices"]  # a CNN split: dicts
    eff = getattr(sol.prediction, "efficiency", None)
    what = "efficiency (speed-up over one device / devices)"
    if eff is None and knee is not None and knee["base_devices"] < devices:
        eff = knee["scaling_efficiency"]
        what = f"scaling efficiency against the {knee['base_devices']}-device plan"
    if eff is None or eff >= LOW_EFFICIENCY:
        return
    hint = ""
    if knee is not None and knee["devices"] < devices:
        hint = (f"; {knee['devices']} devices come within {knee['tolerance']:.0%} of its time "
                "(the knee)")
    click.echo(f"planner: warning: the chosen plan runs {devices} devices at "
               f"{eff:.0%} {what}{hint}", err=True)


def _search_note(sol, time_limit_s) -> None:
    """One line on stderr when a search ended before proving its plan optimal."""
    stopped = getattr(sol, "stopped_by", None)
    if stopped == "time-limit":
        click.echo(f"planner: note: the --time-limit wall-clock guard ({time_limit_s:g} s) "
                   "stopped the search before its deterministic budget; this plan is the best "
                   "found so far and may differ between runs (a larger --time-limit makes it "
                   "reproducible)", err=True)
    elif stopped == "budget":
        click.echo("planner: note: the search reached its deterministic budget before proving "
                   "this plan optimal (status feasible); the same call gives the same plan",
                   err=True)


def _plan_plot(sol, config: dict, path: str, model: str, hardware: str) -> None:
    """The chosen plan's picture, titled with its JSON config's sizes."""
    from planner.plot import plan_plot

    sizes = ", ".join(f"{k.replace('_', ' ')} {config[k]}" for k in
                      ("devices", "tp", "pp", "dp", "global_batch") if k in config)
    plan_plot(sol.prediction, path, f"{model} on {hardware}: {sizes}",
              front=getattr(sol, "pareto", None) or None)


# --- limits / derive / sweep ----------------------------------------------------------------

def limit_options(f):
    opts = [
        click.option("--global-batch", type=DecimalInt(1, 2**40), required=True,
                     help="Global batch: the largest that still generalises (seed paper)."),
        click.option("--collective", type=click.Choice(COLLECTIVES), default="ring",
                     show_default=True),
        click.option("--local-efficiency", type=FiniteFloat(0, 1, min_open=True,
                                                                 max_open=True),
                     default=0.9, show_default=True,
                     help="A device counts as efficient at this fraction of its large-batch "
                          "rate (sets the smallest useful local batch)."),
        click.option("--target-efficiency", type=FiniteFloat(0, 1, min_open=True,
                                                                  max_open=True),
                     default=0.8, show_default=True,
                     help="Parallel efficiency the bandwidth requirement is computed for."),
        click.option("--at-nodes", type=FiniteFloat(1, 2**20),
                     help="Node count for efficiency and bandwidth [default: max useful nodes]."),
        click.option("--critical-batch", type=FiniteFloat(min=0, min_open=True, max=1e15),
                     help="B_noise: also derive the node count and global batch minimising "
                          "time to train (or the batch alone at --at-nodes)."),
        click.option("--nodes-max", type=DecimalInt(1, 2**20),
                     help="With --critical-batch: node counts the time-to-train optimum "
                          "searches [default: the solver's default space, 4096]."),
    ]
    return _with_options(f, opts)


@cli.command()
@spec_options
@limit_options
@transformer_options
def limits(model, hardware, precision, optimizer, servers, overlap, fmt, **kw):
    """Derived theoretical limits, computed from the cost expressions (differentiate, solve,
    pick the branch of each max that holds): for a CNN, data-parallel strong scaling over full
    nodes at a fixed global batch; for a transformer, a hybrid plan at a fixed global batch:
    the memory floor per ZeRO stage and recompute, then at a fixed tp x pp (pinned, or the
    fewest devices that fit with tp inside a node) the optimal data-parallel degree, where its
    communication stops being hidden, the largest useful device count, the best pipeline
    depth, where tensor parallelism turns communication bound and the bandwidth a target
    efficiency needs.

    \b
    Examples:
      planner limits -m alexnet -H k80-fdr --global-batch 1024 --no-overlap
      planner limits -m googlenet -H k80-fdr --global-batch 1024 --collective parameter-server
      planner limits -m gpt3-175b -H dgx-a100-80gb --global-batch 1536
      planner limits -m llama3-70b -H dgx-h100 --global-batch 1024 --tp 8 --pp 4
    """
    from planner import api
    from planner.report import limits_text, transformer_limits_text

    _require(model, hardware)
    lim = api.limits(model, hardware, precision=precision, optimizer=optimizer,
                     servers=servers, overlap=overlap, **kw)
    summary = lim.summary()
    doc = render.document("limits", {"model": model, "hardware": hardware, **summary})
    transformer = api.is_transformer(model)
    _emit(doc, fmt, transformer_limits_text(summary) if transformer else limits_text(summary))


@cli.command()
@spec_options(formats=["text", "latex", "python", "json"])
@limit_options
@transformer_options
@click.option("--formula", "names", multiple=True,
              help="Only these formulas (repeatable). CNNs: iteration_time, speedup, "
                   "efficiency, memory, optimal_nodes, max_speedup, required_bandwidth, "
                   "time_to_train_batch. Transformers: iteration_time, bubble_fraction, "
                   "memory, mfu, optimal_devices, max_speedup, comm_bound_from, "
                   "max_useful_devices, optimal_pp, tp_comm_bound_from, required_bandwidth, "
                   "time_to_train_batch.")
@click.option("--substitute", default=None,
              help="Comma-separated symbols to replace by their values, or 'all'.")
def derive(model, hardware, precision, optimizer, servers, overlap, fmt, names, substitute,
           **kw):
    """The formulas behind `limits` (iteration time, speed-up, efficiency, memory, optimal
    nodes, max speed-up), with a glossary of symbols, their units and their values here.

    latex prints one complete equation / align environment (needs amsmath); python prints a
    module that runs as printed. The JSON form carries expression (SymPy-readable), latex,
    latex_equation, symbols and value; the expression with those symbol values evaluates to
    value, which equals what `limits` reports.

    \b
    Examples:
      planner derive -m alexnet -H k80-fdr --global-batch 1024 --formula optimal_nodes
      planner derive -m alexnet -H k80-fdr --global-batch 1024 --format latex --substitute all
    """
    from planner import api
    from planner import formulas as der
    from planner.report import derive_text

    _require(model, hardware)
    formulas = api.derive(model, hardware, precision=precision, optimizer=optimizer,
                          servers=servers, overlap=overlap, names=names, **kw)
    if substitute:
        wanted = None if substitute == "all" else {x.strip() for x in substitute.split(",")}
        if wanted is not None:
            from planner.expr.symbols import GLOSSARY

            unknown = sorted(wanted - {s.name for s in GLOSSARY})
            if unknown:
                raise SpecError(f"substitute: unknown symbol '{unknown[0]}' (known: "
                                f"{', '.join(sorted(s.name for s in GLOSSARY))})")
        formulas = [f.substituted(wanted) for f in formulas]
    if fmt == "json":
        doc = render.document("derive", {"model": model, "hardware": hardware,
                                         "formulas": [der.as_json(f) for f in formulas]})
        click.echo(render.to_json(doc))
    else:
        click.echo(derive_text(formulas, fmt))


def parallel_options(f):
    """--jobs / --scheduler: where the independent solves of batch and sweep run."""
    opts = [
        click.option("--jobs", "-j", type=DecimalInt(0, 4096), default=1, show_default=True,
                     help="Local processes to run in: 1 runs here, one after the other; 0 uses "
                          "every core."),
        click.option("--scheduler", metavar="tcp://HOST:PORT",
                     help="Run on this Dask cluster instead of local processes (needs "
                          "pip install 'planner[dask]')."),
    ]
    return _with_options(f, opts)


def _parallel_check(jobs: int, scheduler: str | None) -> None:
    if scheduler is not None and jobs != 1:
        raise SpecError("jobs: --jobs applies to local processes; with --scheduler the "
                        "cluster's workers run the tasks")


def _progress(total: int, label: str):
    """A bar on stderr when it is a terminal; pipes and files get nothing at all."""
    if sys.stderr.isatty():
        return click.progressbar(length=total, label=label, file=sys.stderr)
    return contextlib.nullcontext()


@cli.command()
@spec_options
@click.option("--nodes", "nodes_spec", default=None,
              help="Node counts: '1,2,4', 'A:B' or 'A:B:x2' [default: 1:N:x2 up to one sample "
                   "per device, at most 4096].")
@click.option("--global-batch", "batch_spec", default=None,
              help="Strong scaling: one global batch or a list ('256,512', 'A:B:x2').")
@click.option("--local-batch", type=DecimalInt(1, 2**30), help="Weak scaling.")
@click.option("--bandwidth", "bandwidth_spec", default=None,
              help="Network bandwidth per NIC in GB/s to sweep ('6.25,12.5,25') [default: the "
                   "spec's].")
@click.option("--collective", type=click.Choice(COLLECTIVES), default="ring", show_default=True)
@training_options
@click.option("--price-per-device-hour", type=FiniteFloat(min=0, min_open=True, max=1e6),
              help="USD per device-hour for the cost to train [default: the device spec's].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a plot over devices (.png or .svg): transformers MFU and time to "
                   "train (iteration time without a target), CNNs speed-up and time breakdown.")
@transformer_options
@headroom_option
@parallel_options
def sweep(model, hardware, precision, optimizer, servers, overlap, fmt, nodes_spec,
          batch_spec, local_batch, bandwidth_spec, collective, critical_batch, target_steps,
          target_samples, target_tokens, price_per_device_hour, plot_path, jobs, scheduler,
          **hybrid):
    """Predictions over node counts, global batches and network bandwidths (every
    combination; full nodes). For transformers each point is the best tp x pp x dp plan on
    all the devices of those nodes (the hybrid flags pin choices).

    \b
    Examples:
      planner sweep -m alexnet -H k80-fdr --global-batch 1024 --no-overlap
      planner sweep -m resnet50 -H dgx-a100-80gb --local-batch 256 --nodes 1:64:x2 --plot s.png
      planner sweep -m gpt3-175b -H dgx-a100-80gb --global-batch 1536 --nodes 8:1024:x2
      planner sweep -m llama3-8b -H dgx-h100 --global-batch 512 --nodes 1:32:x2 --jobs 0
    """
    from planner import api
    from planner.report import sweep_doc, sweep_text

    _require(model, hardware)
    _parallel_check(jobs, scheduler)
    headroom = hybrid.pop("memory_headroom")
    batches = int_list(batch_spec, "global_batch")
    bandwidths = float_list(bandwidth_spec, "bandwidth")
    nodes = int_list(nodes_spec, "nodes")
    if nodes is None:
        top = 4096 if batches is None else max(1, max(batches))
        nodes = int_list(f"1:{min(top, 4096)}:x2", "nodes")
    global_batch = batches[0] if batches and len(batches) == 1 else batches
    total = len(nodes) * len(batches or [None]) * len(bandwidths or [None])
    if plot_path and (len(batches or []) > 1 or len(bandwidths or []) > 1):
        raise SpecError("plot: --plot draws a sweep over nodes; give one global batch and "
                        "one bandwidth")
    transformer = api.is_transformer(model)
    if transformer:
        if local_batch is not None:
            raise SpecError("local_batch: transformer sweeps take --global-batch (the solver "
                            "splits it into dp x micro-batch x accumulation)")
        if batches is None:
            raise SpecError("global_batch: give --global-batch for a transformer sweep")
        family = {"target_tokens": target_tokens,
                  **{k: v for k, v in hybrid.items() if v is not None}}
    else:
        _reject_transformer_flags(hybrid)
        if target_tokens is not None:
            raise SpecError("target_tokens: --target-tokens applies to transformer models "
                            "(CNNs: --target-samples)")
        family = {"local_batch": local_batch, "collective": collective, "optimizer": optimizer,
                  "servers": servers}
    with _progress(total, "sweep") as bar:
        sw = api.sweep(model, hardware, nodes=nodes, global_batch=global_batch,
                       bandwidths_GBps=bandwidths, overlap=overlap, precision=precision,
                       critical_batch=critical_batch, target_steps=target_steps,
                       target_samples=target_samples,
                       price_per_device_hour=price_per_device_hour, memory_headroom=headroom,
                       jobs=jobs, scheduler=scheduler,
                       on_point=bar and (lambda: bar.update(1)), **family)
    if not sw.points:
        if transformer:
            raise InfeasibleError(f"infeasible: no swept point has a plan "
                                  f"({sw.skipped[0].reason})")
        raise InfeasibleError(f"infeasible: no node count in {nodes_spec or 'the default range'} "
                              f"divides the global batch {batch_spec} into whole local batches")
    if plot_path:
        from planner.plot import sweep_plot

        sweep_plot(sw, plot_path, f"{model} on {hardware}")
    doc = render.document("sweep", {"model": model, "hardware": hardware, **sweep_doc(sw)})
    _emit(doc, fmt, sweep_text(sw))


@cli.command()
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

    _parallel_check(jobs, scheduler)
    todo = scenarios(file, solve)
    with _progress(len(todo), "batch") as bar:
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


@cli.command()
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
    _emit(doc, fmt, calibration_text(results, skipped, fitted, specs, stats))
    stale = [f"{d} (spec {specs[d]:.3f}, fit {v:.3f})" for d, v in fitted.items()
             if abs(specs[d] - v) > cal.CHECK_TOLERANCE]
    if check and stale:
        raise CheckFailed(f"efficiency.compute out of date with the fit: {', '.join(stale)}")


@cli.command()
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


# --- entry point ----------------------------------------------------------------------------

def _json_request(argv: list[str]) -> str | None:
    """The command of `argv` when it asks for --format json (None otherwise): read from the
    arguments themselves, so a request click refused to parse still gets its JSON error."""
    args = [a for a in argv if isinstance(a, str)]
    wants = "--format=json" in args or any(
        a == "--format" and b == "json" for a, b in zip(args, args[1:], strict=False))
    if not wants:
        return None
    return next((a for a in args if a in cli.commands), "planner")


_GOT = re.compile(r"[(,] ?got (.{1,200}?)\)?$")
_KEY = re.compile(r"key '([^']{1,200})'")
_NAMED = re.compile(r"(?:unknown (\w{1,40})|Invalid value for '--([\w-]{1,60})':) '([^']{0,200})'")
_LEAD = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]{0,99}): ")


def _error_doc(command: str, kind: str, message: str, exc: BaseException) -> dict:
    """The JSON error document: kind, the one-line message, the conflicting constraints (exit
    1), and the file, key and value it names where it names them (else null)."""
    file = key = value = None
    message_all, message = message, message.split("\n", 1)[0]  # a spec's later errors: more lines
    lead, _, rest = message.partition(": ")
    if rest and ("/" in lead or lead.endswith((".yaml", ".yml", ".json", ".jsonl", ".csv"))
                 or lead == "-"):
        file = lead
    elif (m := _LEAD.match(message)) and kind == "bad_input":
        key = m.group(1)
    if (m := _KEY.search(message)) is not None:
        key = m.group(1)
    if (m := _GOT.search(message)) is not None:
        value = m.group(1)
    if (m := _NAMED.search(message)) is not None:  # unknown model 'x', Invalid value for '--k': 'x'
        key, value = m.group(1) or m.group(2), m.group(3)
    param = getattr(exc, "param", None)
    if param is not None and getattr(param, "name", None):
        key = param.name
    return render.document(command, {"error": {
        "kind": kind, "message": message_all,
        "constraints": list(getattr(exc, "conflicts", ()) or ()),
        "file": file, "key": key, "value": value}})


def _fail(argv: list[str], code: int, kind: str, message: str, exc: BaseException) -> None:
    """One line on stderr; with --format json also the error document on stdout; exit."""
    click.echo(f"planner: {message}", err=True)
    command = _json_request(argv)
    if command is not None and not isinstance(exc, CheckFailed):
        # (calibrate --check has printed its document already; its exit 1 adds none)
        with contextlib.suppress(Exception):
            click.echo(render.to_json(_error_doc(command, kind, message, exc)))
    sys.exit(code)


def main(argv=None) -> None:
    """Run the CLI; every failure becomes one line on stderr and a documented exit code (with
    --format json, also a JSON error document on stdout)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort as exc:
        _fail(args, 2, "bad_input", "aborted", exc)
    except click.ClickException as exc:
        _fail(args, 2, "bad_input", exc.format_message(), exc)
    except InfeasibleError as exc:
        _fail(args, 1, "infeasible", str(exc), exc)
    except PlannerError as exc:
        kind = "infeasible" if exc.exit_code == 1 else "bad_input"
        _fail(args, exc.exit_code, kind, str(exc), exc)
    except BrokenPipeError:
        sys.exit(0)
    except RecursionError as exc:
        _fail(args, 2, "bad_input", "input nested too deeply", exc)
    except Exception as exc:  # a bug: still one line, never a traceback
        _fail(args, 3, "internal", f"internal error: {type(exc).__name__}: {exc}", exc)


if __name__ == "__main__":
    main()
