"""What each command shows: JSON documents and text for people, from typed results."""

from __future__ import annotations

from planner.render import key_values, si, table
from planner.report_plans import (  # noqa: F401  (the plan renderers, one for every family)
    config_text,
    evaluation_doc,
    evaluation_text,
    solution_doc,
    solution_text,
    split_doc,
    split_text,
    sweep_doc,
    sweep_text,
)
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


def transformer_doc(m) -> dict:
    return {"name": m.name, "kind": "transformer", "description": m.description,
            "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
            "ffn_hidden": m.ffn_hidden, "ffn_kind": m.ffn_kind, "seq_len": m.seq_len,
            "vocab": m.vocab, "experts": m.experts, "top_k": m.top_k, "params": m.params(),
            "layer_params": m.layer_params(), "embedding_params": m.embedding_params(),
            "model_flops_per_sequence": m.model_flops()}


def transformer_details(m) -> list[tuple[str, str]]:
    """What `show model` prints beyond transformer_doc: the architecture as understood (today's
    keys), the layer kinds with their counts, and active parameters."""
    pairs = [("head_dim", f"{m.head_dim} (q_dim {m.q_dim:,})"),
             ("norm", m.norm + (" + post-norms" if m.post_norms else "")
              + (" + qk-norm" if m.qk_norm else "")),
             ("embeddings", "tied" if m.tied_embeddings else "untied")]
    if m.mla:
        a = m.mla
        pairs.append(("mla", f"q_lora_rank {a.q_lora_rank}, kv_lora_rank {a.kv_lora_rank}, "
                             f"qk nope/rope {a.qk_nope_head_dim}/{a.qk_rope_head_dim}, "
                             f"v {a.v_head_dim}"))
    if m.experts > 1:
        moe = f"{m.experts} experts of {m.ffn_hidden:,}, top {m.top_k}"
        if m.shared_experts:
            moe += (f", {m.shared_experts} shared of "
                    f"{m.shared_expert_ffn_hidden or m.ffn_hidden:,}")
        if m.first_dense_layers:
            moe += f", first {m.first_dense_layers} layers dense ({m.dense_ffn_hidden:,})"
        pairs.append(("moe", moe + (", router bias" if m.router_bias else "")))
    if m.sliding_window:
        pairs.append(("sliding window", f"{m.sliding_window:,} tokens, pattern "
                                        f"{m.sliding_window_pattern}"))
    if m.attention_sinks:
        pairs.append(("attention sinks", "one per head per layer"))
    if m.mamba:
        mb = m.mamba
        pairs.append(("mamba-2", f"state {mb.state_size}, {mb.heads} heads of {mb.head_dim}, "
                                 f"{mb.n_groups} groups, conv {mb.conv_kernel}, chunk "
                                 f"{mb.chunk_size}"))
    pairs.append(("layer kinds", ", ".join(f"{n} {k.name} ({m.kind_params(k):,} params)"
                                           for k, n in m.layer_kinds())))
    pairs.append(("active params", f"{m.active_params():,} (layers; embeddings excluded)"))
    return pairs


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
    """`planner derive` as LaTeX (one complete environment), a Python module that runs as
    printed, or text; each renders any family's `planner.formulas.Derived`."""
    from planner import formulas as der

    if fmt == "latex":
        return der.latex_block(formulas)
    if fmt == "python":
        return der.python_module(formulas).rstrip("\n")
    return "\n\n".join(der.text_block(f) for f in formulas)


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
