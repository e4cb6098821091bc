"""Closed forms from piecewise cost expressions: pick the branch that holds at a point, relax
the integer steps, and solve the smooth branch with SymPy.

The cost expressions are sums of Max / Min / Piecewise terms with ceiling and floor steps. At
a point, each Max / Min has one active argument and each Piecewise one active branch; on the
neighbourhood where those choices hold, the expression is smooth once ceiling(x) and floor(x)
are relaxed to x, and SymPy can differentiate and solve it. The values are checked against the
full model by the callers (a closed form is only reported where its branch holds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy as sp

from planner.expr import symbols as S


def value_at(expr: sp.Expr, point: dict) -> float:
    """The number `expr` takes at `point` (every free symbol given)."""
    return float(expr.xreplace(point))


def branch_at(expr: sp.Expr, point: dict) -> sp.Expr:
    """`expr` with each Max / Min replaced by its argument active at `point`, each Piecewise by
    its branch that holds there, and ceiling / floor relaxed to their argument."""
    if isinstance(expr, sp.Max | sp.Min):
        values = [value_at(a, point) for a in expr.args]
        pick = max if isinstance(expr, sp.Max) else min
        return branch_at(expr.args[values.index(pick(values))], point)
    if isinstance(expr, sp.Piecewise):
        for piece in expr.args:
            if piece.cond is sp.true or bool(piece.cond.xreplace(point)):
                return branch_at(piece.expr, point)
        raise ValueError(f"no branch of {expr} holds at {point}")
    if isinstance(expr, sp.ceiling | sp.floor):
        return branch_at(expr.args[0], point)
    if not expr.args:
        return expr
    return expr.func(*(branch_at(a, point) for a in expr.args))


def relax(expr: sp.Expr) -> sp.Expr:
    """`expr` with ceiling(x) and floor(x) replaced by x (a continuous plan variable)."""
    return expr.replace(sp.ceiling, lambda x: x).replace(sp.floor, lambda x: x)


def solve_for(expr: sp.Expr, x: sp.Symbol) -> list[sp.Expr]:
    """Roots in x of `expr` = 0. Terms are grouped by their x-dependent shape (1/x, x, ...) and
    each group's x-free coefficient stands in as one symbol while SymPy solves: the same closed
    forms, found in a fraction of the time SymPy spends on expanded coefficients."""
    by_shape: dict[sp.Expr, sp.Expr] = {}
    for term in sp.Add.make_args(sp.expand(expr)):
        coeff, shape = term.as_independent(x, as_Add=False)
        by_shape[shape] = by_shape.get(shape, sp.Integer(0)) + coeff
    coeffs = {sp.Dummy(f"c{i}", real=True): c for i, c in enumerate(by_shape.values())}
    reduced = sp.Add(*(k * shape for k, shape in zip(coeffs, by_shape, strict=True)))
    return [root.subs(coeffs) for root in sp.solve(reduced, x, check=False)]


def real_in(root: sp.Expr, point: dict, lo: float, hi: float) -> float | None:
    """The value of a closed-form root at `point` if it is real and inside [lo, hi]."""
    try:
        z = complex(root.xreplace(point))
    except (TypeError, ValueError):
        return None
    if abs(z.imag) <= 1e-9 * max(1.0, abs(z.real)) and lo <= z.real <= hi:
        return z.real
    return None


def laurent(expr: sp.Expr, x: sp.Symbol) -> dict[int, float]:
    """{k: a_k} with expr = sum_k a_k x^k, for an expression whose terms are numbers times
    integer powers of x (a relaxed branch of the cost in one plan variable)."""
    out: dict[int, float] = {}
    for term in sp.Add.make_args(sp.expand(expr)):
        coeff, power = term.as_coeff_exponent(x)
        if coeff.has(x) or not power.is_Integer:
            raise ValueError(f"not a Laurent polynomial in {x}: {term}")
        out[int(power)] = out.get(int(power), 0.0) + float(coeff)
    return out


def laurent_form(x: sp.Symbol, powers) -> sp.Expr:
    """sum_k a_k x^k in the glossary's coefficient symbols (powers -1, 0, 1, 2)."""
    names = {-1: S.a_inv, 0: S.a_0, 1: S.a_1, 2: S.a_2}
    unknown = set(powers) - set(names)
    if unknown:
        raise ValueError(f"powers {sorted(unknown)} of {x} have no coefficient symbol")
    return sp.Add(*(names[k] * x**k for k in sorted(powers)))


def laurent_values(coeffs: dict[int, float]) -> dict[sp.Symbol, float]:
    names = {-1: S.a_inv, 0: S.a_0, 1: S.a_1, 2: S.a_2}
    return {names[k]: v for k, v in coeffs.items()}


@dataclass(frozen=True)
class Closed:
    """A closed form, the values of its symbols, what it evaluates to, and why it holds."""

    name: str
    expression: sp.Expr
    values: dict
    note: str

    @property
    def value(self) -> float:
        return value_at(self.expression, self.values)


def divisors(x: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(x) + 1) if x % k == 0]
    return sorted(set(small + [x // k for k in small]))
