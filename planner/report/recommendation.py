"""A recommendation model as `show` prints it, and the placement of its tables (`solve`) as a
JSON document and as text."""

from __future__ import annotations

from planner.report.render import span, table

MODE_WORDS = {"table": "table-wise", "column": "column-wise", "row": "row-wise",
              "data": "data parallel"}


def recommendation_doc(m) -> dict:
    return {"name": m.name, "kind": "recommendation", "description": m.description,
            "tables": len(m.tables), "embedding_rows": sum(t.rows for t in m.tables),
            "embedding_params": m.embedding_params(),
            "embedding_bytes": m.embedding_params() * m.value_bytes,
            "lookups_per_sample": sum(t.pooling for t in m.tables),
            "dense_params": m.dense_params(),
            "dense_flops_per_sample": m.dense_flops_per_sample(),
            "interaction": m.interaction, "global_batch": m.global_batch}


def recommendation_text(m) -> str:
    doc = recommendation_doc(m)
    head = [(k, f"{v:,}" if isinstance(v, int) else str(v)) for k, v in doc.items()]
    rows = [[t.name, f"{t.rows:,}", str(t.dim), f"{t.pooling:g}",
             f"{t.rows * t.dim * m.value_bytes / 2**30:.3g}"] for t in m.tables]
    width = max(len(k) for k, _ in head)
    return "\n".join([*(f"{k:<{width}}  {v}" for k, v in head), "",
                      table(["table", "rows", "dim", "lookups / sample", "GiB"], rows)])


def placement_doc(p, hardware: str) -> dict:
    """The placement (`planner.search.placement.Placement`) as `solve`'s JSON body."""
    m, pr = p.model, p.priced
    names = [t.name for t in m.tables]
    held: list[list[str]] = [[] for _ in pr.per_device_time_s]
    tables = []
    for i, x in enumerate(p.placed):
        o = x.option
        tables.append({"name": names[i], "mode": o.mode, "shards": o.shards, "dim": o.dim,
                       "devices": list(x.devices)})
        if o.mode in ("table", "column"):
            for s, d in enumerate(x.devices):
                held[d].append(names[i] + (f"[{s}/{o.shards}]" if o.shards > 1 else ""))
    every = [f"{names[i]} ({x.option.mode})" for i, x in enumerate(p.placed)
             if x.option.mode in ("row", "data")]
    return {"model": m.name, "hardware": hardware, "precision": {"name": p.precision.value},
            "status": p.status, "devices": len(pr.per_device_time_s),
            "global_batch": p.global_batch, "tables": tables, "on_every_device": every,
            "per_device": [{"device": d, "tables": held[d], "embedding_time_s": t,
                            "memory_bytes": mem} for d, (t, mem) in enumerate(
                                zip(pr.per_device_time_s, pr.per_device_memory_bytes,
                                    strict=True))],
            "prediction": {"iteration_time_s": pr.iteration_time_s,
                           "embedding_time_s": pr.embedding_time_s,
                           "dense_time_s": pr.dense_time_s,
                           "samples_per_s": p.global_batch / pr.iteration_time_s,
                           "memory_bytes_per_device": max(pr.per_device_memory_bytes),
                           "fits_memory": pr.fits},
            "search": {"solve_time_s": p.solve_time_s, "bound_s": p.bound_s}}


def placement_text(doc: dict) -> str:
    pred = doc["prediction"]
    modes = {}
    for t in doc["tables"]:
        key = MODE_WORDS[t["mode"]] + (f" in {t['shards']}" if t["shards"] > 1 else "")
        modes[key] = modes.get(key, 0) + 1
    lines = [f"status          {doc['status']} (CP-SAT over every table's sharding and device; "
             f"{doc['search']['solve_time_s']:.2f} s)",
             f"placement       {doc['devices']} devices, global batch {doc['global_batch']:,}: "
             + ", ".join(f"{n} {k}" for k, n in modes.items()),
             f"iteration time  {span(pred['iteration_time_s'])} (embeddings on the busiest "
             f"device {span(pred['embedding_time_s'])}, dense layers "
             f"{span(pred['dense_time_s'])})",
             f"throughput      {pred['samples_per_s']:,.0f} samples/s",
             f"memory/device   {pred['memory_bytes_per_device'] / 1e9:.3g} GB at most"]
    if doc["on_every_device"]:
        lines.append(f"on every device {', '.join(doc['on_every_device'])}")
    rows = [[str(d["device"]), f"{d['embedding_time_s'] * 1e3:.3f}",
             f"{d['memory_bytes'] / 1e9:.3g}", ", ".join(d["tables"]) or "-"]
            for d in doc["per_device"]]
    return "\n".join([*lines, "", table(["device", "embedding ms", "GB", "tables"], rows)])
