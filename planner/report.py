"""What each command shows: JSON documents and text for people, from typed results."""

from __future__ import annotations

from planner.render import key_values, si, table
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
    return {
        "status": sol.status,
        "config": sol.config.to_json(),
        "prediction": sol.prediction.to_json(),
        "objective": sol.objective,
        "solve_time_s": sol.solve_time_s,
        "build_time_s": sol.build_time_s,
        "search": {"points": sol.points, "branches": sol.branches, "gap": sol.gap},
        "alternatives": [{"config": c.to_json(), "prediction": p.to_json()}
                         for c, p in sol.alternatives],
    }


def solution_text(sol) -> str:
    out = [f"status: {sol.status} (CP-SAT, {sol.points:,} configurations, "
           f"{si(sol.solve_time_s, 's')})", evaluation_text(sol.config, sol.prediction)]
    if sol.alternatives:
        rows = [[c.nodes, c.devices_per_node, c.global_batch, c.collective.value,
                 si(p.iteration_time_s, "s"), f"{p.throughput_samples_per_s:,.0f}",
                 f"{p.efficiency:.1%}"] for c, p in sol.alternatives]
        out.append("runners-up:\n" + table(
            ["nodes", "dev/node", "batch", "collective", "iteration", "samples/s", "eff."], rows))
    return "\n\n".join(out)
