"""`planner sweep`: predictions over node counts, global batches and network bandwidths, for
every model family (`planner.api.sweep`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner import switches
from planner.errors import InfeasibleError, SpecError
from planner.inputs import (
    CNN_ONLY,
    TRANSFORMER_ONLY,
    Specs,
    build,
    check_type,
    enum_value,
    only_for,
    request,
    samples_of_tokens,
    training_of,
)
from planner.plan import Plan, check_softsync
from planner.prediction import Prediction, predict
from planner.search.solution import Solution
from planner.vocabulary import Collective

# --- sweep --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    plan: Plan
    prediction: Prediction
    bandwidth_GBps: float  # per NIC, as swept (or the spec's)
    training: dict | None = None  # steps and time_to_train_s with a critical batch
    solution: Solution | None = None  # transformers: the search's answer at this point

    @property
    def config(self) -> Plan:
        return self.plan

    @property
    def nodes(self) -> int:
        return self.plan.nodes


@dataclass(frozen=True)
class Skipped:
    """A swept point with no plan, and why."""

    nodes: int
    global_batch: int
    bandwidth_GBps: float
    reason: str


@dataclass(frozen=True)
class Sweep:
    points: list[SweepPoint]
    skipped: list[Skipped]
    nodes: tuple[int, ...]  # the node counts swept

    @property
    def skipped_nodes(self) -> list[int]:
        """Node counts with no plan at any batch or bandwidth."""
        have = {p.nodes for p in self.points}
        return [n for n in self.nodes if n not in have]

    def __iter__(self):
        """`points, skipped_nodes = sweep(...)`, as the CNN sweep returned before."""
        return iter((self.points, self.skipped_nodes))


def with_inter_node_bandwidth(system, gbps: float):
    """The system with another per-NIC network bandwidth (a `sweep --bandwidth` point)."""
    if not (0 < gbps <= 1e6):
        raise SpecError(f"bandwidth: must be in (0, 1e6] GB/s, got {gbps}")
    link = system.inter_node.model_copy(update={"bandwidth_GBps": gbps})
    return dataclasses.replace(system, inter_node=link)


# the most points one sweep prices: each list is capped alone (`planner.cli.params`), their
# product here, so a grid of two long ranges is refused at once instead of running for hours
MAX_POINTS = 100_000


def check_grid(nodes, batches, bandwidths) -> None:
    """One line (exit 2) for a grid of more than `MAX_POINTS` combinations."""
    n = len(nodes) * len(batches) * len(bandwidths or [None])
    if n > MAX_POINTS:
        raise SpecError(f"nodes: the sweep has {n:,} points ({len(nodes):,} node counts x "
                        f"{len(batches):,} batches x {len(bandwidths or [None]):,} "
                        f"bandwidths); at most {MAX_POINTS:,}: narrow a range or give a step")


def sweep(specs: Specs, *, nodes: list[int],
          global_batch: int | list[int] | None = None, local_batch: int | None = None,
          bandwidths_GBps: list[float] | None = None, overlap: bool = True,
          critical_batch: float | None = None,
          target_steps: float | None = None, target_samples: float | None = None,
          target_tokens: float | None = None, price_per_device_hour: float | None = None,
          collective: str | None = None, optimizer: str | None = None,
          servers: int | None = None, time_limit_s: float = 10.0,
          on_point=None, **pins) -> Sweep:
    """Every (bandwidth, nodes, global batch) combination of the request's loaded `specs`
    (`planner.inputs.Specs`: model, system, precision, sequence length), all devices of the
    nodes used: a CNN point is the data-parallel plan there (`local_batch` for weak
    scaling); a transformer point is the best tp x pp x dp plan there (`pins` are fields of
    `planner.search.hybrid.Search`: tp, pp, recompute, ...). A point with no plan is in
    `skipped` with the reason. With `critical_batch` and a target each point carries its
    steps, time and cost to train (the price defaults to the device spec's). `on_point` is
    called once per combination tried."""
    train = dict(critical_batch=critical_batch, target_steps=target_steps,
                 price_per_device_hour=price_per_device_hour, deadline_s=None, budget_usd=None)
    batches = global_batch if isinstance(global_batch, list) else [global_batch]
    check_grid(nodes, batches, bandwidths_GBps)
    for key, values in (("nodes", nodes), ("global_batch", [b for b in batches if b is not None])):
        for value in values if isinstance(values, list | tuple) else [values]:
            check_type(key, value, int)
    specs.refuse_recommendation()
    if specs.family == "transformer":
        only_for("transformer", {"local_batch": local_batch, "collective": collective,
                                 "optimizer": optimizer, "servers": servers, **pins}, CNN_ONLY)
        if global_batch is None:
            raise SpecError("global_batch: give --global-batch for a transformer sweep")
        m, base, prec = specs.transformer()
        training = training_of(base.device.price_per_hour_usd,
                               target_samples=samples_of_tokens(m, target_samples,
                                                                target_tokens), **train)
        systems = [(bw, with_inter_node_bandwidth(base, bw)) for bw in bandwidths_GBps or []] \
            or [(base.inter_node.bandwidth_GBps, base)]
        g = base.devices_per_node

        def point(system, bw, n_val, batch):
            from planner.search.hybrid import Search
            from planner.search.support import supported_solve

            q = request(Search, {"global_batch": batch, "nodes": n_val, "overlap": overlap,
                                 "time_limit_s": time_limit_s, "optimizer": optimizer or "adam",
                                 **pins}, training=training,
                        searched=switches.left_to_search(pins))
            sol = supported_solve(m, system, prec, q)[1]  # solve's pick at this point
            return SweepPoint(sol.plan, sol.prediction, bw, sol.training, sol)
    else:
        only_for("cnn", {"target_tokens": target_tokens, "seq_len": specs.seq_len, **pins},
                 (*TRANSFORMER_ONLY, *switches.SEARCH_BOUNDS))
        if (global_batch is None) == (local_batch is None):
            raise SpecError("sweep: give exactly one of --global-batch (strong scaling) or "
                            "--local-batch (weak scaling)")
        softsync = pins.get("softsync")
        prec = specs.given_precision
        cnn = build(specs.model_ref, specs.hardware_ref, prec.value if prec else None,
                    optimizer or "momentum", servers=servers or 1, softsync=softsync,
                    specs=specs)
        training = training_of(cnn.system.device.price_per_hour_usd,
                               target_samples=target_samples, **train)
        col = enum_value(Collective, collective or ("parameter-server" if softsync else "ring"),
                         "collective")
        check_softsync(softsync, col)
        from planner.expr.cnn import DataParallelModel

        systems = [(bw, DataParallelModel(cnn.cnn, with_inter_node_bandwidth(cnn.system, bw),
                                          cnn.options)) for bw in bandwidths_GBps or []] \
            or [(cnn.system.inter_node.bandwidth_GBps, cnn)]
        g = cnn.system.devices_per_node

        def point(dpm, bw, n_val, batch):
            if batch % (n_val * g):
                raise InfeasibleError(f"global batch {batch} does not split into whole local "
                                      f"batches over {n_val * g} devices")
            if softsync and softsync > n_val * g:
                raise InfeasibleError(f"{softsync}-softsync needs at least {softsync} learners")
            plan = Plan.data_parallel(n_val, g, batch, col, overlap, softsync,
                                      dpm.options.optimizer.value)
            pred = predict(dpm, plan)
            return SweepPoint(plan, pred, bw, None if training is None else
                              training.report(batch, plan.devices, pred.iteration_time_s))

    points, skipped = [], []
    for bw, system in systems:
        for n_val in nodes:
            for given in batches:
                if on_point is not None:
                    on_point()
                batch = given if given is not None else local_batch * n_val * g
                try:
                    points.append(point(system, bw, n_val, batch))
                except InfeasibleError as exc:
                    skipped.append(Skipped(n_val, batch, bw,
                                           str(exc).removeprefix("infeasible: ")))
    return Sweep(points, skipped, tuple(nodes))


# --- in parallel --------------------------------------------------------------------------------


def sweep_in_parallel(specs: Specs, *, nodes: list[int],
                      global_batch: int | list[int] | None = None,
                      bandwidths_GBps: list[float] | None = None, jobs: int = 1,
                      scheduler=None, on_point=None, stall_timeout_s: float | None = None,
                      connect_timeout_s: float | None = None, on_progress=None,
                      **kwargs) -> Sweep:
    """`planner.api.sweep` with each (bandwidth, nodes, global batch) combination one task of
    `planner.parallel.parallel_map` (local processes with `jobs`; a Dask cluster with
    `scheduler`, an address 'tcp://HOST:PORT' or a `distributed.Client`): the points and
    skipped ones come back in the serial sweep's order, each the same as there (a point
    depends on its combination alone). `on_point` is called as each combination finishes,
    `on_progress` with a `planner.parallel.Progress`. A lost cluster, or no workers for
    `stall_timeout_s`, is a `planner.parallel.ClusterError` (exit code 4); the workers keep
    their compiled programs between points. Each task carries the loaded `specs`, so a
    worker reads no file: a model or system given as a local YAML path plans on a cluster
    whose workers cannot see it."""
    from planner.parallel import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_STALL_TIMEOUT_S, parallel_map

    batches = global_batch if isinstance(global_batch, list) else [global_batch]
    check_grid(nodes, batches, bandwidths_GBps)
    tasks = [dict(specs=specs, nodes=[n_val], global_batch=batch,
                  bandwidths_GBps=None if bw is None else [bw], **kwargs)
             for bw in bandwidths_GBps or [None] for n_val in nodes for batch in batches]
    parts = parallel_map(_sweep_task, tasks, jobs=jobs, scheduler=scheduler, on_done=on_point,
                         stall_timeout_s=stall_timeout_s or DEFAULT_STALL_TIMEOUT_S,
                         connect_timeout_s=connect_timeout_s or DEFAULT_CONNECT_TIMEOUT_S,
                         on_progress=on_progress)
    return Sweep([p for part in parts for p in part.points],
                 [s for part in parts for s in part.skipped], tuple(nodes))


def _sweep_task(kwargs: dict) -> Sweep:
    """One combination of a parallel sweep (a module-level function: it pickles)."""
    from planner import api

    return api.sweep(kwargs.pop("specs"), **kwargs)
