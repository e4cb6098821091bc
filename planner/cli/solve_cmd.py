"""`planner solve`: the optimal plan, with what it costs to train and where scaling stops."""

from __future__ import annotations

import math

import click

from planner.cli.options import (
    SEARCH_BOUNDS,
    TRANSFORMER_KEYS,
    bound_options,
    cnn_options,
    framework_of,
    framework_option,
    headroom_option,
    reject_transformer_flags,
    require,
    spec_options,
    training_options,
    transformer_options,
)
from planner.cli.output import emit, launch_target, precision_used
from planner.cli.params import (
    COLLECTIVES,
    LAUNCH_FORMATS,
    PLAN_FORMATS,
    DecimalInt,
    FiniteFloat,
    batch_range,
    plot_path_checked,
)
from planner.errors import SpecError
from planner.report import render
from planner.report.render import span
from planner.search.objective import Objective


@click.command()
@spec_options(formats=PLAN_FORMATS, loads=True)
@click.option("--nodes", type=DecimalInt(1, 2**20), help="Pin the node count.")
@click.option("--nodes-max", type=DecimalInt(1, 2**20), help="Node budget.")
@click.option("--devices", type=DecimalInt(1, 2**23), help="Pin the device count.")
@click.option("--devices-max", type=DecimalInt(1, 2**23), help="Device budget.")
@click.option("--devices-per-node", type=DecimalInt(1, 1024),
              help="Pin devices used per node (a transformer plan uses all).")
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
              default=None,
              help="throughput (the default): the fastest plan, most samples per second on "
                   "the devices allowed (the knee line says how few devices come close); "
                   "time-to-train / cost: with --critical-batch and a target; token-budget "
                   "(the default with --tokens): time to train on --tokens tokens "
                   "(transformers); efficiency: CNNs. [default: throughput; token-budget "
                   "with --tokens]")
@training_options
@click.option("--price-per-device-hour", type=FiniteFloat(min=0, min_open=True, max=1e6),
              help="USD per device-hour (GPU-hour) pricing --tokens or the time to train "
                   "[default: the device spec's price].")
@click.option("--deadline", "deadline_s", type=FiniteFloat(min=0, min_open=True, max=1e12),
              help="Constraint: time to train at most this many seconds.")
@click.option("--budget", "budget_usd", type=FiniteFloat(min=0, min_open=True, max=1e15),
              help="Constraint: cost to train at most this many USD.")
@click.option("--pareto", is_flag=True,
              help="Also return the (time-to-train, cost) Pareto front of feasible plans.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=plot_path_checked,
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
@click.option("--prefer-supported", type=FiniteFloat(0, 1), default=None,
              help="Transformers: when no calibration run resembles the fastest plan "
                   "(ZeRO-2 / -3, a LoRA pipeline, cp beyond the family's runs), take the "
                   "best ZeRO 1 plan (for LoRA without a pipeline; at the covered cp) if it "
                   "is within this "
                   "fraction of the best plan's objective (time per sample, cost, time to "
                   "train; 0: only one as good). Default: when it is within the best "
                   "plan's error band (the two bands overlap).")
@click.option("--top", type=DecimalInt(0, 100), default=0, show_default=True,
              help="Also return this many runners-up, each a different split, device count or "
                   "batch (not the same plan with another collective or micro-batch).")
@click.option("--time-limit", "time_limit_s", type=FiniteFloat(0.01, 3600), default=10.0,
              show_default=True, help="Wall-clock guard against runaway searches, in seconds "
                                      "(searches stop on a deterministic budget; one this "
                                      "guard stops says so).")
@cnn_options
@transformer_options
@bound_options
@framework_option
@headroom_option
@click.option("--tokens", "token_budget", type=FiniteFloat(1, 1e18),
              help="Token budget (transformers): print the time to train on this many tokens "
                   "in hours or days and its cost at the price per GPU-hour, and rank plans "
                   "by that time (--objective token-budget, the default with --tokens). No "
                   "--critical-batch needed: the budget fixes the tokens.")
def solve(specs, model, hardware, precision, optimizer, servers, overlap, fmt, collective,
          objective,
          global_batch_max, global_batch_range, token_budget, critical_batch, target_steps,
          target_samples, target_tokens, price_per_device_hour, deadline_s, budget_usd, pareto,
          plot_path, strategy, stages, prefer_supported, framework, **problem):
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

    require(model, hardware)
    if objective is None:
        objective = "token-budget" if token_budget is not None else "throughput"
    if (price_per_device_hour is not None and token_budget is None
            and critical_batch is None):
        raise SpecError("price_per_device_hour: --price-per-device-hour prices a training run: "
                        "give --tokens (a token budget) or --critical-batch with a target")
    hybrid = {k: problem.pop(k) for k in TRANSFORMER_KEYS}
    hybrid |= {k: problem.pop(k) for k in SEARCH_BOUNDS}  # bounds of the search, not pins
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
    framework = framework_of(framework, fmt, specs.family)
    if specs.family == "recommendation":
        _solve_recommendation(specs, fmt, problem)
        return
    if specs.is_cluster:
        _solve_cluster(specs, fmt, objective, rng, hybrid, problem, optimizer, training,
                       token_budget, pareto, plot_path, framework, prefer_supported)
        return
    transformer = specs.family == "transformer"
    if transformer:
        hybrid.pop("seq_len")  # applied to the model's spec (`specs`)
        if strategy is not None or stages is not None:
            raise SpecError("strategy: --strategy applies to CNN models (transformers search "
                            "tp x pp x dp with the hybrid flags)")
        if problem.get("global_batch") is None and rng is None:
            raise SpecError("global_batch: give --global-batch or --global-batch-range for "
                            "transformer models")
        family = {"target_tokens": target_tokens, "token_budget": token_budget,
                  "optimizer": optimizer, **hybrid}
    else:
        reject_transformer_flags(hybrid)
        if token_budget is not None or objective == "token-budget":
            raise SpecError("token_budget: --tokens and --objective token-budget apply to "
                            "transformer models only")
        if target_tokens is not None:
            raise SpecError("target_tokens: --target-tokens applies to transformer models "
                            "(CNNs: --target-samples)")
        family = {"optimizer": optimizer, "servers": servers, "collective": collective,
                  "strategy": strategy or "data", "stages": stages}
    if transformer:  # a framework's plan: priced as it runs, only what it writes tried
        family.update(prefer_supported=prefer_supported, framework=framework)
    sol = api.solve(specs, objective=objective, overlap=overlap, pareto=pareto, **training,
                    global_batch_range=rng, **problem, **family)
    used = precision_used(specs)
    price = specs.price(price_per_device_hour)
    budget = getattr(sol, "token_budget", None)  # a transformer's (CNN splits have none)
    tokens = None if budget is None else dict(budget)
    body = solution_doc(sol)
    body = {"model": model, "hardware": hardware, "precision": used,
            **({"framework": framework} if framework else {}), **body,
            **({"token_budget": tokens} if tokens is not None else {}),
            **({"price_per_device_hour": price} if price is not None and (
                tokens is not None or sol.training) else {})}
    doc = render.document("solve", body)
    if plot_path:
        _plan_plot(sol, doc.get("config") or {}, plot_path, model, hardware)
    emit(doc, fmt, lambda: solution_text(sol, used, tokens, price if sol.training else None,
                                         framework),
         launch_target(specs, fmt))
    _search_note(sol, problem.get("time_limit_s"))
    _efficiency_warning(sol)
    if getattr(sol, "support", None) is not None:  # a CNN layer split has none
        click.echo(_support_line(sol), err=True)


PLACE_OPTIONS = ("model", "hardware", "precision", "fmt", "devices", "nodes", "global_batch",
                 "time_limit_s", "memory_headroom", "workers")


def _solve_recommendation(specs, fmt, problem) -> None:
    """`solve` for a recommendation model: the proven-optimal placement of its tables."""
    from click.core import ParameterSource

    from planner import api
    from planner.report.recommendation import placement_doc, placement_text

    ctx = click.get_current_context()
    given = [p for p in ctx.command.params if p.name not in PLACE_OPTIONS
             and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE]
    if given:
        flag = max(given[0].opts, key=len)
        raise SpecError(f"{given[0].name}: {flag} does not apply to a recommendation model "
                        f"(solve places its tables: --devices or --nodes, --global-batch, "
                        f"--precision, --time-limit)")
    if fmt in LAUNCH_FORMATS:
        raise SpecError(f"format: --format {fmt} has no form for a table placement; use json, "
                        f"yaml or table")
    keys = {k: problem[k] for k in ("devices", "nodes", "global_batch", "time_limit_s",
                                    "memory_headroom", "workers")
            if problem.get(k) is not None}
    found = api._place_tables(specs, **keys)
    doc = render.document("solve", placement_doc(found, specs.hardware_ref))
    emit(doc, fmt, lambda: placement_text(doc))
    if found.status != "optimal":
        click.echo(f"planner: note: the time limit stopped the proof; the placement is within "
                   f"{found.priced.embedding_time_s / found.bound_s - 1:.1%} of the best "
                   f"(CP-SAT's bound)", err=True)


def _solve_cluster(specs, fmt, objective, rng, hybrid, problem, optimizer, training,
                   token_budget, pareto, plot_path, framework, prefer_supported) -> None:
    """`solve` over a cluster of several pools: the best plan of every subset of pools."""
    from planner import api
    from planner.report.cluster import cluster_doc, cluster_text

    given = [k for k, v in (("--tokens", token_budget), ("--pareto", pareto or None),
                            ("--plot", plot_path),
                            *((f"--{k.replace('_', '-')}", v) for k, v in training.items()))
             if v is not None]
    if given:
        raise SpecError(f"hardware: {given[0]} is not searched over a cluster of several "
                        f"pools yet (solve ranks its plans by throughput)")
    hybrid.pop("seq_len", None)  # in the specs
    sol = api._solve_cluster(specs, objective=objective, optimizer=optimizer,
                             global_batch_range=rng, framework=framework,
                             prefer_supported=prefer_supported,
                             **problem, **hybrid)
    cluster, used = specs.target, specs.precision.value
    body = {"model": specs.model_ref, "hardware": specs.hardware_ref,
            "precision": {"name": used}, **({"framework": framework} if framework else {}),
            **cluster_doc(sol, cluster)}
    if fmt in LAUNCH_FORMATS:
        from planner.launch import Target
        from planner.launch.pools import cluster_launch

        if sol.best.kind == "one pool":  # a form with no comment (a ds_config) cannot say where
            pool = cluster.pool(sol.best.pools[0])
            plan = sol.best.solution.plan
            click.echo(f"planner: note: the plan runs on pool {pool.name} alone: "
                       f"{plan.nodes} nodes of {pool.system.name} (of {cluster.name})", err=True)
        click.echo(cluster_launch(fmt, sol, cluster, Target(specs.model, used),
                                  specs.model_ref))
        return
    doc = render.document("solve", body)
    emit(doc, fmt, lambda: cluster_text(doc))


def _support_line(sol) -> str:
    """The stderr line of a plan no calibration run covers (`sol.support`): the covered plan
    --prefer-supported took, or the one a user may pin beside the fastest."""
    from planner.search.support import ZERO1, covered_parts

    sup = sol.support
    why, alt = sup["note"], sup["alternative"]
    # the objective's words: the best plan, its measure, "as <good> as"
    best, what, good = {"cost": ("cheapest", "cost", "cheap"),
                        "time-to-train": ("fastest to train", "time to train", "fast")}.get(
        sup["objective"], ("fastest", "time", "fast"))
    # what the covered plan holds, in the note's and the warning's words (a ZeRO 1 plan; for
    # a LoRA pipeline one without; for context parallelism beyond the data one within it)
    zero1 = sup["covered_by"] == ZERO1
    no_pipe, cp_max, ep_max, full_max = covered_parts(sup["covered_by"])
    room = sup["memory_headroom"]  # the headroom the covered plan's search kept, if any
    # (beside a sharded plan the covered one also holds its gradients whole: said where the
    # label is the memory's, which does not imply it as "ZeRO 1" does)
    whole = full_max is not None and sup["fastest_zero"] >= 2
    words = [w for w, on in (("with gradients and weights whole", whole),
                             ("without a pipeline", no_pipe),
                             (f"at cp {cp_max} or less", cp_max is not None),
                             (f"at ep {ep_max} or less", ep_max is not None),
                             (f"filling {full_max or 0:.1%} of the usable memory or less",
                              full_max is not None)) if on]
    holds, holding = (("with its gradients and weights whole", "with gradients and weights whole")
                      if zero1 else (" and ".join(words),) * 2)
    if sup["taken"]:
        change = sol.objective.value / sup["fastest_objective"] - 1
        if abs(change) < 5e-4 and zero1:
            # the twin of the fastest: nothing was given up
            # (--prefer-supported 0 takes it too: nothing to keep)
            return (f"planner: note: took ZeRO {sol.plan.zero}, as {good} as the {best} plan, "
                    f"which has {why.removeprefix('not covered: ')}")
        within = ("within its error band" if sup["rule"] == "band"
                  else f"within --prefer-supported {sup['tolerance']:g}")
        # (the covered plan holds its gradients whole too: the stage is named last)
        kept = f"ZeRO {sol.plan.zero}" if zero1 else ", ".join(
            x for x, on in (("pp 1", no_pipe), (f"cp {sol.plan.cp}", cp_max is not None),
                            (f"ep {sol.plan.ep}", ep_max is not None),
                            (f"ZeRO {sol.plan.zero}", True)) if on)
        own = sol.prediction.time_band or {}
        still = ("" if "low_s" in own or not own.get("note") else
                 f"; the plan taken is itself {own['note'].split(';')[0]}")
        return (f"planner: note: took the {best} plan {holds} ({kept}, {change:+.1%} {what}, "
                f"{within}) over the {best}, which has {why.removeprefix('not covered: ')} "
                f"(--prefer-supported 0 keeps it){still}")
    line = f"planner: warning: the chosen plan is {why}"
    if alt is not None:
        c, t, b = alt["config"], alt["iteration_time_s"], alt["time_band"] or {}
        likely = f", likely {span(b['low_s'])} to {span(b['high_s'])}" if "low_s" in b else ""
        change = alt["objective_value"] / sup["fastest_objective"] - 1
        pin = " ".join(x for x, on in ((f"--cp {c['cp']}", cp_max is not None),
                                        (f"--ep {c.get('ep', 1)}", ep_max is not None),
                                        ("--pp 1", no_pipe), (f"--zero {c['zero']}", True),
                                        (f"--memory-headroom {_headroom_up(room or 0)}",
                                         room is not None)) if on)
        # (ep folds over tp x cp x dp: not a factor of the devices)
        experts = f", ep {c.get('ep', 1)}" if ep_max is not None else ""
        line += (f"; {holding}, the {best} plan is tp {c['tp']} x cp {c['cp']} x pp {c['pp']} x "
                 f"dp {c['dp']}{experts}, ZeRO {c['zero']}: {span(t)}{likely}, "
                 f"{change:+.1%} {what} ({pin} "
                 f"pins it; --prefer-supported F takes it when within F of the {best})")
    return line


def _headroom_up(room: float) -> str:
    """A headroom written for the command line, rounded up (never a looser bound than the
    one searched)."""
    return f"{math.ceil(room * 1000 - 1e-9) / 1000:.3f}"


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
              front=getattr(sol, "pareto", None) or None, chosen=sol.training or None)
