"""What `show` prints: a model's layers and totals (CNN or transformer) and a hardware spec, as
JSON documents and text for people."""

from __future__ import annotations

from planner.report.render import key_values, si, table
from planner.spec.cluster import Cluster
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


def hardware_doc(spec: Device | Link | System | Cluster) -> dict:
    """A spec as understood, every part written out; `planner.catalog` loads it back (a
    system's device and links inline, `inter_node` a link with `nics_per_node` beside it; a
    cluster's pools by their systems' names, with the nodes a job can have)."""
    if isinstance(spec, Cluster):
        between = (None if spec.between is None else
                   {"link": spec.between.name, "count": spec.between_count})
        pools = [{"name": p.name, "system": p.system.name, "nodes": p.nodes,
                  "price_per_device_hour_usd": p.price_per_device_hour,
                  "partition": p.partition} for p in spec.pools]
        return {"kind": "cluster", "name": spec.name, "description": spec.description,
                "pools": [{k: v for k, v in p.items() if v is not None} for p in pools],
                **({"between_pools": between} if between else {}), "sources": spec.sources}
    if isinstance(spec, System):
        doc = {"kind": "system", "name": spec.name, "description": spec.description,
               "devices_per_node": spec.devices_per_node,
               "devices_per_scale_up_domain": spec.devices_per_scale_up_domain,
               "nics_per_node": spec.nics_per_node,
               "device": spec.device.model_dump(mode="json"),
               "intra_node": spec.intra_node.model_dump(mode="json"),
               "inter_node": spec.inter_node.model_dump(mode="json")}
        if spec.scale_up is not None:
            doc["scale_up"] = spec.scale_up.model_dump(mode="json")
        if spec.host_link is not None:
            doc["host_offload"] = {"link": spec.host_link.model_dump(mode="json"),
                                   "devices_per_link": spec.devices_per_host_link}
        return doc
    return spec.model_dump(mode="json")


def hardware_text(spec: Device | Link | System | Cluster) -> str:
    if isinstance(spec, Cluster):
        pairs = [("cluster", f"{spec.name}: {spec.description}".rstrip(": "))]
        for p in spec.pools:
            price = (f", ${p.price_per_device_hour:g} per device-hour"
                     if p.price_per_device_hour else ", no price (give price_per_device_hour_usd)")
            part = f", partition {p.partition}" if p.partition else ""
            pairs.append((f"pool {p.name}", f"{p.nodes} x {p.system.name} ({p.devices} "
                                            f"{p.system.device.name}){price}{part}"))
        if spec.between is None:
            pairs.append(("between pools", "one fabric: each pool's own NICs"))
        else:
            link, n = spec.between, spec.between_count
            pairs.append(("between pools", f"{n} x {link.name} per node ({link.bandwidth_GBps:g} "
                                           f"GB/s nominal, {link.bandwidth_Bps / 1e9:.3g} GB/s "
                                           f"achievable, {link.latency_us:g} us each): "
                                           f"{n * link.bandwidth_Bps / 1e9:.4g} GB/s achievable "
                                           "per node, never above a pool's own NICs"))
        return key_values(pairs + [(f"source ({k})", v) for k, v in spec.sources.items()])
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
                 ("peak TFLOP/s", peaks),
                 ("memory", f"{spec.memory_GiB:g} GiB"
                  + (f" ({spec.memory_GiB - spec.runtime_reserve_GiB:g} GiB usable: "
                     f"{spec.runtime_reserve_GiB:g} GiB runtime reserve)"
                     if spec.runtime_reserve_GiB else "")),
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
        if m.moe_latent:
            moe += f", latent {m.moe_latent:,} (LatentMoE)"
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
    if m.mtp_layers:
        depth = ", ".join(k.name for k in m.mtp_kinds())
        depths = f"{m.mtp_layers} depth" + ("s" if m.mtp_layers > 1 else "")
        pairs.append(("multi-token prediction", f"{depths} of {depth} "
                                                f"({m.mtp_params():,} params)"))
    return pairs
