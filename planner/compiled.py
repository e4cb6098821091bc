"""A compiled numpy program as data: a straight-line list of numpy operations, each named by a
code and reading earlier slots, with its constants and outputs. `planner.numeric` builds one
from SymPy expressions; this module only runs it, so it imports numpy alone, and its data form
(`to_data` / `from_data`: codes, numbers and names, no code objects) is what the program
cache (`planner.cost.programs`) keeps on disk and reads back without SymPy."""

from __future__ import annotations

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
    """(cond, value) pairs in order: the first true condition's value (NaN where none is)."""
    conds, values = xs[0::2], xs[1::2]
    shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
    return np.select([np.broadcast_to(c, shape) for c in conds],
                     [np.broadcast_to(np.asarray(x, dtype=float), shape) for x in values],
                     default=np.nan)


# every operation a program may hold, by code
OPS: dict[str, Op] = {
    "add": _fold(np.add), "mul": _fold(np.multiply), "div": np.divide, "pow": np.power,
    "sqrt": np.sqrt, "max": _fold(np.maximum), "min": _fold(np.minimum),
    "and": _fold(np.logical_and), "or": _fold(np.logical_or), "not": np.logical_not,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "log": np.log, "exp": np.exp, "ceil": np.ceil,
    "floor": np.floor, "abs": np.abs, "piecewise": _piecewise,
}


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
        self._calls = [self._call(code, i) for i, (code, _) in enumerate(ops)]
        self._plan_frees()

    def _call(self, code: str, i: int) -> Op:
        if code == "const":
            value = self.constants[self.n_args + i]
            return lambda: value
        if code.startswith("fn:"):
            return self.functions[code[3:]]
        return OPS[code]

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
        slots: list = [np.asarray(v, dtype=float) for v in values] + [None] * len(self.ops)
        base = self.n_args
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for i, (_, operands) in enumerate(self.ops):
                slots[base + i] = self._calls[i](*(slots[s] for s in operands))
                for s in self.frees[i]:
                    slots[s] = None
        return {name: slots[s] for name, s in self.outputs.items()}

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
