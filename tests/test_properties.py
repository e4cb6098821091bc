"""Property tests (hypothesis, fixed profile from conftest): random valid specs load, evaluate and
solve; CP-SAT equals brute force on random small problems; the answer's evaluation equals the
reported objective; more bandwidth never predicts slower; more memory never loses feasibility."""

import dataclasses
import hashlib
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import api
from planner.catalog import load_model, load_system
from planner.errors import InfeasibleError
from planner.expr.cnn import DataParallelModel, Options
from planner.expr.collectives import Collective
from planner.prediction import Config, predict
from planner.search.data_parallel import DataParallelSolver, Objective, Problem, Training
from planner.search.objective import SUPPORTED
from tests.test_solve import brute_force

MODELS = ["alexnet", "googlenet", "resnet50", "vgg16"]
SYSTEMS = ["k80-fdr", "titanx-fdr", "dgx1-v100", "dgx-a100-80gb", "p100-dgx1", "aws-p2-8xlarge"]


@st.composite
def problems(draw):
    if draw(st.booleans()):
        batch = dict(global_batch=draw(st.integers(1, 512)))
    else:
        lo = draw(st.integers(1, 256))
        batch = dict(global_batch_range=(lo, lo + draw(st.integers(0, 96))))
    objective = draw(st.sampled_from(SUPPORTED["cnn"]))
    if objective is Objective.efficiency and "global_batch" not in batch:
        objective = Objective.throughput
    training = None
    if objective in (Objective.time_to_train, Objective.cost):
        training = Training(critical_batch=draw(st.floats(1, 4096)), target_steps=100.0,
                            price_per_device_hour=2.0)
    cols = draw(st.lists(st.sampled_from(list(Collective)), min_size=1, max_size=3, unique=True))
    return Problem(training=training,
        nodes_max=draw(st.integers(1, 6)),
        nodes=draw(st.none() | st.integers(1, 6)),
        devices_max=draw(st.none() | st.integers(1, 24)),
        local_batch_min=draw(st.none() | st.integers(1, 64)),
        collectives=tuple(cols), overlap=draw(st.booleans()), objective=objective, **batch,
    )


@pytest.mark.slow
@settings(max_examples=220)
@given(model=st.sampled_from(MODELS), hw=st.sampled_from(SYSTEMS), problem=problems())
def test_cp_sat_equals_brute_force_on_random_problems(model, hw, problem):
    dp = api.build(model, hw)
    if problem.nodes is not None and problem.nodes > problem.nodes_max:
        problem = dataclasses.replace(problem, nodes=problem.nodes_max)
    expected = brute_force(dp, problem)
    solver = DataParallelSolver(dp, problem)
    if not expected:
        try:
            solver.solve()
        except InfeasibleError as exc:
            assert exc.conflicts or "infeasible" in str(exc)
            return
        raise AssertionError("solver found a plan brute force did not")
    sol = solver.solve()
    assert sol.status == "optimal"
    assert math.isclose(sol.objective["value"], expected[0][0], rel_tol=1e-9)
    # the reported objective is the expression evaluated at the answer, and predict agrees
    assert math.isclose(sol.objective["value"], solver.objective_value(sol.config), rel_tol=1e-12)
    pred = predict(dp, sol.config)
    if problem.objective is Objective.iteration_time:
        assert math.isclose(sol.objective["value"], pred.iteration_time_s, rel_tol=1e-12)
    if problem.objective is Objective.throughput:
        assert math.isclose(1 / sol.objective["value"], pred.throughput_samples_per_s,
                            rel_tol=1e-12)


# --- random valid CNNs ---------------------------------------------------------------------


@st.composite
def cnns(draw):
    """A random valid conv/pool/fc stack, with its parameter count worked out independently."""
    c0, hw0 = draw(st.integers(1, 4)), draw(st.integers(8, 64))
    c, hw = c0, hw0
    layers, params = [], 0
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["conv", "conv", "relu", "maxpool", "batchnorm"]))
        if kind == "conv":
            k, out = draw(st.integers(1, min(5, hw))), draw(st.integers(1, 32))
            stride, pad, bias = draw(st.integers(1, 2)), draw(st.integers(0, 2)), draw(st.booleans())
            layers.append({"type": "conv", "out": out, "kernel": k, "stride": stride,
                           "padding": pad, "bias": bias})
            params += out * c * k * k + (out if bias else 0)
            c, hw = out, (hw + 2 * pad - k) // stride + 1
        elif kind == "maxpool" and hw >= 2:
            layers.append({"type": "maxpool", "kernel": 2, "stride": 2})
            hw //= 2
        elif kind == "batchnorm":
            layers.append({"type": "batchnorm"})
            params += 2 * c
        elif kind == "relu":
            layers.append({"type": "relu"})
    out = draw(st.integers(1, 100))
    layers.append({"type": "fc", "out": out})
    params += out * c * hw * hw + out
    return {"kind": "cnn", "name": "random", "input": [c0, hw0, hw0], "layers": layers}, params


@settings(max_examples=60)
@given(spec=cnns(), hw=st.sampled_from(SYSTEMS), nodes=st.integers(1, 4),
       local=st.integers(1, 64))
def test_random_valid_cnns_load_evaluate_and_solve(tmp_path_factory, spec, hw, nodes, local):
    doc, params = spec
    text = yaml.safe_dump(doc)
    path = tmp_path_factory.mktemp("cnn") / f"{hashlib.sha1(text.encode()).hexdigest()}.yaml"
    path.write_text(text)
    assert load_model(str(path)).params == params
    ev = api.evaluate(str(path), hw, nodes=nodes, local_batch=local)
    p = ev.prediction
    assert math.isfinite(p.iteration_time_s) and p.iteration_time_s > 0
    assert 0 < p.efficiency <= 1 + 1e-9
    sol = api.solve(str(path), hw, global_batch=ev.config.global_batch, nodes_max=nodes)
    assert sol.status == "optimal"
    assert sol.prediction.throughput_samples_per_s >= p.throughput_samples_per_s * (1 - 1e-9)


# --- monotonicity ---------------------------------------------------------------------------


def _scaled(system, bw: float = 1.0, mem: float = 1.0):
    links = {k: getattr(system, k).model_copy(
        update={"bandwidth_GBps": getattr(system, k).bandwidth_GBps * bw})
        for k in ("intra_node", "inter_node")}
    dev = system.device.model_copy(update={"memory_GiB": system.device.memory_GiB * mem})
    return dataclasses.replace(system, device=dev, **links)


@settings(max_examples=60)
@given(model=st.sampled_from(MODELS), hw=st.sampled_from(SYSTEMS), factor=st.floats(1, 1e3),
       nodes=st.integers(1, 64), local=st.integers(1, 256), col=st.sampled_from(list(Collective)),
       overlap=st.booleans())
def test_more_bandwidth_never_predicts_slower(model, hw, factor, nodes, local, col, overlap):
    cnn, system = load_model(model), load_system(hw)
    g = system.devices_per_node
    cfg = Config(nodes, g, nodes * g * local, col, overlap)
    opts = Options(system.device.default_precision)
    base = predict(DataParallelModel(cnn, system, opts), cfg).iteration_time_s
    fast = predict(DataParallelModel(cnn, _scaled(system, bw=factor), opts), cfg).iteration_time_s
    assert fast <= base * (1 + 1e-12)


@settings(max_examples=40)
@given(model=st.sampled_from(MODELS), hw=st.sampled_from(SYSTEMS), factor=st.floats(1, 100),
       batch=st.integers(1, 4096), nodes_max=st.integers(1, 8))
def test_more_memory_never_loses_feasibility(model, hw, factor, batch, nodes_max):
    cnn, system = load_model(model), load_system(hw)
    opts = Options(system.device.default_precision)
    prob = Problem(global_batch=batch, nodes_max=nodes_max)

    def solve(sysm):
        try:
            return DataParallelSolver(DataParallelModel(cnn, sysm, opts), prob).solve()
        except InfeasibleError:
            return None

    small, big = solve(system), solve(_scaled(system, mem=factor))
    if small is not None:
        assert big is not None
        assert big.objective["value"] <= small.objective["value"] * (1 + 1e-9)


@settings(max_examples=60)
@given(model=st.sampled_from(MODELS), hw=st.sampled_from(SYSTEMS), lo=st.integers(1, 256),
       width=st.integers(0, 512), nodes_max=st.integers(1, 8), critical=st.floats(1, 4096),
       objective=st.sampled_from([Objective.time_to_train, Objective.cost]))
def test_the_chosen_plan_is_on_its_pareto_front(model, hw, lo, width, nodes_max, critical,
                                                objective):
    training = Training(critical_batch=critical, target_steps=100.0, price_per_device_hour=2.0)
    problem = Problem(global_batch_range=(lo, lo + width), nodes_max=nodes_max,
                      objective=objective, training=training, pareto=True)
    try:
        sol = DataParallelSolver(api.build(model, hw), problem).solve()
    except InfeasibleError:
        return
    assert sol.plan.to_json() in [p["config"] for p in sol.pareto]
    t, c = sol.training["time_to_train_s"], sol.training["cost_usd"]
    assert not any(p["time_to_train_s"] < t * (1 - 1e-9) and p["cost_usd"] < c * (1 - 1e-9)
                   for p in sol.pareto)
