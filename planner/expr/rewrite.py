"""Substitution that keeps Max and Min unevaluated.

`Expr.xreplace` rebuilds every node it touches with SymPy's default evaluation, and an
evaluated Max / Min searches its arguments for pairs it can order symbolically: over a second
per iteration-time expression. The cost expressions are compared numerically, so here Max and
Min are rebuilt as they were written (evaluate=False), and floor / ceiling unevaluated unless
their argument became a number; everything else evaluates as usual, so numbers still fold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.expr import graph
from planner.expr.unordered import _rounded, _unordered

if TYPE_CHECKING:
    import sympy as sp


def substitute(expr: sp.Basic, mapping: dict) -> sp.Basic:
    """`expr` with every key of `mapping` (symbols or sub-expressions) replaced by its value
    (a `planner.expr.graph` node by that module's own substitution)."""
    if isinstance(expr, graph.Node):
        return graph.substitute(expr, mapping)
    import sympy as sp

    memo: dict[sp.Basic, sp.Basic] = {}

    def walk(e: sp.Basic) -> sp.Basic:
        if e in mapping:
            return mapping[e]
        if not e.args:
            return e
        if e in memo:
            return memo[e]
        args = tuple(walk(a) for a in e.args)
        if args == e.args:
            out = e
        elif isinstance(e, sp.Max | sp.Min):
            out = _unordered(e.func, args)
        elif isinstance(e, sp.floor | sp.ceiling):
            out = _rounded(e.func, *args)
        else:
            out = e.func(*args)
        memo[e] = out
        return out

    return walk(expr)
