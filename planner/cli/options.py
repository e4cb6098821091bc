"""The options several commands share, one decorator per group (the transformer's hybrid
choices are all in `transformer_options`), and the checks across them."""

from __future__ import annotations

import functools

import click

from planner import switches
from planner.cli.params import (
    COLLECTIVES,
    FORMATS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    DecimalInt,
    FiniteFloat,
)
from planner.errors import SpecError


def with_options(f, opts: list):
    """Apply click options so that they show in the order listed."""
    for opt in reversed(opts):
        f = opt(f)
    return f


def spec_options(f=None, *, formats=FORMATS, loads=False):
    """--model / --hardware and the training options every prediction needs. `loads`: the
    command takes `specs`, the request's `planner.inputs.Specs` loaded once here (None when
    --model or --hardware is missing: the command says which)."""
    if f is None:
        return functools.partial(spec_options, formats=formats, loads=loads)
    opts = [
        click.option("--model", "-m", help="Built-in model name or YAML path (required)."),
        click.option("--hardware", "-H", help="Built-in system name or YAML path (required)."),
        click.option("--precision", type=click.Choice(PRECISIONS), default=None,
                     help="Compute precision [default: the device's default_precision]."),
        switch_option(switches.BY_NAME["optimizer"]),
        click.option("--servers", type=DecimalInt(1, 1_000_000), default=1, show_default=True,
                     help="Parameter servers (for --collective parameter-server)."),
        switch_option(switches.BY_NAME["overlap"]),
        click.option("--format", "fmt", type=click.Choice(formats), default=formats[0],
                     show_default=True),
    ]
    return with_options(_with_specs(f, loads), opts)


def _with_specs(f, loads: bool):
    """`f` given the loaded `specs` when it `loads`, and refusing --optimizer adafactor /
    muon for a CNN (its memory model knows SGD, momentum and Adam only)."""

    @functools.wraps(f)
    def checked(*args, **kw):
        model, hardware = kw.get("model"), kw.get("hardware")
        specs = None
        if loads and model and hardware:
            from planner.inputs import Specs

            specs = kw["specs"] = Specs.load(model, hardware, kw.get("precision"),
                                             kw.get("seq_len"))
        elif loads:
            kw["specs"] = None
        optimizer = kw.get("optimizer")
        if optimizer in ("adafactor", "muon") and model:
            from planner.inputs import is_transformer

            if not (specs.family == "transformer" if specs else is_transformer(model)):
                raise SpecError(f"optimizer: {optimizer} is priced for transformers only; a "
                                "CNN takes sgd, momentum or adam")
        return f(*args, **kw)

    return checked


TRANSFORMER_KEYS = ("tp", "cp", "ep", "etp", "pp", "dp", "micro_batch", "interleave",
                    "recompute", "recompute_layers", "sequence_parallel", "zero", "schedule",
                    "seq_len", *switches.TRANSFORMER_ONLY)


def cnn_options(f):
    """The switches only CNN plans take (the asynchronous parameter server's --softsync)."""
    return with_options(f, [switch_option(s) for s in switches.SWITCHES
                            if s.families == ("cnn",)])


def switch_option(s: switches.Switch):
    """The click option of a switch: a bool's on / off pair, a count, a number or a choice.
    Unset is None (evaluate takes the default, solve prices it on every row), except for a
    bool every family shares (--overlap), which always has its value."""
    if s.kind is bool:
        shared = len(s.families) > 1
        return click.option(f"{s.flag}/{s.spelled(False)}", s.name,
                            default=s.default if shared else None, show_default=shared,
                            help=_help(s, None if shared else "on" if s.default else "off"))
    kind = (DecimalInt(int(s.low), int(s.high)) if s.kind is int
            else FiniteFloat(s.low, s.high) if s.kind is float else click.Choice(s.values))
    shown = None if s.default is None else f"{s.json(s.default):g}" if s.kind is float \
        else s.json(s.default)
    return click.option(s.flag, s.name, type=kind, help=_help(s, shown))


def _help(s: switches.Switch, default: str | None) -> str:
    text = f"{s.what[0].upper()}{s.what[1:]} ({s.upstream})"
    return text + (f" [default: {default}]." if default is not None else ".")


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
                          "experts; tokens reach them by all-to-all."),
        click.option("--etp", type=DecimalInt(1, 2**20),
                     help="Expert tensor-parallel degree (MoE models): ranks sharing each "
                          "expert's matrices [default: tp, as Megatron-LM; solve tries tp and "
                          "1]. etp x ep must divide tp x cp x dp."),
        click.option("--pp", type=DecimalInt(1, 2**20), help="Pipeline stages."),
        click.option("--dp", type=DecimalInt(1, 2**23), help="Data-parallel replicas."),
        click.option("--micro-batch", "micro_batch", type=DecimalInt(1, 2**30),
                     help="Sequences per micro-batch."),
        click.option("--interleave", type=DecimalInt(1, 1024),
                     help="Virtual stages per pipeline stage (interleaved 1F1B)."),
        click.option("--recompute", type=click.Choice(RECOMPUTE),
                     help="Activation recomputation."),
        click.option("--recompute-layers", "recompute_layers", type=DecimalInt(1, 100_000),
                     help="Recompute only the first N layers of each pipeline chunk, the rest "
                          "keeping their activations (Megatron-LM --recompute-method block "
                          "--recompute-num-layers N); implies --recompute full."),
        click.option("--sequence-parallel/--no-sequence-parallel", "sequence_parallel",
                     default=None, help="Megatron sequence parallelism (with tp > 1)."),
        click.option("--zero", type=DecimalInt(0, 3), help="ZeRO / FSDP sharding stage."),
        click.option("--schedule", type=click.Choice(SCHEDULES),
                     help="Pipeline schedule."),
        click.option("--seq-len", "seq_len", type=DecimalInt(1, 10_000_000),
                     help="Train at this sequence length [default: the model's seq_len]."),
        *(switch_option(s) for s in switches.SWITCHES if s.families == ("transformer",)),
    ]
    return with_options(f, opts)


def framework_option(f):
    """--framework: the framework a transformer plan is priced for (solve, evaluate)."""
    return click.option(
        "--framework", type=click.Choice(switches.FRAMEWORK_FORMS), default=None,
        help="Transformers: price the plan as this framework runs it: a switch it has no "
             "flag for takes the framework's value (torchtitan and DeepSpeed accumulate "
             "gradients unfused, Megatron-LM's fp8 saves GEMM inputs in fp8) and solve tries "
             "only the switches it writes [default: the --format's framework, else each "
             "switch as given or its default].")(f)


def framework_of(framework: str | None, fmt: str, family: str) -> str | None:
    """The framework a plan of a `family` model is priced for: --framework (transformers
    only), or that of a framework --format (both given, they must agree)."""
    if framework and family != "transformer":
        raise SpecError(f"framework: --framework prices a transformer plan as that framework "
                        f"runs it; drop it for a {family} model (--format {framework} writes "
                        f"the form where there is one)")
    form = fmt if fmt in switches.FRAMEWORK_FORMS else None
    if framework and form and framework != form:
        raise SpecError(f"framework: --framework {framework} with --format {fmt}, which writes "
                        f"the plan for {fmt}; give one of the two")
    return framework or form


SEARCH_BOUNDS = switches.SEARCH_BOUNDS


def bound_options(f):
    """--cp-max and --ep-max: the highest context- and expert-parallel degrees a search offers
    (solve, sweep)."""
    f = click.option(
        "--ep-max", "ep_max", type=DecimalInt(1, 1 << 20),
        help="Mixture-of-experts transformers: the highest expert-parallel degree the search "
             "tries (solve's covered plan bounds it by the MoE calibration runs' degrees the "
             "same way) [default: every power of two dividing the experts].")(f)
    return click.option(
        "--cp-max", "cp_max", type=DecimalInt(1, 16),
        help="Transformers: the highest context-parallel degree the search tries, 1 to 16 "
             "(for instance the highest your own runs have reached; solve's covered plan "
             "bounds it by the calibration runs' degrees the same way) [default: 16].")(f)


def headroom_option(f):
    """--memory-headroom: how full a device may be (evaluate, solve, sweep)."""
    from planner.search.memory_fit import DEFAULT_MEMORY_HEADROOM

    return click.option(
        "--memory-headroom", "memory_headroom", type=FiniteFloat(0, 1, max_open=True),
        default=DEFAULT_MEMORY_HEADROOM, show_default=True,
        help="Fraction of each device's usable memory kept free (fragmentation): a plan "
             "fits when it needs at most (1 - FRACTION) x (the device memory less its runtime "
             "reserve: the driver's share, the CUDA context, NCCL's buffers). 0.05 keeps 5 % "
             "free.")(f)


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
    return with_options(f, opts)


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
    return with_options(f, opts)


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
    return with_options(f, opts)


def require(model, hardware) -> None:
    """Every prediction needs --model and --hardware (click cannot require them: evaluate
    --batch reads them from its lines)."""
    if not model:
        raise SpecError("model: --model is required (a built-in name or a YAML path)")
    if not hardware:
        raise SpecError("hardware: --hardware is required (a built-in name or a YAML path)")


def reject_transformer_flags(kw: dict) -> None:
    """A CNN takes none of the hybrid choices (nor the search's bound on them)."""
    for key in (*TRANSFORMER_KEYS, *SEARCH_BOUNDS):
        if kw.get(key) is not None:
            raise SpecError(f"{key}: --{key.replace('_', '-')} applies to transformer models "
                            "only")


def parallel_check(jobs: int, scheduler: str | None) -> None:
    """--jobs and --scheduler exclude each other."""
    if scheduler is not None and jobs != 1:
        raise SpecError("jobs: --jobs applies to local processes; with --scheduler the "
                        "cluster's workers run the tasks")
