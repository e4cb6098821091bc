"""What `limits` and `derive` print: the limits of a CNN (`planner.analysis.cnn_limits.Limits`)
or a transformer (`planner.analysis.transformer_limits.TransformerLimits`) from their summary
dicts, and the formulas behind them (`planner.formulas.Derived`)."""

from __future__ import annotations

from planner.report.plans import spatial_pair
from planner.report.render import count, key_values, si, span

# what the bandwidth lines count: the collective's bottleneck link as achieved, not the
# datasheet rate per NIC that `sweep --bandwidth` sets (it is that times the link's efficiency)
ACHIEVED = "achieved on the bottleneck link: sweep --bandwidth sets the datasheet rate per NIC"


def limits_text(s: dict) -> str:
    eff = s["efficiency_at_nodes"]
    bw = s["required_bandwidth_GBps"]
    cb = s["comm_bound_from_nodes"]
    ttt = s.get("time_to_train")
    extra = [] if ttt is None else [
        ("time-to-train optimum" if ttt["nodes_chosen"] else
         f"time-to-train batch at {count(ttt['nodes'], 'node', '.4g')}",
         (f"{count(ttt['nodes'], 'node', '.0f')} (of 1..{ttt['nodes_max']}), " if ttt["nodes_chosen"]
          else "") + f"global batch {ttt['global_batch']:.4g} (local "
         f"{ttt['local_batch']:.3g}; B_noise {ttt['critical_batch']:g}; "
         f"{span(ttt['time_per_min_step_s'])} per S_min step; {ttt['reason']})")]
    return key_values([
        ("optimal nodes", f"{s['optimal_nodes']:.4g}  ({s['optimal_nodes_reason']})"),
        ("max speed-up", f"{s['max_speedup']:.4g} x over one device"),
        ("comm-bound from", "never within the batch limit" if cb is None
         else f"{count(cb, 'node', '.4g')} (communication >= "
              f"{'hideable backward' if s['overlap'] else 'compute'})"),
        ("smallest efficient local batch", f"{s['local_batch_min']:.4g} "
                                           f"({s['local_efficiency']:.0%} of large-batch rate)"),
        ("max useful nodes", f"{s['max_useful_nodes']} (global batch {s['global_batch']} / "
                             f"({s['devices_per_node']} devices x the smallest efficient local "
                             f"batch): beyond it each device runs under "
                             f"{s['local_efficiency']:.0%} of its large-batch rate)"),
        (f"efficiency at {count(eff['nodes'], 'node')}", f"{eff['efficiency']:.1%}"),
        (f"bandwidth for {s['target_efficiency']:.0%} efficiency",
         "unreachable at any bandwidth" if bw is None
         else f"{bw:.4g} GB/s (available {s['available_bandwidth_GBps']:.4g} GB/s; {ACHIEVED})"),
        *extra,
        *([spatial_pair(s["spatial"])] if s.get("spatial") else []),
        *_solve_pairs(s),
    ])


def _solve_pairs(s: dict) -> list[tuple[str, str]]:
    """What `solve` picks on the same case, and why it differs from the limits above."""
    sv = s.get("solve")
    if sv is None:
        return []

    def where(p: dict | None) -> str:
        if p is None:
            return "no plan fits"
        return (f"{count(p['nodes'], 'node')} (local batch {p['local_batch']}, {p['collective']}, "
                f"{span(p['iteration_time_s'])} per iteration)")

    same, free, bounded = sv["same_collective"], sv["any_collective"], sv["with_local_batch_min"]
    agree = same is not None and abs(same["nodes"] - s["optimal_nodes"]) < 0.5
    rows = [("solve, same collective", where(same) + (
        "" if same is None else ": agrees with the optimal nodes" if agree else
        f": whole nodes over whose devices the global batch {s['global_batch']} splits "
        f"evenly (a whole local batch); the optimal nodes above are continuous "
        f"({s['optimal_nodes']:.4g})"))]
    if free is not None and same is not None and (
            free["collective"] != same["collective"] or free["nodes"] != same["nodes"]):
        rows.append(("solve, any collective", where(free) + ": solve chooses the collective "
                     f"(limits holds --collective {s['collective']})"))
    if sv["local_batch_min"] <= 1:  # one sample per device: the same as the first solve
        return rows
    useful = bounded is not None and bounded["nodes"] == s["max_useful_nodes"]
    rows.append((f"solve, local batch >= {sv['local_batch_min']}", where(bounded) + (
        ": the max useful nodes" if useful else "") + "; solve bounds the local batch only "
        f"when asked (--local-batch-min {sv['local_batch_min']})"))
    return rows


def transformer_limits_text(s: dict) -> str:
    """`planner limits` for a transformer: the plan the limits hold at, then each limit."""
    p, opt = s["plan"], s["optimal_devices"]
    whole = opt["whole_plan"]
    cb, pp, tpb, bw = (s["comm_bound_from"], s["optimal_pp"], s["tp_comm_bound_from"],
                       s["required_bandwidth_GBps"])
    floors = [f"ZeRO {f['zero']} {f['recompute']:<9}: " + (
        "nothing fits" if f["tp"] is None else
        f"tp {f['tp']} x pp {f['pp']} (x dp {f['dp']} = {f['devices']} devices, "
        f"{si(f['memory_bytes_per_device'], 'B')})") for f in s["memory_floor"]]
    ttt = s.get("time_to_train")
    rows = [
        ("at the plan", f"tp {p['tp']} x pp {p['pp']} x dp {p['dp']} = {p['devices']} devices, "
                        f"micro-batch {p['micro_batch']}, {p['recompute']} recompute, "
                        f"sequence parallel {'on' if p['sequence_parallel'] else 'off'}, ZeRO "
                        f"{p['zero']}: {span(s['iteration_time_s'])} per iteration, "
                        f"{si(s['memory_bytes_per_device'], 'B')} of "
                        f"{si(s['memory_capacity_bytes'], 'B')}"),
        ("memory floor (smallest tp x pp)", floors[0]),
        *(("", f) for f in floors[1:]),
        ("optimal devices", f"{opt['devices']:.4g} (dp {opt['dp']:.4g}: {opt['reason']}); "
                            f"whole plan dp {whole['dp']} = {whole['devices']} devices, "
                            f"{span(whole['iteration_time_s'])} per iteration"),
        ("max speed-up", f"{opt['max_speedup']:.4g} x over one data-parallel replica"),
        ("comm-bound from", "never within the batch limit" if cb is None else
         f"{cb['devices']:.4g} devices (dp {cb['dp']:.4g}; first whole plan exposed: dp "
         f"{cb['first_whole_dp_exposed']})"),
        ("max useful devices", f"{s['max_useful_devices']['devices']:.4g} (micro-batch "
                               f"{s['max_useful_devices']['smallest_efficient_micro_batch']} "
                               f"per replica reaches "
                               f"{s['max_useful_devices']['local_efficiency']:.0%} of the "
                               f"large-batch rate)"),
        (f"optimal pp at dp {pp['at_dp']}", f"{pp['pp']}" + (
            "" if pp["continuous"] is None else f" (continuous optimum {pp['continuous']:.4g}: "
            "the stationary point, at most the layers)")),
        (f"tp comm-bound from (dp {s['plan']['dp']})", "never (every tp dividing the heads)"
         if tpb is None else f"tp {tpb['tp']}" + (
             "" if tpb["continuous"] is None else f" ({tpb['reason']})")),
        (f"bandwidth for {s['target_efficiency']:.0%} efficiency at dp {s['bandwidth_at_dp']}",
         "unreachable at any bandwidth" if bw is None else
         f"{bw:.4g} GB/s per device (available {s['available_bandwidth_GBps']:.4g} GB/s; "
         f"{ACHIEVED})"),
    ]
    if ttt is not None:
        rows.append((f"time-to-train batch at dp {ttt['dp']}",
                     f"{ttt['global_batch']:.4g} (B_noise {ttt['critical_batch']:g}; "
                     f"{ttt['reason']})"))
    return key_values(rows)


def plan_flags(plan: dict) -> str:
    """The plan `derive` reads its formulas at (`planner.api.derivation`) as the `evaluate`
    flags that price the same plan (a CNN's node count aside: the formulas' n)."""
    from planner import switches
    from planner.inputs import cli_flag

    out = []
    for key, value in plan.items():
        if key in ("devices", "devices_per_node"):
            continue
        if key in switches.BY_NAME:  # the registry spells a switch's flags
            out.append(switches.BY_NAME[key].spelled(value))
        elif isinstance(value, bool):
            out.append(f"--{cli_flag(key)}" if value else f"--no-{cli_flag(key)}")
        else:
            out.append(f"--{cli_flag(key)} {value}")
    return " ".join(out)


def derive_text(got, fmt: str) -> str:
    """`planner derive` (a `planner.api.Derivation`) as LaTeX (one complete environment), a
    Python module that runs as printed, or text; each renders any family's
    `planner.formulas.Derived`, after the plan they are read at and before what was left
    out."""
    from planner import formulas as der

    head = f"read at the plan (planner evaluate prices it with): {plan_flags(got.plan)}"
    if "tp" in got.plan:  # a transformer's aggregates are its split's own
        head += ("; tau, H, M and the other aggregates are this tp x pp x micro-batch's: a "
                 "formula holds as d and B vary, not t, p or b")
    tail = "\n".join(f"left out: {name}: {why}" for name, why in got.left_out.items())
    if fmt == "latex":
        from planner.latex import paper_block

        first, rest = paper_block(got.formulas).split("\n", 1)
        return "\n".join([first, f"% {head}"] + [f"% {x}" for x in tail.splitlines()] + [rest])
    if fmt == "python":
        return der.python_module(got.formulas, "; ".join([head, *tail.splitlines()])
                                 ).rstrip("\n")
    body = "\n\n".join(der.text_block(f) for f in got.formulas)
    return "\n\n".join([head, body] + ([tail] if tail else []))
