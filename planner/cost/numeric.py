"""Turn the package's own SymPy expressions into fast vectorised numpy functions.

The expression tree is compiled once into nested Python closures over numpy operations. Unlike
`sympy.lambdify` this generates no source and calls no `exec`, so no code path from a spec to
evaluation executes text, and it skips importing SymPy's printers (a third of a cold start).
Only the node types the cost model builds are accepted; anything else is a programming error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.logic.boolalg import BooleanFalse, BooleanTrue

Vec = Callable[[Sequence[np.ndarray]], np.ndarray]

_RELATIONS = {sp.Eq: np.equal, sp.Ne: np.not_equal, sp.Lt: np.less, sp.Le: np.less_equal,
              sp.Gt: np.greater, sp.Ge: np.greater_equal}
_UNARY = {sp.log: np.log, sp.exp: np.exp, sp.ceiling: np.ceil, sp.floor: np.floor, sp.Abs: np.abs}


def compile_expr(expr: sp.Expr, args: Sequence[sp.Symbol],
                 functions: Mapping[str, Callable] | None = None) -> Callable[..., np.ndarray]:
    """`fn(*values)` evaluates `expr` at `args = values`, broadcasting arrays. `functions`
    implements undefined SymPy functions in `expr` by name (e.g. a roofline sum)."""
    index = {s: i for i, s in enumerate(args)}
    fn = _compile(expr, index, dict(functions or {}))

    def call(*values):
        arrays = [np.asarray(v, dtype=float) for v in values]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = np.asarray(fn(arrays), dtype=float)
        return np.broadcast_to(out, np.broadcast(*arrays).shape)

    return call


def _compile(e: sp.Basic, index: dict, functions: dict) -> Vec:  # noqa: C901 - one case per node
    if isinstance(e, sp.Piecewise):
        pairs = [(_compile(p.expr, index, functions), _compile(p.cond, index, functions))
                 for p in e.args]
        def piecewise(v):
            shape = np.broadcast(*v).shape
            values = [np.broadcast_to(np.asarray(f(v), dtype=float), shape) for f, _ in pairs]
            conds = [np.broadcast_to(np.asarray(c(v), dtype=bool), shape) for _, c in pairs]
            return np.select(conds, values, default=np.nan)
        return piecewise
    sub = [_compile(a, index, functions) for a in e.args]
    if e.is_Number or isinstance(e, sp.NumberSymbol):
        value = float(e)
        return lambda v: value
    if isinstance(e, BooleanTrue | BooleanFalse):
        truth = bool(e)
        return lambda v: truth
    if e.is_Symbol:
        if e not in index:
            raise ValueError(f"free symbol {e} is not an argument")
        i = index[e]
        return lambda v: v[i]
    if e.is_Add:
        return lambda v: sum(f(v) for f in sub)
    if e.is_Mul:
        def mul(v):
            out = 1.0
            for f in sub:
                out = out * f(v)
            return out
        return mul
    if e.is_Pow:
        base, power = sub
        return lambda v: np.power(base(v), power(v))
    if isinstance(e, sp.Max | sp.Min):
        op = np.maximum if isinstance(e, sp.Max) else np.minimum
        def extremum(v):
            out = sub[0](v)
            for f in sub[1:]:
                out = op(out, f(v))
            return out
        return extremum
    if type(e) in _RELATIONS:
        op, (lhs, rhs) = _RELATIONS[type(e)], sub
        return lambda v: op(lhs(v), rhs(v))
    if isinstance(e, sp.And | sp.Or):
        op = np.logical_and if isinstance(e, sp.And) else np.logical_or
        def logical(v):
            out = sub[0](v)
            for f in sub[1:]:
                out = op(out, f(v))
            return out
        return logical
    if isinstance(e, sp.Not):
        return lambda v: np.logical_not(sub[0](v))
    if type(e) in _UNARY:
        op, (arg,) = _UNARY[type(e)], sub
        return lambda v: op(arg(v))
    if isinstance(e, AppliedUndef):
        name = type(e).__name__
        if name not in functions:
            raise ValueError(f"no implementation given for {name}")
        impl, (arg,) = functions[name], sub
        return lambda v: impl(arg(v))
    raise TypeError(f"cannot compile {type(e).__name__} node: {e}")
