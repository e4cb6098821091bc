"""A plan over several pools (`planner.search.pools.ClusterSolution`) as a JSON document and
as text: the plan with the pool of every stage or replica group, the best plan of every
subset of pools beside it, what each pool adds, and the cost per token at each pool's price."""

from __future__ import annotations

from planner.cost.pools import MixedPlan
from planner.report.render import table


def _plan(found, names) -> dict:
    plan = found.plan
    if not isinstance(plan, MixedPlan):
        c = plan
        return {"kind": found.kind, "pools": list(found.pools), "tp": c.tp, "cp": c.cp,
                "pp": c.pp, "dp": c.dp, "micro_batch": c.micro_batch,
                "global_batch": c.global_batch, "recompute": c.recompute.value,
                "sequence_parallel": c.sequence_parallel, "zero": c.zero,
                "interleave": c.interleave, "devices": found.devices,
                "nodes": {found.pools[0]: c.nodes}}
    s = plan.shape
    out = {"kind": found.kind, "pools": list(found.pools), "tp": s.tp, "cp": s.cp, "pp": plan.pp,
           "micro_batch": s.micro_batch, "global_batch": plan.global_batch,
           "recompute": s.recompute, "sequence_parallel": s.sequence_parallel, "zero": s.zero,
           "devices": found.devices}
    out["groups"] = [{"replicas": g.replicas, "micro_batches": g.micro_batches,
                      "samples": g.replicas * g.micro_batches * s.micro_batch,
                      "stages": [{"pool": names[st.pool], "layers": st.layers}
                                 for st in g.stages]} for g in plan.groups]
    return out


def _cost_per_million_tokens(found, sol) -> float | None:
    prices = [sol.prices[p] for p in found.devices]
    if any(p is None for p in prices):
        return None
    usd_per_s = sum(n * sol.prices[p] for p, n in found.devices.items()) / 3600
    return usd_per_s * found.iteration_time_s / (found.global_batch * sol.seq_len) * 1e6


def _entry(found, sol) -> dict:
    tokens = found.global_batch * sol.seq_len / found.iteration_time_s
    return {"pools": list(found.subset), "uses": list(found.pools), "kind": found.kind,
            "status": found.status,
            "iteration_time_s": found.iteration_time_s, "global_batch": found.global_batch,
            "tokens_per_s": tokens, "devices": found.devices,
            "memory_bytes_per_device": found.memory_bytes,
            "cost_per_million_tokens_usd": _cost_per_million_tokens(found, sol),
            **({"time_band": found.time_band} if found.time_band else {}),
            **({"support": found.support} if found.support else {})}


def worth(sol) -> list[dict]:
    """Per pool: the best plan with every pool against the best without it (what it adds)."""
    every = tuple(n for n in sol.prices)
    best_all = min(sol.subsets, key=lambda f: f.seconds_per_sample)
    out = []
    for name in every:
        without = [f for f in sol.subsets if name not in f.subset]
        if not without:
            continue
        other = min(without, key=lambda f: f.seconds_per_sample)
        out.append({"pool": name, "best_without_tokens_per_s":
                    other.global_batch * sol.seq_len / other.iteration_time_s,
                    "adds": other.seconds_per_sample / best_all.seconds_per_sample - 1})
    return out


def _gain_band(single, best) -> dict | None:
    """The gain over the best single pool with both plans at the same percentile of their
    bands (the 10th, then the 90th), and at the point estimate (where both bands lie on one
    side of it, the two percentiles alone can miss it): {"low", "high"}; None without both
    bands."""
    a, b = single.time_band or {}, best.time_band or {}
    if "low_s" not in a or "low_s" not in b or single is best:
        return None
    at = [single.seconds_per_sample / best.seconds_per_sample - 1] + [
        (a[k] / single.global_batch) / (b[k] / best.global_batch) - 1
        for k in ("low_s", "high_s")]
    return {"low": min(at), "high": max(at)}


def cluster_doc(sol, cluster) -> dict:
    names = [p.name for p in cluster.pools]
    singles = [f for f in sol.subsets if len(f.pools) == 1]
    best_single = min(singles, key=lambda f: f.seconds_per_sample, default=None)
    doc = {"cluster": cluster.name, "status": sol.status, "plan": _plan(sol.best, names),
           "prediction": _entry(sol.best, sol),
           "subsets": [_entry(f, sol) for f in sol.subsets]}
    if best_single is not None:
        doc["best_single_pool"] = best_single.pools[0]
        doc["gain_over_best_single_pool"] = (best_single.seconds_per_sample
                                             / sol.best.seconds_per_sample - 1)
        gains = _gain_band(best_single, sol.best)
        if gains is not None:
            doc["gain_band"] = gains
    doc["pools_add"] = worth(sol)
    if sol.limits:
        doc["limits"] = sol.limits
    if sol.missing:
        doc["no_plan"] = sol.missing
    if sol.mixed_note:
        doc["mixed_not_searched"] = sol.mixed_note
    doc["search"] = {"cp_sat_models": sol.models_solved, "shapes_priced": sol.shapes_priced,
                     "solve_time_s": sol.solve_time_s}
    return doc


def _describe(entry: dict, plan: dict | None = None) -> str:
    if plan is None or "groups" not in plan:
        return entry["kind"]
    if plan["kind"].startswith("pipeline"):
        runs, last = [], None
        for st in plan["groups"][0]["stages"]:
            if runs and st["pool"] == last[0] and st["layers"] == last[1]:
                runs[-1][2] += 1
            else:
                runs.append([st["pool"], st["layers"], 1])
            last = (st["pool"], st["layers"])
        return " | ".join(f"{c} stage{'s' * (c != 1)} x {n} layers on {p}" for p, n, c in runs)
    return ", ".join(f"{g['replicas']} replicas x {g['micro_batches']} micro-batches on "
                     f"{g['stages'][0]['pool']}" for g in plan["groups"])


def cluster_text(doc: dict) -> str:
    plan, pred = doc["plan"], doc["prediction"]
    lines = [f"cluster {doc['cluster']}: {doc['status']} plan, {plan['kind']} on "
             f"{' + '.join(plan['pools'])}"
             + (f", {doc['precision']['name']} on every pool" if "precision" in doc else "")]
    cp = f" x cp {plan['cp']}" if plan.get("cp", 1) > 1 else ""
    size = (f"tp {plan['tp']}{cp} x pp {plan['pp']}, micro-batch {plan['micro_batch']}, global "
            f"batch {plan['global_batch']}, recompute {plan['recompute']}, ZeRO {plan['zero']}")
    lines.append(f"  {size}")
    if "groups" in plan:
        lines.append(f"  {_describe(pred, plan)}")
    else:
        lines.append(f"  dp {plan['dp']}")
    lines.append(f"  iteration {pred['iteration_time_s']:.4g} s, "
                 f"{pred['tokens_per_s']:,.0f} tokens/s on "
                 + ", ".join(f"{n} devices of {p}" for p, n in pred["devices"].items()))
    if pred.get("time_band"):
        lines.append(f"  likely {_likely(pred['time_band'])}")
    if pred.get("support"):
        lines.append(f"  {_support(pred['support'])}")
    if "gain_over_best_single_pool" in doc:
        lines.append(f"  {doc['gain_over_best_single_pool']:+.1%} throughput over the best "
                     f"single pool ({doc['best_single_pool']})" + (
                         f"; {doc['gain_band']['low']:+.0%} to {doc['gain_band']['high']:+.0%} "
                         "with both at the same percentile of their bands"
                         if "gain_band" in doc else ""))
    rows = [[" + ".join(e["pools"]), e["kind"] + ("" if e["uses"] == e["pools"] else
                                                  f" ({' + '.join(e['uses'])} alone)"),
             f"{e['iteration_time_s']:.4g}",
             f"{e['tokens_per_s']:,.0f}",
             "-" if e["cost_per_million_tokens_usd"] is None
             else f"{e['cost_per_million_tokens_usd']:.3g}"] for e in doc["subsets"]]
    lines += ["", table(["pools", "best plan", "iteration s", "tokens/s", "USD / M tokens"],
                        rows)]
    adds = doc.get("pools_add") or []
    if adds:
        lines.append("")
        lines += [f"  adding {a['pool']}: {a['adds']:+.1%} throughput" for a in adds]
    lines += _limit_lines(doc.get("limits") or {})
    for subset, why in (doc.get("no_plan") or {}).items():
        lines.append(f"  no plan on {subset}: {why}")
    if doc.get("mixed_not_searched"):
        lines.append(f"  mixed plans not searched: {doc['mixed_not_searched']}")
    s = doc["search"]
    lines.append(f"  search: {s['cp_sat_models']} CP-SAT models over {s['shapes_priced']:,} "
                 f"priced shapes, {s['solve_time_s']:.2f} s")
    return "\n".join(lines)


def _support(sup: dict) -> str:
    """The plan taken within its pools' memory reach, or the one weighed beside the fastest
    mix (`planner.search.pools.ClusterSolver._within_reach`)."""
    reach = sup["reach"]
    filling = (f"filling {next(iter(reach.values())):.1%} of the usable memory or less"
               if sup["covered_by"].startswith("memory at most ") else
               "filling each pool's usable memory no more than its family's fullest run ("
               + ", ".join(f"{p} {x:.1%}" for p, x in reach.items()) + ")")
    why = sup["note"].removeprefix("not covered: ")
    alt = sup["alternative"]
    if alt is None:
        return (f"the search for a plan {filling} stopped at its model budget; the fastest "
                f"mix is kept" if sup["cut_off"] else
                f"no plan {filling} fits; the fastest mix is kept")
    what = f"{alt['kind']} on {' + '.join(alt['pools'])}"
    change = alt["seconds_per_sample"] / sup["fastest_seconds_per_sample"] - 1
    if sup["taken"]:
        within = ("within its error band" if sup["rule"] == "band"
                  else f"within --prefer-supported {sup['tolerance']:g}")
        return (f"took the fastest plan {filling} ({what}, {change:+.1%} time, {within}) "
                f"over the fastest mix ({sup['fastest_iteration_time_s']:.4g} s), which has "
                f"{why}")
    beside = (f"the fastest plan {filling} ({what}) takes {alt['iteration_time_s']:.4g} s "
              f"({change:+.1%} time)")
    if sup["rule"] == "fraction":
        return f"{beside}: beyond --prefer-supported {sup['tolerance']:g}; the fastest mix is kept"
    if "low_s" not in (alt["time_band"] or {}):
        return f"{beside} and is not covered either; the fastest mix is kept"
    return f"{beside}: outside its error band; the fastest mix is kept"


def _likely(band: dict) -> str:
    if "low_s" not in band:
        return band["note"]
    return (f"{band['low_s']:.4g} s to {band['high_s']:.4g} s per iteration (measured / "
            f"predicted {band['low_ratio']:.2f}-{band['high_ratio']:.2f} in {band['runs']:,} "
            f"comparable runs; --format json names them)")


def _limit_lines(limits: dict) -> list[str]:
    lines = []
    if "bottleneck" in limits:
        b = limits["bottleneck"]
        others = ", ".join(f"{p} {t:.4g}" for p, t in b["by_pool"].items() if p != b["pool"])
        lines.append(f"  bottleneck: {b['pool']} ({b['measure']}: {b['by_pool'][b['pool']]:.4g}; "
                     f"{others})")
    if "break_even_between_node_Bps" in limits:
        need, now = limits["break_even_between_node_Bps"], limits["between_node_Bps"]
        lines.append(f"  beats {limits['against']} alone while the links between pools carry "
                     f"at least {need / 1e9:.3g} GB/s per node (now {now / 1e9:.3g} GB/s)"
                     if need is not None else
                     f"  does not beat {limits['against']} alone at the links between pools")
    if "balanced_micro_batches" in limits:
        lines.append("  balanced micro-batches per replica (closed form): " + ", ".join(
            f"{x:.4g} on {p}" for p, x in limits["balanced_micro_batches"].items()))
    if "at_own_fabric" in limits:
        f = limits["at_own_fabric"]
        lines.append(f"  with links between pools as fast as their own NICs: "
                     f"{f['kind']} on {' + '.join(f['pools'])}, "
                     f"{f['gain_over_best_single_pool']:+.1%} over the best single pool")
        if f.get("break_even_between_node_Bps") is not None:
            lines.append(f"  (that mix needs at least {f['break_even_between_node_Bps'] / 1e9:.3g}"
                         " GB/s per node between pools to beat it)")
    return lines


def limits_doc(doc: dict) -> dict:
    """`limits` over a cluster: the solve document's plan, its limits and each pool alone."""
    keep = ("cluster", "status", "plan", "prediction", "best_single_pool",
            "gain_over_best_single_pool", "limits")
    singles = [e for e in doc["subsets"] if len(e["pools"]) == 1]
    return {**{k: doc[k] for k in keep if k in doc}, "single_pools": singles}


def limits_text(doc: dict) -> str:
    plan, pred = doc["plan"], doc["prediction"]
    lines = [f"cluster {doc['cluster']}: best plan {plan['kind']} on "
             f"{' + '.join(plan['pools'])}, {pred['tokens_per_s']:,.0f} tokens/s"]
    if "groups" in plan:
        lines.append(f"  {_describe(pred, plan)}")
    if pred.get("support"):
        lines.append(f"  {_support(pred['support'])}")
    for e in doc["single_pools"]:
        lines.append(f"  {e['pools'][0]} alone: {e['tokens_per_s']:,.0f} tokens/s")
    if "gain_over_best_single_pool" in doc:
        lines.append(f"  {doc['gain_over_best_single_pool']:+.1%} throughput over the best "
                     f"single pool ({doc['best_single_pool']})")
    lines += _limit_lines(doc.get("limits") or {})
    if not doc.get("limits"):
        lines.append("  the best plan runs on one pool: nothing between pools limits it")
    return "\n".join(lines)
