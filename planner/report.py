"""What each command shows: JSON documents and text for people, from typed results."""

from __future__ import annotations

from planner.render import duration, key_values, si, table
from planner.spec.cnn import CNN
from planner.spec.hardware import Device, Link, System


def model_doc(cnn: CNN) -> dict:
    return {
        "name": cnn.name,
        "description": cnn.description,
        "input_shape": list(cnn.input_shape),
        "params": cnn.params,
        "macs_per_sample": cnn.macs,
        "forward_flops_per_sample": cnn.forward_flops,
        "layers": [
            {"name": l.name, "type": l.type, "block": l.block,
             "output_shape": list(l.output_shape), "params": l.params,
             "forward_flops_per_sample": l.forward_flops,
             "activation_elements_per_sample": l.activation_elements}
            for l in cnn.layers
        ],
        "share": share(cnn),
    }


def share(cnn: CNN) -> dict:
    """Fractions of forward FLOPs and of parameters in conv vs fully connected layers."""
    flops, params = cnn.forward_flops or 1, cnn.params or 1
    out = {}
    for kind in ("conv", "fc"):
        layers = [l for l in cnn.layers if l.type == kind]
        out[kind] = {"flops_fraction": sum(l.forward_flops for l in layers) / flops,
                     "params_fraction": sum(l.params for l in layers) / params}
    return out


def model_text(cnn: CNN) -> str:
    rows = [[l.name, l.type, "x".join(map(str, l.output_shape)), f"{l.params:,}",
             si(l.forward_flops), si(l.activation_elements)] for l in cnn.layers]
    sh = share(cnn)
    head = (f"{cnn.name}: {cnn.description}\n"
            f"params {cnn.params:,}   forward FLOPs/sample {cnn.forward_flops:,} "
            f"({si(cnn.forward_flops, 'FLOP')})   MACs {cnn.macs:,}\n"
            f"conv: {sh['conv']['flops_fraction']:.1%} of FLOPs, "
            f"{sh['conv']['params_fraction']:.1%} of weights;  "
            f"fc: {sh['fc']['flops_fraction']:.1%} of FLOPs, "
            f"{sh['fc']['params_fraction']:.1%} of weights\n")
    return head + table(["layer", "type", "output", "params", "FLOPs", "activations"], rows)


def hardware_doc(spec: Device | Link | System) -> dict:
    if isinstance(spec, System):
        return {"kind": "system", "name": spec.name, "description": spec.description,
                "devices_per_node": spec.devices_per_node,
                "nics_per_node": spec.nics_per_node,
                "device": spec.device.model_dump(mode="json"),
                "intra_node": spec.intra_node.model_dump(mode="json"),
                "inter_node": spec.inter_node.model_dump(mode="json")}
    return spec.model_dump(mode="json")


def hardware_text(spec: Device | Link | System) -> str:
    if isinstance(spec, System):
        d = spec.device
        return key_values([
            ("system", f"{spec.name}: {spec.description}"),
            ("device", f"{d.name} x {spec.devices_per_node} per node"),
            ("intra-node", f"{spec.intra_node.name} ({spec.intra_node.bandwidth_GBps:g} GB/s, "
                           f"{spec.intra_node.latency_us:g} us)"),
            ("inter-node", f"{spec.nics_per_node} x {spec.inter_node.name} "
                           f"({spec.inter_node.bandwidth_GBps:g} GB/s, "
                           f"{spec.inter_node.latency_us:g} us each)"),
        ]) + "\n\n" + hardware_text(d)
    if isinstance(spec, Device):
        peaks = ", ".join(f"{p.value} {v:g}" for p, v in spec.peak_tflops.items())
        pairs = [("device", f"{spec.name}: {spec.description}"),
                 ("peak TFLOP/s", peaks), ("memory", f"{spec.memory_GiB:g} GiB"),
                 ("memory bandwidth", f"{spec.memory_bandwidth_GBps:g} GB/s"),
                 ("efficiency", f"compute {spec.efficiency.compute:g}, "
                                f"memory {spec.efficiency.memory:g}")]
        if spec.price_per_hour_usd:
            pairs.append(("price", f"${spec.price_per_hour_usd:g} per hour"))
        return key_values(pairs + [(f"source ({k})", v) for k, v in spec.sources.items()])
    return key_values([("link", f"{spec.name}: {spec.description}"),
                       ("bandwidth", f"{spec.bandwidth_GBps:g} GB/s per direction"),
                       ("latency", f"{spec.latency_us:g} us"),
                       ("efficiency", f"{spec.efficiency:g}")]
                      + [(f"source ({k})", v) for k, v in spec.sources.items()])


def config_text(cfg) -> str:
    return (f"{cfg.nodes} nodes x {cfg.devices_per_node} devices = {cfg.devices} devices, "
            f"global batch {cfg.global_batch} (local {cfg.local_batch}), "
            f"{cfg.collective.value}, overlap {'on' if cfg.overlap else 'off'}")


def evaluation_text(cfg, pred) -> str:
    mem = ", ".join(f"{k} {si(v, 'B')}" for k, v in pred.memory_breakdown.items())
    return key_values([
        ("config", config_text(cfg)),
        ("iteration time", si(pred.iteration_time_s, "s")),
        ("throughput", f"{pred.throughput_samples_per_s:,.1f} samples/s"),
        ("compute", si(pred.compute_time_s, "s")),
        ("communication", f"{si(pred.communication_time_s, 's')} "
                          f"({si(pred.exposed_communication_time_s, 's')} exposed)"),
        ("optimizer step", si(pred.optimizer_time_s, "s")),
        ("memory/device", f"{si(pred.memory_bytes_per_device, 'B')} of "
                          f"{si(pred.memory_capacity_bytes, 'B')} ({mem})"
                          + ("" if pred.fits_memory else "  DOES NOT FIT")),
        ("speed-up", f"{pred.speedup:.2f} x (efficiency {pred.efficiency:.1%})"),
    ])


def solution_doc(sol) -> dict:
    from planner.search.strategy import SplitSolution

    if isinstance(sol, SplitSolution):
        return split_doc(sol)
    return {
        "strategy": "data",
        "status": sol.status,
        "config": sol.config.to_json(),
        "prediction": {**sol.prediction.to_json(), **(sol.training or {})},
        "objective": sol.objective,
        **({"pareto": sol.pareto} if sol.pareto is not None else {}),
        "solve_time_s": sol.solve_time_s,
        "build_time_s": sol.build_time_s,
        "search": {"points": sol.points, "branches": sol.branches, "gap": sol.gap},
        "alternatives": [{"config": c.to_json(), "prediction": p.to_json()}
                         for c, p in sol.alternatives],
    }


def _time_to_train_pair(training: dict) -> tuple[str, str]:
    cost = f", {training['cost_usd']:,.2f} USD" if "cost_usd" in training else ""
    return ("time to train", f"{duration(training['time_to_train_s'])} "
                             f"({training['steps']:,.0f} steps{cost})")


def _training_text(training: dict | None, pareto: list[dict] | None) -> list[str]:
    """Time to train of the chosen plan and the Pareto front, as text blocks."""
    out = [key_values([_time_to_train_pair(training)])] if training else []
    if pareto:
        hybrid = "tp" in pareto[0]["config"]
        rows = [[p["config"]["nodes"], p["config"]["devices"]]
                + ([f"{p['config']['tp']}x{p['config']['pp']}x{p['config']['dp']}"]
                   if hybrid else [])
                + [p["config"]["global_batch"], duration(p["time_to_train_s"]),
                   f"{p['cost_usd']:,.2f}"] for p in pareto]
        head = ["nodes", "devices"] + (["tp x pp x dp"] if hybrid else []) + [
            "batch", "time to train", "cost USD"]
        shown = rows if len(rows) <= 12 else rows[:6] + [["..."] * len(head)] + rows[-5:]
        out.append(f"Pareto front ({len(rows)} plans, fastest first):\n" + table(head, shown))
    return out


def solution_text(sol) -> str:
    from planner.search.strategy import SplitSolution

    if isinstance(sol, SplitSolution):
        return split_text(sol)
    out = [f"status: {sol.status} (CP-SAT, {sol.points:,} configurations, "
           f"{si(sol.solve_time_s, 's')})", evaluation_text(sol.config, sol.prediction)]
    out += _training_text(sol.training, sol.pareto)
    if sol.alternatives:
        rows = [[c.nodes, c.devices_per_node, c.global_batch, c.collective.value,
                 si(p.iteration_time_s, "s"), f"{p.throughput_samples_per_s:,.0f}",
                 f"{p.efficiency:.1%}"] for c, p in sol.alternatives]
        out.append("runners-up:\n" + table(
            ["nodes", "dev/node", "batch", "collective", "iteration", "samples/s", "eff."], rows))
    return "\n\n".join(out)


def split_doc(sol) -> dict:
    """A hybrid or pipeline CNN plan (`planner.search.strategy.SplitSolution`)."""
    return {"strategy": sol.strategy, "status": sol.status, "config": sol.config,
            "plan": sol.plan, "prediction": {**sol.prediction, **(sol.training or {})},
            "objective": sol.objective, "data_parallel": sol.data_parallel,
            "search": sol.search}


def split_text(sol) -> str:
    c, p = sol.config, sol.prediction
    head = (f"status: {sol.status} ({sol.strategy}; {sol.search['candidates']:,} points, "
            f"{sol.search['inner_solves']} solved by CP-SAT, the rest pruned by bound)")
    where = (f"{c['nodes']} nodes x {c['devices_per_node']} devices = {c['devices']} devices, "
             f"global batch {c['global_batch']}, {c['collective']}")
    if "layers" in sol.plan:
        where += f", local batch {c['local_batch']}"
        rows = [[l["name"], l["mode"], l["degree"], si(l["compute_time_s"], "s"),
                 si(l["communication_time_s"], "s")]
                for l in sol.plan["layers"] if l["compute_time_s"] or l["communication_time_s"]]
        plan = "layers:\n" + table(["layer", "mode", "degree", "compute", "communication"], rows)
    else:
        where += (f", {c['stages']} stages x {c['replicas']} replicas, {c['micro_batches']} "
                  f"micro-batches of {c['micro_batch']}")
        rows = [[j, f"{s['layers'][0]} .. {s['layers'][-1]}", len(s["layers"]), s["devices"],
                 si(s["time_s"], "s"), si(s["memory_bytes"], "B")]
                for j, s in enumerate(sol.plan["stages"])]
        plan = "stages:\n" + table(["stage", "layers", "count", "devices", "time/micro-batch",
                                      "memory"], rows)
    pairs = [("config", where), ("iteration time", si(p["iteration_time_s"], "s")),
             ("throughput", f"{p['throughput_samples_per_s']:,.1f} samples/s"),
             ("compute", si(p["compute_time_s"], "s")),
             ("communication", f"{si(p['communication_time_s'], 's')} "
                               f"({si(p['exposed_communication_time_s'], 's')} exposed)"),
             ("memory/device", f"{si(p['memory_bytes_per_device'], 'B')} of "
                               f"{si(p['memory_capacity_bytes'], 'B')}"),
             ("speed-up", f"{p['speedup']:.2f} x (efficiency {p['efficiency']:.1%})")]
    if "bubble_fraction" in p:
        pairs.insert(2, ("pipeline bubble", f"{p['bubble_fraction']:.1%}"))
    if sol.training:
        pairs.append(_time_to_train_pair(sol.training))
    base = sol.data_parallel
    if base is not None:
        bc = base["config"]
        pairs.append(("best data parallel", f"{si(base['iteration_time_s'], 's')} on "
                                            f"{bc['devices']} devices (objective "
                                            f"{sol.objective['value'] / base['objective_value']:.3f}"
                                            " x of it here)"))
    else:
        pairs.append(("best data parallel", "none fits in memory"))
    return "\n\n".join([head, key_values(pairs), plan])


def transformer_doc(m) -> dict:
    return {"name": m.name, "kind": "transformer", "description": m.description,
            "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
            "ffn_hidden": m.ffn_hidden, "ffn_kind": m.ffn_kind, "seq_len": m.seq_len,
            "vocab": m.vocab, "experts": m.experts, "top_k": m.top_k, "params": m.params(),
            "layer_params": m.layer_params(), "embedding_params": m.embedding_params(),
            "model_flops_per_sequence": m.model_flops()}


def hybrid_doc(plan, pred: dict, g: int) -> dict:
    return {"config": plan.to_json(g), "prediction": pred}


def hybrid_solution_doc(sol, g: int) -> dict:
    """The solve document of a transformer search (training keys join the prediction)."""
    return {"status": sol.status, "objective": sol.objective, "config": sol.plan.to_json(g),
            "prediction": {**sol.prediction, **(sol.training or {})},
            **({"pareto": sol.pareto} if sol.pareto is not None else {}),
            "search": {"rows": sol.rows, "build_time_s": sol.build_time_s,
                       "solve_time_s": sol.solve_time_s, "gap": sol.gap}}


def hybrid_solution_text(sol, g: int) -> str:
    return "\n".join([f"status: {sol.status} (CP-SAT, {sol.rows:,} configurations, "
                      f"{si(sol.solve_time_s, 's')})", hybrid_text(sol.plan, sol.prediction, g),
                      *_training_text(sol.training, sol.pareto)])


def hybrid_text(plan, pred: dict, g: int) -> str:
    cfg = plan.to_json(g)
    split = (f"{plan.devices} devices ({cfg['nodes']} nodes): tp {plan.tp} x pp {plan.pp}"
             + (f" (x{plan.interleave} interleaved)" if plan.interleave > 1 else "")
             + f" x dp {plan.dp}; micro-batch {plan.micro_batch} x {plan.accumulation} "
             f"accumulation, global batch {plan.global_batch}")
    opts = (f"recompute {plan.recompute}, sequence parallel "
            f"{'on' if plan.sequence_parallel else 'off'}, ZeRO {plan.zero}, {plan.schedule}, "
            f"overlap {'on' if plan.overlap else 'off'}, flash attention "
            f"{'on' if plan.flash_attention else 'off'}")
    times = ", ".join(f"{k} {si(v, 's')}" for k, v in pred["time_breakdown"].items())
    mem = ", ".join(f"{k} {si(v, 'B')}" for k, v in pred["memory_breakdown"].items())
    return key_values([
        ("plan", split),
        ("options", opts),
        ("iteration time", f"{si(pred['iteration_time_s'], 's')} ({times})"),
        ("throughput", f"{pred['tokens_per_s']:,.0f} tokens/s, "
                       f"{pred['samples_per_s']:,.2f} samples/s"),
        ("per device", f"{pred['tflops_per_device_model']:.1f} TFLOP/s model, "
                       f"{pred['tflops_per_device_hardware']:.1f} hardware; MFU "
                       f"{pred['mfu']:.1%}, HFU {pred['hfu']:.1%}"),
        ("memory/device", f"{si(pred['memory_bytes_per_device'], 'B')} of "
                          f"{si(pred['memory_capacity_bytes'], 'B')} ({mem})"
                          + ("" if pred["fits_in_memory"] else "  DOES NOT FIT")),
    ])


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


def derive_text(formulas, fmt: str) -> str:
    import sympy as sp

    from planner.formulas import glossary

    blocks = []
    for f in formulas:
        if fmt == "latex":
            body = f"% {f.name}: {f.description}\n{f.name} = {sp.latex(f.expression)}"
        elif fmt == "python":
            args = ", ".join(sorted(s.name for s in f.expression.free_symbols))
            body = f"def {f.name}({args}):\n    return {sp.pycode(f.expression)}"
        else:
            body = f"{f.name} = {sp.sstr(f.expression)}"
        gl = glossary(f)
        lines = [f"    {k} = {v['value']:.6g} {v['unit']}  ({v['description']})"
                 for k, v in gl.items()]
        value = f.value
        tail = f"  value = {value:.6g} {f.unit}" if value is not None else ""
        note = f"  [{f.note}]" if f.note else ""
        prefix = "# " if fmt == "python" else ("% " if fmt == "latex" else "")
        blocks.append("\n".join([body, prefix + f"where{note}{tail}"]
                                + [prefix + line for line in lines]))
    return "\n\n".join(blocks)


def sweep_doc(points, skipped) -> dict:
    return {"points": [{**p.config.to_json(), "bandwidth_GBps": p.bandwidth_GBps,
                        **p.prediction.to_json(), **(p.training or {})} for p in points],
            "skipped_nodes": skipped}


def _train_cells(training: dict) -> list[str]:
    cost = training.get("cost_usd")
    return [duration(training["time_to_train_s"]), "n/a" if cost is None else f"{cost:,.0f}"]


def sweep_text(points, skipped) -> str:
    show_bw = len({p.bandwidth_GBps for p in points}) > 1
    show_train = any(p.training for p in points)
    rows = []
    for p in points:
        pred = p.prediction
        row = [p.config.nodes, p.config.devices, p.config.global_batch, p.config.local_batch]
        row += [f"{p.bandwidth_GBps:g}"] if show_bw else []
        row += [si(pred.iteration_time_s, "s"), si(pred.compute_time_s, "s"),
                si(pred.communication_time_s, "s"), si(pred.exposed_communication_time_s, "s"),
                f"{pred.throughput_samples_per_s:,.0f}", f"{pred.speedup:.2f}",
                f"{pred.efficiency:.1%}"]
        row += _train_cells(p.training) if show_train else []
        rows.append(row + ["yes" if pred.fits_memory else "NO"])
    head = ["nodes", "devices", "batch", "local"] + (["GB/s"] if show_bw else [])
    head += ["iteration", "compute", "comm", "exposed", "samples/s", "speed-up", "eff."]
    head += (["to train", "cost USD"] if show_train else []) + ["fits"]
    text = table(head, rows)
    if skipped:
        text += f"\n(skipped node counts that do not divide the batch: {skipped})"
    return text


def _scaling(pts) -> dict[int, float]:
    """Tokens/s per device at each point over that of the smallest point with a plan (1.0 =
    linear scaling from there), keyed by the point's index."""
    ok = [(i, p.solution) for i, p in enumerate(pts) if p.solution]
    base = min(ok, key=lambda x: x[1].plan.devices)[1]
    rate = base.prediction["tokens_per_s"] / base.plan.devices
    return {i: s.prediction["tokens_per_s"] / s.plan.devices / rate for i, s in ok}


def transformer_sweep_doc(pts) -> dict:
    scaling = _scaling(pts)
    points, skipped = [], []
    for i, p in enumerate(pts):
        if p.solution is None:
            skipped.append({"nodes": p.nodes, "global_batch": p.global_batch,
                            "bandwidth_GBps": p.bandwidth_GBps, "reason": p.reason})
            continue
        s = p.solution
        points.append({"nodes": p.nodes, "bandwidth_GBps": p.bandwidth_GBps,
                       "scaling_efficiency": scaling[i],
                       "config": s.plan.to_json(s.plan.devices // p.nodes),
                       "prediction": {**s.prediction, **(s.training or {})}})
    return {"points": points, "skipped": skipped}


def transformer_sweep_text(pts) -> str:
    scaling = _scaling(pts)
    show_bw = len({p.bandwidth_GBps for p in pts}) > 1
    show_train = any(p.solution and p.solution.training for p in pts)
    rows, skipped = [], []
    for i, p in enumerate(pts):
        if p.solution is None:
            skipped.append(f"  {p.nodes} nodes, batch {p.global_batch}"
                           + (f", {p.bandwidth_GBps:g} GB/s" if show_bw else "")
                           + f": {p.reason}")
            continue
        plan, pred = p.solution.plan, p.solution.prediction
        row = [p.nodes, plan.devices, plan.global_batch] + (
            [f"{p.bandwidth_GBps:g}"] if show_bw else [])
        row += [f"{plan.tp}x{plan.pp}" + (f"(v{plan.interleave})" if plan.interleave > 1 else "")
                + f"x{plan.dp}", plan.micro_batch, si(pred["iteration_time_s"], "s"),
                f"{pred['tokens_per_s']:,.0f}", f"{pred['mfu']:.1%}", f"{scaling[i]:.1%}"]
        row += _train_cells(p.solution.training) if show_train else []
        rows.append(row)
    head = ["nodes", "devices", "batch"] + (["GB/s"] if show_bw else []) + [
        "tp x pp x dp", "micro", "iteration", "tokens/s", "MFU", "scaling"]
    head += ["to train", "cost USD"] if show_train else []
    text = table(head, rows)
    if skipped:
        text += "\nno plan:\n" + "\n".join(skipped)
    return text


def calibration_doc(results, skipped, fitted: dict, specs: dict, stats: dict) -> dict:
    return {
        "rows": [
            {"row": r.run.row, "label": r.run.label, "role": r.role, "model": r.run.model,
             "system": r.run.system, "devices": r.run.devices,
             "global_batch": r.run.global_batch, "precision": r.run.precision.value,
             "measured_samples_per_s": r.run.measured, "predicted_samples_per_s": r.predicted,
             "error": r.error, "citation": r.run.citation}
            for r in results
        ],
        "skipped": [{"row": s.row, "label": s.label, "reason": s.reason} for s in skipped],
        "efficiency_compute": [
            {"device": d, "spec": specs[d], "fitted": v} for d, v in fitted.items()
        ],
        "summary": stats,
    }


def calibration_text(results, skipped, fitted: dict, specs: dict, stats: dict) -> str:
    rows = [[r.run.row, r.run.label[:48], r.role, r.run.system, f"{r.run.measured:.0f}",
             f"{r.predicted:.0f}", f"{100 * r.error:+.1f}%"] for r in results]
    out = [table(["row", "run", "role", "system", "measured/s", "predicted/s", "error"], rows)]
    out.append("\n" + table(["device", "efficiency.compute in spec", "fitted"],
                            [[d, f"{specs[d]:.3f}", f"{v:.3f}"] for d, v in fitted.items()]))
    held = stats["mape_held_out_pct"]
    out.append(f"\nMAPE {stats['mape_all_pct']:.1f}% over {stats['rows']} rows"
               + (f"; {held:.1f}% over the {stats['held_out_rows']} held-out rows"
                  if held is not None else ""))
    if skipped:
        out.append(f"skipped {len(skipped)} rows (--format json lists why)")
    return "\n".join(out)
