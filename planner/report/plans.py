"""What `evaluate`, `solve` and `sweep` show, for every model family: one renderer each for a
plan with its prediction, a solution, and a sweep (JSON documents and text for people)."""

from __future__ import annotations

import sys

from planner import switches
from planner.report.render import count, duration, key_values, si, span, table, usd


def evaluation_doc(plan, pred) -> dict:
    return {"config": plan.to_json(), "prediction": pred.to_json()}


def _split(c: dict) -> str:
    """A plan's split (its JSON config `c`), compact: tp 2 cp 2 ep 8 pp 2 (x16) dp 8; cp, ep
    and etp where they are not the default, the interleaved chunks after pp."""
    tp, v = c["tp"], c.get("interleave") or 1
    return " ".join([f"tp {tp}", *([f"cp {c['cp']}"] if c.get("cp", 1) > 1 else []),
                     *([f"ep {c['ep']}"] if c.get("ep", 1) > 1 else []),
                     *([f"etp {c['etp']}"] if (c.get("etp") or tp) != tp else []),
                     f"pp {c['pp']}" + (f" (x{v})" if v > 1 else ""), f"dp {c['dp']}"])


def plan_text(plan) -> str:
    where = (f"{count(plan.nodes, 'node')} x {count(plan.devices_per_node, 'device')} = "
             f"{count(plan.devices, 'device')}")
    if plan.collective is not None:  # data parallel, the collective chosen
        return (f"{where}, global batch {plan.global_batch} (local {plan.local_batch}), "
                f"{plan.collective.value}, overlap {'on' if plan.overlap else 'off'}")
    stages = ", ".join(f"{which} stage {n} layers" for which, n in (
        ("first", plan.first_stage_layers), ("last", plan.last_stage_layers)) if n)
    experts = (f" (experts: ep {plan.ep} x etp {plan.etp} folded over tp x cp x dp)"
               if plan.ep > 1 or plan.etp != plan.tp else "")
    return (f"{where}: tp {plan.tp}" + (f" x cp {plan.cp}" if plan.cp > 1 else "")
            + f" x pp {plan.pp}"
            + (f" (x{plan.interleave} interleaved)" if plan.interleave > 1 else "")
            + (f" ({stages})" if stages else "")
            + f" x dp {plan.dp}" + experts
            + f"; micro-batch {plan.micro_batch} x {plan.accumulation} "
            f"accumulation, global batch {plan.global_batch}")


def config_text(plan) -> str:
    """One line saying what the plan is (the name the data-parallel text used)."""
    return plan_text(plan)


def precision_pair(precision: dict) -> tuple[str, str]:
    """The training precision and where it came from (flag, device default, or assumed)."""
    return ("precision", f"{precision['name']} ({precision['source']})")


def evaluation_text(plan, pred, precision: dict | None = None,
                    framework: str | None = None) -> str:
    mem = ", ".join(f"{k} {si(v, 'B')}" for k, v in pred.memory_breakdown.items())
    # the parts only some plans have (cp, ep, offload; the host sync of a device that has
    # one) are left out of the text where 0
    times = ", ".join(f"{k} {span(v)}" for k, v in pred.time_breakdown.items()
                      if v or k not in ("cp_comm", "ep_comm", "offload", "host_sync"))
    pairs = [("plan" if plan.collective is None else "config", plan_text(plan))]
    if plan.collective is None:
        recompute = plan.recompute.value + (f" ({plan.recompute_layers} layers of each chunk)"
                                            if plan.recompute_layers else "")
        pairs.append(("options", ", ".join([
            f"recompute {recompute}", f"sequence parallel "
            f"{'on' if plan.sequence_parallel else 'off'}", f"ZeRO {plan.zero}",
            plan.schedule.value, *switches.describe(plan)])))
    if precision is not None:
        pairs.append(precision_pair(precision))
    if framework is not None:  # what it runs without a flag is priced so (`switches.runs`)
        pairs.append(("framework", f"priced as {framework} runs it (--framework)"))
    pairs.append(("iteration time", f"{span(pred.iteration_time_s)} ({times})"))
    if pred.forward_time_s is not None:
        pairs.append(("evaluation step", f"{span(pred.forward_time_s)} (the forward of one "
                                         "global batch, as a validation step runs it)"))
    if pred.asynchrony is not None:
        pairs.append(asynchrony_pair(pred.asynchrony))
    if pred.time_band is not None:
        pairs.append(band_pair(pred.time_band))
    rate = f"{pred.samples_per_s:,.1f} samples/s"
    if pred.tokens_per_s is not None:  # a sample is a sequence: its length is their ratio
        rate = (f"{pred.tokens_per_s:,.0f} tokens/s, {pred.samples_per_s:,.2f} samples/s of "
                f"{round(pred.tokens_per_s / pred.samples_per_s):,} tokens")
    pairs.append(("throughput", rate))
    if pred.communication_time_s is not None:
        pairs.append(("communication", f"{span(pred.communication_time_s)} "
                                       f"({span(pred.exposed_communication_time_s)} exposed)"))
    if pred.mfu is not None:
        pairs.append(("per device", f"{pred.tflops_per_device_model:.1f} TFLOP/s model, "
                                    f"{pred.tflops_per_device_hardware:.1f} hardware; MFU "
                                    f"{pred.mfu:.1%}, HFU {pred.hfu:.1%}"))
    # the capacity is what a plan may use: the memory less the runtime reserve and headroom
    pairs.append(("memory/device", f"{si(pred.memory_bytes_per_device, 'B')} of "
                                   f"{si(pred.memory_capacity_bytes, 'B')} usable ({mem})"
                                   + ("" if pred.fits_memory else "  DOES NOT FIT")))
    if pred.speedup is not None:
        pairs.append(("speed-up", f"{pred.speedup:.2f} x (efficiency {pred.efficiency:.1%})"))
    return key_values(pairs)


def asynchrony_pair(a: dict) -> tuple[str, str]:
    """The asynchronous parameter server's round and staleness (`prediction.asynchrony_doc`)."""
    return ("asynchrony", f"{a['softsync']}-softsync: {a['updates_per_round']} "
                          f"update{'s' if a['updates_per_round'] > 1 else ''} a round "
                          f"of {a['learners']} gradients, staleness about "
                          f"{a['mean_staleness']} (under {a['max_staleness']}), learning rate "
                          f"alpha0 / staleness; the round is the slowest of learner "
                          f"{span(a['learner_s'])}, server links {span(a['server_links_s'])}, "
                          f"server updates {span(a['server_updates_s'])} ({a['bottleneck']}; "
                          f"Zhang, Gupta et al. 2016)")


def spatial_pair(x: list[dict]) -> tuple[str, str]:
    """Where splitting a sample beats one device per sample (`analysis.spatial.crossovers`)."""
    return ("spatial pays above", ", ".join(
        f"side {s['side']:.3g} at {s['devices_per_sample']} devices per sample" for s in x)
        + f" (one device per sample against a split sample, the convolution trunk; the "
          f"volume's side is {x[0]['side_now']})")


def band_pair(band: dict) -> tuple[str, str]:
    """Where the measured time likely lies (`planner.bands`), or that nothing checks it."""
    if "low_s" not in band:
        return ("likely", band["note"])
    side = ("; such runs measured slower than predicted" if band["low_ratio"] > 1 else
            "; such runs measured faster than predicted" if band["high_ratio"] < 1 else "")
    return ("likely", f"{span(band['low_s'])} to {span(band['high_s'])} (measured / predicted "
                      f"{band['low_ratio']:.2f}-{band['high_ratio']:.2f} in 80 % of "
                      f"{band['runs']:,} comparable runs: {band['group']}{side})")


# --- solve ----------------------------------------------------------------------------------


def _is_split(sol) -> bool:
    """Whether `sol` is a CNN layer split's (a module never imported made none: a transformer
    request does not load the CNN search to answer this)."""
    strategy = sys.modules.get("planner.search.strategy")
    return strategy is not None and isinstance(sol, strategy.SplitSolution)


def solution_doc(sol) -> dict:
    """The solve document of every family (a CNN split has its own: `split_doc`)."""
    if _is_split(sol):
        return split_doc(sol)
    search = {"points": sol.points, "rows": sol.rows, "branches": sol.branches, "gap": sol.gap,
              "build_time_s": sol.build_time_s, "solve_time_s": sol.solve_time_s}
    return {
        **({"strategy": "data"} if sol.plan.collective is not None else {}),
        "status": sol.status,
        "objective": sol.objective,
        "config": sol.plan.to_json(),
        "prediction": {**sol.prediction.to_json(), **(sol.training or {})},
        **({"pareto": sol.pareto} if sol.pareto is not None else {}),
        **({"knee": sol.knee} if sol.knee is not None else {}),
        **({"support": sol.support} if getattr(sol, "support", None) is not None else {}),
        "solve_time_s": sol.solve_time_s,
        "build_time_s": sol.build_time_s,
        "search": search,
        "alternatives": [evaluation_doc(p, pr) for p, pr in sol.alternatives],
    }


def knee_pair(knee: dict) -> tuple[str, str]:
    """Where scaling stops: the knee and the last doubling's speed-up, as one text line."""
    last, doubling = knee["last_doubling_speedup"], ""
    if last is not None:
        a, b = knee["last_doubling_from_devices"], knee["best_devices"]
        grew = round(b / a, 2)  # as printed, so "above" never names an equal number
        # the best plan on at most half the devices: a doubling where it has exactly half
        step = "the last doubling" if b == 2 * a else f"{grew:g} x the devices"
        doubling = (f"; {step} ({a} -> {b} devices) speeds up {last:.2f} x"
                    # faster than the devices grew: memory, not compute
                    + (f" (above {grew:g} x: the fewer devices' memory held them to a "
                       "slower plan)" if round(last, 2) > grew else ""))
    return ("knee", f"{knee['devices']} devices reach {span(knee['time_s'])} "
                    f"{knee['measure']}, within {knee['tolerance']:.0%} of the best "
                    f"({span(knee['best_time_s'])} on {knee['best_devices']} devices)"
                    f"{doubling}")


def time_to_train_pair(training: dict, price: dict | None = None) -> tuple[str, str]:
    """The McCandlish time to train of a plan, its cost and (given `price`) the price used."""
    cost = ""
    if "cost_usd" in training:
        cost = f", {usd(training['cost_usd'])}"
        if price is not None:
            cost += f" at {usd(price['usd'])} per GPU-hour ({price['source']})"
    return ("time to train", f"{duration(training['time_to_train_s'])} "
                             f"({training['steps']:,.0f} steps{cost})")


def token_budget_pairs(tb: dict) -> list[tuple[str, str]]:
    """The token budget's time (days or hours, never SI seconds) and cost, the price shown."""
    tokens = f"{tb['tokens']:.4g}".replace("e+", "e")
    pairs = [("token budget", f"{tokens} tokens in {tb['steps']:,} step{'s' * (tb['steps'] != 1)}: "
                              f"{duration(tb['time_to_train_s'])} to train")]
    if tb["cost_usd"] is None:
        pairs.append(("cost", f"{tb['device_hours']:,.0f} GPU-hours; no price (give "
                              "--price-per-device-hour)"))
    else:
        pairs.append(("cost", f"{usd(tb['cost_usd'])} = {tb['device_hours']:,.0f} GPU-hours x "
                              f"{usd(tb['price_per_device_hour_usd'])} per GPU-hour "
                              f"({tb['price_source']})"))
    return pairs


def _training_text(training: dict | None, pareto: list[dict] | None,
                   price: dict | None = None) -> list[str]:
    """Time to train of the chosen plan and the Pareto front, as text blocks."""
    out = [key_values([time_to_train_pair(training, price)])] if training else []
    if pareto:
        rows = [[p["config"]["nodes"], p["config"]["devices"],
                 _split(p["config"]),
                 p["config"]["global_batch"], duration(p["time_to_train_s"]),
                 usd(p["cost_usd"])] for p in pareto]
        head = ["nodes", "devices", "split", "batch", "time to train", "cost"]
        shown = rows if len(rows) <= 12 else rows[:6] + [["..."] * len(head)] + rows[-5:]
        out.append(f"Pareto front ({len(rows)} plans, fastest first):\n" + table(head, shown))
    return out


def _rate(pred) -> str:
    return (f"{pred.tokens_per_s:,.0f} tok/s" if pred.tokens_per_s is not None
            else f"{pred.samples_per_s:,.0f}/s")


def _use(pred) -> str:
    return f"MFU {pred.mfu:.1%}" if pred.mfu is not None else f"eff. {pred.efficiency:.1%}"


def solution_text(sol, precision: dict | None = None, token_budget: dict | None = None,
                  price: dict | None = None, framework: str | None = None) -> str:
    """`solve`'s text; `precision` ({"name", "source"}), `token_budget` (`token_budget_doc`),
    `price` ({"usd", "source"}) and the `framework` it is priced for add what the command
    knows beyond the solution."""
    if _is_split(sol):
        return split_text(sol, precision, price)
    out = [f"status: {sol.status} (CP-SAT: the minimum of {sol.rows:,} priced plans, "
           f"{span(sol.solve_time_s)})",
           evaluation_text(sol.plan, sol.prediction, precision, framework)]
    if token_budget is not None:
        out.append(key_values(token_budget_pairs(token_budget)))
    if sol.knee is not None:
        out.append(key_values([knee_pair(sol.knee)]))
    out += _training_text(sol.training, sol.pareto, price)
    if sol.alternatives:
        # a transformer's plans have no collective choice: its column only for CNNs
        collective = any(p.collective for p, _ in sol.alternatives)
        rows = [[p.nodes, p.devices_per_node, _split(p.to_json()), p.global_batch, p.micro_batch,
                 *([p.collective.value if p.collective else "-"] if collective else []),
                 span(pr.iteration_time_s), _rate(pr), _use(pr)] for p, pr in sol.alternatives]
        out.append("runners-up:\n" + table(
            ["nodes", "dev/node", "split", "batch", "micro",
             *(["collective"] if collective else []), "iteration", "throughput", "use"], rows))
    return "\n\n".join(out)


def split_doc(sol) -> dict:
    """A hybrid or pipeline CNN plan (`planner.search.strategy.SplitSolution`)."""
    return {"strategy": sol.strategy, "status": sol.status, "config": sol.config,
            "plan": sol.plan, "prediction": {**sol.prediction.to_json(), **(sol.training or {})},
            "objective": sol.objective, "data_parallel": sol.data_parallel,
            "search": sol.search, **({"spatial": sol.spatial} if sol.spatial else {})}


def split_text(sol, precision: dict | None = None, price: dict | None = None) -> str:
    c, p = sol.config, sol.prediction
    head = (f"status: {sol.status} ({sol.strategy}; {sol.search['candidates']:,} points, "
            f"{sol.search['inner_solves']} solved by CP-SAT, the rest pruned by bound)")
    where = (f"{count(c['nodes'], 'node')} x {count(c['devices_per_node'], 'device')} = "
             f"{count(c['devices'], 'device')}, "
             f"global batch {c['global_batch']}, {c['collective']}")
    if "layers" in sol.plan:
        where += (f", local batch {c['local_batch']}" if "local_batch" in c
                  else f", {c['devices_per_sample']} devices per sample")
        rows = [[l["name"], l["mode"], l["degree"], span(l["compute_time_s"]),
                 span(l["communication_time_s"])]
                for l in sol.plan["layers"] if l["compute_time_s"] or l["communication_time_s"]]
        plan = "layers:\n" + table(["layer", "mode", "degree", "compute", "communication"], rows)
    else:
        where += (f", {c['stages']} stages x {c['replicas']} replicas, {c['micro_batches']} "
                  f"micro-batches of {c['micro_batch']}")
        rows = [[j, f"{s['layers'][0]} .. {s['layers'][-1]}", len(s["layers"]), s["devices"],
                 span(s["time_s"]), si(s["memory_bytes"], "B")]
                for j, s in enumerate(sol.plan["stages"])]
        plan = "stages:\n" + table(["stage", "layers", "count", "devices", "time/micro-batch",
                                      "memory"], rows)
    pairs = [("config", where), *([precision_pair(precision)] if precision else []),
             ("iteration time", span(p.iteration_time_s)),
             ("throughput", f"{p.samples_per_s:,.1f} samples/s"),
             ("compute", span(p.compute_time_s)),
             ("communication", f"{span(p.communication_time_s)} "
                               f"({span(p.exposed_communication_time_s)} exposed)"),
             ("memory/device", f"{si(p.memory_bytes_per_device, 'B')} of "
                               f"{si(p.memory_capacity_bytes, 'B')} usable"),
             ("speed-up", f"{p.speedup:.2f} x (efficiency {p.efficiency:.1%})")]
    if p.bubble_fraction is not None:
        pairs.insert(2, ("pipeline bubble", f"{p.bubble_fraction:.1%}"))
    if sol.training:
        pairs.append(time_to_train_pair(sol.training, price))
    base = sol.data_parallel
    if base is not None:
        bc = base["config"]
        pairs.append(("best data parallel", f"{span(base['iteration_time_s'])} on "
                                            f"{bc['devices']} devices (objective "
                                            f"{sol.objective['value'] / base['objective_value']:.3f}"
                                            " x of it here)"))
    else:
        pairs.append(("best data parallel", "none fits in memory"))
    if sol.spatial:
        pairs.append(spatial_pair(sol.spatial))
    return "\n\n".join([head, key_values(pairs), plan])


# --- sweep ----------------------------------------------------------------------------------


def scaling(points) -> list[float]:
    """Samples/s per device at each point over that of the point with the fewest devices of
    its series (1.0 = linear scaling from there): one series per swept bandwidth and global
    batch (per bandwidth in a weak-scaling sweep, whose one local batch grows the global
    one), so no point is measured against another network or batch."""
    weak = (len({p.plan.local_batch for p in points}) == 1
            and len({p.plan.global_batch for p in points}) > 1)

    def series(p):
        return (p.bandwidth_GBps,) if weak else (p.bandwidth_GBps, p.plan.global_batch)

    rate = {}
    for p in sorted(points, key=lambda p: p.plan.devices):
        rate.setdefault(series(p), p.prediction.samples_per_s / p.plan.devices)
    return [p.prediction.samples_per_s / p.plan.devices / rate[series(p)] for p in points]


def sweep_doc(sw) -> dict:
    """Each point as `config` and `prediction` (with the time to train), and the same keys
    flat (the data-parallel sweep's original form)."""
    points = []
    for p, eff in zip(sw.points, scaling(sw.points) if sw.points else [], strict=True):
        config = p.plan.to_json()
        prediction = {**p.prediction.to_json(), **(p.training or {})}
        points.append({**config, "bandwidth_GBps": p.bandwidth_GBps, **prediction,
                       "scaling_efficiency": eff, "config": config, "prediction": prediction})
    skipped = [{"nodes": s.nodes, "global_batch": s.global_batch,
                "bandwidth_GBps": s.bandwidth_GBps, "reason": s.reason} for s in sw.skipped]
    return {"points": points, "skipped": skipped, "skipped_nodes": sw.skipped_nodes}


def sweep_text(sw) -> str:
    pts = sw.points
    show_bw = len({p.bandwidth_GBps for p in pts} | {s.bandwidth_GBps for s in sw.skipped}) > 1
    show_split = any(p.plan.collective is None for p in pts)
    show_train = any(p.training for p in pts)
    rows = []
    for p, eff in zip(pts, scaling(pts) if pts else [], strict=True):
        plan, pred = p.plan, p.prediction
        row = [plan.nodes, plan.devices, plan.global_batch]
        row += [f"{p.bandwidth_GBps:g}"] if show_bw else []
        row += [_split(plan.to_json()), plan.micro_batch] if show_split else [plan.local_batch]
        row += [span(pred.iteration_time_s), span(pred.compute_time_s),
                span(pred.exposed_communication_time_s), _rate(pred)]
        row += ([f"{pred.mfu:.1%}", f"{eff:.1%}"] if pred.mfu is not None
                else [f"{pred.speedup:.2f}", f"{pred.efficiency:.1%}"])
        if show_train:
            cost = p.training.get("cost_usd") if p.training else None
            row += [duration(p.training["time_to_train_s"]) if p.training else "n/a",
                    "n/a" if cost is None else f"{cost:,.0f}"]
        rows.append(row + ["yes" if pred.fits_memory else "NO"])
    head = ["nodes", "devices", "batch"] + (["GB/s"] if show_bw else [])
    head += ["split", "micro"] if show_split else ["local"]
    head += ["iteration", "compute", "exposed comm", "throughput"]
    head += ["MFU", "scaling"] if show_split else ["speed-up", "eff."]
    head += (["to train", "cost USD"] if show_train else []) + ["fits"]
    text = table(head, rows)
    if show_split and pts and max(scaling(pts)) > 1.005:
        base = min(pts, key=lambda p: p.plan.devices).plan
        text += (f"\nscaling above 100 %: at {base.devices} devices memory holds the plan to "
                 f"recompute {base.recompute.value}, ZeRO {base.zero}, micro-batch "
                 f"{base.micro_batch}; more devices free memory for a faster plan (compare "
                 "the points' plans with solve)")
    if sw.skipped:
        text += "\nno plan:\n" + "\n".join(
            f"  {count(s.nodes, 'node')}, batch {s.global_batch}"
            + (f", {s.bandwidth_GBps:g} GB/s" if show_bw else "") + f": {s.reason}"
            for s in sw.skipped)
    return text
