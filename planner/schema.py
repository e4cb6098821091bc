"""JSON Schema (draft 2020-12) of the JSON documents the commands print: `planner schema`.

One schema per command; `evaluate` and `solve` accept either the data-parallel (CNN) or the
hybrid (transformer) form. Tests validate real outputs against these, so a key added to an
output without its schema fails CI.
"""

from __future__ import annotations

NUM = {"type": "number"}
INT = {"type": "integer"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}


def obj(props: dict, required: list[str] | None = None, extra: bool = False) -> dict:
    return {"type": "object", "properties": props,
            "required": sorted(props) if required is None else required,
            "additionalProperties": extra}


def _envelope(command: str, body: dict, required: list[str]) -> dict:
    props = {"schema_version": {"const": 1}, "command": {"const": command}, **body}
    return obj(props, ["schema_version", "command", *required])


DP_CONFIG = obj({"nodes": INT, "devices_per_node": INT, "devices": INT, "global_batch": INT,
                 "local_batch": INT, "collective": STR, "overlap": BOOL})
DP_PREDICTION = obj({
    "iteration_time_s": NUM, "throughput_samples_per_s": NUM, "compute_time_s": NUM,
    "communication_time_s": NUM, "exposed_communication_time_s": NUM, "optimizer_time_s": NUM,
    "memory_bytes_per_device": NUM, "memory_capacity_bytes": NUM, "fits_memory": BOOL,
    "memory_breakdown": obj({k: NUM for k in ("weights", "gradients", "optimizer",
                                              "activations")}),
    "speedup": NUM, "efficiency": NUM,
    # with --critical-batch (time to train)
    "steps": NUM, "samples": NUM, "time_to_train_s": NUM, "cost_usd": NUM,
}, required=["iteration_time_s", "throughput_samples_per_s", "memory_bytes_per_device",
             "speedup", "efficiency"])
HYBRID_CONFIG = obj({
    "devices": INT, "nodes": INT, "devices_per_node": INT, "tp": INT, "pp": INT, "dp": INT,
    "micro_batch": INT, "global_batch": INT, "interleave": INT,
    "recompute": {"enum": ["none", "selective", "full"]}, "sequence_parallel": BOOL,
    "zero": {"enum": [0, 1, 2, 3]}, "schedule": {"enum": ["1f1b", "gpipe"]}, "overlap": BOOL,
    "flash_attention": BOOL, "gradient_accumulation": INT})
HYBRID_PREDICTION = obj({
    "iteration_time_s": NUM, "samples_per_s": NUM, "tokens_per_s": NUM,
    "model_flops_per_iteration": NUM, "hardware_flops_per_iteration": NUM,
    "tflops_per_device_model": NUM, "tflops_per_device_hardware": NUM, "mfu": NUM, "hfu": NUM,
    "time_breakdown": obj({k: NUM for k in ("compute", "tp_comm", "pp_bubble", "pp_comm",
                                            "dp_comm_exposed", "optimizer")}),
    "memory_bytes_per_device": NUM, "memory_capacity_bytes": NUM, "fits_in_memory": BOOL,
    "memory_breakdown": obj({k: NUM for k in ("weights", "gradients", "optimizer",
                                              "activations")}),
    # solve with --critical-batch (time to train)
    "steps": NUM, "samples": NUM, "tokens": NUM, "time_to_train_s": NUM, "cost_usd": NUM,
}, required=["iteration_time_s", "samples_per_s", "tokens_per_s", "model_flops_per_iteration",
             "hardware_flops_per_iteration", "tflops_per_device_model",
             "tflops_per_device_hardware", "mfu", "hfu", "time_breakdown",
             "memory_bytes_per_device", "memory_capacity_bytes", "fits_in_memory",
             "memory_breakdown"])
OBJECTIVE = obj({"name": STR, "value": NUM, "solver_value": NUM, "unit": STR},
                required=["name", "value", "unit"])


def pareto(config: dict) -> dict:
    return {"type": "array", "items": obj({"config": config, "time_to_train_s": NUM,
                                           "cost_usd": NUM, "steps": NUM})}


SPLIT_CONFIG = obj({"nodes": INT, "devices_per_node": INT, "devices": INT, "global_batch": INT,
                    "local_batch": INT, "stages": INT, "replicas": INT, "micro_batch": INT,
                    "micro_batches": INT, "collective": STR, "overlap": BOOL},
                   required=["nodes", "devices_per_node", "devices", "global_batch",
                             "collective", "overlap"])
SPLIT_PREDICTION = {**DP_PREDICTION, "properties": {
    **DP_PREDICTION["properties"], "activation_communication_time_s": NUM,
    "bubble_fraction": NUM, "stage_time_s": NUM, "p2p_time_s": NUM}}
LAYER_PLAN = obj({"name": STR, "mode": {"enum": ["data", "model"]}, "degree": INT,
                  "compute_time_s": NUM, "communication_time_s": NUM})
STAGE_PLAN = obj({"layers": {"type": "array", "items": STR}, "devices": INT, "time_s": NUM,
                  "memory_bytes": NUM, "memory_breakdown": obj({k: NUM for k in (
                      "weights", "gradients", "optimizer", "activations")})})
SPLIT_PLAN = {"oneOf": [obj({"layers": {"type": "array", "items": LAYER_PLAN}}),
                        obj({"stages": {"type": "array", "items": STAGE_PLAN, "minItems": 2}})]}


def _evaluate() -> dict:
    spec = {"model": STR, "hardware": STR, "line": INT}
    dp = _envelope("evaluate", {**spec, "config": DP_CONFIG, "prediction": DP_PREDICTION},
                   ["config", "prediction"])
    hybrid = _envelope("evaluate", {**spec, "config": HYBRID_CONFIG,
                                    "prediction": HYBRID_PREDICTION}, ["config", "prediction"])
    error = _envelope("evaluate", {"line": INT, "error": STR}, ["line", "error"])
    return {"oneOf": [dp, hybrid, error]}


def _solve() -> dict:
    spec = {"model": STR, "hardware": STR, "status": {"enum": ["optimal", "feasible"]},
            "objective": OBJECTIVE}
    dp = _envelope("solve", {
        **spec, "strategy": {"const": "data"}, "config": DP_CONFIG, "prediction": DP_PREDICTION,
        "pareto": pareto(DP_CONFIG),
        "solve_time_s": NUM, "build_time_s": NUM,
        "search": obj({"points": INT, "branches": INT, "gap": NUM}),
        "alternatives": {"type": "array", "items": obj({"config": DP_CONFIG,
                                                        "prediction": DP_PREDICTION})},
    }, ["status", "config", "prediction", "objective", "search"])
    hybrid = _envelope("solve", {
        **spec, "config": HYBRID_CONFIG, "prediction": HYBRID_PREDICTION,
        "pareto": pareto(HYBRID_CONFIG),
        "search": obj({"rows": INT, "build_time_s": NUM, "solve_time_s": NUM, "gap": NUM}),
    }, ["status", "config", "prediction", "objective", "search"])
    split = _envelope("solve", {
        **spec, "strategy": {"enum": ["hybrid", "pipeline"]}, "config": SPLIT_CONFIG,
        "plan": SPLIT_PLAN, "prediction": SPLIT_PREDICTION,
        "data_parallel": {"oneOf": [{"type": "null"}, obj({
            "config": DP_CONFIG, "iteration_time_s": NUM, "objective_value": NUM})]},
        "search": obj({"inner_solves": INT, "candidates": INT, "pruned": INT, "time_s": NUM}),
    }, ["strategy", "status", "config", "plan", "prediction", "objective", "data_parallel"])
    return {"oneOf": [dp, hybrid, split]}


def _limits() -> dict:
    nullable = {"type": ["number", "null"]}
    return _envelope("limits", {
        "model": STR, "hardware": STR, "optimal_nodes": NUM, "optimal_nodes_reason": STR,
        "max_speedup": NUM, "comm_bound_from_nodes": nullable, "local_batch_min": NUM,
        "max_useful_nodes": INT, "efficiency_at_nodes": obj({"nodes": NUM, "efficiency": NUM}),
        "required_bandwidth_GBps": nullable, "available_bandwidth_GBps": NUM,
        "target_efficiency": NUM, "local_efficiency": NUM, "single_device_time_s": NUM,
        "iteration_time_at_optimum_s": NUM, "global_batch": INT, "devices_per_node": INT,
        "collective": STR, "overlap": BOOL,
        "time_to_train": obj({"critical_batch": NUM, "nodes": NUM, "global_batch": NUM,
                              "local_batch": NUM, "time_per_min_step_s": NUM,
                              "nodes_chosen": BOOL, "nodes_max": INT, "reason": STR}),
    }, ["optimal_nodes", "max_speedup", "comm_bound_from_nodes", "max_useful_nodes",
        "required_bandwidth_GBps", "efficiency_at_nodes"])


def _sweep() -> dict:
    point = obj({**DP_CONFIG["properties"], **DP_PREDICTION["properties"],
                 "bandwidth_GBps": NUM},
                required=[*DP_CONFIG["required"], "bandwidth_GBps", "iteration_time_s",
                          "throughput_samples_per_s", "speedup", "efficiency"])
    dp = _envelope("sweep", {"model": STR, "hardware": STR,
                             "points": {"type": "array", "items": point},
                             "skipped_nodes": {"type": "array", "items": INT}},
                   ["points", "skipped_nodes"])
    hybrid_point = obj({"nodes": INT, "bandwidth_GBps": NUM, "scaling_efficiency": NUM,
                        "config": HYBRID_CONFIG, "prediction": HYBRID_PREDICTION})
    skipped = obj({"nodes": INT, "global_batch": INT, "bandwidth_GBps": NUM, "reason": STR})
    hybrid = _envelope("sweep", {"model": STR, "hardware": STR,
                                 "points": {"type": "array", "items": hybrid_point},
                                 "skipped": {"type": "array", "items": skipped}},
                       ["points", "skipped"])
    return {"oneOf": [dp, hybrid]}


def _derive() -> dict:
    symbol = obj({"value": NUM, "unit": STR, "description": STR, "latex": STR})
    # latex: the right-hand side; latex_equation: a complete equation / align environment
    formula = obj({"name": STR, "description": STR, "unit": STR, "expression": STR,
                   "latex": STR, "latex_lhs": STR, "latex_equation": STR, "python": STR,
                   "value": {"type": ["number", "null"]}, "note": STR,
                   "symbols": {"type": "object", "additionalProperties": symbol}})
    return _envelope("derive", {"model": STR, "hardware": STR,
                                "formulas": {"type": "array", "items": formula}}, ["formulas"])


def _show() -> dict:
    # Hardware specs are dumped as written (their YAML keys, with units), so nested spec
    # objects are open; the top-level keys of each kind are fixed.
    spec = {"type": "object"}
    layer = obj({"name": STR, "type": STR, "block": STR, "output_shape": {
        "type": "array", "items": INT}, "params": INT, "forward_flops_per_sample": INT,
        "activation_elements_per_sample": INT})
    fractions = obj({"flops_fraction": NUM, "params_fraction": NUM})
    cnn = _envelope("show", {
        "name": STR, "description": STR, "input_shape": {"type": "array", "items": INT},
        "params": INT, "macs_per_sample": INT, "forward_flops_per_sample": INT,
        "layers": {"type": "array", "items": layer},
        "share": obj({"conv": fractions, "fc": fractions})}, ["name", "params", "layers"])
    transformer = _envelope("show", {
        "name": STR, "kind": {"const": "transformer"}, "description": STR,
        **{k: INT for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len",
                            "vocab", "experts", "top_k", "params", "layer_params",
                            "embedding_params", "model_flops_per_sequence")},
        "ffn_kind": STR}, ["name", "kind", "params"])
    system = _envelope("show", {
        "kind": {"const": "system"}, "name": STR, "description": STR, "devices_per_node": INT,
        "nics_per_node": INT, "device": spec, "intra_node": spec, "inter_node": spec},
        ["kind", "name", "device", "intra_node", "inter_node"])
    device = _envelope("show", {
        "kind": {"const": "device"}, "name": STR, "description": STR,
        "peak_tflops": {"type": "object", "additionalProperties": NUM}, "memory_GiB": NUM,
        "memory_bandwidth_GBps": NUM, "efficiency": spec,
        "price_per_hour_usd": {"type": ["number", "null"]}, "default_precision": STR,
        "sources": {"type": "object", "additionalProperties": STR}},
        ["kind", "name", "peak_tflops", "memory_GiB"])
    link = _envelope("show", {
        "kind": {"const": "link"}, "name": STR, "description": STR, "bandwidth_GBps": NUM,
        "latency_us": NUM, "efficiency": NUM,
        "sources": {"type": "object", "additionalProperties": STR}},
        ["kind", "name", "bandwidth_GBps", "latency_us"])
    return {"oneOf": [cnn, transformer, system, device, link]}


def _list() -> dict:
    names = {"type": "array", "items": STR}
    return {"oneOf": [
        _envelope("list", {"models": names}, ["models"]),
        _envelope("list", {"hardware": obj({"systems": names, "devices": names,
                                            "links": names})}, ["hardware"])]}


def _calibrate() -> dict:
    nullable = {"type": ["number", "null"]}
    row = obj({"row": INT, "label": STR, "role": {"enum": ["fit", "held-out"]}, "model": STR,
               "system": STR, "devices": INT, "global_batch": INT, "precision": STR,
               "measured_samples_per_s": NUM, "predicted_samples_per_s": NUM, "error": NUM,
               "citation": STR})
    return _envelope("calibrate", {
        "rows": {"type": "array", "items": row},
        "skipped": {"type": "array", "items": obj({"row": INT, "label": STR, "reason": STR})},
        "efficiency_compute": {"type": "array", "items": obj({"device": STR, "spec": NUM,
                                                              "fitted": NUM})},
        "summary": obj({"rows": INT, "fit_rows": INT, "held_out_rows": INT,
                        "mape_all_pct": NUM, "mape_held_out_pct": nullable}),
    }, ["rows", "skipped", "efficiency_compute", "summary"])


def schemas() -> dict:
    """{command: JSON Schema}."""
    out = {"evaluate": _evaluate(), "solve": _solve(), "limits": _limits(), "sweep": _sweep(),
           "derive": _derive(), "show": _show(), "list": _list(), "calibrate": _calibrate()}
    for name, sch in out.items():
        sch["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        sch["title"] = f"planner {name} --format json"
    return out
