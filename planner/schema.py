"""JSON Schema (draft 2020-12) of the JSON documents the commands print: `planner schema`.

One schema per command; a plan and its prediction have one form for every model family
(`CONFIG`, `PREDICTION`); `solve` has a second form for the CNN's layer splits and a third
for a cluster of several pools. Tests validate
real outputs against these, so a key added to an output without its schema fails CI.
"""

from __future__ import annotations

from planner import switches

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


# One plan (`planner.plan.Plan`) for every family: a CNN's data-parallel plan has tp = pp = 1
# and names its collective; a transformer's leaves the collective out.
def _switch(sw: switches.Switch) -> dict:
    kind = ({"enum": [None, *sw.values] if sw.optional else list(sw.values)}
            if sw.kind not in (bool, int, float) else
            BOOL if sw.kind is bool else INT if sw.kind is int else NUM)
    return {"type": [kind["type"], "null"]} if sw.optional and "type" in kind else kind


CONFIG = obj({
    "nodes": INT, "devices_per_node": INT, "devices": INT, "tp": INT, "cp": INT, "ep": INT,
    "pp": INT, "dp": INT, "micro_batch": INT, "global_batch": INT, "gradient_accumulation": INT,
    "local_batch": INT, "interleave": INT, "recompute": {"enum": ["none", "selective", "full"]},
    "recompute_layers": {"type": ["integer", "null"]},
    "sequence_parallel": BOOL, "zero": {"enum": [0, 1, 2, 3]},
    "schedule": {"enum": ["1f1b", "gpipe"]}, "collective": STR, "etp": INT,
    **{sw.name: _switch(sw) for sw in switches.SWITCHES}},
    required=["nodes", "devices_per_node", "devices", "tp", "pp", "dp", "micro_batch",
              "global_batch", "gradient_accumulation", "local_batch", "interleave",
              "recompute", "sequence_parallel", "zero", "schedule", "overlap",
              "flash_attention"])
DP_CONFIG = CONFIG  # former names
HYBRID_CONFIG = CONFIG
TRAINING_KEYS = {"steps": NUM, "samples": NUM, "tokens": NUM, "time_to_train_s": NUM,
                 "cost_usd": NUM}
# One prediction (`planner.prediction.Prediction`) for every family; a family leaves out what
# it does not model (a transformer: speed-up; a CNN: tokens, FLOPs, MFU).
PREDICTION = obj({
    "iteration_time_s": NUM, "samples_per_s": NUM, "throughput_samples_per_s": NUM,
    "tokens_per_s": NUM, "compute_time_s": NUM, "communication_time_s": NUM,
    "exposed_communication_time_s": NUM, "optimizer_time_s": NUM,
    "time_breakdown": obj({k: NUM for k in ("compute", "tp_comm", "cp_comm", "ep_comm", "offload",
                                            "pp_bubble", "pp_comm", "dp_comm_exposed",
                                            "comm_exposed", "optimizer", "host_sync")},
                          required=["compute", "optimizer"]),
    "memory_bytes_per_device": NUM, "memory_capacity_bytes": NUM, "fits_memory": BOOL,
    "fits_in_memory": BOOL,
    "memory_breakdown": obj({k: NUM for k in ("weights", "gradients", "optimizer",
                                              "activations")}),
    "speedup": NUM, "efficiency": NUM,
    "model_flops_per_iteration": NUM, "hardware_flops_per_iteration": NUM,
    "tflops_per_device_model": NUM, "tflops_per_device_hardware": NUM, "mfu": NUM, "hfu": NUM,
    # CNN splits
    "activation_communication_time_s": NUM, "bubble_fraction": NUM, "stage_time_s": NUM,
    "p2p_time_s": NUM,
    # transformers: an evaluation step (the forward of one global batch)
    "forward_time_s": NUM,
    # transformers: the likely range of the measured time (planner.bands)
    "time_band": obj({"runs": INT, "group": {"type": ["string", "null"]}, "note": STR,
                      "low_s": NUM, "high_s": NUM, "low_ratio": NUM, "high_ratio": NUM},
                     required=["runs", "group", "note"]),
    # CNNs with the asynchronous parameter server (prediction.asynchrony_doc)
    "asynchrony": obj({"protocol": STR, "softsync": INT, "learners": INT,
                       "gradients_per_update": NUM, "updates_per_round": INT,
                       "mean_staleness": NUM, "max_staleness": NUM, "learning_rate": STR,
                       "learner_s": NUM, "server_links_s": NUM, "server_updates_s": NUM,
                       "bottleneck": STR, "source": STR}),
    # with --critical-batch (time to train)
    **TRAINING_KEYS,
}, required=["iteration_time_s", "samples_per_s", "throughput_samples_per_s", "compute_time_s",
             "exposed_communication_time_s", "optimizer_time_s", "time_breakdown",
             "memory_bytes_per_device", "memory_capacity_bytes", "fits_memory",
             "fits_in_memory", "memory_breakdown"])
DP_PREDICTION = PREDICTION  # former names
HYBRID_PREDICTION = PREDICTION
OBJECTIVE = obj({"name": STR, "value": NUM, "solver_value": NUM, "unit": STR},
                required=["name", "value", "unit"])


def pareto(config: dict) -> dict:
    return {"type": "array", "items": obj({"config": config, "time_to_train_s": NUM,
                                           "cost_usd": NUM, "steps": NUM})}


# where splitting a sample over k devices beats one device per sample (analysis/spatial.py)
SPATIAL_CROSSOVERS = {"type": "array", "items": obj({
    "devices_per_sample": INT, "spatial_dims": INT, "side_now": INT, "scale": NUM, "side": NUM,
    "scale_bandwidth_only": NUM, "side_bandwidth_only": NUM, "scale_latency_only": NUM,
    "formula": STR, "work_one_s": NUM, "work_split_s": NUM, "halo_bandwidth_s": NUM,
    "halo_latency_s": NUM, "issue_bound": BOOL})}
SPLIT_CONFIG = obj({"nodes": INT, "devices_per_node": INT, "devices": INT, "global_batch": INT,
                    "local_batch": INT, "devices_per_sample": INT, "stages": INT,
                    "replicas": INT, "micro_batch": INT,
                    "micro_batches": INT, "collective": STR, "overlap": BOOL},
                   required=["nodes", "devices_per_node", "devices", "global_batch",
                             "collective", "overlap"])
SPLIT_PREDICTION = PREDICTION
LAYER_PLAN = obj({"name": STR, "mode": {"enum": ["data", "model", "spatial"]}, "degree": INT,
                  "compute_time_s": NUM, "communication_time_s": NUM})
STAGE_PLAN = obj({"layers": {"type": "array", "items": STR}, "devices": INT, "time_s": NUM,
                  "memory_bytes": NUM, "memory_breakdown": obj({k: NUM for k in (
                      "weights", "gradients", "optimizer", "activations")})})
SPLIT_PLAN = {"oneOf": [obj({"layers": {"type": "array", "items": LAYER_PLAN}}),
                        obj({"stages": {"type": "array", "items": STAGE_PLAN, "minItems": 2}})]}


# where scaling stops (`planner.search.table.knee`); the speed-up is null when no plan runs on
# half the best plan's devices
KNEE = obj({"devices": INT, "time_s": NUM, "tolerance": NUM, "measure": STR,
            "best_devices": INT, "best_time_s": NUM,
            "last_doubling_speedup": {"type": ["number", "null"]},
            "last_doubling_from_devices": {"type": ["integer", "null"]},
            "scaling_efficiency": NUM, "base_devices": INT})


# the precision a plan is priced at and where it came from (--precision, the device's
# default_precision, or fp32 assumed for a device spec naming none)
PRECISION = obj({"name": STR, "source": STR})
PRICE = obj({"usd": NUM, "source": STR})
FRAMEWORK = {"enum": list(switches.FRAMEWORK_FORMS)}  # the framework a plan is priced for
# solve --tokens: time and cost of training on a token budget (no critical batch)
TOKEN_BUDGET = obj({"tokens": NUM, "steps": NUM, "time_to_train_s": NUM,
                    "time_to_train_days": NUM, "device_hours": NUM,
                    "price_per_device_hour_usd": {"type": ["number", "null"]},
                    "price_source": {"type": ["string", "null"]},
                    "cost_usd": {"type": ["number", "null"]}})


def _evaluate() -> dict:
    spec = {"model": STR, "hardware": STR, "line": INT, "precision": PRECISION,
            "framework": FRAMEWORK}
    plan = _envelope("evaluate", {**spec, "config": CONFIG, "prediction": PREDICTION},
                     ["config", "prediction"])
    error = _envelope("evaluate", {"line": INT, "error": ERROR}, ["line", "error"])
    return {"oneOf": [plan, error]}


def _solve() -> dict:
    spec = {"model": STR, "hardware": STR, "status": {"enum": ["optimal", "feasible"]},
            "objective": OBJECTIVE, "precision": PRECISION, "token_budget": TOKEN_BUDGET,
            "price_per_device_hour": PRICE, "framework": FRAMEWORK}
    plan = _envelope("solve", {
        **spec, "strategy": {"const": "data"}, "config": CONFIG, "prediction": PREDICTION,
        "pareto": pareto(CONFIG), "knee": KNEE, "solve_time_s": NUM, "build_time_s": NUM,
        # a transformer pick no calibration run covers (planner.search.support)
        "support": obj({"note": STR, "taken": BOOL, "rule": {"enum": ["band", "fraction"]},
                        "covered_by": {"type": "string",
                                       "pattern": "^(ZeRO 1|(pp 1|cp at most [0-9]+|ep at "
                                                  "most [0-9]+|memory at most [0-9.]+%)"
                                                  "(, ((cp|ep) at most [0-9]+|memory at most "
                                                  "[0-9.]+%)){0,3})$"},
                        "tolerance": {"type": ["number", "null"]},
                        "fastest_iteration_time_s": NUM, "fastest_zero": INT,
                        "memory_headroom": {"type": ["number", "null"]},
                        "objective": STR,
                        "fastest_objective": NUM,
                        "alternative": {"oneOf": [{"type": "null"}, obj({
                            "config": CONFIG, "iteration_time_s": NUM, "objective_value": NUM,
                            "time_band": {"oneOf": [{"type": "null"},
                                                    PREDICTION["properties"]["time_band"]]}})]}}),
        "search": obj({"points": INT, "rows": INT, "branches": INT, "gap": NUM,
                       "build_time_s": NUM, "solve_time_s": NUM},
                      required=["points", "rows", "branches", "gap"]),
        "alternatives": {"type": "array", "items": obj({"config": CONFIG,
                                                        "prediction": PREDICTION})},
    }, ["status", "config", "prediction", "objective", "search", "alternatives"])
    split = _envelope("solve", {
        **spec, "strategy": {"enum": ["hybrid", "pipeline"]}, "config": SPLIT_CONFIG,
        "plan": SPLIT_PLAN, "prediction": SPLIT_PREDICTION,
        "data_parallel": {"oneOf": [{"type": "null"}, obj({
            "config": CONFIG, "iteration_time_s": NUM, "objective_value": NUM})]},
        "search": obj({"inner_solves": INT, "candidates": INT, "pruned": INT, "time_s": NUM}),
        "spatial": SPATIAL_CROSSOVERS,
    }, ["strategy", "status", "config", "plan", "prediction", "objective", "data_parallel"])
    return {"oneOf": [plan, split, _cluster(spec), _placement()]}


def _placement() -> dict:
    """`solve` for a recommendation model: the placement of its tables
    (`planner.report.recommendation`)."""
    table = obj({"name": STR, "mode": {"enum": ["table", "column", "row", "data"]},
                 "shards": INT, "dim": INT, "devices": {"type": "array", "items": INT}})
    device = obj({"device": INT, "tables": {"type": "array", "items": STR},
                  "embedding_time_s": NUM, "memory_bytes": NUM})
    return _envelope("solve", {
        "model": STR, "hardware": STR, "precision": obj({"name": STR}),
        "status": {"enum": ["optimal", "feasible"]}, "devices": INT, "global_batch": INT,
        "tables": {"type": "array", "items": table},
        "on_every_device": {"type": "array", "items": STR},
        "per_device": {"type": "array", "items": device},
        "prediction": obj({"iteration_time_s": NUM, "embedding_time_s": NUM,
                           "dense_time_s": NUM, "samples_per_s": NUM,
                           "memory_bytes_per_device": NUM, "fits_memory": BOOL}),
        "search": obj({"solve_time_s": NUM, "bound_s": NUM}),
    }, ["status", "devices", "global_batch", "tables", "per_device", "prediction"])


def _cluster_parts() -> tuple[dict, dict, dict]:
    """The plan, a subset's entry and the limits of a cluster document (`report.cluster`)."""
    per_pool = {"type": "object", "additionalProperties": INT}
    stage = obj({"pool": STR, "layers": INT})
    group = obj({"replicas": INT, "micro_batches": INT, "samples": INT,
                 "stages": {"type": "array", "items": stage}})
    plan = obj({"kind": STR, "pools": {"type": "array", "items": STR}, "tp": INT, "cp": INT,
                "pp": INT, "dp": INT, "micro_batch": INT, "global_batch": INT,
                "recompute": STR, "sequence_parallel": BOOL, "zero": INT, "interleave": INT,
                "devices": per_pool, "nodes": per_pool,
                "groups": {"type": "array", "items": group}},
               ["kind", "pools", "tp", "pp", "micro_batch", "global_batch", "devices"])
    band = obj({"runs": INT, "group": {"type": ["string", "null"]}, "note": STR, "low_s": NUM,
                "high_s": NUM, "low_ratio": NUM, "high_ratio": NUM}, ["runs", "group", "note"])
    entry = obj({"pools": {"type": "array", "items": STR},
                 "uses": {"type": "array", "items": STR}, "kind": STR,
                 "status": {"enum": ["optimal", "feasible"]}, "iteration_time_s": NUM,
                 "global_batch": INT, "tokens_per_s": NUM, "devices": per_pool,
                 "memory_bytes_per_device": {"type": "object", "additionalProperties": NUM},
                 "cost_per_million_tokens_usd": {"type": ["number", "null"]},
                 "time_band": band,
                 # a mix beyond a pool's memory reach and the covered mix weighed beside it
                 "support": obj({"note": STR, "taken": BOOL,
                                 "covered_by": {"type": "string", "pattern":
                                                "^memory (at most [0-9.]+%|within each "
                                                "pool's reach)$"},
                                 "reach": {"type": "object", "additionalProperties": NUM},
                                 "rule": {"enum": ["band", "fraction"]},
                                 "tolerance": {"type": ["number", "null"]},
                                 "cut_off": BOOL,
                                 "fastest_iteration_time_s": NUM,
                                 "fastest_seconds_per_sample": NUM,
                                 "alternative": {"oneOf": [{"type": "null"}, obj({
                                     "kind": STR, "pools": {"type": "array", "items": STR},
                                     "iteration_time_s": NUM, "seconds_per_sample": NUM,
                                     "time_band": band})]}})},
                ["pools", "uses", "kind", "status", "iteration_time_s", "global_batch",
                 "tokens_per_s", "devices", "memory_bytes_per_device",
                 "cost_per_million_tokens_usd"])
    nullable = {"type": ["number", "null"]}
    limits = obj({
        "bottleneck": obj({"pool": STR, "measure": STR, "by_pool": {
            "type": "object", "additionalProperties": NUM}}),
        "between_node_Bps": NUM, "against": STR, "break_even_between_node_Bps": nullable,
        "balanced_micro_batches": {"type": "object", "additionalProperties": NUM},
        "at_own_fabric": obj({"pools": {"type": "array", "items": STR}, "kind": STR,
                              "gain_over_best_single_pool": NUM,
                              "break_even_between_node_Bps": nullable})}, [])
    return plan, entry, limits


def _cluster(spec: dict) -> dict:
    """`solve` over a cluster of several pools (`planner.report.cluster`)."""
    plan, entry, limits = _cluster_parts()
    return _envelope("solve", {
        "model": STR, "hardware": STR, "precision": obj({"name": STR}), "cluster": STR,
        "framework": FRAMEWORK, "status": spec["status"], "plan": plan, "prediction": entry,
        "subsets": {"type": "array", "items": entry},
        "best_single_pool": STR, "gain_over_best_single_pool": NUM,
        "gain_band": obj({"low": NUM, "high": NUM}),
        "pools_add": {"type": "array", "items": obj({
            "pool": STR, "best_without_tokens_per_s": NUM, "adds": NUM})},
        "no_plan": {"type": "object", "additionalProperties": STR},
        "mixed_not_searched": STR, "limits": limits,
        "search": obj({"cp_sat_models": INT, "shapes_priced": INT, "solve_time_s": NUM}),
    }, ["cluster", "status", "plan", "prediction", "subsets", "pools_add", "search"])


def _cluster_limits() -> dict:
    """`limits` over a cluster of several pools (`planner.report.cluster.limits_doc`)."""
    plan, entry, limits = _cluster_parts()
    return _envelope("limits", {
        "model": STR, "hardware": STR, "precision": obj({"name": STR}), "cluster": STR,
        "status": {"enum": ["optimal", "feasible"]}, "plan": plan, "prediction": entry,
        "best_single_pool": STR, "gain_over_best_single_pool": NUM, "limits": limits,
        "single_pools": {"type": "array", "items": entry},
    }, ["cluster", "status", "plan", "prediction", "single_pools"])


SOLVED = {"oneOf": [{"type": "null"}, obj({"nodes": INT, "devices": INT, "local_batch": INT,
                                            "collective": STR, "iteration_time_s": NUM})]}


def _limits() -> dict:
    nullable = {"type": ["number", "null"]}
    cnn = _envelope("limits", {
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
        # what `solve` picks on this case: on the same collective, on any, and with the
        # smallest efficient local batch as --local-batch-min (null: no plan fits)
        "spatial": SPATIAL_CROSSOVERS,
        "solve": obj({"same_collective": SOLVED, "any_collective": SOLVED,
                      "local_batch_min": INT, "with_local_batch_min": SOLVED}),
    }, ["optimal_nodes", "max_speedup", "comm_bound_from_nodes", "max_useful_nodes",
        "required_bandwidth_GBps", "efficiency_at_nodes"])
    return {"oneOf": [cnn, _transformer_limits(), _cluster_limits()]}


def _transformer_limits() -> dict:
    """`limits` for a transformer: the plan the limits hold at, the memory floor per ZeRO stage
    and recompute, and each limit with the whole plan that realises it."""
    nullable, int_or_null = {"type": ["number", "null"]}, {"type": ["integer", "null"]}
    floor = obj({"zero": INT, "recompute": STR, "tp": int_or_null, "pp": int_or_null,
                 "dp": INT, "devices": INT, "memory_bytes_per_device": NUM},
                required=["zero", "recompute", "tp", "pp"])
    plan = obj({"tp": INT, "pp": INT, "dp": INT, "devices": INT, "micro_batch": INT,
                "interleave": INT, "recompute": STR, "sequence_parallel": BOOL, "zero": INT,
                "schedule": STR, "overlap": BOOL, "flash_attention": BOOL})
    whole = obj({"dp": INT, "devices": INT, "iteration_time_s": NUM, "speedup": NUM})
    return _envelope("limits", {
        "model": STR, "hardware": STR, "global_batch": INT, "devices_per_node": INT,
        "plan": plan, "iteration_time_s": NUM, "memory_bytes_per_device": NUM,
        "memory_capacity_bytes": NUM, "memory_floor": {"type": "array", "items": floor},
        "optimal_devices": obj({"dp": NUM, "devices": NUM, "reason": STR, "max_speedup": NUM,
                                "whole_plan": whole}),
        "comm_bound_from": {"oneOf": [{"type": "null"}, obj({
            "dp": NUM, "devices": NUM, "first_whole_dp_exposed": int_or_null,
            "reason": STR})]},
        "max_useful_devices": obj({"devices": NUM, "smallest_efficient_micro_batch": INT,
                                   "local_efficiency": NUM}),
        "optimal_pp": obj({"pp": INT, "continuous": nullable, "at_dp": INT}),
        "tp_comm_bound_from": {"oneOf": [{"type": "null"}, obj({
            "tp": INT, "continuous": nullable, "reason": {"type": ["string", "null"]},
            "at_dp": INT})]},
        "required_bandwidth_GBps": nullable, "available_bandwidth_GBps": NUM,
        "bandwidth_at_dp": INT, "target_efficiency": NUM,
        "time_to_train": obj({"critical_batch": NUM, "dp": INT, "global_batch": NUM,
                              "reason": STR}),
    }, ["plan", "memory_floor", "optimal_devices", "comm_bound_from", "max_useful_devices",
        "optimal_pp", "tp_comm_bound_from", "required_bandwidth_GBps"])


def _sweep() -> dict:
    # each point as config + prediction, and the same keys flat (the first sweep's form)
    flat = {**CONFIG["properties"], **PREDICTION["properties"]}
    point = obj({**flat, "bandwidth_GBps": NUM, "scaling_efficiency": NUM, "config": CONFIG,
                 "prediction": PREDICTION},
                required=[*CONFIG["required"], *PREDICTION["required"], "bandwidth_GBps",
                          "scaling_efficiency", "config", "prediction"])
    skipped = obj({"nodes": INT, "global_batch": INT, "bandwidth_GBps": NUM, "reason": STR})
    return _envelope("sweep", {"model": STR, "hardware": STR,
                               "points": {"type": "array", "items": point},
                               "skipped": {"type": "array", "items": skipped},
                               "skipped_nodes": {"type": "array", "items": INT}},
                     ["points", "skipped", "skipped_nodes"])


def _derive() -> dict:
    symbol = obj({"value": NUM, "unit": STR, "description": STR, "latex": STR})
    # where the values hold: low <= expression <= high (null: no upper end)
    holds = obj({"expression": STR, "low": NUM, "high": {"type": ["number", "null"]},
                 "why": STR})
    # latex: the right-hand side; latex_equation: a complete equation / align environment
    formula = obj({"name": STR, "description": STR, "unit": STR, "expression": STR,
                   "latex": STR, "latex_lhs": STR, "latex_equation": STR, "python": STR,
                   "value": {"type": ["number", "null"]}, "note": STR,
                   "symbols": {"type": "object", "additionalProperties": symbol},
                   "holds": {"type": "array", "items": holds}})
    # the plan the formulas are read at: a transformer's split and switches, a CNN's collective
    plan = {"type": "object", "additionalProperties": {"type": ["number", "string", "boolean"]}}
    return _envelope("derive", {"model": STR, "hardware": STR, "plan": plan,
                                "formulas": {"type": "array", "items": formula},
                                # a formula not printed (none asked for by name): why
                                "left_out": {"type": "object", "additionalProperties": STR}},
                     ["plan", "formulas", "left_out"])


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
    recommendation = _envelope("show", {
        "name": STR, "kind": {"const": "recommendation"}, "description": STR,
        **{k: INT for k in ("tables", "embedding_rows", "embedding_params", "embedding_bytes",
                            "dense_params", "dense_flops_per_sample")},
        "lookups_per_sample": NUM, "interaction": {"enum": ["dot", "dcnv2"]},
        "global_batch": {"type": ["integer", "null"]}}, ["name", "kind", "tables"])
    system = _envelope("show", {
        "kind": {"const": "system"}, "name": STR, "description": STR, "devices_per_node": INT,
        "devices_per_scale_up_domain": INT, "nics_per_node": INT, "device": spec,
        "intra_node": spec, "inter_node": spec, "scale_up": spec,
        "host_offload": obj({"link": spec, "devices_per_link": INT})},
        ["kind", "name", "device", "intra_node", "inter_node"])
    device = _envelope("show", {
        "kind": {"const": "device"}, "name": STR, "description": STR,
        "peak_tflops": {"type": "object", "additionalProperties": NUM}, "memory_GiB": NUM,
        "runtime_reserve_GiB": NUM,
        "memory_bandwidth_GBps": NUM, "efficiency": spec,
        "collective_library": {"enum": ["nccl", "rccl", "mpi"]}, "fp8_gemm_any_layout": BOOL,
        "kernels": {"oneOf": [{"type": "null"}, obj({"launch_us": NUM, "gemm_half_dim": NUM,
                                                     "gemm_half_dim_fp8": {"type": ["number", "null"]},
                                                     "overlap_slowdown": NUM,
                                                     "kernel_gpu_us": NUM,
                                                     "step_sync_us": {"type": ["number", "null"]}},
                                                    ["launch_us", "gemm_half_dim"])]},
        "flash_attention": {"oneOf": [{"type": "null"}, obj({
            "kernel": STR, "fwd_tflops": {"type": "object", "additionalProperties": NUM},
            "bwd_tflops": {"type": "object", "additionalProperties": NUM},
            "fwd_half_keys": NUM, "bwd_half_keys": NUM, "causal_extra_keys": NUM,
            "fp8_fwd_tflops": {"type": ["object", "null"], "additionalProperties": NUM},
            "fp8_fwd_half_keys": {"type": ["number", "null"]},
            "fp8_bwd_tflops": {"type": ["object", "null"], "additionalProperties": NUM},
            "fp8_bwd_half_keys": {"type": ["number", "null"]},
            "mxfp8_fwd_tflops": {"type": ["object", "null"], "additionalProperties": NUM},
            "mxfp8_fwd_half_keys": {"type": ["number", "null"]},
            "mxfp8_bwd_tflops": {"type": ["object", "null"], "additionalProperties": NUM},
            "mxfp8_bwd_half_keys": {"type": ["number", "null"]}})]},
        "price_per_hour_usd": {"type": ["number", "null"]}, "default_precision": STR,
        "sources": {"type": "object", "additionalProperties": STR}},
        ["kind", "name", "peak_tflops", "memory_GiB"])
    link = _envelope("show", {
        "kind": {"const": "link"}, "name": STR, "description": STR, "bandwidth_GBps": NUM,
        "latency_us": NUM, "efficiency": NUM,
        "sources": {"type": "object", "additionalProperties": STR}},
        ["kind", "name", "bandwidth_GBps", "latency_us"])
    # a cluster as its YAML writes it (the nodes a job can have; no between_pools: one fabric)
    pool = obj({"name": STR, "system": STR, "nodes": INT, "price_per_device_hour_usd": NUM,
                "partition": STR}, ["name", "system", "nodes"])
    cluster = _envelope("show", {
        "kind": {"const": "cluster"}, "name": STR, "description": STR,
        "pools": {"type": "array", "items": pool},
        "between_pools": obj({"link": STR, "count": INT}),
        "sources": {"type": "object", "additionalProperties": STR}},
        ["kind", "name", "pools"])
    return {"oneOf": [cnn, transformer, recommendation, system, device, link, cluster]}


def _list() -> dict:
    names = {"type": "array", "items": STR}
    return {"oneOf": [
        _envelope("list", {"models": names}, ["models"]),
        # every kind, or the one kind asked for (`planner list systems`)
        _envelope("list", {"hardware": {**obj({"systems": names, "devices": names,
                                               "links": names, "clusters": names}, []),
                                        "minProperties": 1}},
                  ["hardware"]),
        _envelope("list", {"switches": {"type": "array", "items": obj({
            "name": STR, "flag": STR, "default": {}, "values": {"type": ["array", "null"]},
            "families": {"type": "array", "items": STR}, "what": STR, "upstream": STR,
            "solve": STR, "limits": BOOL, "precisions": {"type": ["array", "null"]},
            "across_pools": BOOL})}}, ["switches"])]}


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


# The document a command prints with --format json when it fails (exit 1, 2 or 3): the kind,
# the one-line message stderr also carries, the conflicting constraints of an infeasible
# problem, and the file, key and value the message names (null where it names none).
NULLABLE_STR = {"type": ["string", "null"]}
ERROR = obj({"kind": {"enum": ["infeasible", "bad_input", "internal"]}, "message": STR,
             "constraints": {"type": "array", "items": STR}, "file": NULLABLE_STR,
             "key": NULLABLE_STR, "value": NULLABLE_STR})


def error_schema(command: str) -> dict:
    return _envelope(command, {"error": ERROR}, ["error"])


def schemas() -> dict:
    """{command: JSON Schema}: each command's document, or its error document."""
    out = {"evaluate": _evaluate(), "solve": _solve(), "limits": _limits(), "sweep": _sweep(),
           "derive": _derive(), "show": _show(), "list": _list(), "calibrate": _calibrate()}
    for name, sch in out.items():
        forms = sch.get("oneOf", [sch])
        out[name] = sch = {"oneOf": [*forms, error_schema(name)]}
        sch["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        sch["title"] = f"planner {name} --format json"
    return out
