"""One request, loaded once: `planner.inputs.Specs` holds the model, the hardware target and the
precision a request names; the command line loads them once and every verb and output reads
them from there."""

import collections
import json

import pytest

import planner.api as planner
from planner import catalog, inputs
from planner.errors import SpecError
from planner.inputs import Specs
from planner.spec.hardware import Precision


@pytest.fixture
def loads(monkeypatch):
    """Every load of a model or hardware spec file, counted by (loader, name)."""
    counts = collections.Counter()

    def counted(name, original):
        def load(ref, *args, **kwargs):
            counts[(name, ref)] += 1
            return original(ref, *args, **kwargs)

        return load

    for name in ("load_model", "load_system", "load_target"):
        original = getattr(catalog, name)
        monkeypatch.setattr(catalog, name, counted(name, original))
        if hasattr(inputs, name):
            monkeypatch.setattr(inputs, name, counted(name, original))
    return counts


@pytest.mark.parametrize("args", [
    ["solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "16", "--global-batch", "64",
     "--format", "json"],
    ["solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "16", "--global-batch", "64",
     "--seq-len", "512", "--format", "megatron"],
    ["evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--global-batch", "64",
     "--tp", "2", "--zero", "1", "--recompute", "full", "--format", "torchtitan"],
    ["evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "4", "--global-batch", "256",
     "--format", "json"],
    ["solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--format", "json"],
    ["limits", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024", "--format", "json"],
    ["limits", "-m", "gpt2", "-H", "dgx-a100-80gb", "--global-batch", "64", "--seq-len", "512",
     "--format", "json"],
    ["derive", "-m", "gpt2", "-H", "dgx-a100-80gb", "--global-batch", "64", "--format", "json"],
    ["sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024", "--nodes", "1,2",
     "--format", "json"],
    ["sweep", "-m", "gpt2", "-H", "dgx-a100-80gb", "--global-batch", "64", "--nodes", "1,2",
     "--seq-len", "512", "--format", "json"],
])
def test_the_command_line_loads_each_spec_once(run, loads, args):
    code, out, err = run(*args)
    assert code == 0, err
    model, hardware = args[2], args[4]
    # the target is read once (a system's own load inside it counts once more)
    assert loads[("load_model", model)] == 1
    assert loads[("load_target", hardware)] == 1
    assert loads[("load_system", hardware)] == 1
    assert set(loads) == {("load_model", model), ("load_target", hardware),
                          ("load_system", hardware)}


def test_specs_hold_what_the_request_names():
    s = Specs.load("llama3-8b", "dgx-h100", "fp8", 4096)
    assert (s.family, s.model.seq_len, s.precision, s.given_precision) == (
        "transformer", 4096, Precision.fp8, Precision.fp8)
    assert s.system.name == "dgx-h100" and not s.is_cluster and s.pool_nodes is None
    default = Specs.load("llama3-8b", "dgx-h100")
    assert default.given_precision is None
    assert default.precision is default.system.device.default_precision
    assert Specs.load("alexnet", "k80-fdr", seq_len=4096).family == "cnn"  # refused by a verb


def test_a_cluster_of_one_pool_is_its_system_with_a_node_budget(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text("kind: cluster\nname: one\npools:\n  - {system: dgx-h100, nodes: 3}\n")
    s = Specs.load("gpt2", str(path))
    assert not s.is_cluster and s.pool_nodes == 3 and s.system.name == "dgx-h100"
    sol = planner.solve(s, devices_max=64, global_batch=64)
    assert sol.plan.devices <= 3 * 8


def test_several_pools_are_refused_where_one_system_is_needed():
    s = Specs.load("gpt2", "lab-a100-h100")
    assert s.is_cluster
    with pytest.raises(SpecError, match="cluster of 2 pools"):
        s.system  # noqa: B018
    with pytest.raises(SpecError, match="cluster of 2 pools"):
        planner.evaluate(s, devices=8, global_batch=64)


def test_loaded_specs_give_the_same_answer_as_names():
    named = planner.solve("gpt2", "dgx-a100-80gb", precision="bf16", seq_len=512,
                          devices_max=32, global_batch=64)
    loaded = planner.solve(Specs.load("gpt2", "dgx-a100-80gb", "bf16", 512), devices_max=32,
                           global_batch=64)
    assert loaded.plan == named.plan
    assert loaded.prediction.iteration_time_s == named.prediction.iteration_time_s
    ev = planner.evaluate(Specs.load("alexnet", "k80-fdr"), nodes=2, global_batch=256)
    assert ev.prediction.iteration_time_s == planner.evaluate(
        "alexnet", "k80-fdr", nodes=2, global_batch=256).prediction.iteration_time_s


@pytest.mark.parametrize("extra", [{"precision": "bf16"}, {"seq_len": 512}])
def test_loaded_specs_refuse_a_second_spelling(extra):
    with pytest.raises(SpecError, match="loaded already"):
        planner.solve(Specs.load("gpt2", "dgx-a100-80gb"), devices_max=8, global_batch=64,
                      **extra)
    with pytest.raises(SpecError, match="loaded already"):
        planner.solve(Specs.load("gpt2", "dgx-a100-80gb"), "dgx-h100", global_batch=64)


def test_the_cluster_json_names_the_request(run):
    code, out, err = run("solve", "-m", "gpt2", "-H", "lab-a100-h100", "--global-batch", "256",
                         "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    # the one precision every pool runs, the pools' defaults first (A100 fp16, H100 bf16)
    assert inputs.cluster_precision(catalog.load_target("lab-a100-h100")) is Precision.bf16
    assert (doc["model"], doc["hardware"], doc["precision"]["name"]) == (
        "gpt2", "lab-a100-h100", "bf16")


@pytest.mark.parametrize("model, hardware, case", [
    ("gpt2", "dgx-a100-80gb", dict(nodes=[1, 2], global_batch=64)),
    ("alexnet", "k80-fdr", dict(nodes=[1, 2, 4], global_batch=256)),
])
def test_a_parallel_sweep_sends_its_loaded_specs_to_the_workers(tmp_path, model, hardware,
                                                                  case):
    """The worker processes read no file: the model, given as a YAML path, is gone before the
    sweep runs, and every point still matches the serial sweep of the same specs."""
    path = tmp_path / "model.yaml"
    path.write_text((catalog.MODELS / f"{model}.yaml").read_text())
    specs = Specs.load(str(path), hardware)
    path.unlink()
    serial = planner.sweep(specs, **case)
    parallel = planner.sweep(specs, jobs=2, **case)
    assert [p.prediction.iteration_time_s for p in parallel.points] == [
        p.prediction.iteration_time_s for p in serial.points]
    assert [p.plan for p in parallel.points] == [p.plan for p in serial.points]
    assert len(serial.points) == len(case["nodes"])
