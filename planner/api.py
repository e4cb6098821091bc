"""The Python API: the same operations as the CLI, with typed results.

    import planner.api as planner
    sol = planner.solve("alexnet", "k80-fdr", global_batch=256)
    print(sol.config.nodes, sol.prediction.iteration_time_s)

Specs are given by built-in name or YAML path, exactly as on the command line.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from planner.catalog import load_model, load_system
from planner.cost.collectives import Collective
from planner.cost.data_parallel import DEFAULT_BUCKET_BYTES, DataParallelModel, Options
from planner.cost.memory import Optimizer
from planner.errors import SpecError
from planner.prediction import Config, Prediction, predict
from planner.search.data_parallel import DataParallelSolver, Objective, Problem
from planner.search.strategy import SplitSearch, Strategy
from planner.search.training import Training
from planner.spec.cnn import CNN
from planner.spec.hardware import Precision


def _enum(cls, value, key: str):
    if value is None or isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise SpecError(f"{key}: unknown value {value!r} (allowed: {allowed})") from None


@functools.cache
def build(model: str, hardware: str, precision: str | None = None, optimizer: str = "momentum",
          bucket_bytes: float = DEFAULT_BUCKET_BYTES, servers: int = 1) -> DataParallelModel:
    """The symbolic model for a (model, hardware, options) triple; cached per process."""
    cnn = load_model(model)
    if not isinstance(cnn, CNN):
        raise SpecError(f"model: '{model}' is a transformer; this command covers CNNs (use "
                        "evaluate or solve with --tp/--pp/--dp for transformers)")
    system = load_system(hardware)
    prec = _enum(Precision, precision, "precision") or system.device.default_precision
    system.device.peak_flops(prec)  # fail early, with the device's offer, if unsupported
    if servers < 1:
        raise SpecError(f"servers: must be a positive integer, got {servers}")
    opts = Options(prec, _enum(Optimizer, optimizer, "optimizer"), bucket_bytes, servers)
    return DataParallelModel(cnn, system, opts)


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


@dataclass(frozen=True)
class Evaluation:
    config: Config
    prediction: Prediction


def evaluate(model: str, hardware: str, *, nodes: int | None = None, devices: int | None = None,
             devices_per_node: int | None = None, global_batch: int | None = None,
             local_batch: int | None = None, collective: str = "ring", overlap: bool = True,
             precision: str | None = None, optimizer: str = "momentum",
             servers: int = 1) -> Evaluation:
    dp = build(model, hardware, precision, optimizer, servers=servers)
    n, g = placement(dp, nodes, devices, devices_per_node)
    if global_batch is None:
        if local_batch is None:
            raise SpecError("global_batch: give --global-batch or --local-batch")
        global_batch = local_batch * n * g
    elif local_batch is not None and local_batch * n * g != global_batch:
        raise SpecError(f"local_batch: {local_batch} x {n * g} devices != global_batch "
                        f"{global_batch}")
    cfg = Config(n, g, global_batch, _enum(Collective, collective, "collective"), overlap)
    return Evaluation(cfg, predict(dp, cfg))


def training_of(device_price: float | None, critical_batch: float | None,
                target_steps: float | None, target_samples: float | None,
                price_per_device_hour: float | None, deadline_s: float | None,
                budget_usd: float | None) -> Training | None:
    """The statistical-efficiency inputs as a checked `Training` (None without a critical
    batch); the price defaults to the device spec's."""
    if critical_batch is None:
        if any(x is not None for x in (target_steps, target_samples, deadline_s, budget_usd)):
            raise SpecError("critical_batch: --target-steps / --target-samples / "
                            "--target-tokens / --deadline / --budget need --critical-batch")
        return None
    training = Training(critical_batch, target_steps, target_samples,
                        price_per_device_hour or device_price, deadline_s, budget_usd)
    training.check(wants_price=False)  # the solvers add what their objective needs
    return training


def solve(model: str, hardware: str, *, precision: str | None = None,
          optimizer: str = "momentum", servers: int = 1, collective: str | None = None,
          objective: str = "throughput", critical_batch: float | None = None,
          target_steps: float | None = None, target_samples: float | None = None,
          price_per_device_hour: float | None = None, deadline_s: float | None = None,
          budget_usd: float | None = None, strategy: str = "data",
          stages: int | None = None, **problem):
    """Keys of `problem` are the fields of `planner.search.data_parallel.Problem`.
    `strategy` is data (a `Solution`), hybrid (per-layer data/model modes), pipeline (stages)
    or auto (the best of the three); `stages` pins the pipeline depth. Hybrid and pipeline
    give a
    `planner.search.strategy.SplitSolution`. With
    `critical_batch` (B_noise) and one of `target_steps` (S_min) / `target_samples` (E_min),
    the solution carries steps and time to train (McCandlish et al. 2018); the price per
    device-hour defaults to the device spec's."""
    dp = build(model, hardware, precision, optimizer, servers=servers)
    cols = (_enum(Collective, collective, "collective"),) if collective else tuple(Collective)
    training = training_of(dp.system.device.price_per_hour_usd, critical_batch, target_steps,
                           target_samples, price_per_device_hour, deadline_s, budget_usd)
    try:
        prob = Problem(collectives=cols, objective=_enum(Objective, objective, "objective"),
                       training=training, **problem)
    except TypeError as exc:
        raise SpecError(f"solve: {exc}") from None
    strat = _enum(Strategy, strategy, "strategy")
    if strat is Strategy.data and stages is None:
        return DataParallelSolver(dp, prob).solve()
    return SplitSearch(dp, prob, stages).solve(strat)


def limits(model: str, hardware: str, *, global_batch: int, collective: str = "ring",
           overlap: bool = True, precision: str | None = None, optimizer: str = "momentum",
           servers: int = 1, local_efficiency: float | None = None,
           target_efficiency: float | None = None, at_nodes: float | None = None,
           critical_batch: float | None = None, nodes_max: int | None = None):
    """The derived limits of strong scaling (a `planner.scaling.Limits`; `.summary()` for a dict)."""
    from planner import scaling as lim

    dp = build(model, hardware, precision, optimizer, servers=servers)
    return lim.Limits(
        dp, _enum(Collective, collective, "collective"), overlap, global_batch,
        local_efficiency=local_efficiency or lim.DEFAULT_LOCAL_EFFICIENCY,
        target_efficiency=target_efficiency or lim.DEFAULT_TARGET_EFFICIENCY,
        at_nodes=at_nodes, critical_batch=critical_batch,
        nodes_max=lim.DEFAULT_NODES_MAX if nodes_max is None else nodes_max,
    )


def derive(model: str, hardware: str, **kwargs):
    """The formulas behind `limits` (a list of `planner.formulas.Derived`)."""
    from planner import formulas as der

    return der.derive(limits(model, hardware, **kwargs))


@dataclass(frozen=True)
class SweepPoint:
    config: Config
    prediction: Prediction
    bandwidth_GBps: float  # per NIC, as swept (or the spec's)
    training: dict | None = None  # steps and time_to_train_s with a critical batch


def with_inter_node_bandwidth(system, gbps: float):
    """The system with another per-NIC network bandwidth (a `sweep --bandwidth` point)."""
    import dataclasses

    if not (0 < gbps <= 1e6):
        raise SpecError(f"bandwidth: must be in (0, 1e6] GB/s, got {gbps}")
    link = system.inter_node.model_copy(update={"bandwidth_GBps": gbps})
    return dataclasses.replace(system, inter_node=link)


def sweep(model: str, hardware: str, *, nodes: list[int],
          global_batch: int | list[int] | None = None, local_batch: int | None = None,
          bandwidths_GBps: list[float] | None = None, collective: str = "ring",
          overlap: bool = True, precision: str | None = None, optimizer: str = "momentum",
          servers: int = 1, critical_batch: float | None = None,
          target_steps: float | None = None,
          target_samples: float | None = None, price_per_device_hour: float | None = None,
          on_point=None) -> tuple[list[SweepPoint], list[int]]:
    """Evaluate every (bandwidth, nodes, global batch) combination (full nodes). Returns
    (points, skipped node counts whose devices divide none of the global batches). With
    `critical_batch` and a target each point carries its steps, time and cost to train (the
    price defaults to the device spec's). `on_point`
    is called once per combination tried (a progress bar's tick)."""
    if (global_batch is None) == (local_batch is None):
        raise SpecError("sweep: give exactly one of --global-batch (strong scaling) or "
                        "--local-batch (weak scaling)")
    base = build(model, hardware, precision, optimizer, servers=servers)
    training = training_of(base.system.device.price_per_hour_usd, critical_batch, target_steps,
                           target_samples, price_per_device_hour, None, None)
    g = base.system.devices_per_node
    col = _enum(Collective, collective, "collective")
    batches = global_batch if isinstance(global_batch, list) else [global_batch]
    points, skipped = [], []
    for bw in bandwidths_GBps or [base.system.inter_node.bandwidth_GBps]:
        dp = base if bandwidths_GBps is None else DataParallelModel(
            base.cnn, with_inter_node_bandwidth(base.system, bw), base.options)
        for n_val in nodes:
            fitted = False
            for gb in batches:
                if on_point is not None:
                    on_point()
                batch = gb if gb is not None else local_batch * n_val * g
                if batch % (n_val * g):
                    continue
                fitted = True
                cfg = Config(n_val, g, batch, col, overlap)
                pred = predict(dp, cfg)
                train = (None if training is None else
                         training.report(batch, cfg.devices, pred.iteration_time_s))
                points.append(SweepPoint(cfg, pred, bw, train))
            if not fitted and n_val not in skipped:
                skipped.append(n_val)
    return points, skipped


# --- transformers: hybrid tensor x pipeline x data parallel --------------------------------


def is_transformer(model: str) -> bool:
    from planner.spec.transformer import Transformer

    return isinstance(load_model(model), Transformer)


def _transformer_setup(model: str, hardware: str, precision: str | None,
                       seq_len: int | None = None):
    from planner.spec.transformer import Transformer, with_seq_len

    m = load_model(model)
    if not isinstance(m, Transformer):
        raise SpecError(f"model: '{model}' is not a transformer")
    m = with_seq_len(m, seq_len)
    system = load_system(hardware)
    prec = _enum(Precision, precision, "precision") or system.device.default_precision
    system.device.peak_flops(prec)
    return m, system, prec


def _samples_of_tokens(m, target_samples: float | None,
                       target_tokens: float | None) -> float | None:
    """E_min in sequences from --target-tokens (tokens / sequence length), or as given."""
    if target_tokens is None:
        return target_samples
    if target_samples is not None:
        raise SpecError("target_tokens: give --target-tokens or --target-samples, not both")
    return target_tokens / m.seq_len


@dataclass(frozen=True)
class HybridEvaluation:
    plan: object  # planner.search.hybrid.Plan
    prediction: dict
    devices_per_node: int


def evaluate_transformer(model: str, hardware: str, *, global_batch: int,
                         devices: int | None = None, nodes: int | None = None, tp: int = 1,
                         pp: int = 1, dp: int | None = None, micro_batch: int = 1,
                         interleave: int = 1, recompute: str = "none",
                         sequence_parallel: bool = False, zero: int = 0,
                         schedule: str = "1f1b", overlap: bool = True,
                         flash_attention: bool = True, precision: str | None = None,
                         seq_len: int | None = None) -> HybridEvaluation:
    """Predict one hybrid configuration; devices = tp x pp x dp (give any two of devices, dp)."""
    from planner.search.hybrid import Plan, predict

    m, system, prec = _transformer_setup(model, hardware, precision, seq_len)
    g = system.devices_per_node
    if nodes is not None:
        if devices is not None and devices != nodes * g:
            raise SpecError(f"devices: {devices} != nodes {nodes} x {g} devices per node")
        devices = nodes * g
    if dp is None:
        if devices is None:
            raise SpecError("devices: give --devices, --nodes or --dp")
        if devices % (tp * pp):
            raise SpecError(f"devices: {devices} is not divisible by tp {tp} x pp {pp}")
        dp = devices // (tp * pp)
    elif devices is not None and devices != tp * pp * dp:
        raise SpecError(f"devices: {devices} != tp {tp} x pp {pp} x dp {dp}")
    plan = Plan(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, global_batch=global_batch,
                interleave=interleave, recompute=recompute,
                sequence_parallel=sequence_parallel and tp > 1, zero=zero, schedule=schedule,
                overlap=overlap, flash_attention=flash_attention)
    return HybridEvaluation(plan, predict(m, system, prec, plan), g)


def solve_transformer(model: str, hardware: str, *, precision: str | None = None,
                      time_limit_s: float = 10.0, seq_len: int | None = None,
                      critical_batch: float | None = None, target_steps: float | None = None,
                      target_samples: float | None = None, target_tokens: float | None = None,
                      price_per_device_hour: float | None = None, deadline_s: float | None = None,
                      budget_usd: float | None = None, **search):
    """The proven-optimal hybrid plan (a `planner.search.hybrid.HybridSolution`). Keys of `search`
    are the fields of `planner.search.hybrid.Search`; any subset of the choices may be pinned.
    Time to train and cost take the same inputs as `solve`, and `target_tokens` (E_min in
    tokens: E_min in sequences = tokens / sequence length) in place of `target_samples`."""
    from planner.search.hybrid import HybridSolver, Search

    m, system, prec = _transformer_setup(model, hardware, precision, seq_len)
    target_samples = _samples_of_tokens(m, target_samples, target_tokens)
    training = training_of(system.device.price_per_hour_usd, critical_batch, target_steps,
                           target_samples, price_per_device_hour, deadline_s, budget_usd)
    try:
        q = Search(time_limit_s=time_limit_s, training=training, **search)
    except TypeError as exc:
        raise SpecError(f"solve: {exc}") from None
    return HybridSolver(m, system, prec, q).solve()


@dataclass(frozen=True)
class TransformerSweepPoint:
    nodes: int
    global_batch: int
    bandwidth_GBps: float
    solution: object | None  # planner.search.hybrid.HybridSolution; None when infeasible
    reason: str | None = None  # why no plan exists at this point


def sweep_transformer(model: str, hardware: str, *, nodes: list[int],
                      global_batch: int | list[int], bandwidths_GBps: list[float] | None = None,
                      precision: str | None = None, seq_len: int | None = None,
                      critical_batch: float | None = None, target_steps: float | None = None,
                      target_samples: float | None = None, target_tokens: float | None = None,
                      price_per_device_hour: float | None = None,
                      time_limit_s: float = 10.0, on_point=None,
                      **pins) -> list[TransformerSweepPoint]:
    """The best hybrid plan on every (bandwidth, nodes, global batch) combination, all devices
    of the nodes used (`pins` are fields of `planner.search.hybrid.Search`: tp, pp, recompute,
    ...). A point with no plan (memory, or no split of the devices divides the batch) carries
    the reason instead."""
    from planner.errors import InfeasibleError
    from planner.search.hybrid import HybridSolver, Search

    m, base, prec = _transformer_setup(model, hardware, precision, seq_len)
    target_samples = _samples_of_tokens(m, target_samples, target_tokens)
    training = training_of(base.device.price_per_hour_usd, critical_batch, target_steps,
                           target_samples, price_per_device_hour, None, None)
    g = base.devices_per_node
    out = []
    for bw in bandwidths_GBps or [base.inter_node.bandwidth_GBps]:
        system = base if bandwidths_GBps is None else with_inter_node_bandwidth(base, bw)
        for n_val in nodes:
            for batch in global_batch if isinstance(global_batch, list) else [global_batch]:
                if on_point is not None:
                    on_point()
                q = Search(global_batch=batch, devices=n_val * g, training=training,
                           time_limit_s=time_limit_s, **pins)
                try:
                    sol = HybridSolver(m, system, prec, q).solve()
                except InfeasibleError as exc:
                    out.append(TransformerSweepPoint(n_val, batch, bw, None,
                                                     str(exc).removeprefix("infeasible: ")))
                    continue
                out.append(TransformerSweepPoint(n_val, batch, bw, sol))
    return out
