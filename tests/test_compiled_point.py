"""A compiled program run at one point (every argument a scalar or an array of one value: a
plan priced alone) takes Python floats instead of numpy arrays; it must give numpy's answers
value for value, where Python would raise too (x / 0, 0 / 0, overflow, outside a function's
domain, NaN through max / min, a piecewise with no true condition), and the real cost
programs must give the same prices either way."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.catalog import load_model, load_system
from planner.compiled import OPS, Compiled
from planner.cost.programs import program
from planner.cost.transformer import Hardware
from planner.expr.choices import Choices
from planner.spec.hardware import Precision

# values that reach every edge of every operation
EDGES = (0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 3.0, 1e308, -1e308, 1e-300, math.inf, -math.inf,
         math.nan, 700.0, 1000.0)
ARITY = {"sqrt": 1, "not": 1, "log": 1, "exp": 1, "ceil": 1, "floor": 1, "abs": 1}


def _program(code: str, arity: int) -> Compiled:
    return Compiled(arity, [(code, tuple(range(arity)))], {}, {"out": arity})


def _same(point, vector, ulps: int = 0) -> bool:
    """Equal values (NaN equal to NaN; the sign of a zero, which no price reads and numpy's
    loops choose by CPU, not counted), within `ulps` units in the last place, and the same
    kind."""
    a, b = np.asarray(point), np.ravel(vector)[0]
    if (a.dtype == bool) != (np.asarray(b).dtype == bool):
        return False
    if ulps and np.isfinite(a) and np.isfinite(b) and a.dtype != bool:
        return bool(abs(a - b) <= ulps * np.spacing(max(abs(a), abs(b))))
    return bool(a == b or (np.isnan(a) and np.isnan(b)))


@pytest.mark.parametrize("code", sorted(set(OPS) - {"piecewise"}))
def test_every_operation_at_a_point_is_numpys(code):
    arity = ARITY.get(code, 2)
    prog = _program(code, arity)
    pairs = [(x,) for x in EDGES] if arity == 1 else [(x, y) for x in EDGES for y in EDGES]
    for args in pairs:
        point = prog(*args)["out"]
        # two copies of the point: numpy's own loops, the first element compared
        vector = prog(*(np.array([x, x]) for x in args))["out"]
        # numpy 2.4's vector power runs its own SIMD routine, a unit in the last place off
        # libm's (2.5 ** 2.5), which the scalar path calls
        assert _same(point, vector, ulps=1 if code == "pow" else 0), (code, args, point, vector)
        assert np.shape(point) == ()


def test_a_piecewise_takes_the_first_true_condition_or_nan():
    # conditions x1 > 0 and x2 > 0, as the programs write them (comparisons)
    prog = Compiled(4, [("const", ()), ("gt", (0, 4)), ("gt", (2, 4)), ("piecewise", (5, 1, 6, 3))],
                    {4: 0.0}, {"out": 7})
    for c1, v1, c2, v2 in [(1, 5.0, 1, 7.0), (0, 5.0, 1, 7.0), (0, 5.0, 0, 7.0),
                           (1, math.nan, 0, 1.0)]:
        point = prog(c1, v1, c2, v2)["out"]
        vector = prog(*(np.array([x, x]) for x in (c1, v1, c2, v2)))["out"]
        assert _same(point, vector)


def test_arrays_of_one_value_keep_their_shape():
    prog = _program("add", 2)
    assert prog(np.array([1.0]), 2.0)["out"].shape == (1,)
    assert prog(np.array([[1.0]]), np.array([2.0]))["out"].shape == (1, 1)
    assert prog(np.array([1.0]), 2.0)["out"][0] == 3.0


@pytest.mark.parametrize("choices", [Choices(), Choices(recompute="selective", zero=1,
                                                        sequence_parallel=True),
                                     Choices(recompute="full", zero=3, schedule="gpipe")])
def test_the_cost_program_prices_a_plan_alike_at_a_point_and_in_a_table(choices):
    """Each output of gpt2's program at one plan equals the same plan priced among others."""
    hw = Hardware.of(load_system("dgx-a100-80gb"), Precision.bf16)
    prog = program(load_model("gpt2"), hw, (choices,))
    plan = [2.0, 2.0, 4.0, 1.0, 8.0, 1.0, 1.0, 1.0, 2.0, 1.0, 1.0]
    point = prog(*plan)
    table = prog(*(np.array([x, 1.0]) for x in plan))
    for name, value in point.items():
        assert _same(value, table[name]), name
