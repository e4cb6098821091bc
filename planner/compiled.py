"""A compiled numpy program as data: a straight-line list of numpy operations, each named by a
code and reading earlier slots, with its constants and outputs. `planner.numeric` builds one
from SymPy expressions, `planner.expr.graph` from the transformer's graphs; this module only
runs it, so it imports numpy alone, and its data form (`to_data` / `from_data`: codes, numbers
and names, no code objects) is what the program cache (`planner.cost.programs`) keeps on disk
and reads back."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

Op = Callable[..., np.ndarray]
FORMAT = 1  # the data form's version: a cached program of another form is rebuilt


def _fold(op: Op) -> Op:
    def folded(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = op(out, x)
        return out
    return folded


def _piecewise(*xs):
    """(cond, value) pairs in order: the first true condition's value (NaN where none is).
    Folded from the last pair (`np.where` per pair: a SymPy Piecewise has two or three,
    the last one's condition most often True, where `np.select` builds every branch's
    broadcast copy)."""
    conds, values = xs[0::2], xs[1::2]
    shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
    last = conds[-1]
    out = (np.asarray(values[-1], dtype=float) if np.ndim(last) == 0 and bool(last)
           else np.where(last, np.asarray(values[-1], dtype=float), np.nan))
    for cond, value in zip(conds[-2::-1], values[-2::-1], strict=True):
        out = np.where(cond, np.asarray(value, dtype=float), out)
    return out if out.shape == shape else np.array(np.broadcast_to(out, shape), dtype=float)


# every operation a program may hold, by code
OPS: dict[str, Op] = {
    "add": _fold(np.add), "mul": _fold(np.multiply), "div": np.divide, "pow": np.power,
    "sqrt": np.sqrt, "max": _fold(np.maximum), "min": _fold(np.minimum),
    "and": _fold(np.logical_and), "or": _fold(np.logical_or), "not": np.logical_not,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "log": np.log, "exp": np.exp, "ceil": np.ceil,
    "floor": np.floor, "abs": np.abs, "piecewise": _piecewise,
}


# --- one point: the same operations on Python floats ------------------------------------------
# A plan priced alone (`predict`, a brute force, a fit) runs the program on scalars, where
# numpy's per-call overhead is most of the time; these give numpy's float64 results (IEEE
# arithmetic in the same order; libm's functions, which numpy's scalar loops call too) and its
# answers where Python's would raise: inf for x / 0 and overflow, NaN for 0 / 0 and outside
# a function's domain, NaN through max / min.

_NAN, _INF = math.nan, math.inf


def _s_div(a, b):
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or a != a:
            return _NAN
        return math.copysign(_INF, a) * math.copysign(1.0, b)


def _s_pow(a, b):
    try:
        return math.pow(a, b)
    except OverflowError:
        return _INF if a > 0 or float(b).is_integer() and b % 2 == 0 else -_INF
    except ValueError:  # 0 to a negative power, or a negative base to a fraction
        if a != 0:
            return _NAN
        return math.copysign(_INF, a) if float(b).is_integer() and b % 2 == 1 else _INF


def _s_max(a, b):
    return _NAN if a != a or b != b else (b if b > a else a)


def _s_min(a, b):
    return _NAN if a != a or b != b else (b if b < a else a)


def _s_log(x):
    if x > 0:
        return math.log(x)
    return -_INF if x == 0 else _NAN


def _s_exp(x):
    try:
        return math.exp(x)
    except OverflowError:
        return _INF


def _s_round(f):
    def rounded(x):
        if not math.isfinite(x):
            return x
        r = float(f(x))
        return math.copysign(r, x) if r == 0 else r  # ceil(-0.5) is -0.0
    return rounded


def _s_piecewise(*xs):
    for cond, value in zip(xs[0::2], xs[1::2], strict=True):
        if cond:
            return float(value)
    return _NAN


SCALAR_OPS: dict[str, Op] = {
    "add": _fold(lambda a, b: a + b), "mul": _fold(lambda a, b: a * b), "div": _s_div,
    "pow": _s_pow, "sqrt": lambda x: math.sqrt(x) if x >= 0 else _NAN,
    "max": _fold(_s_max), "min": _fold(_s_min),
    "and": _fold(lambda a, b: bool(a) and bool(b)),
    "or": _fold(lambda a, b: bool(a) or bool(b)), "not": lambda x: not x,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "log": _s_log, "exp": _s_exp, "ceil": _s_round(math.ceil), "floor": _s_round(math.floor),
    "abs": abs, "piecewise": _s_piecewise,
}
_SCALAR_TYPES = (int, float, np.number, np.bool_)


class Compiled:
    """`program(*values)` evaluates every output at the arguments `values` (arrays broadcast)
    and returns name -> array. `ops`: (code, operand slots); slots 0 .. n_args - 1 are the
    arguments, then one per operation; a "const" operation holds its value in `constants`;
    "fn:NAME" calls `functions[NAME]`."""

    def __init__(self, n_args: int, ops: list[tuple[str, tuple[int, ...]]],
                 constants: Mapping[int, float | bool], outputs: Mapping[str, int],
                 functions: Mapping[str, Callable] | None = None):
        self.n_args, self.ops = n_args, ops
        self.constants, self.outputs = dict(constants), dict(outputs)
        self.functions = dict(functions or {})
        self._calls = [self._call(code, i, OPS) for i, (code, _) in enumerate(ops)]
        self._scalar_calls = [self._call(code, i, SCALAR_OPS) for i, (code, _) in enumerate(ops)]
        self._plan_frees()

    def _call(self, code: str, i: int, table: Mapping[str, Op]) -> Op:
        if code == "const":
            value = self.constants[self.n_args + i]
            return lambda: value
        if code.startswith("fn:"):
            return self.functions[code[3:]]
        return table[code]

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

    def __call__(self, *values) -> dict[str, np.ndarray]:
        if len(values) != self.n_args:
            raise TypeError(f"expected {self.n_args} arguments, got {len(values)}")
        if all(isinstance(v, _SCALAR_TYPES) or (isinstance(v, np.ndarray) and v.size == 1)
               for v in values):
            return self._at_point(values)
        slots: list = [np.asarray(v, dtype=float) for v in values] + [None] * len(self.ops)
        base = self.n_args
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for i, (_, operands) in enumerate(self.ops):
                slots[base + i] = self._calls[i](*(slots[s] for s in operands))
                for s in self.frees[i]:
                    slots[s] = None
        return {name: slots[s] for name, s in self.outputs.items()}

    def _at_point(self, values) -> dict[str, np.ndarray]:
        """`__call__` at one point (every argument one value, a scalar or an array of one):
        what numpy gives, numpy scalars or arrays of shape (1, ...) as the arguments broadcast."""
        ndim = max((v.ndim for v in values if isinstance(v, np.ndarray)), default=0)
        slots: list = ([float(v.item() if isinstance(v, np.ndarray) else v) for v in values]
                       + [None] * len(self.ops))
        base, calls = self.n_args, self._scalar_calls
        for i, (_, operands) in enumerate(self.ops):
            slots[base + i] = calls[i](*[slots[s] for s in operands])
        out = {}
        for name, s in self.outputs.items():
            v = slots[s]
            kind = bool if isinstance(v, bool | np.bool_) else float
            out[name] = np.full((1,) * ndim, v, dtype=kind) if ndim else np.array(v, kind)[()]
        return out

    @property
    def size(self) -> int:
        """Operations in the program (distinct sub-expressions)."""
        return len(self.ops)

    # --- data form ---------------------------------------------------------------------------

    def to_data(self) -> dict:
        """The program as JSON-ready data (refused for a program calling functions)."""
        if self.functions:
            raise ValueError("a program calling functions has no data form")
        return {"format": FORMAT, "n_args": self.n_args,
                "ops": [[code, list(operands)] for code, operands in self.ops],
                "constants": [[i, v] for i, v in self.constants.items()],
                "outputs": self.outputs}

    @classmethod
    def from_data(cls, data: dict) -> Compiled:
        """The program of `to_data`; ValueError where the data is not such a program."""
        try:
            if data["format"] != FORMAT:
                raise ValueError(f"program data of form {data['format']}, not {FORMAT}")
            n_args, ops = int(data["n_args"]), [(str(c), tuple(int(s) for s in o))
                                                for c, o in data["ops"]]
            constants = {int(i): (v if isinstance(v, bool) else float(v))
                         for i, v in data["constants"]}
            outputs = {str(k): int(v) for k, v in data["outputs"].items()}
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not program data: {err}") from None
        end = n_args + len(ops)
        for i, (code, operands) in enumerate(ops):
            if (code not in OPS and code != "const") or any(
                    not 0 <= s < n_args + i for s in operands):
                raise ValueError(f"program data: operation {i} ({code!r}) is not valid")
            if code == "const" and n_args + i not in constants:
                raise ValueError(f"program data: constant {i} has no value")
        if any(not 0 <= s < end for s in outputs.values()):
            raise ValueError("program data: an output names no slot")
        return cls(n_args, ops, constants, outputs)
