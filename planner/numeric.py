"""Turn the package's own SymPy expressions into fast vectorised numpy programs.

A `Program` is a straight-line list of numpy operations, one per distinct sub-expression of
the expressions it computes (SymPy expressions hash structurally, so a sub-expression shared by
the iteration time, the memory and the breakdown is computed once: common-subexpression
elimination by hash-consing). Each node type has its own method, `_op_<ClassName>`, found along
the class's MRO the way SymPy's printers dispatch. Unlike `sympy.lambdify` nothing is printed
and no `exec` runs, so no path from a spec to evaluation executes text. Only the node types the
cost models build are accepted; anything else is a programming error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import sympy as sp

from planner.compiled import Compiled

_RELATIONS = {"Equality": "eq", "Unequality": "ne", "StrictLessThan": "lt",
              "LessThan": "le", "StrictGreaterThan": "gt", "GreaterThan": "ge"}
_UNARY = {"log": "log", "exp": "exp", "ceiling": "ceil", "floor": "floor", "Abs": "abs"}


def _expr(e) -> sp.Basic:
    """Our own Python numbers as SymPy numbers (an expression may fold to a plain 0)."""
    if isinstance(e, bool | int):
        return sp.Integer(int(e))
    if isinstance(e, float):
        return sp.Float(e)
    return e


class Program(Compiled):
    """`program(*values)` evaluates every expression of `exprs` (a name -> expression mapping)
    at `args = values`, broadcasting arrays, and returns name -> array. `functions` implements
    undefined SymPy functions by name (e.g. a roofline sum held as arrays). Built here, run by
    `planner.compiled.Compiled`."""

    def __init__(self, exprs: Mapping[str, sp.Expr], args: Sequence[sp.Symbol],
                 functions: Mapping[str, Callable] | None = None):
        self.slot: dict[sp.Basic, int] = {a: i for i, a in enumerate(args)}
        self.n_args = len(args)
        self.ops: list[tuple[str, tuple[int, ...]]] = []
        self.constants: dict[int, float | bool] = {}
        self.functions = dict(functions or {})
        outputs = {name: self._node(_expr(e)) for name, e in exprs.items()}
        super().__init__(self.n_args, self.ops, self.constants, outputs, functions)
        del self.slot  # the expressions are not needed to run it

    # --- building ----------------------------------------------------------------------------

    def _node(self, e: sp.Basic) -> int:
        if e in self.slot:
            return self.slot[e]
        for cls in type(e).__mro__:
            method = getattr(self, f"_op_{cls.__name__}", None)
            if method is not None:
                break
        else:
            raise TypeError(f"cannot compile {type(e).__name__} node: {e}")
        index = method(e)
        self.slot[e] = index
        return index

    def _emit(self, code: str, *operands: int) -> int:
        self.ops.append((code, operands))
        return self.n_args + len(self.ops) - 1

    def _constant(self, value: float | bool) -> int:
        index = self._emit("const")
        self.constants[index] = value
        return index

    def _op_Symbol(self, e):
        raise ValueError(f"free symbol {e} is not an argument")

    def _op_Number(self, e):
        return self._constant(float(e))

    def _op_NumberSymbol(self, e):
        return self._constant(float(e))

    def _op_BooleanTrue(self, e):
        return self._constant(True)

    def _op_BooleanFalse(self, e):
        return self._constant(False)

    def _op_Add(self, e):
        return self._emit("add", *(self._node(a) for a in e.args))

    def _op_Mul(self, e):
        # x * y**-1 as a division: as exact as numpy's own and several times faster than power
        num = [a for a in e.args if not (a.is_Pow and a.exp == -1)]
        den = [a.base for a in e.args if a.is_Pow and a.exp == -1]
        top = (self._emit("mul", *(self._node(a) for a in num)) if len(num) > 1
               else self._node(num[0]) if num else self._constant(1.0))
        if not den:
            return top
        bottom = (self._node(den[0]) if len(den) == 1
                  else self._emit("mul", *(self._node(a) for a in den)))
        return self._emit("div", top, bottom)

    def _op_Pow(self, e):
        base = self._node(e.base)
        if e.exp == -1:
            return self._emit("div", self._constant(1.0), base)
        if e.exp == 2:
            return self._emit("mul", base, base)
        if e.exp == sp.Rational(1, 2):
            return self._emit("sqrt", base)
        return self._emit("pow", base, self._node(e.exp))

    def _op_Max(self, e):
        return self._emit("max", *(self._node(a) for a in e.args))

    def _op_Min(self, e):
        return self._emit("min", *(self._node(a) for a in e.args))

    def _op_Relational(self, e):
        return self._emit(_RELATIONS[type(e).__name__], self._node(e.lhs), self._node(e.rhs))

    def _op_And(self, e):
        return self._emit("and", *(self._node(a) for a in e.args))

    def _op_Or(self, e):
        return self._emit("or", *(self._node(a) for a in e.args))

    def _op_Not(self, e):
        return self._emit("not", self._node(e.args[0]))

    def _op_Function(self, e):
        name = type(e).__name__
        if name in _UNARY:
            return self._emit(_UNARY[name], self._node(e.args[0]))
        raise TypeError(f"cannot compile {name} node: {e}")

    def _op_AppliedUndef(self, e):
        name = type(e).__name__
        if name not in self.functions:
            raise ValueError(f"no implementation given for {name}")
        return self._emit(f"fn:{name}", self._node(e.args[0]))

    def _op_Piecewise(self, e):
        operands = []
        for piece in e.args:
            operands += [self._node(piece.cond), self._node(piece.expr)]
        return self._emit("piecewise", *operands)


def compile_expr(expr: sp.Expr, args: Sequence[sp.Symbol],
                 functions: Mapping[str, Callable] | None = None) -> Callable[..., np.ndarray]:
    """`fn(*values)` evaluates one expression at `args = values` as a float array of the
    arguments' broadcast shape."""
    program = Program({"value": expr}, args, functions)

    def call(*values):
        arrays = [np.asarray(v, dtype=float) for v in values]
        out = np.asarray(program(*arrays)["value"], dtype=float)
        return np.broadcast_to(out, np.broadcast(*arrays).shape)

    return call
