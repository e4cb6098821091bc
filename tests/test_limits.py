"""limits and derive: closed forms against the full model, derive against limits, sweep against
limits, and the seed paper's conclusions as numbers."""

import math

import pytest
import sympy as sp

from planner import api
from planner.expr import symbols as S
from planner.expr.collectives import Collective
from planner.formulas import as_json, derive

CASES = [(c, ov) for c in Collective for ov in (False, True)]


@pytest.fixture(scope="module")
def alexnet_limits():
    return {case: api.limits("alexnet", "k80-fdr", global_batch=1024, collective=case[0].value,
                             overlap=case[1]) for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_symbolic_iteration_time_equals_full_model(alexnet_limits, case):
    lim = alexnet_limits[case]
    for nodes in (2.0, 7.5, 40.0, 300.0):
        vals = lim.piece_values(lim.global_batch / (lim.g * nodes))
        closed = float(lim.iteration_expr().subs({**vals, S.n: nodes}))
        assert math.isclose(closed, lim.iteration_time(nodes), rel_tol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_derive_text_form_evaluates_to_value_equal_to_limits(alexnet_limits, case):
    lim = alexnet_limits[case]
    formulas = {f.name: as_json(f) for f in derive(lim)}
    summary = lim.summary()
    for name in ("optimal_nodes", "max_speedup"):
        j = formulas[name]
        expr = sp.sympify(j["expression"])  # test-only: our own output, never user input
        value = float(expr.subs({sp.Symbol(k): v["value"] for k, v in j["symbols"].items()}))
        assert math.isclose(value, j["value"], rel_tol=1e-9)
        assert math.isclose(j["value"], summary[name], rel_tol=1e-9)


@pytest.mark.parametrize("case", CASES)
def test_optimum_is_no_worse_than_any_node_count(alexnet_limits, case):
    lim = alexnet_limits[case]
    t_opt = lim.iteration_time(lim.optimal_nodes)
    for x in [1, 1.5, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 512]:
        assert t_opt <= lim.iteration_time(x) * (1 + 1e-12)


def test_parameter_server_optimum_matches_independent_closed_form():
    """Seed paper / DESIGN.md: with a parameter server, n* = sqrt(c B beta s / (2 |W| delta))
    (per device; here divided by g devices per node)."""
    lim = api.limits("alexnet", "k80-fdr", global_batch=1024, collective="parameter-server",
                     overlap=False)
    vals = lim.piece_values(lim.global_batch / (lim.g * lim.optimal_nodes))
    c, B, beta, s, M, g = (vals[x] for x in (S.c, S.B, S.beta, S.s, S.M, S.g))
    assert math.isclose(lim.optimal_nodes, math.sqrt(c * B * beta * s / (2 * M)) / g,
                        rel_tol=1e-9)


def test_ring_optimum_matches_design_formula():
    lim = api.limits("alexnet", "k80-fdr", global_batch=1024, collective="ring", overlap=False)
    vals = lim.piece_values(lim.global_batch / (lim.g * lim.optimal_nodes))
    c, B, beta, a, M, g, k = (vals[x] for x in (S.c, S.B, S.beta, S.alpha, S.M, S.g, S.k))
    assert math.isclose(lim.optimal_nodes, math.sqrt((c * B - 2 * M / beta) / (2 * k * a)) / g,
                        rel_tol=1e-9)


def test_seed_conclusions_alexnet_k80_fdr():
    lim = api.limits("alexnet", "k80-fdr", global_batch=1024, overlap=False)
    s = lim.summary()
    assert 12 <= s["max_useful_nodes"] <= 96  # "a few dozen nodes"
    assert s["comm_bound_from_nodes"] < s["max_useful_nodes"]  # turns communication bound early
    assert s["max_speedup"] < 0.25 * 2 * s["optimal_nodes"]  # far from linear


def test_sweep_agrees_with_limits():
    lim = api.limits("alexnet", "k80-fdr", global_batch=1024, overlap=False)
    points, _ = api.sweep("alexnet", "k80-fdr", nodes=list(range(1, 513)), global_batch=1024,
                          overlap=False)
    best = max(points, key=lambda p: p.prediction.speedup)
    assert best.prediction.speedup <= lim.max_speedup * (1 + 1e-9)
    # the best integer node count that divides the batch brackets the continuous optimum
    divs = [p.config.nodes for p in points]
    below = max(d for d in divs if d <= lim.optimal_nodes)
    above = min(d for d in divs if d >= lim.optimal_nodes)
    assert best.config.nodes in (below, above)
    for p in points:
        assert math.isclose(p.prediction.iteration_time_s, lim.iteration_time(p.config.nodes),
                            rel_tol=1e-12)


def test_required_bandwidth_meets_target_exactly():
    lim = api.limits("alexnet", "k80-fdr", global_batch=1024, overlap=True, at_nodes=8,
                     target_efficiency=0.5)
    f = lim.required_bandwidth()
    assert f is not None
    vals = {**f.values, S.beta: f.value}
    t = float(lim.iteration_expr().subs(vals))
    eff = lim.single_device_time / (lim.g * 8 * t)
    assert math.isclose(eff, 0.5, rel_tol=1e-9)


@pytest.mark.parametrize("at_nodes", [None, 4.0, 32.0])
def test_derive_efficiency_is_limits_efficiency_at_the_same_nodes(run_json, at_nodes):
    """`derive --formula efficiency` is evaluated where `limits` reports the efficiency: at
    --at-nodes (it had been at the optimum whatever --at-nodes said)."""
    args = ["-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256"]
    if at_nodes is not None:
        args += ["--at-nodes", str(at_nodes)]
    lim = run_json("limits", *args)["efficiency_at_nodes"]
    der = run_json("derive", *args, "--formula", "efficiency")["formulas"][0]
    assert der["symbols"]["n"]["value"] == lim["nodes"]
    assert math.isclose(der["value"], lim["efficiency"], rel_tol=1e-12)
