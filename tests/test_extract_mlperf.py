"""The MLPerf extraction's choice of a submission's config (`benchmarks/extract_mlperf.py`):
where several configs fit its GPU count and global batch, the result log's printed layout and
switches say which ran, and of configs that agree the one named after the system is read."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import extract_mlperf as X  # noqa: E402

# NeMo's resolved config as a result log prints it (rank-prefixed lines of a YAML dump)
LOG = """0:   tensor_model_parallel_size: 1
0:   pipeline_model_parallel_size: 1
0:   context_parallel_size: 1
0:   micro_batch_size: 1
0:   fp4: {fp4}
0:   fp8: true
0:   enable_cuda_graph: {graph}
0:   external_cuda_graph: false
0:   ub_tp_comm_overlap: false
"""


def _env(precision: str, graph: bool) -> dict:
    """A one-node LoRA config's environment: tp 1, global batch 8, in fp8 or NVFP4."""
    env = {"DGXNNODES": "1", "DGXNGPU": "8", "TP": "1", "PP": "1", "CP": "1", "MBS": "1",
           "MINIBS": "1", "FP8": "True", "FP8_RECIPE": "delayed", "TP_COMM_OVERLAP": "False"}
    if precision == "nvfp4":
        env |= {"FP4": "True", "FP4_RECIPE": "nvfp4"}
    if graph:
        env["MCORE_CUDA_GRAPH"] = "1"
    return env


class _Pool:
    """The part of `ConfigPool` that `select_config` reads."""

    bench = "llama2_70b_lora"

    def __init__(self, configs: dict):
        self.cfg = {f"Sub/benchmarks/{self.bench}/implementations/nemo/{name}": env
                    for name, env in configs.items()}

    def readme_configs(self, system):  # noqa: ARG002 (no README names a config here)
        return set()


def _select(configs: dict, log: str | None, system: str = "1xSYS"):
    pool = _Pool(configs)
    sysjson = {"accelerators_per_node": "8", "number_of_nodes": "1",
               "accelerator_model_name": "NVIDIA B300"}
    layout = X.logged_layout(log) if log else {}
    switches = X.logged_switches(log) if log else {}
    return X.select_config(pool, system, sysjson, 8, set(), layout, switches)


def test_the_log_prints_its_layout_and_switches():
    log = LOG.format(fp4="true", graph="false")
    assert X.logged_layout(log) == {"tp": 1, "pp": 1, "cp": 1, "micro_batch": 1}
    assert X.logged_switches(log) == {"fp4": True, "fp8": True, "enable_cuda_graph": False,
                                      "external_cuda_graph": False,
                                      "ub_tp_comm_overlap": False}
    # a switch printed with two values says nothing
    assert "fp4" not in X.logged_switches(log + "1:   fp4: false\n")


def test_the_log_tells_apart_configs_of_another_precision_or_cuda_graphs():
    configs = {"config_A_1x8x1xtp1pp1cp1.sh": _env("fp8", graph=True),
               "config_A_1x8x1xtp1pp1cp1_fp4.sh": _env("nvfp4", graph=True),
               "config_B_1x8x1xtp1pp1cp1.sh": _env("fp8", graph=False)}
    path, _, _, why = _select(configs, None)
    assert path is None and why.startswith("ambiguous: 3 candidate configs")
    path, fields, how, _ = _select(configs, LOG.format(fp4="true", graph="true"))
    assert path.endswith("_fp4.sh") and fields["precision"] == "nvfp4"
    assert "the one candidate whose layout and settings the result log prints" in how
    path, fields, _, _ = _select(configs, LOG.format(fp4="false", graph="false"))
    assert path.endswith("config_B_1x8x1xtp1pp1cp1.sh") and fields["cuda_graph"] == ""
    # two that agree with the log in every switch it prints (not the fp8 recipe) stay ambiguous
    configs["config_C_1x8x1xtp1pp1cp1.sh"] = _env("fp8", graph=False) | {
        "FP8_RECIPE": "tensorwise"}
    path, _, _, why = _select(configs, LOG.format(fp4="false", graph="false"))
    assert path is None and "ambiguous" in why


def test_of_configs_that_agree_the_one_named_after_the_system_is_read():
    # the MI300X (192 GB) recipe recomputes 21 layers, the MI325X (256 GB) one nothing: the
    # same layout and switches, so only the name tells which a MI325X system ran
    mi300x = _env("fp8", graph=False) | {"ACG": "full", "ACM": "block", "ACL": "21"}
    configs = {"config_MI300X_1x8x1.sh": mi300x,
               "config_MI325X_1x8x1.sh": _env("fp8", graph=False)}
    path, fields, how, _ = _select(configs, None, system="8xMI325X_2xEPYC_9575F")
    assert path.endswith("config_MI325X_1x8x1.sh") and fields["recompute"] == ""
    assert "2 candidate configs identical" in how
    path, fields, _, _ = _select(configs, None, system="MI300X_EPYC_9575F_pytorch")
    assert path.endswith("config_MI300X_1x8x1.sh") and fields["recompute"] == "full"
    assert X._names_system("x/config_XE9780x8B300-SXM-270GB_1x8x1.sh", "1xXE9780x8B300-SXM-270GB")
    assert not X._names_system("x/config_GB300_2x4x1.sh", "1xXE9780x8B300-SXM-270GB")
