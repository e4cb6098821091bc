"""Property tests for transformers: random valid specs load, evaluate and solve; the hybrid
solver equals brute force over every plan on random small problems; more bandwidth never
predicts slower; more memory never loses feasibility."""

import dataclasses
import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import load_system
from planner.errors import InfeasibleError, SpecError
from planner.search.hybrid import RECOMPUTE, HybridSolver, Plan, Search, predict
from planner.search.training import Training
from planner.spec.hardware import Precision
from planner.spec.transformer import build_transformer

SYSTEM = load_system("dgx-a100-80gb")


@st.composite
def transformers(draw):
    heads = draw(st.sampled_from([1, 2, 4, 6, 8]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8) if heads % k == 0]))
    data = {"kind": "transformer", "name": "random", "layers": draw(st.integers(1, 8)),
            "hidden": heads * draw(st.sampled_from([8, 16, 64])), "heads": heads,
            "kv_heads": kv, "seq_len": draw(st.sampled_from([16, 64, 256])),
            "vocab": draw(st.integers(10, 5000)),
            "ffn_kind": draw(st.sampled_from(["gelu", "swiglu"])),
            "tied_embeddings": draw(st.booleans()), "bias": draw(st.booleans())}
    return build_transformer(data, "random")


def _brute(m, system, B, budget):
    best = math.inf
    divs = [t for t in range(1, m.heads + 1) if m.heads % t == 0 and m.kv_heads % t == 0]
    for t, p, d in itertools.product(divs, range(1, m.layers + 1), range(1, B + 1)):
        n = t * p * d
        if B % d or n > budget or (n > system.devices_per_node and n % system.devices_per_node):
            continue
        for mb in (x for x in range(1, B // d + 1) if (B // d) % x == 0):
            for v, rec, sp, zero, sched in itertools.product(
                    range(1, m.layers + 1), RECOMPUTE, [False, True], [0, 1, 2, 3],
                    ["1f1b", "gpipe"]):
                try:
                    plan = Plan.split(t, p, d, mb, B, node_size=system.devices_per_node,
                                      interleave=v, recompute=rec, sequence_parallel=sp and t > 1,
                                      zero=zero, schedule=sched)
                    pred = predict(m, system, Precision.bf16, plan)
                except SpecError:
                    continue
                if pred.fits_memory:
                    best = min(best, pred.iteration_time_s)
    return best


@pytest.mark.slow
@given(transformers(), st.sampled_from([2, 4, 8, 12]), st.sampled_from([1, 2, 4, 8]))
def test_solver_equals_brute_force_on_random_transformers(m, B, budget):
    best = _brute(m, SYSTEM, B, budget)
    try:
        sol = HybridSolver(m, SYSTEM, Precision.bf16, Search(global_batch=B,
                                                            devices_max=budget)).solve()
    except InfeasibleError:
        assert best == math.inf
        return
    assert sol.status == "optimal"
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)
    assert sol.prediction.iteration_time_s / B == sol.objective["value"]  # s/sample


def _with_links(system, factor):
    intra = system.intra_node.model_copy(
        update={"bandwidth_GBps": system.intra_node.bandwidth_GBps * factor})
    inter = system.inter_node.model_copy(
        update={"bandwidth_GBps": system.inter_node.bandwidth_GBps * factor})
    return dataclasses.replace(system, intra_node=intra, inter_node=inter)


@given(transformers(), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]),
       st.floats(1.0, 100.0))
def test_more_bandwidth_never_predicts_slower(m, t, p, factor):
    if m.heads % t or m.kv_heads % t or p > m.layers:
        return
    plan = Plan.split(t, p, 2, 1, 8, node_size=SYSTEM.devices_per_node)
    slow = predict(m, SYSTEM, Precision.bf16, plan).iteration_time_s
    fast = predict(m, _with_links(SYSTEM, factor), Precision.bf16, plan).iteration_time_s
    assert fast <= slow * (1 + 1e-12)


@pytest.mark.slow
@given(transformers(), st.floats(1.0, 16.0))
def test_more_memory_never_loses_feasibility(m, factor):
    dev = SYSTEM.device
    roomy = dataclasses.replace(SYSTEM, device=dev.model_copy(
        update={"memory_GiB": dev.memory_GiB * factor}))
    q = Search(global_batch=8, devices_max=8)
    try:
        small = HybridSolver(m, SYSTEM, Precision.bf16, q).solve()
    except InfeasibleError:
        return
    big = HybridSolver(m, roomy, Precision.bf16, q).solve()
    assert big.objective["value"] <= small.objective["value"] * (1 + 1e-12)


@pytest.mark.slow
@given(transformers(), st.sampled_from([(2, 8), (4, 16), (1, 12)]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from(["time-to-train", "cost"]), st.floats(1.0, 64.0))
def test_the_chosen_plan_is_on_its_pareto_front(m, batches, budget, objective, critical):
    training = Training(critical_batch=critical, target_steps=100.0, price_per_device_hour=2.0)
    q = Search(global_batch_range=batches, devices_max=budget, objective=objective,
               training=training, pareto=True)
    try:
        sol = HybridSolver(m, SYSTEM, Precision.bf16, q).solve()
    except InfeasibleError:
        return
    assert sol.plan.to_json() in [p["config"] for p in sol.pareto]
    t, c = sol.training["time_to_train_s"], sol.training["cost_usd"]
    assert not any(p["time_to_train_s"] < t * (1 - 1e-9) and p["cost_usd"] < c * (1 - 1e-9)
                   for p in sol.pareto)
