"""The MLPerf extraction's choice of a submission's config (`benchmarks/extract_mlperf.py`):
where several configs fit its GPU count and global batch, the result log's printed layout and
switches say which ran, and of configs that agree the one named after the system is read; and
the YAML defaults a config's unset variables take."""

import subprocess
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


# the v5.x LoRA recipes' binding of the log's CUDA-graph switches to config variables
LORA_BINDING = "enable_cuda_graph=MCORE_CUDA_GRAPH,external_cuda_graph=LAYER_CUDA_GRAPH"


def _env(precision: str, graph: bool, binding: str = LORA_BINDING) -> dict:
    """A one-node LoRA config's environment: tp 1, global batch 8, in fp8 or NVFP4, with
    MCORE_CUDA_GRAPH on or off, its implementation's YAML binding the graph switches as
    `binding` says (what `ConfigPool` records)."""
    env = {"DGXNNODES": "1", "DGXNGPU": "8", "TP": "1", "PP": "1", "CP": "1", "MBS": "1",
           "MINIBS": "1", "FP8": "True", "FP8_RECIPE": "delayed", "TP_COMM_OVERLAP": "False",
           "MCORE_CUDA_GRAPH": "0", "__GRAPH_BINDING__": binding}
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
    assert path.endswith("config_B_1x8x1xtp1pp1cp1.sh") and fields["cuda_graph"] == "0"
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


def test_the_graph_switches_are_read_as_the_implementation_binds_them():
    # an implementation whose YAML sets enable_cuda_graph from LAYER_CUDA_GRAPH (the v4.x
    # recipes): MCORE_CUDA_GRAPH says nothing of it
    layer = "enable_cuda_graph=LAYER_CUDA_GRAPH"
    on = X.fields(_env("fp8", graph=False, binding=layer) | {"LAYER_CUDA_GRAPH": "1"}, 8)
    off = X.fields(_env("fp8", graph=True, binding=layer), 8)
    logged = {"enable_cuda_graph": True}
    assert X.agrees_with_log(on, {}, logged) and not X.agrees_with_log(off, {}, logged)
    # no binding found, or no graph variable in the config: the switch contradicts nothing
    unbound = X.fields(_env("fp8", graph=True, binding=""), 8)
    assert X.agrees_with_log(unbound, {}, {"enable_cuda_graph": False})
    unset = X.fields({k: v for k, v in _env("fp8", graph=False).items()
                      if k != "MCORE_CUDA_GRAPH"}, 8)
    assert unset["cuda_graph"] == "" and X.agrees_with_log(unset, {}, {"enable_cuda_graph": True})


def test_tp_overlap_and_precision_tell_configs_apart_only_where_known():
    overlap = X.fields(_env("fp8", graph=False) | {"TP_COMM_OVERLAP": "True"}, 8)
    plain = X.fields(_env("fp8", graph=False), 8)
    assert not X.agrees_with_log(overlap, {}, {"ub_tp_comm_overlap": False})
    assert X.agrees_with_log(plain, {}, {"ub_tp_comm_overlap": False})
    unknown = X.fields({k: v for k, v in _env("fp8", graph=False).items()
                        if k != "TP_COMM_OVERLAP"}, 8)
    assert unknown["tp_comm_overlap"] == ""
    assert X.agrees_with_log(unknown, {}, {"ub_tp_comm_overlap": True})
    # a precision the config does not give (an implementation's source sets it) is no evidence
    bare = X.fields({k: v for k, v in _env("fp8", graph=False).items() if k != "FP8"}, 8)
    assert bare["precision"] == "" and X.format_of(bare["precision"]) is None
    assert X.agrees_with_log(bare, {}, {"fp4": True, "fp8": False})
    assert X.format_of("NVFP4") == "fp4" and X.format_of("MXFP8") == "fp8"


def test_the_longest_system_name_a_config_carries_wins():
    system = "XE9680Lx8H200-SXM-141GB"
    assert (X._system_name_match("c/config_XE9680Lx8H200-SXM-141GB_1x8x2.sh", system)
            > X._system_name_match("c/config_XE9680_1x8x2.sh", system) > 0)
    # a config named after the system alone, no layout suffix
    assert X._system_name_match("c/config_1xXE9680Lx8B200-SXM-180GB.sh",
                                "1xXE9680Lx8B200-SXM-180GB") > 0
    assert X._system_name_match("c/config_GB300_2x4x1.sh", "1xXE9780x8B300-SXM-270GB") == 0


def _commit(repo: Path, files: dict[str, str]) -> list[str]:
    """A git repository at `repo` holding `files` (path: text), committed; its paths."""
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t",
                                                 "commit", "-q", "-m", "files"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return sorted(files)


def test_a_submission_without_yaml_takes_the_default_of_the_nvidia_recipe_it_copies(tmp_path):
    """Oracle's and Lambda's LoRA submissions ship shell files only; where the config_common.sh
    a config sources is NVIDIA's byte for byte, NVIDIA's YAML default (cp_comm_type a2a) is
    what the run read. A config_common.sh of its own, or an NVIDIA recipe whose YAML gives no
    default, leaves the variable unset."""
    bench = "llama2_70b_lora"
    common = "export DGXNGPU=4\nexport CP=8\n"
    config = "source $(dirname ${BASH_SOURCE[0]})/config_common.sh\nexport DGXNNODES=18\n"
    nvidia = f"NVIDIA/benchmarks/{bench}/implementations"
    files = _commit(tmp_path / "repo", {
        f"{nvidia}/nemo/config_common.sh": common,
        f"{nvidia}/nemo/config_GB200_18x4x1xtp1pp1cp8.sh": config,
        f"{nvidia}/nemo/conf/peft.yaml": "cp_comm_type: ${oc.env:CP_COMM_TYPE,a2a}\n",
        f"{nvidia}/old/config_common.sh": common + "export OLD=1\n",
        f"{nvidia}/old/conf/peft.yaml": "seed: 1\n",
        f"Oracle/benchmarks/{bench}/implementations/gb200/config_common.sh": common,
        f"Oracle/benchmarks/{bench}/implementations/gb200/config_GB200_18x4.sh": config,
        f"Lambda/benchmarks/{bench}/implementations/own/config_common.sh": common + "# own\n",
        f"Lambda/benchmarks/{bench}/implementations/own/config_GB200_18x4.sh": config,
        f"Cisco/benchmarks/{bench}/implementations/old/config_common.sh": common
        + "export OLD=1\n",
        f"Cisco/benchmarks/{bench}/implementations/old/config_GB200_18x4.sh": config})
    repo = str(tmp_path / "repo")

    def cp_comm(sub: str, impl: str) -> str | None:
        pool = X.ConfigPool(repo, files, sub, bench, str(tmp_path / "scratch"))
        env = pool.cfg[f"{sub}/benchmarks/{bench}/implementations/{impl}/config_GB200_18x4.sh"]
        return env.get("CP_COMM_TYPE")

    assert cp_comm("Oracle", "gb200") == "a2a"
    assert cp_comm("Lambda", "own") is None  # its own config_common.sh
    assert cp_comm("Cisco", "old") is None  # NVIDIA's recipe whose YAML gives no default
