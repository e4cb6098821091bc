"""Clusters of several pools: the spec, the mixed-plan cost against the one-system model, the
CP-SAT models against brute force, the bound-ordered search against solving every shape, and
the command line."""

import itertools
import json
import math

import numpy as np
import pytest

from planner.catalog import load_model, load_target
from planner.cost import pools as cost
from planner.cost.pools import Group, MixedPlan, Shape, Stage
from planner.errors import SpecError
from planner.plan import Plan, stage_layers
from planner.search.hybrid import predict
from planner.search.hybrid_space import Search
from planner.search.memory_fit import filled
from planner.search.pools import ClusterSolver, _slot_bound
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len

BF16 = Precision.bf16


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Two nodes of A100 and two of H100, joined by one 100 GbE link per node."""
    path = tmp_path_factory.mktemp("cluster") / "small.yaml"
    path.write_text("kind: cluster\nname: small\npools:\n"
                    "  - {system: dgx-a100-80gb, nodes: 2}\n"
                    "  - {system: dgx-h100, nodes: 2}\n"
                    "between_pools: {link: 100gbe, count: 1}\n")
    return str(path)


def test_builtin_cluster_loads():
    c = load_target("lab-a100-h100")
    assert [(p.name, p.nodes, p.devices) for p in c.pools] == [
        ("dgx-a100-80gb", 32, 256), ("dgx-h100", 16, 128)]
    # 8 NDR links per node (8 x 50 GB/s x 0.9), no faster than the A100 pool's own 8 HDR
    # NICs (8 x 25 GB/s x 0.9)
    assert c.between_node_Bps(*c.pools) == pytest.approx(8 * 25e9 * 0.9)


@pytest.mark.parametrize("body, message", [
    ("pools:\n  - {system: dgx-h100, nodes: 2}\n  - {system: dgx-h100, nodes: 3}\n",
     "two pools named 'dgx-h100'"),
    ("pools:\n  - {system: dgx-h900, nodes: 2}\n", "key 'pools.0.system': unknown hardware"),
    ("pools:\n  - {system: dgx-h100, nodes: 2, availability: 0.1}\n",
     "key 'pools.0.availability'"),
    ("pools: []\n", "pools"),
    ("pools:\n  - {system: dgx-h100, nodes: 2}\nbetween_pools: {link: nvlink9, count: 1}\n",
     "key 'between_pools.link'"),
])
def test_bad_cluster_is_one_line(tmp_path, body, message):
    path = tmp_path / "c.yaml"
    path.write_text("kind: cluster\nname: c\n" + body)
    with pytest.raises(SpecError, match=message) as err:
        load_target(str(path))
    assert "\n" not in str(err.value).split(":", 1)[0]


@pytest.mark.parametrize("t, p, d, mb, B, rec", [
    (8, 8, 4, 1, 512, "full"), (8, 12, 2, 2, 256, "selective"), (4, 16, 2, 1, 64, "full"),
    (8, 6, 1, 1, 32, "full"), (8, 1, 1, 1, 8, "full"), (2, 16, 4, 1, 1536, "none")])
def test_one_pool_mixed_plan_is_the_one_system_model(t, p, d, mb, B, rec):
    """Assembled stage by stage from the per-layer parts and the forms, a plan on one pool
    costs exactly what the one-system model says (time and memory)."""
    m, c = load_model("gpt3-175b"), load_target("lab-a100-h100")
    for k, pool in enumerate(c.pools):
        shape = Shape(t, mb, rec, True, 2, True)
        plan = MixedPlan(shape, (Group(tuple(Stage(k, n) for n in stage_layers(96, p)), d,
                                       B // (d * mb)),))
        priced = cost.price(m, c, BF16, plan)
        ref = predict(m, pool.system, BF16, Plan.split(
            t, p, d, mb, B, node_size=8, recompute=rec, sequence_parallel=True, zero=2))
        assert priced.iteration_time_s == pytest.approx(ref.iteration_time_s, rel=1e-12)
        assert max(priced.memory_bytes[0]) == pytest.approx(ref.memory_bytes_per_device,
                                                            rel=1e-12)


@pytest.mark.parametrize("t, cp, p, d, rec, zero", [
    (4, 2, 8, 4, "full", 2), (2, 4, 10, 2, "selective", 1), (8, 2, 4, 1, "none", 2),
    (1, 8, 16, 2, "full", 0)])
def test_context_parallel_stages_are_the_one_system_model(t, cp, p, d, rec, zero):
    """With context parallelism a mixed plan on one pool still costs what the one-system
    model says: stages of tp x cp devices, gradients reduced over dp x cp ranks."""
    m, c = load_model("llama3-70b"), load_target("lab-a100-h100")
    m = with_seq_len(m, 16384)
    for k, pool in enumerate(c.pools):
        shape = Shape(t, 1, rec, t > 1, zero, True, (), cp)
        B = 8 * d
        plan = MixedPlan(shape, (Group(tuple(Stage(k, n) for n in stage_layers(80, p)), d,
                                       B // d),))
        priced = cost.price(m, c, BF16, plan)
        ref = predict(m, pool.system, BF16, Plan.split(
            t, p, d, 1, B, node_size=8, recompute=rec, sequence_parallel=t > 1, zero=zero,
            cp=cp))
        assert priced.iteration_time_s == pytest.approx(ref.iteration_time_s, rel=1e-12)
        # the one-system model puts max(embedding, output layer) on its fullest stage, the
        # mixed plan each on its own stage: Llama's output layer has the final norm (h / t
        # parameters) more than its embedding
        gap = ref.memory_bytes_per_device - max(priced.memory_bytes[0])
        assert 0 <= gap <= m.hidden / t * 18  # 18 bytes per parameter at most (ZeRO 0)
        assert plan.devices_on(k) == t * cp * p * d


def test_switches_reach_every_stage():
    """A switch the request sets (flash attention off, tensor-parallel overlap on) prices
    the stages of a mixed plan as it prices the one-system plan."""
    m, c = load_model("gpt3-175b"), load_target("lab-a100-h100")
    given = (("flash_attention", False), ("tp_overlap", True))
    shape = Shape(8, 1, "full", True, 2, True, given)
    plan = MixedPlan(shape, (Group(tuple(Stage(1, n) for n in stage_layers(96, 8)), 2, 64),))
    ref = predict(m, c.pools[1].system, BF16, Plan.split(
        8, 8, 2, 1, 128, node_size=8, recompute="full", sequence_parallel=True, zero=2,
        flash_attention=False, tp_overlap=True))
    plain = cost.price(m, c, BF16, MixedPlan(Shape(8, 1, "full", True, 2, True),
                                             plan.groups))
    assert cost.price(m, c, BF16, plan).iteration_time_s == pytest.approx(
        ref.iteration_time_s, rel=1e-12)
    assert plain.iteration_time_s != pytest.approx(ref.iteration_time_s, rel=1e-3)


def _value(m, c, plan, caps):
    priced = cost.price(m, c, BF16, plan, caps)
    return priced.iteration_time_s if priced.fits else math.inf


@pytest.mark.parametrize("tp, cp", [(4, 1), (2, 2)])
def test_pipeline_model_matches_brute_force(small, tp, cp):
    """Every pool assignment and layer split of a 4-stage gpt2 pipeline over two pools: the
    CP-SAT model's plan is the cheapest that fits (stages of tp x cp devices)."""
    m, c = load_model("gpt2"), load_target(small)
    solver = ClusterSolver(m, c, BF16, Search(global_batch=64, cp=cp))
    shape, d, p, B = Shape(tp, 2, "none", True, 2, True, (), cp), 2, 4, 64
    got = solver._solve_pipeline(shape, (0, 1), B, d, p, math.inf)
    mcount = B // (shape.micro_batch * d)
    best = math.inf
    for pools in itertools.product((0, 1), repeat=p):
        if len(set(pools)) < 2 or any(pools.count(k) * d * shape.width > 16 for k in (0, 1)):
            continue
        for cut in itertools.combinations(range(1, m.layers), p - 1):
            sizes = [b - a for a, b in zip((0, *cut), (*cut, m.layers), strict=True)]
            plan = MixedPlan(shape, (Group(tuple(Stage(k, n) for k, n in zip(
                pools, sizes, strict=True)), d, mcount),))
            best = min(best, _value(m, c, plan, solver.caps))
    assert math.isfinite(best)
    assert _value(m, c, got, solver.caps) == pytest.approx(best, rel=1e-6)


def test_replica_model_matches_brute_force(small):
    """Every split of 64 samples over replicas on two pools: the CP-SAT model's is the best."""
    m, c = load_model("gpt2"), load_target(small)
    solver = ClusterSolver(m, c, BF16, Search(global_batch=64))
    shape, p, B = Shape(2, 2, "none", True, 2, True), 2, 64
    got = solver._solve_replicas(shape, (0, 1), B, 0, p, math.inf)
    split, per = stage_layers(m.layers, p), B // shape.micro_batch
    best = math.inf
    for d0, d1 in itertools.product(range(1, 5), repeat=2):  # 16 devices / (tp 2 x pp 2)
        if (d0 * 4) % 8 or (d1 * 4) % 8:
            continue  # whole nodes
        for m0 in range(1, per // d0 + 1):
            rest = per - d0 * m0
            if rest <= 0 or rest % d1:
                continue
            plan = MixedPlan(shape, (Group(tuple(Stage(0, n) for n in split), d0, m0),
                                     Group(tuple(Stage(1, n) for n in split), d1, rest // d1)))
            best = min(best, _value(m, c, plan, solver.caps))
    assert math.isfinite(best)
    assert got.global_batch == B
    assert _value(m, c, got, solver.caps) == pytest.approx(best, rel=1e-6)


def _least_slot(L, lt, logit, hop, least, caps, room):
    """The brute-force least slowest-stage time: every pool per stage and layer split."""
    K, best = len(lt), math.inf
    p = sum(least) + 1
    for pools in itertools.product(range(K), repeat=p):
        if any(not least[k] <= pools.count(k) <= caps[k] for k in range(K)):
            continue
        for cut in itertools.combinations(range(1, L), p - 1):
            sizes = [b - a for a, b in zip((0, *cut), (*cut, L), strict=True)]
            if any(n > room[k] for n, k in zip(sizes, pools, strict=True)):
                continue
            best = min(best, max(n * lt[k] + hop + (logit[k] if j == p - 1 else 0)
                                 for j, (n, k) in enumerate(zip(sizes, pools, strict=True))))
    return best


def test_slot_bound_is_the_brute_force_least_slot():
    """The pipeline bound's slot against every placement of small pipelines: never above the
    least slowest stage, and equal to it without an output layer (the bound is exact then)."""
    rng = np.random.default_rng(7)
    exact = 0
    for case in range(150):
        K = int(rng.integers(1, 4))
        L = int(rng.integers(K + 1, 10))
        least = rng.integers(1, 3, K)
        if least.sum() + 1 > L:
            continue
        caps = least + rng.integers(0, 3, K)
        lt = rng.uniform(1, 3, K)
        logit = rng.uniform(0, 2, K) * (case % 2)
        room = rng.integers(1, L + 1, K)
        hop = float(rng.uniform(0, 0.5))
        p = int(least.sum()) + 1
        want = _least_slot(L, lt, logit, hop, least, caps, room)
        got = _slot_bound(L, lt[:, None], logit[:, None], np.array([hop]), least[:, None],
                          caps[:, None], np.array([p]), room[:, None])[0]
        if not math.isfinite(want):
            continue
        assert got <= want * (1 + 1e-12)
        if case % 2 == 0:
            assert got == pytest.approx(want, rel=1e-9)
            exact += 1
    assert exact > 20


@pytest.mark.slow
def test_bound_order_loses_nothing(small):
    """The search stops at the first shape whose lower bound is no better than its best plan:
    solving every shape to the end finds nothing better, and no shape beats its bound."""
    m, c = load_model("gpt2"), load_target(small)
    solver = ClusterSolver(m, c, BF16, Search(global_batch_range=(32, 64), tp=4))
    found, _ = solver._mixed((0, 1), None)
    # the bounds sharpened against an incumbent hold for every plan that beats it
    incumbent = found.seconds_per_sample * 1.25
    for form in (solver._pipeline_rows, solver._replica_rows):
        plain, sharp = form((0, 1)), form((0, 1), incumbent)
        below = plain["lb"] < incumbent  # where the incumbent sharpens the bound
        assert (sharp["lb"][below] >= plain["lb"][below]).all()
        assert (sharp["lb"][below] > plain["lb"][below]).any() or form == solver._replica_rows
        for i in range(len(plain["lb"])):
            plan = plain["solve"](i, math.inf)
            if plan is None:
                continue
            value = _value(m, c, plan, solver.caps) / plan.global_batch
            assert value >= plain["lb"][i] * (1 - 1e-9)
            if value < incumbent:
                assert value >= sharp["lb"][i] * (1 - 1e-9)
            assert value >= found.seconds_per_sample * (1 - 1e-6)


def test_mixed_is_never_slower_than_one_pool(run_json):
    import jsonschema

    from planner.schema import schemas

    doc = run_json("solve", "-m", "gpt3-175b", "-H", "lab-a100-h100", "--global-batch", "512")
    jsonschema.validate(doc, schemas()["solve"])
    assert doc["status"] == "optimal"
    singles = [s for s in doc["subsets"] if len(s["pools"]) == 1]
    assert len(singles) == 2 and len(doc["subsets"]) == 3
    best = doc["prediction"]
    assert all(best["tokens_per_s"] >= s["tokens_per_s"] for s in singles)
    assert doc["gain_over_best_single_pool"] > 0.2  # the A100 pool is worth adding
    plan = doc["plan"]
    assert plan["kind"] == "pipeline across pools"
    stages = plan["groups"][0]["stages"]
    assert sum(s["layers"] for s in stages) == 96 and len(stages) == plan["pp"]
    assert {s["pool"] for s in stages} == {"dgx-a100-80gb", "dgx-h100"}
    # an H100 stage holds more layers than an A100 stage: its device is faster
    most = {p: max(s["layers"] for s in stages if s["pool"] == p) for p in plan["pools"]}
    assert most["dgx-h100"] > most["dgx-a100-80gb"]
    assert plan["devices"]["dgx-h100"] <= 128 and plan["devices"]["dgx-a100-80gb"] <= 256
    assert {a["pool"] for a in doc["pools_add"]} == {"dgx-a100-80gb", "dgx-h100"}
    # the band: every pool's stages at its own band's percentiles (each pool's band for the
    # plan's ZeRO stage and devices), so within their range
    from planner import bands
    from planner.catalog import load_system
    from planner.spec.hardware import Precision

    m = load_model("gpt3-175b")
    ratios = {p: bands.band(bands.features(m, load_system(p).device.name, Precision.bf16,
                                           plan["zero"], sum(plan["devices"].values())))
              for p in plan["pools"]}
    assert all(r.low is not None for r in ratios.values())
    band = best["time_band"]
    assert min(r.low for r in ratios.values()) <= band["low_ratio"] + 1e-12
    assert band["high_ratio"] <= max(r.high for r in ratios.values()) + 1e-12
    assert band["low_s"] < best["iteration_time_s"] * band["high_ratio"] == pytest.approx(
        band["high_s"])
    gains = doc["gain_band"]
    assert gains["low"] <= doc["gain_over_best_single_pool"] <= gains["high"] + 1e-9
    # the slowest stage is the bottleneck's; the break-even bandwidth is below the link's
    limits = doc["limits"]
    by_pool = limits["bottleneck"]["by_pool"]
    assert by_pool[limits["bottleneck"]["pool"]] == max(by_pool.values())
    assert limits["against"] == "dgx-h100"
    assert 0 < limits["break_even_between_node_Bps"] < limits["between_node_Bps"]


def test_break_even_bandwidth_bisection_is_the_closed_form():
    """The least bandwidth between pools at which the lab pipeline still beats the H100 pool
    alone: bisection on the plan's price equals the closed form per boundary stage, and the
    plan is faster just above it, not just below."""
    from planner import api
    from planner.analysis import pools as limits

    sol = api.solve("gpt3-175b", "lab-a100-h100", global_batch=512)
    m, c, plan = load_model("gpt3-175b"), load_target("lab-a100-h100"), sol.best.plan
    target = sol.of(("dgx-h100",)).seconds_per_sample
    prec = Precision.bf16  # the cluster's one precision, which the search priced
    bisected = limits.break_even_between_Bps(m, c, prec, plan, target)
    assert bisected == pytest.approx(limits.pipeline_break_even_Bps(m, c, prec, plan, target),
                                     rel=1e-7)
    assert bisected == pytest.approx(sol.limits["break_even_between_node_Bps"], rel=1e-12)
    for scale, faster in ((1.001, True), (0.999, False)):
        t = cost.price(m, c.at_between(bisected * scale), prec, plan).iteration_time_s
        assert (t / plan.global_batch < target) is faster


def test_limits_over_a_cluster_is_solves_limits(run_json, run):
    """`planner limits -H CLUSTER`: the same bottleneck and break-even bandwidth as solve's,
    each pool alone beside the mix, schema-valid; a one-system limit is refused."""
    import jsonschema

    from planner.schema import schemas

    args = ("-m", "gpt3-175b", "-H", "lab-a100-h100", "--global-batch", "512")
    lim, sol = run_json("limits", *args), run_json("solve", *args)
    jsonschema.validate(lim, schemas()["limits"])
    assert lim["limits"] == sol["limits"] and lim["plan"] == sol["plan"]
    assert [e["pools"] for e in lim["single_pools"]] == [["dgx-a100-80gb"], ["dgx-h100"]]
    code, out, err = run("limits", *args)
    assert code == 0 and "beats dgx-h100 alone while the links between pools" in out
    code, _, err = run("limits", *args, "--critical-batch", "1e6")
    assert code == 2 and "limit of one system" in err


@pytest.mark.slow
def test_replicas_balance_in_closed_form_and_need_their_link(run_json):
    """Replicas on three pools: the closed form (real micro-batches at which every pool's
    replicas finish together) bounds the step from below, and the plan's integer micro-batches
    are the best split of the global batch against it, found by brute force over every split
    (the replicas' counts, 9, 5 and 5 here, leave only some totals reachable, so the pool that
    sets the pace can sit a few micro-batches off its own closed form); the plan needs a link
    between pools."""
    doc = run_json("solve", "-m", "gpt3-175b", "-H", "mixed-hopper-blackwell",
                   "--global-batch", "4096")
    plan, limits = doc["plan"], doc["limits"]
    assert plan["kind"] == "replicas across pools"
    groups = plan["groups"]
    got = {g["stages"][0]["pool"]: g["micro_batches"] for g in groups}
    x = limits["balanced_micro_batches"]
    assert got.keys() == x.keys()
    total = 4096 // plan["micro_batch"]
    assert sum(g["micro_batches"] * g["replicas"] for g in groups) == total
    # a pool's step is (micro-batches + p - 1) slots, and the closed form makes them equal:
    # the step relative to the balanced one is max over pools of (n + p - 1) / (x + p - 1)
    lag = len(groups[0]["stages"]) - 1
    pools, reps = [g["stages"][0]["pool"] for g in groups], [g["replicas"] for g in groups]

    def pace(counts):
        return max((n + lag) / (x[k] + lag) for k, n in zip(pools, counts, strict=True))

    assert len(reps) == 3
    best = math.inf
    for a in range(1, total // reps[0] + 1):
        left = total - reps[0] * a
        for b in range(1, left // reps[1] + 1):
            rest = left - reps[1] * b
            if rest > 0 and rest % reps[2] == 0:
                best = min(best, pace((a, b, rest // reps[2])))
    assert pace([got[k] for k in pools]) == pytest.approx(best, rel=1e-12)
    assert best >= 1
    assert 0 < limits["break_even_between_node_Bps"] < limits["between_node_Bps"]


def test_slow_link_between_pools_names_the_mix_it_blocks(tmp_path, run_json):
    """One 10 GbE link per node between an A100 and an H100 pool: the H100 pool alone wins,
    and the report says what the mix would gain at the pools' own NIC speed and what link it
    needs."""
    import jsonschema

    from planner.schema import schemas

    path = tmp_path / "far.yaml"
    path.write_text("kind: cluster\nname: far\npools:\n  - {system: dgx-a100-80gb, nodes: 4}\n"
                    "  - {system: dgx-h100, nodes: 4}\nbetween_pools: {link: 10gbe, count: 1}\n")
    doc = run_json("solve", "-m", "llama3-8b", "-H", str(path), "--global-batch", "128")
    jsonschema.validate(doc, schemas()["solve"])
    assert doc["plan"]["kind"] == "one pool" and doc["plan"]["pools"] == ["dgx-h100"]
    mix = doc["limits"]["at_own_fabric"]
    assert mix["gain_over_best_single_pool"] > 0
    far = load_target(str(path))
    assert mix["break_even_between_node_Bps"] > far.between_node_Bps(*far.pools)


@pytest.mark.parametrize("pin, key, value", [("--pp", "pp", 8), ("--tp", "tp", 4),
                                             ("--micro-batch", "micro_batch", 2)])
def test_pins_hold_across_pools(run_json, pin, key, value):
    doc = run_json("solve", "-m", "gpt3-175b", "-H", "lab-a100-h100", "--global-batch",
                   "1536", pin, str(value))
    assert doc["plan"]["kind"] != "one pool" and doc["plan"][key] == value


def test_pools_of_different_collective_libraries_are_never_mixed(tmp_path, run_json):
    """MI300X (RCCL) beside H100 (NCCL): each pool alone, never a job over both."""
    path = tmp_path / "amd-nvidia.yaml"
    path.write_text("kind: cluster\nname: amd-nvidia\npools:\n"
                    "  - {system: mi300x-8, nodes: 4}\n  - {system: dgx-h100, nodes: 4}\n")
    doc = run_json("solve", "-m", "llama3-8b", "-H", str(path), "--global-batch", "256")
    assert doc["plan"]["kind"] == "one pool"
    assert all(len(e["uses"]) == 1 for e in doc["subsets"])
    assert "collective libraries (nccl, rccl)" in doc["no_plan"]["mi300x-8 + dgx-h100"]


def test_one_pool_cluster_is_its_system_with_a_node_budget(tmp_path, run_json):
    path = tmp_path / "one.yaml"
    path.write_text("kind: cluster\nname: one\npools:\n  - {system: dgx-h100, nodes: 4}\n")
    got = run_json("solve", "-m", "gpt2", "-H", str(path), "--global-batch", "256")
    ref = run_json("solve", "-m", "gpt2", "-H", "dgx-h100", "--nodes-max", "4",
                   "--global-batch", "256")
    assert got["config"] == ref["config"]
    assert got["prediction"]["iteration_time_s"] == ref["prediction"]["iteration_time_s"]


@pytest.mark.parametrize("args, message", [
    (("evaluate", "-m", "gpt2", "-H", "lab-a100-h100", "--devices", "8", "--global-batch",
      "8"), "is a cluster of 2 pools"),
    (("solve", "-m", "gpt2", "-H", "lab-a100-h100", "--global-batch", "64", "--objective",
      "iteration-time"), "ranks plans by throughput"),
    (("solve", "-m", "resnet50", "-H", "lab-a100-h100", "--global-batch", "64"),
     "plans transformers"),
    (("solve", "-m", "gpt2", "-H", "lab-a100-h100", "--global-batch", "64", "--nodes-max",
      "4"), "the pools' node counts are the budget"),
])
def test_cluster_refusals_are_one_line(run, args, message):
    code, out, err = run(*args)
    assert code == 2 and message in err and err.count("\n") == 1


def test_unsupported_switch_still_solves_each_pool(run_json):
    doc = run_json("solve", "-m", "gpt2", "-H", "lab-a100-h100", "--global-batch", "256",
                   "--optimizer", "muon")
    assert "optimizer" in doc["mixed_not_searched"]
    import jsonschema

    from planner.schema import schemas

    jsonschema.validate(doc, schemas()["solve"])
    assert [s["kind"] for s in doc["subsets"]] == ["one pool", "one pool"]


def test_text_report_names_every_subset(run):
    code, out, err = run("solve", "-m", "gpt2", "-H", "lab-a100-h100", "--global-batch", "256")
    assert code == 0, err
    assert "dgx-a100-80gb + dgx-h100" in out and "USD / M tokens" in out
    json.dumps(out)


def test_python_api_solves_a_cluster():
    from planner import api

    sol = api.solve("gpt2", "lab-a100-h100", global_batch=256)
    assert sol.status == "optimal" and len(sol.subsets) == 3
    assert sol.of(("dgx-a100-80gb", "dgx-h100")) is not None


def test_a_cluster_trains_in_one_precision_whatever_the_order_of_its_pools(tmp_path, run_json):
    """Without --precision a cluster of A100 (fp16 by default) and H100 (bf16) pools trains in
    bf16 on every pool, listed either way round; each pool alone is then priced as that
    system alone at bf16."""
    docs = []
    for order in ((0, 1), (1, 0)):
        pools = [("dgx-a100-80gb", 32), ("dgx-h100", 16)]
        body = "kind: cluster\nname: lab\npools:\n" + "".join(
            f"  - {{system: {pools[k][0]}, nodes: {pools[k][1]}}}\n" for k in order)
        path = tmp_path / f"lab{order[0]}.yaml"
        path.write_text(body)
        docs.append(run_json("solve", "-m", "gpt3-175b", "-H", str(path), "--global-batch",
                             "1536"))
    assert {d["precision"]["name"] for d in docs} == {"bf16"}
    assert docs[0]["prediction"]["iteration_time_s"] == docs[1]["prediction"]["iteration_time_s"]
    alone = run_json("solve", "-m", "gpt3-175b", "-H", "dgx-h100", "--nodes-max", "16",
                     "--global-batch", "1536", "--precision", "bf16")
    h100 = next(e for e in docs[0]["subsets"] if e["pools"] == ["dgx-h100"])
    assert h100["iteration_time_s"] == pytest.approx(alone["prediction"]["iteration_time_s"],
                                                     rel=1e-9)


def test_a_capped_search_says_feasible_not_optimal(monkeypatch):
    """Past MAX_MODELS CP-SAT models the rows left are unproven: the subset's plan (and the
    solution) is `feasible`, never claimed optimal."""
    from planner import api
    from planner.search import pools

    full = api.solve("gpt2", "lab-a100-h100", global_batch=256)
    mixed = full.of(("dgx-a100-80gb", "dgx-h100"))
    assert full.status == "optimal" and mixed.status == "optimal" and full.models_solved > 1
    monkeypatch.setattr(pools, "MAX_MODELS", 1)
    capped = api.solve("gpt2", "lab-a100-h100", global_batch=256)
    assert capped.models_solved == 1
    assert capped.status == "feasible"
    assert capped.of(("dgx-a100-80gb", "dgx-h100")).status == "feasible"
    assert capped.best.seconds_per_sample >= full.best.seconds_per_sample * (1 - 1e-9)


def test_a_mix_beyond_a_pools_memory_reach_weighs_the_covered_mix(run_json):
    """At global batch 1,536 the fastest mix fills the H100s to 98.4 % of their usable memory,
    beyond the fullest H100 calibration run (94.2 %): its band is "not covered", so the
    search weighs the fastest mix within that filling, as one pool's search weighs its covered
    plan, and takes it where it lies within its own band's spread of the fastest. The single
    pools beside it are covered picks too, so the gain compares like with like."""
    import jsonschema

    from planner import bands
    from planner.catalog import load_system
    from planner.schema import schemas

    doc = run_json("solve", "-m", "gpt3-175b", "-H", "lab-a100-h100", "--global-batch", "1536")
    jsonschema.validate(doc, schemas()["solve"])
    best = doc["prediction"]
    sup = best["support"]
    reach = bands.covered("h100-sxm5-80gb", "full")
    assert sup["taken"] and sup["covered_by"] == f"memory at most {reach:.1%}"
    assert sup["reach"] == {"dgx-h100": reach}  # the A100's runs bound no filling
    assert sup["rule"] == "band" and not sup["cut_off"]
    assert "beyond 94.2%" in sup["note"] and "(pool dgx-h100)" in sup["note"]
    # the taken mix is covered, within reach, and no faster than the fastest it replaced
    assert "low_s" in best["time_band"]
    h100 = load_system("dgx-h100").device
    assert filled(best["memory_bytes_per_device"]["dgx-h100"], h100) <= reach
    per_sample = best["iteration_time_s"] / best["global_batch"]
    assert sup["alternative"]["seconds_per_sample"] == pytest.approx(per_sample, rel=1e-12)
    assert sup["alternative"]["kind"] == best["kind"] == "replicas across pools"
    assert sup["fastest_seconds_per_sample"] < per_sample
    assert per_sample <= (1 + sup["tolerance"]) * sup["fastest_seconds_per_sample"]
    # the subset's entry says the same, and the gain is over a covered single pool
    mixed = next(s for s in doc["subsets"] if len(s["pools"]) == 2)
    assert mixed["support"] == sup
    single = next(s for s in doc["subsets"] if s["pools"] == ["dgx-h100"])
    assert "low_s" in single["time_band"] and "gain_band" in doc
    # --prefer-supported 0 takes a covered plan only as fast: the fastest mix stays
    doc = run_json("solve", "-m", "gpt3-175b", "-H", "lab-a100-h100", "--global-batch", "1536",
                   "--prefer-supported", "0")
    jsonschema.validate(doc, schemas()["solve"])
    sup = doc["prediction"]["support"]
    assert not sup["taken"] and sup["rule"] == "fraction" and sup["tolerance"] == 0
    assert doc["prediction"]["iteration_time_s"] == pytest.approx(
        sup["fastest_iteration_time_s"], rel=1e-12)


def _lab_1536():
    m = with_seq_len(load_model("gpt3-175b"), 2048)
    return ClusterSolver(m, load_target("lab-a100-h100"), BF16, Search(global_batch=1536))


def _fastest_mix(solver):
    best, cut = solver._fastest_mix((0, 1), math.inf)
    return solver._found((0, 1), *best, cut)


def test_a_covered_mix_outside_the_band_leaves_the_fastest():
    """With a reach that only a slow mix keeps to (the H100s filled to 5 % at most), the
    fastest mix stays and its record names the covered mix it passed over; the text says so."""
    from planner.report.cluster import _support

    solver = _lab_1536()
    solver.reach = [None, 0.05]
    found, _ = solver._mixed((0, 1), None)
    sup, alt = found.support, found.support["alternative"]
    assert not sup["taken"] and sup["covered_by"] == "memory at most 5.0%"
    assert found.iteration_time_s == pytest.approx(sup["fastest_iteration_time_s"], rel=1e-12)
    assert alt["seconds_per_sample"] > (1 + sup["tolerance"]) * sup["fastest_seconds_per_sample"]
    assert "low_s" in alt["time_band"] and "low_s" not in found.time_band
    assert _support(sup) == (
        f"the fastest plan filling 5.0% of the usable memory or less ({alt['kind']} on "
        f"dgx-a100-80gb + dgx-h100) takes {alt['iteration_time_s']:.4g} s "
        f"({alt['seconds_per_sample'] / sup['fastest_seconds_per_sample'] - 1:+.1%} time): "
        "outside its error band; the fastest mix is kept")


def test_where_no_mix_within_the_reach_beats_the_smaller_subsets_their_covered_plan_is_weighed():
    """The second search is bounded by the smaller subsets' best: where no mix within the
    reach beats it, that plan is the covered one weighed (and here, within the band, taken)."""
    solver = _lab_1536()
    requested = list(solver.caps)
    covered, _ = solver._mixed((0, 1), None)  # the covered mix of the test above
    # the bounded search took its capacities as an argument: the request's are as they were
    assert solver.caps == requested
    hws = {p.name: p.system.device for p in solver.cluster.pools}
    assert filled(covered.memory_bytes["dgx-h100"], hws["dgx-h100"]) <= solver.reach[1]
    fastest = _fastest_mix(solver)
    solver.reach = [None, 0.05]  # no mix keeps to it faster than `covered`
    got = solver._within_reach((0, 1), covered, fastest)
    assert got.support["taken"] and got.status == "optimal"
    assert got.iteration_time_s == covered.iteration_time_s and got.plan == covered.plan
    assert got.support["alternative"]["kind"] == covered.kind


def test_a_second_search_cut_off_by_the_model_budget_proves_nothing(monkeypatch):
    """Where the model budget runs out before the second search ends, the fastest mix is kept
    as `feasible` and the record says the search was cut off, not that no plan fits."""
    from planner.report.cluster import _support
    from planner.search import pools

    solver = _lab_1536()
    fastest = _fastest_mix(solver)
    monkeypatch.setattr(pools, "MAX_MODELS", solver.models)
    got = solver._within_reach((0, 1), None, fastest)
    assert not got.support["taken"] and got.support["cut_off"] and got.status == "feasible"
    assert got.support["alternative"] is None
    assert _support(got.support) == ("the search for a plan filling 94.2% of the usable memory "
                                     "or less stopped at its model budget; the fastest mix is "
                                     "kept")


def test_a_mix_not_covered_for_another_reason_than_its_memory_carries_no_record(run_json):
    """A pinned ZeRO-2 mix within the memory reach is not covered for its sharded gradients:
    no second search, no record (that is the pin's to lift)."""
    doc = run_json("solve", "-m", "llama2-7b", "-H", "lab-a100-h100", "--global-batch", "256",
                   "--zero", "2")
    best = doc["prediction"]
    assert "support" not in best and "ZeRO-2" in best["time_band"]["note"]


def test_a_mix_over_families_of_different_reach_names_each_pools():
    """Pools whose families' fullest runs differ are each kept to their own: the record says
    "memory within each pool's reach" and the text names each pool's share."""
    from planner.report.cluster import _support
    from planner.search.pools import EACH_POOLS_REACH

    solver = _lab_1536()
    solver.reach = [0.99, solver.reach[1]]  # as if the A100's runs bounded a filling too
    found, _ = solver._mixed((0, 1), None)
    sup = found.support
    assert sup["covered_by"] == EACH_POOLS_REACH
    assert sup["reach"] == {"dgx-a100-80gb": 0.99, "dgx-h100": solver.reach[1]}
    assert _support(sup).startswith(
        "took the fastest plan filling each pool's usable memory no more than its family's "
        f"fullest run (dgx-a100-80gb 99.0%, dgx-h100 {solver.reach[1]:.1%}) (")
    empty = {**sup, "alternative": None, "cut_off": False, "taken": False}
    assert _support(empty) == ("no plan filling each pool's usable memory no more than its "
                               f"family's fullest run (dgx-a100-80gb 99.0%, dgx-h100 "
                               f"{solver.reach[1]:.1%}) fits; the fastest mix is kept")
