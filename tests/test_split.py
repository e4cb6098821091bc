"""CNN layer splits (issue 4): per-layer data/model modes and pipeline stages.

CP-SAT per point against every mode assignment and every cut; the branch and bound against
every point; the all-data plan against the data-parallel prediction; the issue's AlexNet and
VGG-16 cases; the CLI."""

import itertools
import json
import shlex
import subprocess

import pytest

from planner.api import build
from planner.cost.cnn_layout import segments, units
from planner.cost.layer_modes import LayerModes
from planner.cost.stages import Stages
from planner.expr.cnn import DataParallelModel, Options
from planner.expr.collectives import Collective
from planner.prediction import Config, predict
from planner.search.data_parallel import Problem
from planner.search.layer_modes import best_modes
from planner.search.stages import best_cut
from planner.search.strategy import SplitSearch, Strategy
from planner.spec.cnn import build_cnn
from planner.spec.hardware import Precision

SMALL = {
    "kind": "cnn", "name": "small", "input": [3, 32, 32],
    "layers": [
        {"type": "conv", "out": 32, "kernel": 3, "padding": 1}, {"type": "relu"},
        {"type": "maxpool", "kernel": 2},
        {"type": "conv", "out": 64, "kernel": 3, "padding": 1}, {"type": "relu"},
        {"type": "maxpool", "kernel": 2},
        {"type": "fc", "out": 2048}, {"type": "relu"},
        {"type": "fc", "out": 2048}, {"type": "relu"},
        {"type": "fc", "out": 16}, {"type": "softmax"},
    ],
}


def small_model(hardware="k80-fdr"):
    system = build("alexnet", hardware).system
    return DataParallelModel(build_cnn(SMALL, "small"), system, Options(Precision.fp32))


def brute_modes(lm: LayerModes, capacity: float):
    best = None
    rows = range(len(lm.segments))
    for assign in itertools.product(range(len(lm.degrees)), repeat=len(lm.segments)):
        if not lm.valid[rows, assign].all():  # a mode that cannot run there
            continue
        br = lm.evaluate(assign)
        if br.memory_bytes <= capacity and (best is None or br.iteration_time_s < best[0]):
            best = (br.iteration_time_s, assign)
    return best


@pytest.mark.parametrize(("n", "g", "b", "collective", "overlap", "capacity"), [
    (4, 2, 2, Collective.ring, True, None),
    (4, 2, 16, Collective.hierarchical, True, None),
    (2, 2, 4, Collective.tree, False, None),
    (8, 1, 1, Collective.parameter_server, True, None),
    (4, 2, 8, Collective.halving_doubling, True, 0.5),  # memory forces some model parallelism
])
def test_modes_cp_sat_equals_every_assignment(n, g, b, collective, overlap, capacity):
    lm = LayerModes(small_model(), n, g, b, collective, overlap)
    all_data = lm.evaluate([0] * lm.shape[0])
    cap = all_data.memory_bytes * capacity if capacity else 1e15
    want = brute_modes(lm, cap)
    got = best_modes(lm, cap, 10)
    assert got is not None and got[1]
    t = lm.evaluate(got[0])
    assert t.memory_bytes <= cap
    # CP-SAT works in integer ns: at most half a ns per term apart.
    assert t.iteration_time_s == pytest.approx(want[0], abs=1e-7)
    if capacity:
        assert any(got[0]), "a tight memory cap must push some segment to model mode"


def test_modes_memory_too_small_is_none():
    lm = LayerModes(small_model(), 2, 2, 4, Collective.ring, True)
    assert best_modes(lm, 1.0, 10) is None


@pytest.mark.parametrize("model", ["alexnet", "vgg16", "resnet50", "googlenet"])
def test_all_data_modes_equal_the_data_parallel_prediction(model):
    dp = build(model, "dgx-a100-80gb")
    for n, g, b in [(1, 1, 32), (1, 8, 4), (4, 8, 16)]:
        for c in Collective:
            for ov in (True, False):
                lm = LayerModes(dp, n, g, b, c, ov)
                br = lm.evaluate([0] * lm.shape[0])
                pr = predict(dp, Config(n, g, n * g * b, c, ov))
                assert br.iteration_time_s == pytest.approx(pr.iteration_time_s, rel=1e-12)
                assert br.memory_bytes == pytest.approx(pr.memory_bytes_per_device, rel=1e-12)


def brute_cut(st: Stages, capacity: float):
    U, p = len(st.units), st.p
    best = None
    for inner in itertools.combinations(range(1, U), p - 1):
        bounds = [0, *inner, U]
        stage_of = [next(j for j in range(p) if bounds[j] <= u < bounds[j + 1]) for u in range(U)]
        sp = st.evaluate(stage_of)
        if all(s["memory_bytes"] <= capacity for s in sp.stages) and \
                (best is None or sp.iteration_time_s < best[0]):
            best = (sp.iteration_time_s, stage_of)
    return best


@pytest.mark.parametrize(("n", "g", "p", "mu", "m", "capacity"), [
    (1, 2, 2, 8, 4, None), (2, 2, 4, 4, 8, None), (4, 2, 8, 1, 16, None), (2, 2, 2, 8, 2, 0.6),
    (2, 1, 2, 2, 2, None),
])
def test_cut_cp_sat_equals_every_cut(n, g, p, mu, m, capacity):
    st = Stages(small_model(), n, g, p, mu, m, Collective.ring)
    total = sum(st.memory_static.values()).sum() + st.memory_activation.sum() * min(m, p)
    cap = total * capacity if capacity else 1e15
    want = brute_cut(st, cap)
    got = best_cut(st, cap, 10)
    assert (got is None) == (want is None)
    if want is not None:
        assert got[1]
        assert st.evaluate(got[0]).iteration_time_s == pytest.approx(want[0], abs=1e-7)


def test_balanced_cut_is_the_min_max_over_every_cut():
    st = Stages(build("vgg16", "k80-fdr"), 3, 1, 3, 4, 8, Collective.ring)
    U = len(st.units)
    best = min(max(st.time[a:b].sum() for a, b in zip([0, *cut], [*cut, U], strict=True))
               for cut in itertools.combinations(range(1, U), 2))
    assert st.balanced() == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("strategy", [Strategy.hybrid, Strategy.pipeline])
def test_branch_and_bound_equals_every_point(strategy):
    """The search's objective is the best over every point's inner optimum."""
    dp = small_model()
    prob = Problem(global_batch=32, nodes_max=4, collectives=(Collective.ring,
                                                               Collective.hierarchical))
    search = SplitSearch(dp, prob)
    got = search.solve(strategy)
    values = []
    for n, g in itertools.product(range(1, 5), range(1, 3)):
        N = n * g
        if 32 % N:
            continue
        for c in prob.collectives:
            if strategy is Strategy.hybrid:
                lm = LayerModes(dp, n, g, 32 // N, c, True)
                a = best_modes(lm, 1e15, 10)
                values.append(lm.evaluate(a[0]).iteration_time_s / 32)
                continue
            for p in range(2, min(N, len(units(dp.cnn))) + 1):
                if N % p or 32 % (N // p):
                    continue
                per_copy = 32 // (N // p)
                for mu in [x for x in range(1, per_copy + 1) if per_copy % x == 0]:
                    st = Stages(dp, n, g, p, mu, per_copy // mu, c)
                    cut = best_cut(st, 1e15, 10)
                    values.append(st.evaluate(cut[0]).iteration_time_s / 32)
    assert got.status == "optimal"
    assert got.objective["value"] == pytest.approx(min(values), rel=1e-6)


def test_alexnet_hybrid_beats_data_parallel_with_fc_layers_model_parallel():
    """Issue 4: AlexNet, global batch 256, up to 16 nodes of k80-fdr."""
    sol = SplitSearch(build("alexnet", "k80-fdr"),
                      Problem(global_batch=256, nodes_max=16)).solve(Strategy.hybrid)
    modes = {l["name"]: (l["mode"], l["degree"]) for l in sol.plan["layers"]}
    assert [l["name"] for l in sol.plan["layers"]] == \
        [l.name for l in build("alexnet", "k80-fdr").cnn.layers]
    assert all(modes[f"conv{i}"] == ("data", 1) for i in range(1, 6))
    assert modes["fc6"][0] == modes["fc7"][0] == "model" and modes["fc6"][1] > 1
    assert sol.prediction["iteration_time_s"] < sol.data_parallel["iteration_time_s"]
    assert sol.objective["value"] < sol.data_parallel["objective_value"]


def test_vgg16_pipeline_on_8_devices_covers_every_layer_once_in_order():
    dp = build("vgg16", "k80-fdr")
    sol = SplitSearch(dp, Problem(global_batch=256, devices=8)).solve(Strategy.pipeline)
    stages = sol.plan["stages"]
    assert len(stages) >= 2 and sol.config["stages"] == len(stages)
    assert [name for s in stages for name in s["layers"]] == [l.name for l in dp.cnn.layers]
    assert sol.config["devices"] == 8 == sol.config["stages"] * sol.config["replicas"]
    assert sol.config["global_batch"] == (sol.config["replicas"] * sol.config["micro_batch"]
                                          * sol.config["micro_batches"])


@pytest.mark.parametrize("model", ["resnet50", "googlenet"])
def test_branching_networks_split_only_between_blocks(model):
    cnn = build(model, "k80-fdr").cnn
    block_of = {l.name: l.unit for l in cnn.layers}
    for groups in (units(cnn), segments(cnn)):
        seen = [cnn.layers[g.layers[0]].unit for g in groups]
        assert seen == sorted(set(seen)), "a block spread over two groups"
        assert [i for g in groups for i in g.layers] == list(range(len(cnn.layers)))
    sol = SplitSearch(build(model, "k80-fdr"),
                      Problem(global_batch=128, devices=4)).solve(Strategy.pipeline)
    stages = sol.plan["stages"]
    assert len(stages) >= 2
    for a, b in zip(stages, stages[1:], strict=False):
        assert block_of[a["layers"][-1]] != block_of[b["layers"][0]]


def test_auto_returns_the_best_strategy(run_json):
    args = ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
            "--nodes-max", "8")
    docs = {s: run_json(*args, "--strategy", s) for s in ("data", "hybrid", "pipeline", "auto")}
    best = min(("data", "hybrid", "pipeline"), key=lambda s: docs[s]["objective"]["value"])
    assert docs["auto"]["strategy"] == best
    assert docs["auto"]["objective"]["value"] == pytest.approx(docs[best]["objective"]["value"])


def test_auto_takes_what_is_possible_when_a_strategy_is_not(run, run_json):
    """On one device no pipeline exists: `pipeline` is infeasible (exit 1), `auto` returns
    the best of the rest (it had failed with the pipeline's infeasibility)."""
    args = ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64", "--devices", "1")
    code, _, err = run(*args, "--strategy", "pipeline")
    assert code == 1 and "pipeline" in err
    auto, data = run_json(*args, "--strategy", "auto"), run_json(*args, "--strategy", "data")
    assert auto["config"]["devices"] == 1
    assert auto["objective"]["value"] <= data["objective"]["value"] * (1 + 1e-12)


def test_cli_hybrid_json_keys(run_json):
    doc = run_json("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
                   "--nodes-max", "16", "--strategy", "hybrid")
    assert doc["strategy"] == "hybrid" and doc["status"] == "optimal"
    assert set(doc["plan"]["layers"][0]) == {"name", "mode", "degree", "compute_time_s",
                                             "communication_time_s"}
    assert doc["data_parallel"]["iteration_time_s"] > doc["prediction"]["iteration_time_s"]


def test_cli_pipeline_env_matches_json(run, run_json):
    args = ("solve", "-m", "vgg16", "-H", "k80-fdr", "--global-batch", "256", "--devices", "8",
            "--strategy", "pipeline")
    doc = run_json(*args)
    code, out, _ = run(*args, "--format", "env")
    assert code == 0
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert int(env["PLANNER_PP"]) == doc["config"]["stages"] == len(doc["plan"]["stages"])
    assert int(env["PLANNER_DP"]) == doc["config"]["replicas"]
    assert int(env["PLANNER_MICRO_BATCH"]) == doc["config"]["micro_batch"]
    shell = subprocess.run(["bash", "-c", out + "\necho $PLANNER_PP"], capture_output=True,
                           text=True, check=True)
    assert shell.stdout.strip() == shlex.quote(env["PLANNER_PP"])


@pytest.mark.parametrize(("args", "code", "needle"), [
    (("-m", "gpt2", "-H", "dgx-a100-80gb", "--global-batch", "64", "--strategy", "hybrid"), 2,
     "strategy"),
    (("-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--strategy", "pipeline",
      "--local-batch-min", "4"), 2, "local_batch"),
    (("-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--strategy", "hybrid",
      "--top", "2"), 2, "top"),
    (("-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--strategy", "sideways"), 2,
     "strategy"),
    (("-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--strategy", "pipeline",
      "--devices", "1"), 1, "pipeline"),
])
def test_cli_strategy_errors(run, args, code, needle):
    got, out, err = run("solve", *args)
    assert got == code and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_schema_accepts_split_outputs(run_json):
    import jsonschema

    from planner.schema import schemas

    for strategy, extra in (("hybrid", ("--nodes-max", "8")), ("pipeline", ("--devices", "8"))):
        doc = run_json("solve", "-m", "vgg16", "-H", "k80-fdr", "--global-batch", "256",
                       "--strategy", strategy, *extra)
        jsonschema.validate(doc, schemas()["solve"])
        bad = json.loads(json.dumps(doc))
        bad["plan"]["surprise"] = 1
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schemas()["solve"])


def test_memory_infeasible_names_the_memory_needed(run):
    code, _, err = run("solve", "-m", "vgg16", "-H", "k80-fdr", "--global-batch", "4096",
                       "--devices", "1", "--strategy", "hybrid")
    assert code == 1 and "memory" in err and "4096" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [
    ("-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--nodes-max", "16"),
    ("-m", "cosmoflow", "-H", "dgx-a100-80gb", "--global-batch", "4", "--nodes-max", "4",
     "--precision", "bf16"),
])
@pytest.mark.parametrize("fmt", ["env", "slurm"])
def test_a_hybrid_that_splits_layers_has_no_launcher_form(run, args, fmt):
    """Express it or refuse it: a per-layer split (fc layers in model mode, a volume in
    spatial slabs) is refused in one line, exit 2; it had been written as plain data
    parallelism, or crashed on the spatial plan's missing local batch."""
    code, out, err = run("solve", *args, "--strategy", "hybrid", "--format", fmt)
    assert code == 2 and "no launcher form writes" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
