"""Max and Min built as written, and floor and ceiling of symbolic arguments unevaluated.
SymPy's `Max(..., evaluate=False)` still sorts its arguments
by `default_sort_key`, which counts every node below them: on the transformer's nested
expressions that sorting was 40 % of building them. Here the arguments keep the order the
cost model writes them in (duplicates dropped, as SymPy drops them), which is as deterministic;
SymPy's printers sort Max / Min arguments themselves, so the printed forms do not change."""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.expr import graph

if TYPE_CHECKING:
    import sympy as sp


def _graph(args) -> bool:
    """Any argument a node of the cost model's own algebra (`planner.expr.graph`): built
    there, with no SymPy."""
    return any(isinstance(a, graph.Node) for a in args)


def _unordered(cls, args):
    import sympy as sp
    from sympy.core.sympify import _sympify  # strict: numbers and expressions, never text

    args = tuple(dict.fromkeys(_sympify(a) for a in args))
    if len(args) == 1:
        return args[0]
    obj = sp.Expr.__new__(cls, *args)
    obj._argset = frozenset(args)
    return obj


def smax(*args) -> sp.Expr:
    """Max(*args), unevaluated and unsorted."""
    if _graph(args):
        return graph.Max(*args)
    import sympy as sp

    return _unordered(sp.Max, args)


def smin(*args) -> sp.Expr:
    """Min(*args), unevaluated and unsorted."""
    if _graph(args):
        return graph.Min(*args)
    import sympy as sp

    return _unordered(sp.Min, args)


def _rounded(cls, x) -> sp.Expr:
    """floor / ceiling of `x`: folded where `x` is a number, else built unevaluated (SymPy's
    evaluation of a symbolic argument only asks the assumptions whether it is an integer,
    which it cannot say of the cost model's ratios: 70 ms of a cold solve's builds)."""
    from sympy.core.sympify import _sympify

    x = _sympify(x)
    return cls(x) if x.is_number else cls(x, evaluate=False)


def sfloor(x) -> sp.Expr:
    """floor(x), unevaluated unless `x` is a number."""
    if isinstance(x, graph.Node):
        return graph.floor(x)
    import sympy as sp

    return _rounded(sp.floor, x)


def sceil(x) -> sp.Expr:
    """ceiling(x), unevaluated unless `x` is a number."""
    if isinstance(x, graph.Node):
        return graph.ceiling(x)
    import sympy as sp

    return _rounded(sp.ceiling, x)
