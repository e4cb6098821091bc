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
