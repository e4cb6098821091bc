"""`planner sweep`: predictions over node counts, global batches and bandwidths."""

from __future__ import annotations

import click

from planner.cli.batch_cmd import Reporter, check_scheduler, cluster_options
from planner.cli.options import (
    bound_options,
    cnn_options,
    headroom_option,
    parallel_check,
    parallel_options,
    reject_transformer_flags,
    require,
    spec_options,
    training_options,
    transformer_options,
)
from planner.cli.output import emit, progress
from planner.cli.params import (
    COLLECTIVES,
    DecimalInt,
    FiniteFloat,
    float_list,
    int_list,
    plot_path_checked,
)
from planner.errors import InfeasibleError, SpecError
from planner.report import render


@click.command()
@spec_options(loads=True)
@click.option("--nodes", "nodes_spec", default=None,
              help="Node counts: '1,2,4', 'A:B' or 'A:B:x2' [default: 1:N:x2 up to one sample "
                   "per device, at most 4096].")
@click.option("--global-batch", "batch_spec", default=None,
              help="Strong scaling: one global batch or a list ('256,512', 'A:B:x2').")
@click.option("--local-batch", type=DecimalInt(1, 2**30), help="Weak scaling.")
@click.option("--bandwidth", "bandwidth_spec", default=None,
              help="Network bandwidth per NIC in GB/s to sweep ('6.25,12.5,25') [default: the "
                   "spec's].")
@click.option("--collective", type=click.Choice(COLLECTIVES), default=None,
              help="The gradient exchange [default: ring; parameter-server with --softsync].")
@training_options
@click.option("--price-per-device-hour", type=FiniteFloat(min=0, min_open=True, max=1e6),
              help="USD per device-hour for the cost to train [default: the device spec's].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=plot_path_checked,
              help="Write a plot over devices (.png or .svg): transformers MFU and time to "
                   "train (iteration time without a target), CNNs speed-up and time breakdown.")
@cnn_options
@transformer_options
@bound_options
@headroom_option
@parallel_options
@cluster_options
def sweep(specs, model, hardware, precision, optimizer, servers, overlap, fmt, nodes_spec,
          batch_spec, local_batch, bandwidth_spec, collective, critical_batch, target_steps,
          target_samples, target_tokens, price_per_device_hour, plot_path, jobs, scheduler,
          stall_timeout, connect_timeout, progress_every, **hybrid):
    """Predictions over node counts, global batches and network bandwidths (every
    combination; full nodes). For transformers each point is the best tp x pp x dp plan on
    all the devices of those nodes (the hybrid flags pin choices).

    With --jobs or --scheduler the points run in parallel, with the same result. A cluster
    lost mid-run, or with no workers for --stall-timeout, is one line and exit 4.

    \b
    Examples:
      planner sweep -m alexnet -H k80-fdr --global-batch 1024 --no-overlap
      planner sweep -m resnet50 -H dgx-a100-80gb --local-batch 256 --nodes 1:64:x2 --plot s.png
      planner sweep -m gpt3-175b -H dgx-a100-80gb --global-batch 1536 --nodes 8:1024:x2
      planner sweep -m llama3-8b -H dgx-h100 --global-batch 512 --nodes 1:32:x2 --jobs 0
    """
    from planner import api
    from planner.report import sweep_doc, sweep_text

    require(model, hardware)
    parallel_check(jobs, scheduler)
    check_scheduler(scheduler)
    headroom = hybrid.pop("memory_headroom")
    batches = int_list(batch_spec, "global_batch")
    bandwidths = float_list(bandwidth_spec, "bandwidth")
    nodes = int_list(nodes_spec, "nodes")
    if nodes is None:
        top = 4096 if batches is None else max(1, max(batches))
        nodes = int_list(f"1:{min(top, 4096)}:x2", "nodes")
    global_batch = batches[0] if batches and len(batches) == 1 else batches
    total = len(nodes) * len(batches or [None]) * len(bandwidths or [None])
    if plot_path is not None and (len(batches or []) > 1 or len(bandwidths or []) > 1):
        raise SpecError("plot: --plot draws a sweep over nodes; give one global batch and "
                        "one bandwidth")
    specs.refuse_recommendation()
    transformer = specs.family == "transformer"
    if transformer:
        if local_batch is not None:
            raise SpecError("local_batch: transformer sweeps take --global-batch (the solver "
                            "splits it into dp x micro-batch x accumulation)")
        if batches is None:
            raise SpecError("global_batch: give --global-batch for a transformer sweep")
        hybrid.pop("seq_len")  # applied to the model's spec (`specs`)
        family = {"target_tokens": target_tokens, "optimizer": optimizer,
                  **{k: v for k, v in hybrid.items() if v is not None}}
    else:
        reject_transformer_flags(hybrid)
        if target_tokens is not None:
            raise SpecError("target_tokens: --target-tokens applies to transformer models "
                            "(CNNs: --target-samples)")
        family = {"local_batch": local_batch, "collective": collective, "optimizer": optimizer,
                  "servers": servers, "softsync": hybrid.get("softsync")}
    common = dict(nodes=nodes, global_batch=global_batch, bandwidths_GBps=bandwidths,
                  overlap=overlap, critical_batch=critical_batch,
                  target_steps=target_steps, target_samples=target_samples,
                  price_per_device_hour=price_per_device_hour, memory_headroom=headroom,
                  **family)
    if jobs == 1 and scheduler is None:
        with progress(total, "sweep") as bar:
            sw = api.sweep(specs, on_point=bar and (lambda: bar.update(1)), **common)
    else:
        from planner.parallel import ClusterError

        reporter = Reporter("sweep", total, progress_every)
        try:
            sw = api.sweep(specs, jobs=jobs, scheduler=scheduler,
                           stall_timeout_s=stall_timeout, connect_timeout_s=connect_timeout,
                           on_progress=reporter, **common)
        except ClusterError as exc:
            reporter.close()
            _cluster_failed(exc, fmt)  # exits
        finally:
            reporter.close()
    if not sw.points:
        if transformer:
            raise InfeasibleError(f"infeasible: no swept point has a plan "
                                  f"({sw.skipped[0].reason})")
        raise InfeasibleError(f"infeasible: no node count in {nodes_spec or 'the default range'} "
                              f"divides the global batch {batch_spec} into whole local batches")
    if plot_path is not None:
        from planner.plot import sweep_plot

        sweep_plot(sw, plot_path, f"{model} on {hardware}")
    doc = render.document("sweep", {"model": model, "hardware": hardware, **sweep_doc(sw)})
    emit(doc, fmt, lambda: sweep_text(sw))


def _cluster_failed(exc, fmt: str) -> None:
    """A lost cluster: one line, with --format json its error document (kind
    'cluster_lost'), exit 4."""
    import sys

    click.echo(f"planner: {exc}", err=True)
    if fmt == "json":
        click.echo(render.to_json(render.document("sweep", {"error": {
            "kind": "cluster_lost", "message": str(exc), "constraints": [], "file": None,
            "key": None, "value": None}})))
    sys.exit(exc.exit_code)
