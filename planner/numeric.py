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

Op = Callable[..., np.ndarray]

_RELATIONS = {"Equality": np.equal, "Unequality": np.not_equal, "StrictLessThan": np.less,
              "LessThan": np.less_equal, "StrictGreaterThan": np.greater,
              "GreaterThan": np.greater_equal}
_UNARY = {"log": np.log, "exp": np.exp, "ceiling": np.ceil, "floor": np.floor, "Abs": np.abs}


def _expr(e) -> sp.Basic:
    """Our own Python numbers as SymPy numbers (an expression may fold to a plain 0)."""
    if isinstance(e, bool | int):
        return sp.Integer(int(e))
    if isinstance(e, float):
        return sp.Float(e)
    return e


def _fold(op: Op) -> Op:
    def folded(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = op(out, x)
        return out
    return folded


class Program:
    """`program(*values)` evaluates every expression of `exprs` (a name -> expression mapping)
    at `args = values`, broadcasting arrays, and returns name -> array. `functions` implements
    undefined SymPy functions by name (e.g. a roofline sum held as arrays)."""

    def __init__(self, exprs: Mapping[str, sp.Expr], args: Sequence[sp.Symbol],
                 functions: Mapping[str, Callable] | None = None):
        self.functions = dict(functions or {})
        self.slot: dict[sp.Basic, int] = {a: i for i, a in enumerate(args)}
        self.n_args = len(args)
        self.ops: list[tuple[Op, tuple[int, ...]]] = []
        self.constants: dict[int, float | bool] = {}
        self.outputs = {name: self._node(_expr(e)) for name, e in exprs.items()}
        self._plan_frees()

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

    def _emit(self, op: Op, *operands: int) -> int:
        self.ops.append((op, operands))
        return self.n_args + len(self.ops) - 1

    def _constant(self, value: float | bool) -> int:
        index = self._emit(lambda: value)
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
        return self._emit(_fold(np.add), *(self._node(a) for a in e.args))

    def _op_Mul(self, e):
        # x * y**-1 as a division: as exact as numpy's own and several times faster than power
        num = [a for a in e.args if not (a.is_Pow and a.exp == -1)]
        den = [a.base for a in e.args if a.is_Pow and a.exp == -1]
        top = (self._emit(_fold(np.multiply), *(self._node(a) for a in num)) if len(num) > 1
               else self._node(num[0]) if num else self._constant(1.0))
        if not den:
            return top
        bottom = (self._node(den[0]) if len(den) == 1
                  else self._emit(_fold(np.multiply), *(self._node(a) for a in den)))
        return self._emit(np.divide, top, bottom)

    def _op_Pow(self, e):
        base = self._node(e.base)
        if e.exp == -1:
            return self._emit(np.divide, self._constant(1.0), base)
        if e.exp == 2:
            return self._emit(np.multiply, base, base)
        if e.exp == sp.Rational(1, 2):
            return self._emit(np.sqrt, base)
        return self._emit(np.power, base, self._node(e.exp))

    def _op_Max(self, e):
        return self._emit(_fold(np.maximum), *(self._node(a) for a in e.args))

    def _op_Min(self, e):
        return self._emit(_fold(np.minimum), *(self._node(a) for a in e.args))

    def _op_Relational(self, e):
        op = _RELATIONS[type(e).__name__]
        return self._emit(op, self._node(e.lhs), self._node(e.rhs))

    def _op_And(self, e):
        return self._emit(_fold(np.logical_and), *(self._node(a) for a in e.args))

    def _op_Or(self, e):
        return self._emit(_fold(np.logical_or), *(self._node(a) for a in e.args))

    def _op_Not(self, e):
        return self._emit(np.logical_not, self._node(e.args[0]))

    def _op_Function(self, e):
        name = type(e).__name__
        if name in _UNARY:
            return self._emit(_UNARY[name], self._node(e.args[0]))
        raise TypeError(f"cannot compile {name} node: {e}")

    def _op_AppliedUndef(self, e):
        name = type(e).__name__
        if name not in self.functions:
            raise ValueError(f"no implementation given for {name}")
        return self._emit(self.functions[name], self._node(e.args[0]))

    def _op_Piecewise(self, e):
        operands = []
        for piece in e.args:
            operands += [self._node(piece.cond), self._node(piece.expr)]

        def piecewise(*xs):
            conds, values = xs[0::2], xs[1::2]
            shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
            return np.select([np.broadcast_to(c, shape) for c in conds],
                             [np.broadcast_to(np.asarray(x, dtype=float), shape)
                              for x in values], default=np.nan)
        return self._emit(piecewise, *operands)

    def _plan_frees(self) -> None:
        """After each operation, the slots no later operation reads (memory stays bounded by
        the live intermediates, not by every node of the program)."""
        last = {}
        for i, (_, operands) in enumerate(self.ops):
            for s in operands:
                last[s] = i
        keep = set(self.outputs.values())
        self.frees: list[list[int]] = [[] for _ in self.ops]
        for s, i in last.items():
            if s >= self.n_args and s not in keep and s not in self.constants:
                self.frees[i].append(s)

    # --- evaluation --------------------------------------------------------------------------

    def __call__(self, *values) -> dict[str, np.ndarray]:
        if len(values) != self.n_args:
            raise TypeError(f"expected {self.n_args} arguments, got {len(values)}")
        slots: list = [np.asarray(v, dtype=float) for v in values] + [None] * len(self.ops)
        base = self.n_args
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for i, (op, operands) in enumerate(self.ops):
                slots[base + i] = op(*(slots[s] for s in operands))
                for s in self.frees[i]:
                    slots[s] = None
        return {name: slots[s] for name, s in self.outputs.items()}

    @property
    def size(self) -> int:
        """Operations in the program (distinct sub-expressions)."""
        return len(self.ops)


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
