"""The Python API: the same operations as the CLI, each verb once for every model family, with
typed results read as attributes.

    import planner.api as planner
    sol = planner.solve("alexnet", "k80-fdr", global_batch=256)
    print(sol.plan.nodes, sol.prediction.iteration_time_s)
    sol = planner.solve("gpt3-175b", "dgx-a100-80gb", global_batch=1536, devices_max=4096, top=2)
    print(sol.plan.tp, sol.plan.pp, sol.plan.dp, sol.prediction.mfu)

`evaluate`, `solve` and `sweep` dispatch on the model's family (CNN or transformer); every
answer is a `planner.plan.Plan` with a `planner.prediction.Prediction`. Specs are given by
built-in name or YAML path, exactly as on the command line.

Every verb takes the command line's option names, underscored (`tokens=`, `deadline=`,
`budget=`, `within=`, `time_limit=`, `bandwidth=`, `formula=`, ...: `planner.inputs.CLI_NAMES`)
as well as its own (`token_budget=`, `deadline_s=`, ...); a name it does not take is a
one-line `planner.errors.SpecError` naming the closest one ("did you mean"), never a
TypeError.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner import switches
from planner.catalog import load_model, load_system, pool_nodes  # noqa: F401  (planner.load_model, ...)
from planner.errors import SpecError
from planner.inputs import (
    TRANSFORMER_ONLY,
    TRANSFORMER_REFUSES,
    Specs,
    build,
    check_type,
    cli_names,
    devices_of,
    enum_value,
    is_recommendation,
    is_transformer,
    only_for,
    request,
    samples_of_tokens,
    training_of,
    type_hints,
    whole_node,
)
from planner.plan import Plan, check_softsync
from planner.prediction import Prediction, predict
from planner.search.memory_fit import DEFAULT_MEMORY_HEADROOM, check_headroom, within
from planner.search.objective import objective_for
from planner.search.requests import Problem
from planner.search.solution import Solution
from planner.spec.hardware import Precision  # noqa: F401  (planner.api.Precision, as before)
from planner.sweeping import Skipped, Sweep, SweepPoint, with_inter_node_bandwidth
from planner.vocabulary import Collective

if TYPE_CHECKING:
    from planner.expr.cnn import DataParallelModel
from planner.sweeping import sweep as _sweep

_enum = enum_value  # the name `limits` uses
__all__ = ["Evaluation", "Skipped", "Solution", "Sweep", "SweepPoint", "build", "derive",
           "evaluate", "evaluate_transformer", "is_recommendation", "is_transformer", "limits",
           "place_tables", "placement", "solve",
           "solve_transformer", "sweep", "sweep_transformer", "training_of",
           "with_inter_node_bandwidth"]


def _keywords(f) -> set[str]:
    """The keyword arguments `f` names (not its positional ones, nor **kwargs)."""
    return {p.name for p in inspect.signature(f).parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - {"model", "hardware",
                                                                       "specs"}


def _fields(cls, *fixed: str) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} - set(fixed)


def _search_fields() -> set[str]:
    from planner.search.hybrid_space import Search

    return _fields(Search, "objective", "training", "framework")


SPEC_KEYS = frozenset({"precision", "seq_len"})  # what `Specs.load` takes beside the names


@functools.cache
def _accepted(verb: str) -> frozenset[str]:
    """Every keyword argument a verb takes (its own names; `CLI_NAMES` adds the command
    line's): its signature's and those it passes on."""
    if verb == "evaluate":
        names = _keywords(evaluate.__wrapped__) | set(switches.NAMES) | SPEC_KEYS
    elif verb == "solve":
        names = (_keywords(solve.__wrapped__) | SPEC_KEYS
                 | _fields(Problem, "collectives", "objective", "training") | _search_fields())
    elif verb == "limits":
        names = (_keywords(limits.__wrapped__) | _keywords(_transformer_limits)
                 | set(switches.NAMES) | SPEC_KEYS)
    elif verb == "derive":
        names = _accepted("limits") | _keywords(derive.__wrapped__)
    else:  # sweep: its own, the sweep's, a transformer point's search pins, in parallel
        from planner.sweeping import sweep_in_parallel

        names = (_keywords(sweep.__wrapped__) | _keywords(_sweep) | _search_fields()
                 | _keywords(sweep_in_parallel) | SPEC_KEYS)
    return frozenset(names)


def _cli_names(verb: str, loads: bool = False):
    """The verb taking the command line's names (`planner.inputs.CLI_NAMES`) too, a wrong or
    missing keyword a one-line `SpecError` instead of a TypeError. `loads`: the verb takes the
    request's `Specs`, loaded here once from the model, hardware, precision and sequence length
    named (or given already loaded as `model`, the hardware left out: the command line's
    way)."""

    def wrap(f):
        required = [p.name for p in inspect.signature(f).parameters.values()
                    if p.kind is p.KEYWORD_ONLY and p.default is p.empty]

        @functools.wraps(f)
        def call(model, hardware=None, **kwargs):
            kwargs = cli_names(verb, kwargs, _accepted(verb))
            for name in required:
                if name not in kwargs:
                    raise SpecError(f"{verb}: missing argument '{name}'")
            hints = type_hints(f)  # the verb's own keywords of the wrong type: one line
            for key, value in kwargs.items():
                if value is not None and key in hints and key not in switches.BY_NAME:
                    check_type(key, value, hints[key])
            if not loads:
                return f(model, hardware, **kwargs)
            if isinstance(model, Specs):
                named = [k for k in ("precision", "seq_len") if kwargs.get(k) is not None]
                if hardware is not None or named:
                    raise SpecError(f"{verb}: the specs are loaded already; give "
                                    f"{named[0] if named else 'hardware'} to Specs.load")
                return f(model, **kwargs)
            return f(Specs.load(model, hardware, kwargs.pop("precision", None),
                                kwargs.pop("seq_len", None)), **kwargs)

        return call

    return wrap


def placement(dp: DataParallelModel, nodes: int | None, devices: int | None,
              devices_per_node: int | None) -> tuple[int, int]:
    """(nodes, devices per node) from whichever of the three the user gave."""
    dpn = dp.system.devices_per_node
    g = devices_per_node
    if g is not None and not 1 <= g <= dpn:
        raise SpecError(f"devices_per_node: {g} is outside [1, {dpn}] for '{dp.system.name}'")
    if nodes is not None:
        if devices is not None and devices != nodes * (g or dpn):
            raise SpecError(f"devices: {devices} != nodes {nodes} x devices_per_node {g or dpn}")
        return nodes, g or dpn
    if devices is None:
        raise SpecError("nodes: give --nodes or --devices")
    if devices < 1:
        raise SpecError(f"devices: must be a positive integer, got {devices}")
    g = g or min(devices, dpn)
    if devices % g:
        raise SpecError(f"devices: {devices} is not a multiple of {g} devices per node")
    return devices // g, g


# --- evaluate -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    plan: Plan
    prediction: Prediction

    @property
    def config(self) -> Plan:
        return self.plan

    @property
    def devices_per_node(self) -> int:
        return self.plan.devices_per_node


@_cli_names("evaluate", loads=True)
def evaluate(specs: Specs, *, nodes: int | None = None, devices: int | None = None,
             global_batch: int | None = None, devices_per_node: int | None = None,
             local_batch: int | None = None,
             collective: str | None = None, servers: int | None = None, tp: int | None = None,
             cp: int | None = None, ep: int | None = None, etp: int | None = None,
             pp: int | None = None, dp: int | None = None, micro_batch: int | None = None,
             interleave: int | None = None, recompute: str | None = None,
             recompute_layers: int | None = None, sequence_parallel: bool | None = None,
             zero: int | None = None, schedule: str | None = None,
             memory_headroom: float = DEFAULT_MEMORY_HEADROOM, framework: str | None = None,
             **switch_values) -> Evaluation:
    """Predict one plan of `model` on `hardware` (names or paths; `precision`, `seq_len` as
    `planner.inputs.Specs.load` takes them). CNNs: data parallel on nodes x
    devices_per_node with a global or local batch and a collective. Transformers: tp x cp x
    pp x dp (give any two of devices / nodes, dp), ep and etp for MoE models, micro-batch,
    interleave, recompute (`recompute_layers`:
    the layers of each pipeline chunk recomputed, implying full), sequence parallel (default
    on for an MoE model with tp > 1, as Megatron-LM requires), ZeRO, schedule. Keywords
    named as the switches of `planner.switches` (overlap, optimizer, tp_overlap, dp_shard,
    ...; `planner list switches` lists them) set those; each left out takes its default, or
    with `framework` (megatron, torchtitan, deepspeed) the value that framework always
    runs (`switches.framework_pins`). The plan fits when it needs at most (1 -
    memory_headroom) x the device memory."""
    check_headroom(memory_headroom)
    given = {**{k: v for k, v in locals().items()
                if k not in ("switch_values", "specs", "framework")},
             "seq_len": specs.seq_len, **switch_values}
    chosen = switches.given(switch_values)
    if specs.family == "transformer":
        only_for("transformer", given, TRANSFORMER_REFUSES)
        whole_node(devices_per_node, specs.system.devices_per_node)
        chosen.update(switches.framework_pins(chosen, framework, specs.precision.value,
                                              zero or 0))
        return _evaluate_transformer(specs, global_batch=global_batch, devices=devices,
                                     nodes=nodes, tp=tp or 1, cp=cp or 1, ep=ep or 1, etp=etp, pp=pp or 1,
                                     dp=dp, micro_batch=micro_batch or 1,
                                     interleave=interleave or 1,
                                     recompute=recompute or ("full" if recompute_layers
                                                             else "none"),
                                     recompute_layers=recompute_layers,
                                     sequence_parallel=sequence_parallel, zero=zero or 0,
                                     schedule=schedule or "1f1b",
                                     memory_headroom=memory_headroom, **chosen)
    overlap, optimizer = chosen.get("overlap", True), chosen.get("optimizer")
    softsync = chosen.get("softsync")
    only_for("cnn", given, TRANSFORMER_ONLY)
    cnn = _cnn(specs, optimizer, servers, softsync)
    n, g = placement(cnn, nodes, devices, devices_per_node)
    if global_batch is None:
        if local_batch is None:
            raise SpecError("global_batch: give --global-batch or --local-batch")
        global_batch = local_batch * n * g
    elif local_batch is not None and local_batch * n * g != global_batch:
        raise SpecError(f"local_batch: {local_batch} x {n * g} devices != global_batch "
                        f"{global_batch}")
    col = enum_value(Collective, collective or ("parameter-server" if softsync else "ring"),
                     "collective")
    plan = Plan.data_parallel(n, g, global_batch, col, overlap, softsync,
                              cnn.options.optimizer.value)
    return Evaluation(plan, within(predict(cnn, plan), cnn.system.device.usable_memory_bytes,
                                   memory_headroom))


def _cnn(specs: Specs, optimizer: str | None, servers: int | None, softsync: int | None):
    """The CNN's symbolic model of the request (`planner.inputs.build`, kept per process)."""
    prec = specs.given_precision
    return build(specs.model_ref, specs.hardware_ref, prec.value if prec else None,
                 optimizer or "momentum", servers=1 if servers is None else servers,
                 softsync=softsync, specs=specs)


def _evaluate_transformer(specs: Specs, *, global_batch, devices, nodes, tp, cp, ep, pp, dp,
                          memory_headroom, **choices) -> Evaluation:
    from planner.plan import check_pins
    from planner.search.hybrid import predict as predict_transformer

    m, system, prec = specs.transformer()
    if global_batch is None:
        raise SpecError("global_batch: --global-batch is required for transformer models")
    check_pins(m, tp=tp, pp=pp, interleave=choices["interleave"], cp=cp, ep=ep,
               first=choices.get("first_stage_layers"), last=choices.get("last_stage_layers"))
    g = system.devices_per_node
    devices = devices_of(devices, nodes, g)
    if dp is None:
        if devices is None:
            raise SpecError("devices: give --devices, --nodes or --dp")
        if devices % (tp * cp * pp):
            what = f"tp({tp}) x cp({cp}) x pp({pp})" if cp > 1 else f"tp({tp}) x pp({pp})"
            raise SpecError(f"devices: {devices} is not divisible by {what} = {tp * cp * pp}")
        dp = devices // (tp * cp * pp)
    elif devices is not None and devices != tp * cp * pp * dp:
        what = f"tp({tp}) x cp({cp})" if cp > 1 else f"tp({tp})"
        raise SpecError(f"devices: {what} x pp({pp}) x dp({dp}) = {tp * cp * pp * dp} != "
                        f"{devices} devices")
    if choices["sequence_parallel"] is None:  # Megatron-LM: MoE with tp > 1 needs it
        choices["sequence_parallel"] = m.experts > 1
    choices["sequence_parallel"] = choices["sequence_parallel"] and tp > 1
    plan = Plan.split(tp, pp, dp, micro_batch=choices.pop("micro_batch"),
                      global_batch=global_batch, node_size=g, cp=cp, ep=ep, **choices)
    return Evaluation(plan, predict_transformer(m, system, prec, plan, memory_headroom))


def evaluate_transformer(model: str, hardware: str, **kwargs) -> Evaluation:
    """`evaluate` for a transformer (the former name)."""
    specs = _former(model, hardware, kwargs)
    return evaluate(specs, **kwargs)


def _former(model: str, hardware: str, kwargs: dict) -> Specs:
    """The specs of a former `*_transformer` verb's request, refused unless a transformer."""
    specs = Specs.load(model, hardware, kwargs.pop("precision", None), kwargs.pop("seq_len", None))
    specs.transformer()
    return specs


# --- solve --------------------------------------------------------------------------------------


@_cli_names("solve", loads=True)
def solve(specs: Specs, *, objective: str | None = None, critical_batch: float | None = None,
          target_steps: float | None = None, target_samples: float | None = None,
          target_tokens: float | None = None, price_per_device_hour: float | None = None,
          deadline_s: float | None = None, budget_usd: float | None = None,
          optimizer: str | None = None, servers: int | None = None,
          collective: str | None = None, strategy: str | None = None, stages: int | None = None,
          prefer_supported: float | None = None, framework: str | None = None, **problem):
    """The best plan of `model` on `hardware` (names or paths; `precision`, `seq_len` as
    `planner.inputs.Specs.load` takes them): a `Solution`: plan, prediction, objective,
    runners-up with `top`, the fewest nodes within a tolerance with `fewest_nodes_within`, the
    (time-to-train, cost) Pareto front with `pareto`. Keys of `problem`: nodes, nodes_max,
    devices, devices_max, global_batch, global_batch_range, top, fewest_nodes_within, pareto,
    overlap, time_limit_s, and per family the fields of `planner.search.data_parallel.Problem`
    (CNNs: devices per node, local batch, collective; `strategy` data, hybrid, pipeline or
    auto, which give a `planner.search.strategy.SplitSolution`) or of
    `planner.search.hybrid.Search` (transformers: tp, pp, dp, micro_batch, recompute, ...
    pinned, token_budget). With `critical_batch` (B_noise) and one of `target_steps` (S_min) /
    `target_samples` (E_min) / `target_tokens` (transformers: E_min in tokens), the solution
    carries steps and time to train (McCandlish et al. 2018); the price per device-hour
    defaults to the device spec's. The objective defaults, as on the command line, to
    token-budget with a token budget (`tokens`), else throughput. A transformer pick no calibration
    run covers carries `support` (`planner.search.support`): for a ZeRO-2 or ZeRO-3 pick the
    fastest ZeRO 1 plan beside it (for a LoRA pick the fastest without a pipeline, at
    ZeRO 1), taken by default where it lies within the fastest plan's
    error band (the covered plan's high / low - 1), or with `prefer_supported` F within 1 + F
    (0: only one as good), in the objective's value. `framework` (megatron, torchtitan,
    deepspeed): the plan is priced as that framework runs it (`switches.framework_pins`) and
    must be one its launcher form writes, so the switches it cannot write are not tried
    (`switches.left_to_search`)."""
    if objective is None:
        objective = "token-budget" if problem.get("token_budget") is not None else "throughput"
    nodes = specs.pool_nodes
    if nodes is not None:  # a cluster of one pool: that system, at most its nodes
        problem["nodes_max"] = min(problem.get("nodes_max") or nodes, nodes)
    elif specs.is_cluster:
        return _solve_cluster(specs, objective=objective, optimizer=optimizer,
                              framework=framework, prefer_supported=prefer_supported, **problem)
    train = dict(critical_batch=critical_batch, target_steps=target_steps,
                 price_per_device_hour=price_per_device_hour, deadline_s=deadline_s,
                 budget_usd=budget_usd)
    if specs.family == "recommendation":
        given = {"objective": None if objective == "throughput" else objective,
                 "optimizer": optimizer, "servers": servers, "collective": collective,
                 "strategy": strategy, "stages": stages, "seq_len": specs.seq_len,
                 "prefer_supported": prefer_supported, **train,
                 **{k: v for k, v in problem.items() if k not in PLACE_KEYS}}
        extra = sorted(k for k, v in given.items() if v not in (None, False, 0, ()))
        if extra:
            raise SpecError(f"{extra[0]}: a recommendation model's solve places its tables "
                            f"(keys: {', '.join(sorted(PLACE_KEYS))})")
        return _place_tables(specs, **{k: v for k, v in problem.items() if k in PLACE_KEYS})
    if specs.family == "transformer":
        only_for("transformer", {"optimizer": optimizer, "servers": servers,
                                 "collective": collective, "strategy": strategy,
                                 "stages": stages, **problem}, TRANSFORMER_REFUSES)
        whole_node(problem.pop("devices_per_node", None), specs.system.devices_per_node)
        from planner.search.hybrid import Search

        m, system, prec = specs.transformer()
        # priced as the framework runs what it has no flag for
        problem.update(switches.framework_pins(problem, framework, prec.value,
                                               problem.get("zero")))
        _pin_for_form(problem, framework)
        budget = problem.get("token_budget")
        training = training_of(system.device.price_per_hour_usd,
                               target_samples=samples_of_tokens(m, target_samples,
                                                                target_tokens),
                               budget_samples=None if budget is None or critical_batch
                               is not None else budget / m.seq_len, **train)
        q = request(Search, {**problem, "optimizer": optimizer or "adam"},
                    objective=objective_for(objective, "transformer"), training=training,
                    searched=switches.left_to_search(problem, framework), framework=framework)
        if prefer_supported is not None and not 0 <= prefer_supported <= 1:
            raise SpecError(f"prefer_supported: must be a fraction in [0, 1], got "
                            f"{prefer_supported!r}")
        from planner.search.support import supported_solve

        sol = supported_solve(m, system, prec, q, prefer_supported)[1]
        if q.token_budget is None:
            return sol
        from planner.search.training import token_budget

        return dataclasses.replace(sol, token_budget=token_budget(
            q.token_budget, sol.plan.devices, sol.prediction.tokens_per_s,
            sol.prediction.iteration_time_s, specs.price(price_per_device_hour)))
    only_for("cnn", {"target_tokens": target_tokens, "seq_len": specs.seq_len,
                     "prefer_supported": prefer_supported, **problem},
             (*TRANSFORMER_ONLY, "prefer_supported", *switches.SEARCH_BOUNDS))
    softsync = problem.get("softsync")
    if softsync is not None:  # the asynchronous protocol is the parameter server's
        collective = collective or "parameter-server"
        check_softsync(softsync, collective)
        if strategy not in (None, "data") or stages is not None:
            raise SpecError("softsync: the asynchronous parameter server is priced for data "
                            "parallelism (--strategy data)")
    cnn = _cnn(specs, optimizer, servers, softsync)
    cols = ((enum_value(Collective, collective, "collective"),) if collective
            else tuple(Collective))
    training = training_of(cnn.system.device.price_per_hour_usd,
                           target_samples=target_samples, **train)
    from planner.search.data_parallel import DataParallelSolver
    from planner.search.strategy import SplitSearch, Strategy

    prob = request(Problem, problem, collectives=cols,
                   objective=objective_for(objective, "cnn"), training=training)
    strat = enum_value(Strategy, strategy or "data", "strategy")
    if strat is Strategy.data and stages is None:
        return DataParallelSolver(cnn, prob).solve()
    return SplitSearch(cnn, prob, stages).solve(strat)


def _pin_for_form(problem: dict, framework: str | None) -> None:
    """What the framework's search pins where the request leaves it unset
    (`planner.rules.FORM_PINS`)."""
    from planner import rules

    for key, value in rules.FORM_PINS.get(framework, {}).items():
        if problem.get(key) is None:
            problem[key] = value


PLACE_KEYS = frozenset({"devices", "nodes", "global_batch", "time_limit_s", "memory_headroom",
                        "workers"})


def place_tables(model: str, hardware: str, *, precision: str | None = None, **keys):
    """The placement of a recommendation model's embedding tables on `devices` (or `nodes`
    whole nodes) of `hardware`, proven optimal within `time_limit_s` (default 30 s;
    `planner.search.placement.Placement`, with the model, system and batch as `.model`,
    `.system`, `.global_batch`). `global_batch` defaults to the model spec's; `keys`:
    devices, nodes, global_batch, time_limit_s, memory_headroom, workers."""
    return _place_tables(Specs.load(model, hardware, precision), **keys)


def _place_tables(specs: Specs, *, devices: int | None = None, nodes: int | None = None,
                  global_batch: int | None = None, time_limit_s: float = 30.0,
                  memory_headroom: float = DEFAULT_MEMORY_HEADROOM, workers: int = 1):
    from planner.cost.recommendation import costs
    from planner.search.memory_fit import usable_bytes
    from planner.search.placement import place

    if specs.is_cluster:
        raise SpecError(f"hardware: '{specs.hardware_ref}' is a cluster of several pools; a "
                        f"recommendation model's tables are placed on one system")
    m, system = specs.model, specs.system
    g = system.devices_per_node
    devices = devices_of(devices, nodes, g)
    if devices is None:
        raise SpecError("devices: give --devices (or --nodes): the tables are placed on that "
                        "many devices")
    if devices > g and devices % g:
        raise SpecError(f"devices: {devices} is more than one node and not a multiple of "
                        f"{g} devices per node")
    if devices > 4096:
        raise SpecError(f"devices: at most 4,096 devices per placement, got {devices}")
    batch = global_batch or m.global_batch
    if batch is None:
        raise SpecError(f"global_batch: give --global-batch ('{m.name}' names none)")
    if batch % devices:
        raise SpecError(f"global_batch: {batch} does not split evenly over {devices} devices")
    prec = specs.precision
    cap = usable_bytes(system.device.usable_memory_bytes, check_headroom(memory_headroom))
    c = costs(m, system, prec, devices, batch, cap)
    found = place(c, [t.name for t in m.tables], time_limit_s, workers)
    return dataclasses.replace(found, model=m, system=system, global_batch=batch,
                               precision=prec)


def solve_cluster(model: str, hardware: str, *, precision: str | None = None,
                  seq_len: int | None = None, **problem):
    """The best plan over a cluster of several pools (`planner.search.pools`): a
    `ClusterSolution` with the best plan of every subset of the pools. Keys of `problem`:
    objective, optimizer, framework (as in `solve`) and the transformer search's
    (`planner.search.hybrid.Search`)."""
    return _solve_cluster(Specs.load(model, hardware, precision, seq_len), **problem)


def _solve_cluster(specs: Specs, *, objective: str = "throughput",
                   optimizer: str | None = None, framework: str | None = None,
                   prefer_supported: float | None = None, **problem):
    from planner.search.hybrid import Search
    from planner.search.pools import ClusterSolver

    if specs.family != "transformer":
        raise SpecError(f"hardware: a cluster of several pools plans transformers; "
                        f"'{specs.model_ref}' is a {specs.family} model (give one pool's "
                        f"system)")
    m, cluster, prec = specs.model, specs.target, specs.precision
    problem.update(switches.framework_pins(problem, framework, prec.value, problem.get("zero")))
    _pin_for_form(problem, framework)
    q = request(Search, {**problem, "optimizer": optimizer or "adam"},
                objective=objective_for(objective, "transformer"),
                searched=switches.left_to_search(problem, framework), framework=framework)
    return ClusterSolver(m, cluster, prec, q, prefer_supported).solve()


def solve_transformer(model: str, hardware: str, **kwargs) -> Solution:
    """`solve` for a transformer (the former name)."""
    return solve(_former(model, hardware, kwargs), **kwargs)


@_cli_names("limits", loads=True)
def limits(specs: Specs, *, global_batch: int, collective: str = "ring",
           overlap: bool = True, optimizer: str | None = None, servers: int = 1,
           local_efficiency: float | None = None,
           target_efficiency: float | None = None, at_nodes: float | None = None,
           critical_batch: float | None = None, nodes_max: int | None = None, **hybrid):
    """The derived limits: of data-parallel strong scaling for a CNN (a
    `planner.analysis.cnn_limits.Limits`), of a hybrid plan for a transformer (a
    `planner.analysis.transformer_limits.TransformerLimits`, its keys in `hybrid`: tp, pp, dp,
    micro_batch, interleave, recompute, sequence_parallel, zero, schedule, flash_attention,
    seq_len). `.summary()` gives the dict either way."""
    if specs.family == "transformer":
        only_for("transformer", {"collective": None if collective == "ring" else collective,
                                 "at_nodes": at_nodes, "nodes_max": nodes_max,
                                 "servers": None if servers == 1 else servers},
                 ("collective", "servers", "at_nodes", "nodes_max"))
        if optimizer not in (None, "adam"):
            raise SpecError(f"optimizer: the transformer limits are derived with Adam; use "
                            f"evaluate, solve or sweep for --optimizer {optimizer}")
        return _transformer_limits(specs, global_batch, overlap, local_efficiency,
                                   target_efficiency, critical_batch, **hybrid)
    only_for("cnn", {**hybrid, "seq_len": specs.seq_len}, TRANSFORMER_ONLY)
    from planner.analysis import cnn_limits as lim

    dp = _cnn(specs, optimizer, servers, None)
    return lim.Limits(
        dp, _enum(Collective, collective, "collective"), overlap, global_batch,
        local_efficiency=local_efficiency or lim.DEFAULT_LOCAL_EFFICIENCY,
        target_efficiency=target_efficiency or lim.DEFAULT_TARGET_EFFICIENCY,
        at_nodes=at_nodes, critical_batch=critical_batch,
        nodes_max=lim.DEFAULT_NODES_MAX if nodes_max is None else nodes_max,
    )


def _transformer_limits(specs: Specs, global_batch, overlap, local_efficiency,
                        target_efficiency, critical_batch, *, tp=None, pp=None, dp=None,
                        micro_batch=None, interleave=None, recompute=None,
                        sequence_parallel=None, zero=None, schedule=None, cp=None, ep=None,
                        etp=None, recompute_layers=None, **switch_values):
    from planner.analysis import transformer_limits as tl
    from planner.expr.transformer import RECOMPUTE, SCHEDULES, Choices

    for key, value in (("cp", cp), ("ep", ep)):
        if value not in (None, 1):
            raise SpecError(f"{key}: the transformer limits hold at {key} = 1 (got {value}); "
                            f"use evaluate, solve or sweep for {key} > 1")
    refused = [k for k, v in (("etp", etp), ("recompute_layers", recompute_layers))
               if v is not None]
    taken = {}  # the switches the limits are derived with
    for key, value in switches.given(switch_values).items():
        switch = switches.BY_NAME[key]
        value = switch.check(value)
        if switch.limits:
            taken[key] = value
        elif value != switch.default:
            refused.append(key)
    if refused:
        key = refused[0]
        raise SpecError(f"{key}: the transformer limits are derived without "
                        f"--{key.replace('_', '-')} (an even pipeline split, no expert "
                        f"or tp-overlap choices); use evaluate, solve or sweep")

    m, system, prec = specs.transformer()
    base = tl.DEFAULT_CHOICES
    if recompute is not None and recompute not in RECOMPUTE:
        raise SpecError(f"recompute: unknown value {recompute!r} (allowed: "
                        f"{', '.join(RECOMPUTE)})")
    if schedule is not None and schedule not in SCHEDULES:
        raise SpecError(f"schedule: unknown value {schedule!r} (allowed: "
                        f"{', '.join(SCHEDULES)})")
    if zero is not None and zero not in (0, 1, 2, 3):
        raise SpecError(f"zero: must be 0, 1, 2 or 3, got {zero}")
    choices = Choices(recompute=recompute or base.recompute,
                      sequence_parallel=(base.sequence_parallel if sequence_parallel is None
                                         else sequence_parallel),
                      zero=base.zero if zero is None else zero,
                      schedule=schedule or base.schedule, **{"overlap": overlap, **taken})
    return tl.TransformerLimits(
        m, system, prec, global_batch, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch or 1,
        interleave=interleave or 1, choices=choices,
        local_efficiency=local_efficiency or tl.DEFAULT_LOCAL_EFFICIENCY,
        target_efficiency=target_efficiency or tl.DEFAULT_TARGET_EFFICIENCY,
        critical_batch=critical_batch)


@_cli_names("derive", loads=True)
def derive(specs: Specs, *, names: tuple[str, ...] = (),
           substitute: str | tuple[str, ...] | None = None, **kwargs):
    """The formulas behind `limits` (a list of `planner.formulas.Derived`), only `names`
    (`formula`) when given; `substitute` replaces these symbols (a comma-separated string or
    a tuple, or 'all') by their values, as `planner derive --substitute` does. The plan they
    are read at and the formulas left out: `derivation`."""
    return derivation(specs, names=names, substitute=substitute, **kwargs).formulas


@dataclass(frozen=True)
class Derivation:
    """What `planner derive` prints: the plan the formulas are read at (as `limits` reports
    it: a transformer's split and switches, a CNN's collective), the formulas, and the
    formulas left out with why (none when `names` were given: a named one with no answer is
    an error)."""

    plan: dict
    formulas: list
    left_out: dict


@_cli_names("derive", loads=True)
def derivation(specs: Specs, *, names: tuple[str, ...] = (),
               substitute: str | tuple[str, ...] | None = None, **kwargs) -> Derivation:
    """`derive` with the plan its formulas are read at and the formulas it left out."""
    lim = limits(specs, **kwargs)
    if specs.family == "transformer":
        from planner.analysis import transformer_formulas as tf

        formulas, known = tf.derive(lim, tuple(names)), tf.FORMULAS
        closed = "no closed form for this plan; planner limits gives the bound on the full model"
    else:
        from planner import formulas as der

        formulas, known = der.select(der.derive(lim), names), der.FORMULAS
        closed = "compute and latency alone miss the target efficiency: no bandwidth reaches it"
    got = {f.name for f in formulas}
    left_out = {} if names else {
        n: "needs --critical-batch" if n == "time_to_train_batch" else closed
        for n in known if n not in got}
    return Derivation(lim.plan, _substituted(formulas, substitute), left_out)


def _substituted(formulas: list, substitute) -> list:
    if not substitute:
        return formulas
    wanted = None
    if substitute != "all":
        from planner.expr.symbols import GLOSSARY

        parts = substitute.split(",") if isinstance(substitute, str) else substitute
        wanted = {x.strip() for x in parts}
        known = {s.name for s in GLOSSARY}
        unknown = sorted(wanted - known)
        if unknown:
            raise SpecError(f"substitute: unknown symbol '{unknown[0]}' (known: "
                            f"{', '.join(sorted(known))})")
    return [f.substituted(wanted) for f in formulas]


@_cli_names("sweep", loads=True)
def sweep(specs: Specs, *, memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
          jobs: int = 1, scheduler=None, **kwargs) -> Sweep:
    """`planner.sweeping.sweep` of `model` on `hardware` (names or paths; `precision`,
    `seq_len` as `planner.inputs.Specs.load` takes them), each point's memory fit checked
    against (1 - memory_headroom) x the device memory (a transformer point's search keeps only
    plans that fit it). With `jobs` other than 1 (0: every core) or a Dask `scheduler` (an
    address 'tcp://HOST:PORT' or a `distributed.Client`) the combinations run in parallel
    (`planner.sweeping.sweep_in_parallel`, which also takes `stall_timeout_s`,
    `connect_timeout_s` and `on_progress`), with the same result. Many solves:
    `planner.batch.batch` (docs/batch.md)."""
    check_headroom(memory_headroom)
    if jobs == 1 and scheduler is None:  # the cluster's settings, as the command line: unused
        for key in ("stall_timeout_s", "connect_timeout_s", "on_progress"):
            kwargs.pop(key, None)
    if jobs != 1 or scheduler is not None:
        from planner.sweeping import sweep_in_parallel

        return sweep_in_parallel(specs, memory_headroom=memory_headroom, jobs=jobs,
                                 scheduler=scheduler, **kwargs)
    if specs.family == "transformer":
        return _sweep(specs, memory_headroom=memory_headroom, **kwargs)
    sw = _sweep(specs, **kwargs)
    device_bytes = specs.system.device.usable_memory_bytes
    points = [dataclasses.replace(p, prediction=within(p.prediction, device_bytes,
                                                       memory_headroom)) for p in sw.points]
    return dataclasses.replace(sw, points=points)


def sweep_transformer(model: str, hardware: str, **kwargs) -> Sweep:
    """`sweep` for a transformer (the former name)."""
    return sweep(_former(model, hardware, kwargs), **kwargs)
