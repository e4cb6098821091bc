"""LaTeX for `planner derive`: symbol names, left-hand sides and complete equation environments.

Symbols are named from their SymPy names, never from user text: `alpha_inter` prints as
`\\alpha_{\\mathrm{inter}}`, `t_0` as `t_{0}`, `n_star` as `n^*`. A formula's left-hand side
comes from `LHS`, one table keyed by formula name; a formula without an entry prints its name
upright, so a new formula renders before anyone names it. The output needs `amsmath` (`align`).
"""

from __future__ import annotations

import re

import sympy as sp
from sympy.printing.latex import LatexPrinter

# Left-hand side of each formula, keyed by `Derived.name`. Add a line for a new formula.
LHS: dict[str, str] = {
    # CNN / data parallel (planner.formulas)
    "iteration_time": r"T_{\mathrm{iter}}",
    "speedup": "S",
    "efficiency": r"\eta",
    "memory": r"M_{\mathrm{dev}}",
    "optimal_nodes": "n^*",
    "max_speedup": r"S_{\max}",
    "required_bandwidth": r"\beta_{\mathrm{req}}",
    "time_to_train_batch": "B^*",
    # transformer limits (issue 13)
    "optimal_devices": "N^*",
    "optimal_pp": "p^*",
    "memory_floor": r"N_{\mathrm{mem}}",
    "comm_bound_from": r"N_{\mathrm{comm}}",
    "tp_comm_bound_from": r"t_{\mathrm{comm}}",
    "max_useful_devices": r"N_{\max}",
    "mfu": r"\mathrm{MFU}",
    "bubble_fraction": r"f_{\mathrm{bubble}}",
    "activation_memory": r"M_{\mathrm{act}}",
    "flops_per_token": r"F_{\mathrm{token}}",
}

_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
          "lambda", "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi",
          "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Upsilon",
          "Phi", "Psi", "Omega"}
_SUPERSCRIPTS = {"star": "*", "prime": r"\prime"}
_WORD = re.compile(r"[A-Za-z0-9]+")


def _upright(text: str) -> str:
    return r"\mathrm{" + text + "}"


def _parens(tex: str) -> str:
    return r"\left(" + tex + r"\right)"


def _part(word: str) -> str:
    """One piece of a symbol name: a Greek letter, a single character, or an upright word."""
    if word in _GREEK:
        return "\\" + word
    if len(word) == 1 or word.isdigit():
        return word
    if _WORD.fullmatch(word):
        return _upright(word)
    return _upright(re.sub(r"[^A-Za-z0-9]", "", word))


def symbol_latex(name: str) -> str:
    """LaTeX for a symbol name: base, then an upright subscript of the remaining words
    (`B_noise` -> `B_{\\mathrm{noise}}`); a trailing `_star` is a superscript star."""
    words = [w for w in name.split("_") if w]
    if not words:
        return r"\mathrm{?}"
    sup = ""
    if len(words) > 1 and words[-1] in _SUPERSCRIPTS:
        mark = _SUPERSCRIPTS[words.pop()]
        sup = "^" + (mark if len(mark) == 1 else "{" + mark + "}")
    base, subs = _part(words[0]), words[1:]
    if not subs:
        return base + sup
    if len(subs) == 1 and (len(subs[0]) == 1 or subs[0].isdigit() or subs[0] in _GREEK):
        sub = _part(subs[0])
    else:
        sub = _upright(",".join(re.sub(r"[^A-Za-z0-9]", "", w) for w in subs))
    return f"{base}_{{{sub}}}{sup}"


def lhs(name: str) -> str:
    """The left-hand side for a formula name (`LHS`, else the name upright)."""
    if name in LHS:
        return LHS[name]
    return _upright(name.replace("_", r"\_"))


def _is_compound_sqrt(f: sp.Expr) -> bool:
    return f.is_Pow and f.exp == sp.S.Half and not f.base.is_Atom


class PaperLatexPrinter(LatexPrinter):
    """SymPy's LaTeX printer with paper habits: symbol names from `symbol_latex`, positive
    terms of a sum first (`c - h_1`, not `- h_1 + c`), a coefficient before a square root
    (`\\frac{1}{g} \\sqrt{...}`) and `\\log_2`."""

    def _print_Symbol(self, expr, style="plain"):
        return symbol_latex(expr.name)

    _print_Dummy = _print_Symbol

    def _as_ordered_terms(self, expr, order=None):
        terms = super()._as_ordered_terms(expr, order=order)
        return sorted(terms, key=lambda t: t.could_extract_minus_sign())

    def _print_Mul(self, expr):
        factors = sp.Mul.make_args(expr)
        if factors[0].is_Number and factors[0] < 0:  # also for unevaluated products
            positive = [-factors[0]] if factors[0] != -1 else []
            rest = _unevaluated(positive + list(factors[1:]))
            tex = self._print(rest)
            return "- " + (_parens(tex) if rest.is_Add else tex)
        roots = [f for f in factors if _is_compound_sqrt(f)]
        logs = [f for f in factors if isinstance(f, sp.log)]
        inv_log2 = [f for f in factors if f == 1 / sp.log(2)]
        if len(logs) == 1 and len(inv_log2) == 1:
            rest = [f for f in factors if f is not logs[0] and f is not inv_log2[0]]
            log2 = r"\log_{2}{" + _parens(self._print(logs[0].args[0])) + "}"
            return self._with_coefficient(rest, log2)
        if len(roots) == 1 and len(factors) > 1:
            rest = [f for f in factors if f is not roots[0]]
            return self._with_coefficient(rest, self._print(roots[0]))
        return super()._print_Mul(expr)

    def _with_coefficient(self, rest: list, tex: str) -> str:
        coeff = _unevaluated(rest)
        if coeff == 1:
            return tex
        ctex = self._print(coeff)
        if coeff.is_Add:
            ctex = _parens(ctex)
        return f"{ctex} {tex}"


def _unevaluated(factors: list) -> sp.Expr:
    if not factors:
        return sp.S.One
    return factors[0] if len(factors) == 1 else sp.Mul(*factors, evaluate=False)


def latex(expr: sp.Expr) -> str:
    return PaperLatexPrinter().doprint(expr)


def lines(name: str, display: sp.Expr, where=()) -> list[tuple[str, str]]:
    """(left-hand side, right-hand side) of a formula and of the definitions it uses."""
    out = [(lhs(name), latex(display))]
    out += [(symbol_latex(sym.name), latex(expr)) for sym, expr in where]
    return out


def environment(rows: list[tuple[str, str, str | None]]) -> str:
    """A complete `equation` (one row) or `align` (several) environment. Each row is
    (left-hand side, right-hand side, label or None for an unnumbered definition)."""
    if len(rows) == 1:
        lhs_tex, rhs_tex, label = rows[0]
        tag = rf"\label{{eq:{label}}}" if label else r"\notag"
        return "\n".join([r"\begin{equation}", f"  {lhs_tex} = {rhs_tex} {tag}",
                          r"\end{equation}"])
    body = []
    for i, (lhs_tex, rhs_tex, label) in enumerate(rows):
        tag = rf"\label{{eq:{label}}}" if label else r"\notag"
        end = r" \\" if i < len(rows) - 1 else ""
        body.append(f"  {lhs_tex} &= {rhs_tex} {tag}{end}")
    return "\n".join([r"\begin{align}", *body, r"\end{align}"])


# --- a block that fits a two-column paper (`planner derive --format latex`) -------------------

COLUMN_CHARS = 46  # visible characters of math in one line of a two-column paper's column
_COUNT_UNITS = {"nodes", "devices/node", "devices", "stages", "replicas", "micro-batches",
                "chunks", "layers", "servers", "calls", "samples"}
_INVISIBLE = re.compile(r"\\(?:left|right|Bigl|Bigr|mathrm|text|operatorname|frac|quad|"
                        r"begin\{cases\}|end\{cases\}|notag|label\{[^}]*\})|[{}&\s]|\\[,:;!]")


def width(tex_: str) -> int:
    """A rough count of the characters `tex_` shows (commands and braces not counted, a
    Greek letter as one; a fraction counts both its parts, so this errs on the wide side)."""
    return len(re.sub(r"\\[A-Za-z]+", "x", _INVISIBLE.sub("", tex_)))


def _is_count(e: sp.Expr, counts: set) -> bool:
    """True when `e` is a whole number whatever the values: an integer, a count symbol
    (replicas, stages, devices, ...), or sums and products of those."""
    if e.is_Integer or e in counts:
        return True
    if e.is_Add or e.is_Mul:
        return all(_is_count(a, counts) for a in e.args)
    return False


def display_form(e: sp.Expr, counts: set) -> sp.Expr:
    """The same function written for a paper: no ceiling or floor around a whole number, and
    a case split that is an argument of a max or min taken out of that max (the max of each
    case inside the cases); nothing around that max changes."""
    e = e.replace(lambda x: isinstance(x, sp.ceiling | sp.floor) and _is_count(x.args[0], counts),
                  lambda x: x.args[0])
    return e.replace(
        lambda x: isinstance(x, sp.Max | sp.Min) and any(isinstance(a, sp.Piecewise)
                                                         for a in x.args),
        lambda x: sp.piecewise_fold(x))


class Names:
    """Fresh symbols Q_1, Q_2, ... for the parts a block writes once, and their definitions."""

    def __init__(self, prefix: str = "Q"):
        self.prefix, self.parts = prefix, []

    def name(self, part: sp.Expr) -> sp.Symbol:
        for sym, e in self.parts:
            if e == part:
                return sym
        sym = sp.Symbol(f"{self.prefix}_{len(self.parts) + 1}", positive=True)
        self.parts.append((sym, part))
        return sym


def _repeated(exprs: list[sp.Expr], min_chars: int) -> sp.Expr | None:
    """The widest subexpression (printed at least `min_chars` wide) that occurs twice or more
    in `exprs` together, or None."""
    seen: dict[sp.Expr, int] = {}
    for e in exprs:
        for sub in sp.preorder_traversal(e):
            if not sub.is_Atom:
                seen[sub] = seen.get(sub, 0) + 1
    best = None
    for sub, n in seen.items():
        if n < 2:
            continue
        w = width(latex(sub))
        if w >= min_chars and (best is None or w > best[0]):
            best = (w, sub)
    return None if best is None else best[1]


def _fit(e: sp.Expr, names: Names, budget: int, top: bool = True) -> sp.Expr:
    """`e` with every part too wide for a line that cannot be broken (a fraction, a product)
    and every case split below the top replaced by a name: sums and maxima break between
    their terms, so their terms are fitted one by one; elsewhere the widest part is named."""
    if isinstance(e, sp.Piecewise):
        cases = e.func(*((_fit(v, names, budget), c) for v, c in e.args))
        return cases if top else names.name(cases)
    if e.is_Atom or (width(latex(e)) <= budget and not e.has(sp.Piecewise)):
        return e
    if e.is_Add or isinstance(e, sp.Max | sp.Min):
        return e.func(*(_fit(a, names, budget, top=False) for a in e.args), evaluate=False)
    for _ in range(8):  # name the widest part until this one fits
        cases = [a for a in sp.preorder_traversal(e) if isinstance(a, sp.Piecewise)]
        if width(latex(e)) <= budget and not cases:
            break
        # a reciprocal is named by its base: T / Q, not T Q with Q = 1 / (...)
        parts = cases or [a.base if a.is_Pow and a.exp == -1 else a
                          for a in sp.preorder_traversal(e) if a is not e and not a.is_Atom
                          and width(latex(a)) >= 8]
        parts = [a for a in parts if not a.is_Atom]
        if not parts:
            break
        widest = max(parts, key=lambda a: width(latex(a)))
        e = e.xreplace({widest: names.name(_fit(widest, names, budget))})
    return e


def rhs_lines(e: sp.Expr, budget: int = COLUMN_CHARS) -> list[str]:
    r"""The right-hand side as one or more lines: a sum split between its terms, a max or min
    of wide arguments one argument per line inside \max\Bigl( ... \Bigr) (each argument split
    in turn); short pieces packed back onto one line."""
    printer = PaperLatexPrinter()
    tex_ = printer.doprint(e)
    if width(tex_) <= budget:
        return [tex_]
    pieces: list[str] = []
    if e.is_Add:
        for t in printer._as_ordered_terms(e):
            neg = t.could_extract_minus_sign()
            lines = rhs_lines(-t if neg else t, budget)
            pieces.append(("- " if neg else "+ " if pieces else "") + lines[0])
            pieces += lines[1:]
    elif isinstance(e, sp.Max | sp.Min):
        op = r"\max" if isinstance(e, sp.Max) else r"\min"
        for k, a in enumerate(e.args):
            lines = rhs_lines(a, budget)
            lines[-1] += "," if k < len(e.args) - 1 else r"\Bigr)"
            pieces += lines
        pieces[0] = op + r"\Bigl(" + pieces[0]
    else:
        return [tex_]
    packed: list[str] = []
    for piece in pieces:
        if packed and width(packed[-1] + piece) <= budget:
            packed[-1] += " " + piece
        else:
            packed.append(piece)
    return packed


def paper_environment(rows: list[tuple[str, sp.Expr, str | None]],
                      budget: int = COLUMN_CHARS) -> str:
    """An `align` environment of (left-hand side, expression, label or None) rows whose long
    right-hand sides run over several lines (continuations indented, unnumbered)."""
    body = []
    for lhs_tex, e, label in rows:
        lines = rhs_lines(e, budget)
        tag = rf"\label{{eq:{label}}}" if label else r"\notag"
        for i, line in enumerate(lines):
            start = f"  {lhs_tex} &= " if i == 0 else r"  &\quad "
            body.append(start + line + (f" {tag}" if i == len(lines) - 1 else r" \notag"))
    return "\n".join([r"\begin{align}", " \\\\\n".join(body), r"\end{align}"])


def _in_order(parts: list) -> list:
    """Named parts, each after the parts its definition uses."""
    done: list = []
    pending = list(parts)
    while pending:
        for i, (sym, e) in enumerate(pending):
            if not any(s in e.free_symbols for s, _ in pending if s is not sym):
                done.append(pending.pop(i))
                break
        else:  # cannot happen (a name stands for a strict part); keep the rest as they are
            done += pending
            break
    return done


def fitted_rows(rows: list[tuple[str, sp.Expr, str | None]], counts: set,
                budget: int = COLUMN_CHARS) -> tuple[list, list]:
    """(rows, named parts): the rows in display form (`display_form`), each wide part that
    repeats and each part too wide for a line named once (`Names`), the named parts in the
    order a reader needs them."""
    rows = [(lhs_tex, display_form(e, counts), label) for lhs_tex, e, label in rows]
    names = Names()
    while len(names.parts) < 20:  # each wide part that repeats, written once
        sub = _repeated([e for _, e, _ in rows] + [e for _, e in names.parts], 24)
        if sub is None:
            break
        sym = names.name(sub)
        rows = [(l, e.xreplace({sub: sym}), lab) for l, e, lab in rows]
        names.parts = [(s, e if s is sym else e.xreplace({sub: sym})) for s, e in names.parts]
    rows = [(l, _fit(e, names, budget), lab) for l, e, lab in rows]
    k = 0
    while k < len(names.parts):  # a named part fitted in turn (it may name more)
        sym, e = names.parts[k]
        names.parts[k] = (sym, _fit(e, names, budget))
        k += 1
    named = _in_order(names.parts)
    # numbered in the order they are defined: Q_1 first
    renumber = {sym: sp.Symbol(f"{names.prefix}_{k}", positive=True)
                for k, (sym, _) in enumerate(named, 1)}
    tmp = {sym: sp.Dummy() for sym in renumber}
    back = {tmp[sym]: new for sym, new in renumber.items()}
    rows = [(l, e.xreplace(tmp).xreplace(back), lab) for l, e, lab in rows]
    named = [(renumber[sym], e.xreplace(tmp).xreplace(back)) for sym, e in named]
    return rows, named


def expand_names(e: sp.Expr, named: list) -> sp.Expr:
    """`e` with every named part written back out (the inverse of `fitted_rows`)."""
    for sym, part in reversed(named):
        e = e.xreplace({sym: part})
    return e


def paper_block(formulas, budget: int = COLUMN_CHARS) -> str:
    """`planner derive --format latex`: every formula (`planner.formulas.Derived`) in one
    `align` environment that fits a column of a two-column paper (`fitted_rows`): the paper
    forms of `planner.formulas`, no case split inside a max, no ceiling around a whole
    number, each wide part that repeats or cannot be broken named once (Q_1, Q_2, ...,
    defined in the block and listed in the glossary), long sums and maxima broken over
    lines. Comment lines first: each formula's value, the named parts, and the value, unit
    and meaning of every symbol."""
    from planner import formulas as der
    from planner.expr import symbols as S

    counts = {s for s, m in S.GLOSSARY.items() if m.unit in _COUNT_UNITS}
    rows, seen = [], set()
    comments = [r"% planner derive: needs \usepackage{amsmath}"]
    symbols: dict[str, dict] = {}
    for d in formulas:
        value = d.value
        head = f"% {d.name}: {d.description}"
        head += f"; value {value:.6g} {d.unit}" if value is not None else ""
        comments.append(head + (f" [{d.note}]" if d.note else "")
                        + (f"; holds for {der.holds_text(d)}" if d.holds else ""))
        for k, v in der.glossary(d).items():
            symbols.setdefault(k, {**v, "uses": {}})["uses"].setdefault(v["value"], []).append(
                d.name)
        rhs, where = d.shown()
        for row in [(lhs(d.name), rhs, d.name)] + [(symbol_latex(s.name), w, None)
                                                   for s, w in where]:
            if row[2] is None and row[:2] in seen:
                continue
            seen.add(row[:2])
            rows.append(row)
    rows, named = fitted_rows(rows, counts, budget)
    if named:
        comments.append("% named parts, each written once in the block")
        for sym, _ in named:
            users = [lab for _, e, lab in rows if lab and sym in e.free_symbols]
            users += [s.name for s, e in named if sym in e.free_symbols]
            comments.append(f"%   ${symbol_latex(sym.name)}$ ({sym.name}): a part of "
                            f"{', '.join(users) or 'the formulas'}")
    comments += where_comments(symbols)
    parts = [(symbol_latex(s.name), e, None) for s, e in named]
    return "\n".join(comments) + "\n" + paper_environment(parts + rows, budget)


def where_comments(symbols: dict) -> list[str]:
    """The LaTeX comment lines naming each symbol's value(s), unit and meaning (`symbols`:
    name -> {latex, unit, description, uses: value -> formulas using it})."""
    out = ["% where"] if symbols else []
    for k, v in sorted(symbols.items()):
        uses = v["uses"]
        shown = "; ".join(f"{x:.6g} {v['unit']}" + (f" ({', '.join(names)})" if len(uses) > 1
                                                      else "") for x, names in uses.items())
        out.append(f"%   ${v['latex']}$ ({k}) = {shown}: {v['description']}")
    return out
