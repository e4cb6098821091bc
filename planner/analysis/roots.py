"""Closed-form roots with SymPy, and `Formula`: a closed form with the values it holds at.

The limits of `planner.analysis.cnn_limits` and `planner.analysis.time_to_train` solve the cost
expressions with these, then check every root they find against the full model.
"""

from __future__ import annotations

import fractions
from dataclasses import dataclass

import sympy as sp

from planner.expr import symbols as S


def relax(expr: sp.Expr) -> sp.Expr:
    """Replace ceiling(x) by x so the expression can be differentiated (tree allreduce)."""
    return expr.replace(sp.ceiling, lambda x: x)


def solve_for_n(expr: sp.Expr) -> list[sp.Expr]:
    """Roots in n of `expr` = 0. Terms are grouped by their n-dependent shape (1/n, n,
    log n, ...) and each group's n-free coefficient stands in as one symbol while SymPy
    solves: the same closed forms (LambertW for log-latency collectives), found in a fraction
    of a second instead of the minute SymPy spends checking roots in expanded coefficients."""
    by_shape: dict[sp.Expr, sp.Expr] = {}
    for term in sp.Add.make_args(sp.expand(expr)):
        coeff, shape = term.as_independent(S.n, as_Add=False)
        by_shape[shape] = by_shape.get(shape, sp.Integer(0)) + coeff
    coeffs = {sp.Dummy(f"c{i}", real=True): c for i, c in enumerate(by_shape.values())}
    reduced = sp.Add(*(d * shape for d, shape in zip(coeffs, by_shape, strict=True)))
    return [r.subs(coeffs) for r in sp.solve(reduced, S.n)]


def affine(expr: sp.Expr, x: sp.Symbol) -> tuple[sp.Expr, sp.Expr] | None:
    """(a, k) with expr = a + k x, a and k free of x; None when expr is not affine in x."""
    k = sp.diff(expr, x)
    if k.has(x):
        return None
    return expr.subs(x, 0), k


def affine_root(expr: sp.Expr, x: sp.Symbol) -> list[sp.Expr]:
    """Roots in x of expr = 0: -a / k where expr = a + k x, else SymPy's."""
    ak = affine(expr, x)
    if ak is None:
        return sp.solve(expr, x)
    a, k = ak
    return [] if k == 0 else [-a / k]


def rational(x: float) -> sp.Rational:
    """A float as a short exact fraction (0.8 -> 4/5) without SymPy parsing anything."""
    f = fractions.Fraction(x).limit_denominator(10**6)
    return sp.Rational(f.numerator, f.denominator)


def real_root_in(root: sp.Expr, vals: dict, lo: float, hi: float) -> float | None:
    """The value of a closed-form root at `vals` if it is real and inside [lo, hi]."""
    try:
        x = complex(root.subs(vals))
    except (TypeError, ValueError):
        return None
    if abs(x.imag) < 1e-12 * max(1.0, abs(x.real)) and lo <= x.real <= hi:
        return x.real
    return None


@dataclass(frozen=True)
class Formula:
    """A limit's closed form `expression`, the `values` of its symbols, and why it is the
    answer (`note`)."""

    name: str
    expression: sp.Expr  # in the aggregate symbols
    values: dict  # symbol -> number
    note: str = ""

    @property
    def value(self) -> float:
        return float(self.expression.subs(self.values))
