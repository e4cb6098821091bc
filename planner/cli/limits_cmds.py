"""`planner limits` and `derive`: the limits the cost expressions imply, and the formulas behind
them."""

from __future__ import annotations

import click

from planner.cli.options import limit_options, require, spec_options, transformer_options
from planner.cli.output import emit
from planner.errors import SpecError
from planner.report import render


@click.command()
@spec_options(loads=True)
@limit_options
@transformer_options
def limits(specs, model, hardware, precision, optimizer, servers, overlap, fmt, **kw):
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

    require(model, hardware)
    if specs.is_cluster:
        _cluster_limits(specs, optimizer, overlap, fmt, kw)
        return
    transformer = specs.family == "transformer"
    if transformer:
        kw.pop("seq_len")  # applied to the model's spec (`specs`)
    lim = api.limits(specs, optimizer=optimizer, servers=servers, overlap=overlap, **kw)
    summary = lim.summary()
    if not transformer:
        summary["solve"] = _solve_on_this_case(
            specs, summary, optimizer=optimizer or "momentum", servers=servers,
            overlap=overlap, global_batch=kw["global_batch"])
    doc = render.document("limits", {"model": model, "hardware": hardware, **summary})
    emit(doc, fmt, lambda: (transformer_limits_text(summary) if transformer
                            else limits_text(summary)))


def _cluster_limits(specs, optimizer, overlap, fmt, kw) -> None:
    """`limits` over a cluster of several pools: what limits the best plan over the mix (the
    bottleneck pool, the bandwidth between pools it needs to beat the best pool alone, the
    balanced batch shares of replicas) and the best plan of each pool beside it; `solve -H
    CLUSTER` searches the same (`planner.analysis.pools`)."""
    from planner import api
    from planner.cli.options import TRANSFORMER_KEYS
    from planner.report.cluster import cluster_doc, limits_doc, limits_text

    for key in ("at_nodes", "critical_batch", "nodes_max"):
        if kw.get(key) is not None:
            raise SpecError(f"{key}: --{key.replace('_', '-')} is a limit of one system; over a "
                            f"cluster of several pools limits reports the best mix's")
    hybrid = {k: kw[k] for k in TRANSFORMER_KEYS if kw.get(k) is not None}
    hybrid.pop("seq_len", None)  # applied to the model's spec (`specs`)
    sol = api._solve_cluster(specs, optimizer=optimizer, global_batch=kw["global_batch"],
                             overlap=overlap, **hybrid)
    body = limits_doc(cluster_doc(sol, specs.target))
    doc = render.document("limits", {"model": specs.model_ref, "hardware": specs.hardware_ref,
                                     "precision": {"name": specs.precision.value}, **body})
    emit(doc, fmt, lambda: limits_text(doc))


def _solve_on_this_case(specs, summary: dict, **case) -> dict:
    """What `planner solve` returns on the case `limits` holds at (a CNN), and why the two
    differ: `limits` treats the node count as continuous on one collective, with the smallest
    efficient local batch as a separate limit; `solve` takes whole nodes whose devices split
    the global batch evenly, chooses the collective unless pinned, and bounds the local batch
    only when asked (--local-batch-min). Each solve: nodes, devices, local batch, collective
    and iteration time (None where no plan fits)."""
    import math

    from planner import api
    from planner.errors import PlannerError

    def plan(**extra) -> dict | None:
        try:
            sol = api.solve(specs, **case, **extra)
        except PlannerError:
            return None
        p = sol.plan
        return {"nodes": p.nodes, "devices": p.devices, "local_batch": p.local_batch,
                "collective": p.collective.value, "iteration_time_s":
                sol.prediction.iteration_time_s}

    b_min = max(1, math.ceil(summary["local_batch_min"] - 1e-9))
    same = plan(collective=summary["collective"])
    return {"same_collective": same, "any_collective": plan(),
            "local_batch_min": b_min, "with_local_batch_min": plan(
                collective=summary["collective"], local_batch_min=b_min)}


@click.command()
@spec_options(formats=["text", "latex", "python", "json"], loads=True)
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
def derive(specs, model, hardware, precision, optimizer, servers, overlap, fmt, names,
           substitute, **kw):
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

    require(model, hardware)
    if specs.family == "transformer":
        kw.pop("seq_len")  # applied to the model's spec (`specs`)
    got = api.derivation(specs, optimizer=optimizer, servers=servers, overlap=overlap,
                         names=names, substitute=substitute, **kw)
    if fmt == "json":
        doc = render.document("derive", {"model": model, "hardware": hardware,
                                         "plan": got.plan, "left_out": got.left_out,
                                         "formulas": [der.as_json(f) for f in got.formulas]})
        click.echo(render.to_json(doc))
    else:
        click.echo(derive_text(got, fmt))
