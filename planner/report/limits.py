"""What `limits` and `derive` print: the limits of a CNN (`planner.analysis.cnn_limits.Limits`)
or a transformer (`planner.analysis.transformer_limits.TransformerLimits`) from their summary
dicts, and the formulas behind them (`planner.formulas.Derived`)."""

from __future__ import annotations

from planner.report.render import key_values, si


def limits_text(s: dict) -> str:
    eff = s["efficiency_at_nodes"]
    bw = s["required_bandwidth_GBps"]
    cb = s["comm_bound_from_nodes"]
    ttt = s.get("time_to_train")
    extra = [] if ttt is None else [
        ("time-to-train optimum" if ttt["nodes_chosen"] else
         f"time-to-train batch at {ttt['nodes']:.4g} nodes",
         (f"{ttt['nodes']:.0f} nodes (of 1..{ttt['nodes_max']}), " if ttt["nodes_chosen"]
          else "") + f"global batch {ttt['global_batch']:.4g} (local "
         f"{ttt['local_batch']:.3g}; B_noise {ttt['critical_batch']:g}; "
         f"{si(ttt['time_per_min_step_s'], 's')} per S_min step; {ttt['reason']})")]
    return key_values([
        ("optimal nodes", f"{s['optimal_nodes']:.4g}  ({s['optimal_nodes_reason']})"),
        ("max speed-up", f"{s['max_speedup']:.4g} x over one device"),
        ("comm-bound from", "never within the batch limit" if cb is None
         else f"{cb:.4g} nodes (communication >= {'hideable backward' if s['overlap'] else 'compute'})"),
        ("smallest efficient local batch", f"{s['local_batch_min']:.4g} "
                                           f"({s['local_efficiency']:.0%} of large-batch rate)"),
        ("max useful nodes", f"{s['max_useful_nodes']} (global batch {s['global_batch']} / "
                             f"({s['devices_per_node']} devices x local batch))"),
        (f"efficiency at {eff['nodes']:g} nodes", f"{eff['efficiency']:.1%}"),
        (f"bandwidth for {s['target_efficiency']:.0%} efficiency",
         "unreachable at any bandwidth" if bw is None
         else f"{bw:.4g} GB/s (available {s['available_bandwidth_GBps']:.4g} GB/s)"),
        *extra,
    ])


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
                        f"micro-batch {p['micro_batch']}, {p['recompute']} recompute, ZeRO "
                        f"{p['zero']}: {si(s['iteration_time_s'], 's')} per iteration, "
                        f"{si(s['memory_bytes_per_device'], 'B')} of "
                        f"{si(s['memory_capacity_bytes'], 'B')}"),
        ("memory floor (smallest tp x pp)", floors[0]),
        *(("", f) for f in floors[1:]),
        ("optimal devices", f"{opt['devices']:.4g} (dp {opt['dp']:.4g}: {opt['reason']}); "
                            f"whole plan dp {whole['dp']} = {whole['devices']} devices, "
                            f"{si(whole['iteration_time_s'], 's')} per iteration"),
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
            "" if pp["continuous"] is None else f" (stationary point {pp['continuous']:.4g})")),
        (f"tp comm-bound from (dp {s['plan']['dp']})", "never (every tp dividing the heads)"
         if tpb is None else f"tp {tpb['tp']}" + (
             "" if tpb["continuous"] is None else f" ({tpb['reason']})")),
        (f"bandwidth for {s['target_efficiency']:.0%} efficiency at dp {s['bandwidth_at_dp']}",
         "unreachable at any bandwidth" if bw is None else
         f"{bw:.4g} GB/s per device (available {s['available_bandwidth_GBps']:.4g} GB/s)"),
    ]
    if ttt is not None:
        rows.append((f"time-to-train batch at dp {ttt['dp']}",
                     f"{ttt['global_batch']:.4g} (B_noise {ttt['critical_batch']:g}; "
                     f"{ttt['reason']})"))
    return key_values(rows)


def derive_text(formulas, fmt: str) -> str:
    """`planner derive` as LaTeX (one complete environment), a Python module that runs as
    printed, or text; each renders any family's `planner.formulas.Derived`."""
    from planner import formulas as der

    if fmt == "latex":
        return der.latex_block(formulas)
    if fmt == "python":
        return der.python_module(formulas).rstrip("\n")
    return "\n\n".join(der.text_block(f) for f in formulas)
