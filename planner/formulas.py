"""The formulas behind `limits`, as SymPy expressions with a glossary of their symbols.

Every formula is the expression `limits` evaluates, in the aggregate symbols of
`planner.expr.symbols`, with the values that hold for the chosen model, hardware and the
roofline piece at the optimum. Substituting those values gives `value`, which is what
`limits` reports.

A formula may also carry a display form: `display` written with named parts (`T_iter`,
`n_star`) and `where`, the expressions those names stand for, so a paper can print
`S = T_1 / T_iter` next to `T_iter = ...` instead of one line that repeats T(n). The display
form and `expression` are the same function of the values. Rendering (text, LaTeX, Python)
is generic: it reads `Derived` and nothing about the model family.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import keyword
import math
from dataclasses import dataclass, field

import sympy as sp
from sympy.printing.printer import Printer
from sympy.printing.pycode import PythonCodePrinter
from sympy.printing.str import StrPrinter

from planner import latex as tex
from planner.analysis.cnn_limits import Limits
from planner.errors import InfeasibleError, SpecError
from planner.expr import symbols as S
from planner.tidy import evaluate, tidy_checked

FORMULAS = ("iteration_time", "speedup", "efficiency", "memory", "optimal_nodes",
            "max_speedup", "required_bandwidth", "time_to_train_batch")
DIMENSIONLESS = "dimensionless"


@dataclass(frozen=True)
class Holds:
    """Where a formula's values hold: low <= expression <= high (an expression of its free
    symbols), and why not beyond."""

    expression: sp.Expr
    low: float
    high: float  # inf: no upper end
    why: str

    def text(self, values: dict) -> str:
        """'0.111 <= B/(g*n) <= 18.4, n from 27.8 to 4606 here' (the range of the formula's
        n or d at the other symbols' values)."""
        lo, hi, e = self.low, self.high, self.expression
        out = (f"{text(e)} = {lo:.6g} only" if lo == hi else
               f"{lo:.6g} <= {text(e)}" + (f" <= {hi:.6g}" if hi < math.inf else ""))
        var = next((x for x in (S.n, S.d) if x in e.free_symbols and x in values), None)
        if var is None or e.free_symbols - set(values):
            return out
        f = e.subs({k: v for k, v in values.items() if k != var})  # of var alone

        def solved(bound: float) -> float | None:
            roots = sp.solve(sp.Eq(f, bound), var) if 0 < bound < math.inf else []
            return float(roots[0]) if roots else None

        if lo == hi:
            return out + f", {var.name} = {solved(lo):.6g} here"
        # low <= e <= high as bounds on var: swapped where e falls as var grows (B / (g n))
        falls = bool(sp.diff(f, var).subs(var, values[var]) < 0)
        least, most = (solved(hi), solved(lo)) if falls else (solved(lo), solved(hi))
        if least is not None and most is not None:
            return out + f", {var.name} from {least:.6g} to {most:.6g} here"
        if most is not None:
            return out + f", {var.name} <= {most:.6g} here"
        return out + (f", {var.name} >= {least:.6g} here" if least is not None else "")

    def python(self, printer) -> str:
        lo, hi = self.low, self.high
        return (f"{lo!r} <= {printer.doprint(self.expression)}"
                + (f" <= {hi!r}" if hi < math.inf else ""))

    def to_json(self) -> dict:
        return {"expression": text(self.expression), "low": self.low,
                "high": None if self.high == math.inf else self.high, "why": self.why}


@dataclass(frozen=True)
class Derived:
    name: str
    description: str
    unit: str
    expression: sp.Expr  # in the glossary symbols only
    values: dict  # symbol -> number, for every free symbol
    note: str = ""
    display: sp.Expr | None = None  # `expression` written with the names defined in `where`
    where: tuple = field(default=())  # ((name symbol, expression), ...), in order of use
    # where `values` hold (`Holds`: e.g. the roofline piece t_0, c, h_0, h_1 read at one local
    # batch B / (g n)); empty: everywhere
    holds: tuple = field(default=())

    @property
    def value(self) -> float | None:
        v = self.expression.subs(self.values)
        try:
            return float(v)
        except TypeError:
            return None

    def substituted(self, names: set[str] | None) -> Derived:
        """The same formula with the named symbols (or all, for None) replaced by numbers."""
        subs = {s: v for s, v in self.values.items() if names is None or s.name in names}

        def put(e: sp.Expr) -> sp.Expr:
            # each product of numbers multiplied out (38.2 sqrt(10) -> 120.84)
            return e.subs(subs).replace(lambda x: x.is_number and not x.is_Atom,
                                        lambda x: sp.Float(x.evalf(15), 15))

        display = None if self.display is None else put(self.display)
        where = tuple((sym, put(e)) for sym, e in self.where)
        return Derived(self.name, self.description, self.unit, put(self.expression),
                       {s: v for s, v in self.values.items() if s not in subs}, self.note,
                       display, where,
                       tuple(dataclasses.replace(h, expression=put(h.expression))
                             for h in self.holds if not put(h.expression).is_number))

    @functools.cached_property
    def tidied(self) -> sp.Expr:
        """`expression` in paper form (`planner.tidy`), with the same value."""
        return tidy_checked(self.expression, self.values)

    def shown(self) -> tuple[sp.Expr, tuple]:
        """(right-hand side, where) in paper form: tidied, each with the value of the raw
        expression (`tidy_checked` keeps the raw one where a rewrite would not)."""
        return self._shown

    @functools.cached_property
    def _shown(self) -> tuple[sp.Expr, tuple]:
        if self.display is None:
            return self.tidied, ()
        env = dict(self.values)
        where = []
        for sym, e in self.where:
            where.append((sym, tidy_checked(e, env)))
            with contextlib.suppress(TypeError, ValueError):  # not numeric: show as it is
                env[sym] = sp.Float(evaluate(e, env).real, 17)
        return tidy_checked(self.display, env), tuple(where)


def derive(lim: Limits) -> list[Derived]:
    n_opt, f_opt = lim.optimum
    vals = dict(f_opt.values)
    at_opt = {**vals, S.n: n_opt}
    T = lim.iteration_expr()
    dp = lim.dp
    memory_vals = {**at_opt, S.W: dp.cnn.params,
                   S.q: (float(dp.memory["weights"]) + float(dp.memory["gradients"])
                         + float(dp.memory["optimizer"])) / dp.cnn.params,
                   S.A: float(dp.memory["activations"].subs(S.b, 1))}
    per_iter = ((S.T_iter, T),)
    # efficiency where `limits` reports it: at --at-nodes (default: the max useful nodes)
    n_at = lim.nodes_for_targets
    at_eff = {**dict(lim.piece_values(lim.global_batch / (lim.g * n_at))), S.n: n_at}
    out = [
        # T(n) = t_0 + c B / (g n) + exposed collective time (planner.analysis.cnn_limits; seed paper sec. 3)
        Derived("iteration_time", "iteration time T(n) under strong scaling", "s", T, at_opt),
        # speed-up and efficiency against one device at the same global batch (seed paper)
        Derived("speedup", "speed-up over one device at the same global batch", DIMENSIONLESS,
                S.T1 / T, at_opt, display=S.T1 / S.T_iter, where=per_iter),
        Derived("efficiency", "parallel efficiency: speed-up per device, at --at-nodes "
                f"(here {n_at:g} nodes)", DIMENSIONLESS,
                S.T1 / (S.g * S.n * T), at_eff, display=S.T1 / (S.g * S.n * S.T_iter),
                where=per_iter),
        # weights + gradients + optimizer state + activations of b = B / (g n) samples
        Derived("memory", "bytes per device at b = B/(g n)", "B",
                S.W * S.q + S.A * S.B / (S.g * S.n), memory_vals),
        # dT/dn = 0 (or the active boundary) of T(n), planner.analysis.cnn_limits.Limits.optimum
        Derived("optimal_nodes", "node count minimising T(n)", "nodes", f_opt.expression, vals,
                f_opt.note),
        Derived("max_speedup", "speed-up at the optimal node count", DIMENSIONLESS,
                S.T1 / T.subs(S.n, f_opt.expression), vals, f_opt.note,
                display=S.T1 / T.subs(S.n, S.n_star), where=((S.n_star, f_opt.expression),)),
    ]
    bw = lim.required_bandwidth()
    if bw is not None:
        # beta solving T1 / (g n T(n, beta)) = target efficiency
        out.append(Derived("required_bandwidth", "bandwidth for the target efficiency", "B/s",
                           bw.expression, bw.values, bw.note))
    if lim.critical_batch is not None:
        # McCandlish et al. 2018: minimise (1 + B_noise / B) T(n, B) over B
        f = lim.time_to_train_formula()
        out.append(Derived("time_to_train_batch", "global batch minimising the time to train "
                           "(1 + B_noise / B) T(n, B) at n nodes", "samples", f.expression,
                           f.values, f.note))
    # a formula in the roofline piece's values (t_0, c, h_0, h_1) with n free holds at the
    # local batches B / (g n) of that piece
    out = [dataclasses.replace(d, holds=(Holds(
        S.B / (S.g * S.n), *lim.piece_batches(d.values[S.n], d.values),
        f"the local batches of the roofline piece {', '.join(x.name for x in PIECE if x in uses(d))}"
        "; planner evaluate prices whole plans"),))
           if S.n in d.values and set(PIECE) & uses(d) else d for d in out]
    return [_only_free(d) for d in out]


def uses(d: Derived) -> set:
    """The symbols `d` is a function of: those of its expression, display form, named parts
    (less the names) and ranges."""
    free = set(d.expression.free_symbols)
    for e in ([] if d.display is None else [d.display]) + [e for _, e in d.where]:
        free |= e.free_symbols
    for h in d.holds:
        free |= h.expression.free_symbols
    return free - {name for name, _ in d.where}


def _only_free(d: Derived) -> Derived:
    """Only the values of symbols the formula uses (`uses`)."""
    return dataclasses.replace(d, values={s: v for s, v in d.values.items() if s in uses(d)})


def select(formulas: list[Derived], names: tuple[str, ...]) -> list[Derived]:
    if not names:
        return formulas
    known = {f.name: f for f in formulas}
    for name in names:
        if name not in FORMULAS:
            raise SpecError(f"formula: unknown name '{name}' (known: {', '.join(FORMULAS)})")
        if name == "time_to_train_batch" and name not in known:
            raise SpecError("formula: 'time_to_train_batch' needs --critical-batch")
        if name not in known:  # a well-formed problem with no answer: infeasible, as limits
            raise InfeasibleError(f"infeasible: formula '{name}' has no solution for this "
                                  "problem (planner limits says which bound is never reached)", (name,))
    return [known[n] for n in names]


def _meaning(sym: sp.Symbol) -> S.Meaning:
    return S.GLOSSARY.get(sym, S.Meaning("", ""))


def glossary(d: Derived) -> dict:
    return {s.name: {"value": float(v), "unit": _meaning(s).unit,
                     "description": _meaning(s).description, "latex": tex.symbol_latex(s.name)}
            for s, v in sorted(d.values.items(), key=lambda kv: kv[0].name)}


# --- rendering -------------------------------------------------------------------------------

def _positive_first(printer, expr, order=None):
    """The printer's order of a sum's terms, positive terms first (`c - h_1`)."""
    terms = Printer._as_ordered_terms(printer, expr, order=order)
    return sorted(terms, key=lambda t: t.could_extract_minus_sign())


class _TextPrinter(StrPrinter):
    """SymPy's string form (SymPy-readable), positive terms of a sum first."""

    _as_ordered_terms = _positive_first


def text(expr: sp.Expr) -> str:
    return _TextPrinter().doprint(expr)


def latex_rows(d: Derived, label: bool = True) -> list[tuple[str, str, str | None]]:
    """(left-hand side, right-hand side, label) of the formula and of its `where` parts."""
    rhs, where = d.shown()
    rows = [(tex.lhs(d.name), tex.latex(rhs), d.name if label else None)]
    return rows + [(tex.symbol_latex(sym.name), tex.latex(e), None) for sym, e in where]


def latex_equation(d: Derived) -> str:
    """The formula as a complete `equation` (or, with `where` parts, `align`) environment."""
    return tex.environment(latex_rows(d))


def holds_text(d: Derived) -> str:
    """Each range the formula's values hold on, with why ('' when everywhere)."""
    return "; ".join(f"{h.text(d.values)} ({h.why})" for h in d.holds)


PIECE = (S.t0, S.c, S.h0, S.h1)  # a CNN's compute terms: one roofline piece of the local batch


def as_json(d: Derived) -> dict:
    full = d.tidied
    return {"name": d.name, "description": d.description, "unit": d.unit,
            "expression": text(full), "latex": tex.latex(full), "latex_lhs": tex.lhs(d.name),
            "latex_equation": latex_equation(d), "python": _python_printer().doprint(full),
            "symbols": glossary(d), "value": d.value, "note": d.note,
            "holds": [h.to_json() for h in d.holds]}


class _PythonPrinter(PythonCodePrinter):
    _as_ordered_terms = _positive_first


def _python_printer() -> PythonCodePrinter:
    return _PythonPrinter({"fully_qualified_modules": True, "standard": "python3",
                              "strict": True})


def _identifier(name: str) -> str:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"not a Python identifier: {name!r}")  # our symbols never are
    return name


def _doc(text_: str) -> str:
    """Text safe inside a triple-quoted docstring."""
    return text_.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def python_module(formulas: list[Derived], plan: str = "") -> str:
    """A Python module that runs as printed: one function per formula, its symbols as
    parameters with this problem's values as defaults, and a main block printing each value
    (`plan`: the plan they are read at, in the module's docstring)."""
    printer = _python_printer()
    functions = []
    for d in formulas:
        rhs, where = d.shown()
        symbols = sorted(d.values, key=lambda x: x.name)
        params = [f"    {_identifier(x.name)}={float(d.values[x])!r}," for x in symbols]
        params += ["    strict=True,"] if d.holds else []
        summary = f"{d.description} [{d.unit}]" + (f" ({d.note})" if d.note else "")
        if d.holds:
            summary += f"; holds for {holds_text(d)}"
        head = ([f"def {_identifier(d.name)}(", *params, "):"] if params
                else [f"def {_identifier(d.name)}():"])
        lines = [*head, f'    """{_doc(summary)}']
        if symbols:
            lines += [""] + [f"    {x.name}: {_doc(_meaning(x).description)} [{_meaning(x).unit}]"
                             for x in symbols] + ['    """']
        else:
            lines[-1] += '"""'
        for h in d.holds:  # the defaults' own range: refuse another unless told
            why = (f"the defaults hold for {holds_text(d)}; strict=False evaluates the "
                   "formula as written")
            at = printer.doprint(h.expression)
            lines += [f"    if strict and not {h.python(printer)}:",
                      f"        raise ValueError(f\"{at} = {{{at}!r}}: \" + {why!r})"]
        lines += [f"    {_identifier(x.name)} = {printer.doprint(e)}" for x, e in where]
        lines.append(f"    return {printer.doprint(rhs)}")
        functions.append("\n".join(lines))
    imports = sorted(printer.module_imports)
    head = ['"""Formulas from `planner derive`: each function returns the formula\'s value; '
            'its defaults are\nthe values of this problem' + (f", {_doc(plan)}" if plan else "")
            + '."""', ""]
    head += [f"import {m}" for m in imports] + ([""] if imports else [])
    main = ['if __name__ == "__main__":']
    main += [f'    print("{d.name} =", repr({d.name}()))' for d in formulas]
    return "\n".join(head) + "\n\n" + "\n\n\n".join(functions) + "\n\n\n" + "\n".join(main) + "\n"


def latex_block(formulas: list[Derived]) -> str:
    """All formulas in one `align` (one formula: `equation`) environment, each `where` part
    once, after comment lines with each formula's value and the symbols' values."""
    comments = [r"% planner derive: needs \usepackage{amsmath}"]
    rows, seen = [], set()
    symbols: dict[str, dict] = {}  # name -> glossary entry, with the formulas per value
    for d in formulas:
        value = d.value
        head = f"% {d.name}: {d.description}"
        head += f"; value {value:.6g} {d.unit}" if value is not None else ""
        head += f" [{d.note}]" if d.note else ""
        comments.append(head)
        for k, v in glossary(d).items():
            symbols.setdefault(k, {**v, "uses": {}})["uses"].setdefault(v["value"], []).append(
                d.name)
        for row in latex_rows(d):
            if row[2] is None and row[:2] in seen:
                continue
            seen.add(row[:2])
            rows.append(row)
    comments += tex.where_comments(symbols)
    return "\n".join(comments) + "\n" + tex.environment(rows)


def text_block(d: Derived) -> str:
    """`name = expression` (SymPy-readable), its named parts, the value and the glossary."""
    rhs, where = d.shown()
    lines = [f"{d.name} = {text(rhs)}"]
    lines += [f"  with {sym.name} = {text(e)}" for sym, e in where]
    value = d.value
    tail = f"  value = {value:.6g} {d.unit}" if value is not None else ""
    note = f"  [{d.note}]" if d.note else ""
    lines.append(f"where{note}{tail}")
    if d.holds:
        lines.append(f"  holds for {holds_text(d)}")
    lines += [f"    {k} = {v['value']:.6g} {v['unit']}  ({v['description']})"
              for k, v in glossary(d).items()]
    return "\n".join(lines)
