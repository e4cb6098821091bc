"""The transformer cost model's own small algebra: expressions as immutable graphs of numpy
operations, built without SymPy.

A cold `solve` builds the expressions of a dozen choices; through SymPy that took three
quarters of a second (its canonical ordering, assumption queries and exact rational
arithmetic on every node) plus its import. Built here, each node is a tuple of an operation and
its operands, hashed once, with constants folded exactly (ints and `Fraction`s; floats where
the model gives a float) and the identities x + 0, x * 1, x * 0 and x ** 1 dropped, so the
graph compiles straight into a `planner.compiled.Compiled` program (equal sub-graphs hash and
compare equal: one slot each). `limits` and `derive`, which solve and print formulas, take the
same graph as SymPy (`to_sympy`), rebuilt by SymPy's own operations in the order the model
wrote them, so the formulas they read are the ones SymPy would have built. The constructors
are named as SymPy's (`Integer`, `Rational`, `Max`, `Piecewise`, ...) so the model reads the
same either way.
"""

from __future__ import annotations

import functools
import math
import numbers
import weakref
from fractions import Fraction

from planner.compiled import SCALAR_OPS, Compiled

Number = int | Fraction | float | bool
# every node alive, by (op, args): the graph's hash-consing (a node no graph holds is dropped)
_INTERNED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_RELATIONS = ("lt", "gt", "le", "ge", "eq", "ne")


class Node:
    """One operation (`op`) on its operands (`args`: nodes; a constant's or a symbol's value).
    Nodes are interned: equal graphs are the same object, so `==` (structure) is identity and
    a shared sub-graph is met once; `<`, `>`, `<=`, `>=` build relations (`Eq` builds an
    equation), as SymPy's expressions do."""

    __slots__ = ("op", "args", "_hash", "__weakref__")

    def __new__(cls, op: str, args: tuple):
        key = (op, args)
        node = _INTERNED.get(key)
        if node is None:
            node = object.__new__(cls)
            node.op, node.args, node._hash = op, args, hash(key)
            _INTERNED[key] = node
        return node

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # a pickled node is interned again where it is read
        return Node, (self.op, self.args)

    def __eq__(self, other) -> bool:
        if isinstance(other, Node):
            return self is other
        return self.op == "const" and isinstance(other, numbers.Number) and \
            self.args[0] == other and not isinstance(self.args[0], bool)

    def __ne__(self, other) -> bool:
        return not self == other

    def __bool__(self) -> bool:
        if self.op == "const":
            return bool(self.args[0])
        raise TypeError(f"cannot decide the truth of {self}")

    def __float__(self) -> float:
        if self.op == "const":
            return float(self.args[0])
        raise TypeError(f"{self} has free symbols {sorted(s.name for s in self.free_symbols)}")

    def __repr__(self) -> str:
        if self.op in ("const", "sym"):
            return str(self.args[0])
        return f"{self.op}({', '.join(map(repr, self.args))})"

    # --- arithmetic -------------------------------------------------------------------------
    def __add__(self, o):
        return _add(self, o)

    def __radd__(self, o):
        return _add(o, self)

    def __sub__(self, o):
        return _add(self, _mul(-1, o))

    def __rsub__(self, o):
        return _add(o, _mul(-1, self))

    def __mul__(self, o):
        return _mul(self, o)

    def __rmul__(self, o):
        return _mul(o, self)

    def __truediv__(self, o):
        return _div(self, o)

    def __rtruediv__(self, o):
        return _div(o, self)

    def __pow__(self, o):
        return _pow(self, o)

    def __rpow__(self, o):
        return _pow(o, self)

    def __neg__(self):
        return _mul(-1, self)

    def __lt__(self, o):
        return _relation("lt", self, o)

    def __le__(self, o):
        return _relation("le", self, o)

    def __gt__(self, o):
        return _relation("gt", self, o)

    def __ge__(self, o):
        return _relation("ge", self, o)

    # --- reading ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        if self.op != "sym":
            raise AttributeError("only a symbol has a name")
        return self.args[0]

    @property
    def is_number(self) -> bool:
        return self.op == "const"

    @property
    def free_symbols(self) -> set[Node]:
        return {n for n in _walk(self) if n.op == "sym"}

    def _sympy_(self):
        """SymPy's conversion hook: a SymPy function given a node reads it as
        `to_sympy(node)`."""
        return to_sympy(self)

    def subs(self, mapping, value=None) -> Node:
        """This graph with symbols replaced, constants folded as it goes;
        `subs(x, 1)` as SymPy's. A key may be a symbol of either algebra or a name."""
        if value is not None:
            mapping = {mapping: value}
        return substitute(self, mapping)


Expr = Node


def const(value: Number) -> Node:
    """A constant node (an exact int or fraction, a float, or a truth value)."""
    if isinstance(value, Node):
        return value
    if getattr(value, "is_Number", False):  # a SymPy number (read without importing SymPy)
        value = (int(value) if value.is_Integer else Fraction(int(value.p), int(value.q))
                 if value.is_Rational else float(value))
    if isinstance(value, Fraction) and value.denominator == 1:
        value = int(value)
    if not isinstance(value, bool | int | Fraction | float):
        raise TypeError(f"not a number: {value!r}")
    return Node("const", (value, type(value).__name__))


def of(x) -> Node:
    """`x` as a node: a number, a node, or a SymPy symbol or number (by its name or value)."""
    if getattr(x, "is_Symbol", False) and not isinstance(x, Node):
        return symbol(x.name)
    return _value(x)


def symbol(name: str) -> Node:
    """The symbol `name` (the SymPy symbol of that name in `planner.expr.symbols`)."""
    return Node("sym", (name,))


def _value(x) -> Node:
    return x if isinstance(x, Node) else const(x)


def _num(x) -> Number | None:
    """The value of a constant (None for anything else)."""
    if isinstance(x, Node):
        return x.args[0] if x.op == "const" else None
    return x


def _exact_div(x: Number, y: Number) -> Number:
    if isinstance(x, int | Fraction) and isinstance(y, int | Fraction) and y != 0:
        return Fraction(x) / Fraction(y)
    return SCALAR_OPS["div"](float(x), float(y))


def _exact_pow(x: Number, y: Number) -> Number:
    if isinstance(y, int) and isinstance(x, int | Fraction) and (x != 0 or y >= 0):
        return Fraction(x) ** y
    return SCALAR_OPS["pow"](float(x), float(y))


# per arithmetic operation: its value on two constants, and what it is where one operand is
# a constant that makes it trivial (x + 0, x * 1, x * 0, 0 / x, x / 1, x ** 1, x ** 0)
_FOLD = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "div": _exact_div,
         "pow": _exact_pow}
_TRIVIAL = {
    "add": lambda a, b, x, y: b if x == 0 else a if y == 0 else None,
    "mul": lambda a, b, x, y: (const(0) if x == 0 or y == 0 else b if x == 1
                               else a if y == 1 else None),
    "div": lambda a, b, x, y: const(0) if x == 0 else a if y == 1 else None,
    "pow": lambda a, b, x, y: a if y == 1 else const(1) if y == 0 else None,
}


def _arith(op: str, a, b) -> Node:
    a, b = _value(a), _value(b)
    x, y = _num(a), _num(b)
    if x is not None and y is not None:
        return const(_FOLD[op](x, y))
    trivial = _TRIVIAL[op](a, b, x, y)
    return Node(op, (a, b)) if trivial is None else trivial


def _add(a, b) -> Node:
    return _arith("add", a, b)


def _mul(a, b) -> Node:
    return _arith("mul", a, b)


def _div(a, b) -> Node:
    return _arith("div", a, b)


def _pow(a, b) -> Node:
    return _arith("pow", a, b)


def _relation(op: str, a, b) -> Node:
    a, b = _value(a), _value(b)
    x, y = _num(a), _num(b)
    if x is not None and y is not None:
        return const(bool(SCALAR_OPS[op](x, y)))
    return Node(op, (a, b))


def _nary(op: str, args, fold) -> Node:
    """max / min / and / or of `args` in the order written, repeats dropped (as SymPy's
    unordered Max and Min of `planner.expr.unordered` keep them), constants folded where all
    are constant."""
    nodes = tuple(dict.fromkeys(_value(a) for a in args))
    if len(nodes) == 1:
        return nodes[0]
    values = [_num(n) for n in nodes]
    if all(v is not None for v in values):
        return const(fold(values))
    return Node(op, nodes)


def Integer(n: int) -> Node:  # noqa: N802 (named as SymPy's)
    return const(int(n))


def Rational(a, b=1) -> Node:  # noqa: N802
    return const(Fraction(a) / Fraction(b))


def Float(x) -> Node:  # noqa: N802
    return const(float(x))


def Max(*args, evaluate=False) -> Node:  # noqa: N802, ARG001 (as written, never sorted)
    return _nary("max", args, max)


def Min(*args, evaluate=False) -> Node:  # noqa: N802, ARG001
    return _nary("min", args, min)


def And(*args) -> Node:  # noqa: N802
    args = [a for a in (_value(x) for x in args) if _num(a) is not True]
    if any(_num(a) is False for a in args):
        return const(False)
    return _nary("and", args, all) if args else const(True)


def Or(*args) -> Node:  # noqa: N802
    args = [a for a in (_value(x) for x in args) if _num(a) is not False]
    if any(_num(a) is True for a in args):
        return const(True)
    return _nary("or", args, any) if args else const(False)


def Eq(a, b) -> Node:  # noqa: N802
    return _relation("eq", a, b)


def floor(x) -> Node:
    return _unary("floor", x, math.floor)


def ceiling(x) -> Node:
    return _unary("ceil", x, math.ceil)


def sqrt(x) -> Node:
    return _pow(x, Fraction(1, 2))


def log(x) -> Node:
    return _unary("log", x, SCALAR_OPS["log"])


def _unary(op: str, x, fold) -> Node:
    x = _value(x)
    v = _num(x)
    if v is not None:
        out = fold(v if isinstance(v, int | Fraction) else float(v))
        return const(out)
    return Node(op, (x,))


def Piecewise(*pairs, evaluate=True) -> Node:  # noqa: N802, ARG001
    """(value, condition) pairs: the first whose condition holds (NaN where none does);
    conditions that are constants decide at once."""
    flat: list[Node] = []
    for value, cond in pairs:
        cond = _value(cond)
        c = _num(cond)
        if c is False:
            continue
        if c is True and not flat:
            return _value(value)
        flat += [cond, _value(value)]
        if c is True:
            break
    if not flat:
        return const(math.nan)
    return Node("piecewise", tuple(flat))


# --- walking ---------------------------------------------------------------------------------

def _walk(root: Node):
    """Every node of the graph once, operands before the nodes reading them."""
    seen: set[int] = set()
    order: list[Node] = []
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if node.op not in ("const", "sym"):
            stack.extend((a, False) for a in reversed(node.args) if id(a) not in seen)
    return order


_BUILD = {"add": _add, "mul": _mul, "div": _div, "pow": _pow,
          "max": lambda *a: Max(*a), "min": lambda *a: Min(*a),
          "and": lambda *a: And(*a), "or": lambda *a: Or(*a),
          "floor": floor, "ceil": ceiling, "log": log,
          "piecewise": lambda *a: Piecewise(*zip(a[1::2], a[0::2], strict=True)),
          **{op: functools.partial(_relation, op) for op in _RELATIONS}}


def _rebuild(roots: list[Node], leaf) -> dict[Node, object]:
    """Each node of `roots` rebuilt bottom-up: leaves by `leaf(node)` (None: kept), the
    others by the operation's constructor on their rebuilt operands."""
    out: dict[Node, object] = {}
    for root in roots:
        for node in _walk(root):
            if node in out:
                continue
            if node.op in ("const", "sym"):
                got = leaf(node)
                out[node] = node if got is None else got
            else:
                args = [out[a] for a in node.args]
                out[node] = (node if all(x is a for x, a in zip(args, node.args, strict=True))
                             else _BUILD[node.op](*args))
    return out


def substitute(expr, mapping) -> Node:
    """`expr` with each symbol of `mapping` (a node, a SymPy symbol or a name) replaced by its
    value, constants folded as it goes."""
    if not isinstance(expr, Node):
        return expr

    def named(k) -> str:
        if isinstance(k, str):
            return k
        if isinstance(k, Node) and k.op == "sym":
            return k.name
        if getattr(k, "is_Symbol", False):  # a SymPy symbol, by its name
            return k.name
        raise TypeError(f"substitute: {k!r} is not a symbol")

    by_name = {named(k): v for k, v in mapping.items()}
    rebuilt = _rebuild([expr], lambda n: _value(by_name[n.name])
                       if n.op == "sym" and n.name in by_name else None)
    return rebuilt[expr]


def compile_graphs(exprs: dict[str, object], args) -> Compiled:
    """One straight-line program computing every graph of `exprs` at `args` (symbols): a
    slot per distinct sub-graph."""
    slots: dict[Node, int] = {a: i for i, a in enumerate(args)}
    ops: list[tuple[str, tuple[int, ...]]] = []
    constants: dict[int, float | bool] = {}
    n_args = len(args)

    def emit(code, operands):
        ops.append((code, operands))
        return n_args + len(ops) - 1

    for expr in exprs.values():
        for node in _walk(_value(expr)):
            if node in slots:
                continue
            if node.op == "sym":
                raise ValueError(f"free symbol {node.name} is not an argument")
            if node.op == "const":
                v = node.args[0]
                slots[node] = emit("const", ())
                constants[slots[node]] = v if isinstance(v, bool) else float(v)
            elif node.op == "pow" and _num(node.args[1]) == Fraction(1, 2):
                slots[node] = emit("sqrt", (slots[node.args[0]],))
            else:
                slots[node] = emit(node.op, tuple(slots[a] for a in node.args))
    outputs = {name: slots[_value(e)] for name, e in exprs.items()}
    return Compiled(n_args, ops, constants, outputs)


# --- as SymPy --------------------------------------------------------------------------------

def to_sympy(expr):
    """The SymPy expression of a graph (numbers and SymPy expressions pass through): each
    symbol `planner.expr.symbols`' of its name, each operation SymPy's, applied in the order
    the graph was built (Max / Min unsorted, floor / ceiling unevaluated on expressions, a
    Piecewise unevaluated unless a condition is a constant: `planner.expr.unordered` and
    `planner.expr.layer._if`)."""
    if not isinstance(expr, Node):
        return expr
    return _sympy_rebuild([expr])[expr]


def _sympy_rebuild(roots: list[Node]) -> dict:
    import sympy as sp

    from planner.expr import symbols as S
    from planner.expr.unordered import sceil, sfloor, smax, smin

    names = {v.name: v for v in vars(S).values() if isinstance(v, sp.Symbol)}

    def leaf(node):
        if node.op == "sym":
            return names[node.name]
        v = node.args[0]
        if isinstance(v, bool):
            return sp.true if v else sp.false
        if isinstance(v, int):
            return sp.Integer(v)
        if isinstance(v, Fraction):
            return sp.Rational(v.numerator, v.denominator)
        return sp.Float(v)

    def piecewise(*a):
        pairs = list(zip(a[1::2], a[0::2], strict=True))
        if any(isinstance(c, sp.logic.boolalg.BooleanAtom) for _, c in pairs) or any(
                isinstance(x, sp.Piecewise) for x, _ in pairs):
            return sp.Piecewise(*pairs)
        return sp.Piecewise(*pairs, evaluate=False)

    rel = {"eq": sp.Eq, "ne": sp.Ne, "lt": sp.Lt, "le": sp.Le, "gt": sp.Gt, "ge": sp.Ge}
    build = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "div": lambda x, y: x / y,
             "pow": lambda x, y: x ** y, "max": smax, "min": smin, "and": sp.And,
             "or": sp.Or, "floor": sfloor, "ceil": sceil, "log": sp.log,
             "piecewise": piecewise, **rel}
    out: dict = {}
    for root in roots:
        for node in _walk(root):
            if node not in out:
                out[node] = (leaf(node) if node.op in ("const", "sym")
                             else build[node.op](*(out[a] for a in node.args)))
    return out


def many_to_sympy(exprs: dict) -> dict:
    """`to_sympy` of each value of `exprs` (their shared sub-graphs converted once)."""
    nodes = [e for e in exprs.values() if isinstance(e, Node)]
    done = _sympy_rebuild(nodes) if nodes else {}
    return {k: done[e] if isinstance(e, Node) else e for k, e in exprs.items()}
