"""The paper form of an expression: the same value, written the way a paper would write it.

`tidy` rewrites a SymPy expression for display only (`planner derive`): one square root per
product with perfect squares taken out (`sqrt(2) sqrt(X/a) / (2 sqrt(g) sqrt(k))` becomes
`(1/g) sqrt(X / (2 a k))`), common factors of a sum pulled out pair by pair, the biggest first
(`B c - B h_1` becomes `B (c - h_1)`, `2 M (g n - 1)/(beta g n) + 2 alpha k (g n - 1)` becomes
`2 (g n - 1)(alpha k + M/(beta g n))`), integer content and signs taken out of sums so no sum
reads as the negative of another (`-(-x + y)` becomes `x - y`), and logarithms of powers
expanded. The rewrite relies on every symbol being positive (or nonnegative), as they are in
`planner.expr.symbols`; `tidy_checked` keeps the original wherever the two differ in value.

The result may hold unevaluated products and powers: print it, evaluate it, never rebuild
other expressions from it.
"""

from __future__ import annotations

import math
from itertools import combinations

import sympy as sp

_HALF = sp.S.Half


def tidy(expr: sp.Expr) -> sp.Expr:
    return _tidy(_expand_log_powers(expr))


def tidy_checked(expr: sp.Expr, values: dict, rel: float = 1e-12) -> sp.Expr:
    """`tidy(expr)` if it has the value of `expr` at `values` (to `rel`), else `expr`."""
    out = tidy(expr)
    return out if _close(out, expr, values, rel) else expr


def evaluate(expr: sp.Expr, values: dict) -> complex:
    """The value of `expr` at `values`, the values put in as given (so a ceiling of
    log(8) / log(2) stays 3 as in `Derived.value`, not 3 + 1e-30 rounded up)."""
    return complex(expr.xreplace({sym: _number(v) for sym, v in values.items()}))


def _number(v) -> sp.Expr:
    """A value as a SymPy number: integers exact, floats as given (no text is parsed)."""
    if isinstance(v, sp.Basic):
        return v
    return sp.Integer(v) if isinstance(v, int) else sp.Float(float(v))


def _close(a: sp.Expr, b: sp.Expr, values: dict, rel: float) -> bool:
    try:
        x, y = evaluate(a, values), evaluate(b, values)
    except (TypeError, ValueError, ZeroDivisionError):
        return False
    if not (math.isfinite(x.real) and math.isfinite(y.real)):
        return False
    return abs(x - y) <= rel * max(abs(x), abs(y)) or x == y


# --- logarithms ------------------------------------------------------------------------------

def _expand_log_powers(expr: sp.Expr) -> sp.Expr:
    """log(a**x * b**y) -> x log(a) + y log(b) when an exponent is symbolic (positive bases)."""

    def split(arg):
        factors = sp.Mul.make_args(arg)
        if not any(f.is_Pow and not f.exp.is_Number for f in factors):
            return None
        return sp.Add(*(f.exp * sp.log(f.base) if f.is_Pow else sp.log(f) for f in factors))

    def rewrite(e):
        if isinstance(e, sp.log) and len(e.args) == 1:
            out = split(e.args[0])
            if out is not None:
                return out
        return e

    return expr.replace(lambda e: isinstance(e, sp.log), rewrite)


# --- products ----------------------------------------------------------------------------------

def _tidy(e: sp.Expr, in_sum: bool = False) -> sp.Expr:
    if e.is_Atom:
        return e
    if e.is_Add:
        return _add([_tidy(a, in_sum=True) for a in e.args])
    if e.is_Mul or e.is_Pow:
        return _mul(e, in_sum)
    args = [_tidy(a) for a in e.args]
    try:  # Max, Min, ceiling, log, ...: keep the arguments as written
        return e.func(*args, evaluate=False)
    except TypeError:
        return e.func(*args)


def _factors(e: sp.Expr) -> tuple[sp.Expr, dict]:
    """(numeric coefficient, {base: exponent}) of a tidied product."""
    coeff, powers = sp.S.One, {}
    for f in sp.Mul.make_args(e):
        if f.is_Number:
            coeff *= f
            continue
        base, exp = f.as_base_exp()
        if base.is_Mul:  # an unevaluated product inside a power
            c, inner = _factors(base)
            if c != 1:
                if exp.is_Integer:
                    coeff *= c ** exp
                else:
                    powers[c] = powers.get(c, 0) + exp
            for b, x in inner.items():
                powers[b] = powers.get(b, 0) + x * exp
            continue
        powers[base] = powers.get(base, 0) + exp
    return coeff, {b: x for b, x in powers.items() if x != 0}


def _mul(e: sp.Expr, in_sum: bool = False) -> sp.Expr:
    """A product: numbers together, sums with their common factor and sign taken out, one
    square root; alone (not a term of a sum), -x / (y - z) becomes x / (z - y)."""
    coeff = sp.S.One
    powers: dict[sp.Expr, sp.Expr] = {}

    def put(base, exp):
        powers[base] = powers.get(base, 0) + exp

    for f in sp.Mul.make_args(e):
        if f.is_Number:
            coeff *= f
            continue
        base, exp = f.as_base_exp()
        if base.is_Number:  # sqrt(2)
            put(base, exp)
            continue
        tb = _tidy(base)
        if tb.is_Add:  # take the common factor (and for whole powers the sign) out of the sum
            c, common, tb = _content(tb, signed=exp.is_Integer)
            for b, x in common.items():
                put(b, x * exp)
            factors = [(c, {tb: sp.S.One})]
        else:
            factors = [_factors(tb)]
        for c, inner in factors:
            if c != 1:
                if exp.is_Integer:
                    coeff *= c ** exp
                else:
                    put(c, exp)
            for b, x in inner.items():
                put(b, x * exp)
    powers = {b: x for b, x in powers.items() if x != 0}
    odd_sums = [b for b, x in powers.items() if b.is_Add and x.is_Integer and x % 2]
    if coeff.is_Number and coeff < 0 and not in_sum and odd_sums:
        # -x / (y - z) reads as x / (z - y): no leading minus on a product standing alone
        b = max(odd_sums, key=_negatives)
        nb = _add([_neg(t) for t in b.args])
        if nb.is_Add and nb not in powers:
            powers[nb] = powers.pop(b)
            coeff = -coeff
    return _assemble(coeff, {b: x for b, x in powers.items() if x != 0})


def _negatives(s: sp.Expr) -> int:
    return sum(1 for t in sp.Add.make_args(s) if t.could_extract_minus_sign())


def _neg(t: sp.Expr) -> sp.Expr:
    c, p = _factors(t)
    return _assemble(-c, p)


def _content(s: sp.Expr, signed: bool = True) -> tuple[sp.Expr, dict, sp.Expr]:
    """(number, common factor, rest) of a sum: every term's common factor taken out, and with
    `signed` the sign too, so the rest reads positive first."""
    split = [_factors(t) for t in sp.Add.make_args(s)]
    common = split[0]
    for t in split[1:]:
        common = _common(common, t) or (
            _gcd(common[0], t[0]), {})
    c, powers = common
    if c != 1 and not _smaller_numbers([t[0] for t in split], c):
        c = sp.S.One  # 1 + s/(6 h) stays, not (6 + s/h)/6
    trivial = len(split) == 1 or (c == 1 and not powers)
    rest = s if trivial else _add([_divide(t, (c, powers)) for t in split])
    if signed and rest.is_Add and _reads_negative(rest):
        c, rest = -c, _add([_neg(t) for t in sp.Add.make_args(rest)])
    return c, powers, rest


def _smaller_numbers(coeffs: list, c: sp.Expr) -> bool:
    """Whether dividing the coefficients by c shows smaller numbers (2 x - 2 -> 2 (x - 1))."""
    def size(r):
        return abs(r.p) + r.q if r.is_Rational else 0
    return sum(size(x / c) for x in coeffs) < sum(size(x) for x in coeffs)


def _reads_negative(s: sp.Expr) -> bool:
    """More negative terms than positive, or as many and SymPy's first term negative."""
    terms = s.as_ordered_terms()
    neg = sum(1 for t in terms if t.could_extract_minus_sign())
    return 2 * neg > len(terms) or (2 * neg == len(terms) and terms[0].could_extract_minus_sign())


def _assemble(coeff: sp.Expr, powers: dict) -> sp.Expr:
    """coeff * prod(base**exp), one square root for all the half-integer exponents."""
    outside: list[sp.Expr] = []
    radicand_num: sp.Expr = sp.S.One
    radicand: list[tuple[sp.Expr, sp.Expr]] = []
    for b, x in powers.items():
        if x.is_Rational and x.q == 2:
            if b.is_Number:
                radicand_num *= b ** (2 * x)
                continue
            whole = 2 * x  # the exponent of b under the root
            out = (sp.Integer(int(whole / 2)) if abs(whole) >= 2 and b.is_nonnegative
                   else sp.S.Zero)
            if out != 0:
                outside.append(sp.Pow(b, out))
            radicand.append((b, whole - 2 * out))
        else:
            outside.append(b ** x if not b.is_Add else sp.Pow(b, x))
    if not radicand and radicand_num == 1:
        return _product(coeff, outside)
    # numbers: r sqrt(q), or sqrt(r^2 q) if that shows smaller numbers
    r, q = coeff, sp.Rational(radicand_num)
    if r.is_Rational and r != 0 and q != 1:
        inside = r * r * q
        shown_out = (abs(r.p) + r.q if abs(r) != 1 else 0) + q.p + q.q
        shown_in = inside.p + inside.q
        if shown_in < shown_out:
            r, q = (1 if r > 0 else -1), inside
    root_factors = [sp.Pow(b, x) if b.is_Add else b ** x for b, x in radicand if x != 0]
    rad = _product(q, root_factors)
    if rad == 1:
        return _product(r, outside)
    root = sp.Pow(rad, _HALF, evaluate=False) if not rad.is_Atom else sp.sqrt(rad)
    return _product(r, outside + [root])


def _product(coeff: sp.Expr, factors: list[sp.Expr]) -> sp.Expr:
    """coeff * factors as one flat product, unevaluated where SymPy would spread a number
    over a sum (2 (x + y)) or split a square root (sqrt(2 x) -> sqrt(2) sqrt(x))."""
    flat = [a for f in factors for a in sp.Mul.make_args(f) if a != 1]
    if coeff == 0:
        return sp.S.Zero
    if not flat:
        return coeff
    fragile = any(a.is_Add or (a.is_Pow and not a.base.is_Atom) for a in flat)
    if not fragile:
        return sp.Mul(coeff, *flat)
    args = ([coeff] if coeff != 1 else []) + flat
    return args[0] if len(args) == 1 else sp.Mul(*args, evaluate=False)


# --- sums --------------------------------------------------------------------------------------

def _weight(powers: dict) -> int:
    return sum((3 if b.is_Add else 1) * int(min(abs(x), 3)) for b, x in powers.items()
               if not b.is_Number)


def _common(a: tuple, b: tuple):
    """The common factor of two terms, as (coefficient, powers), or None if only a number."""
    (ca, pa), (cb, pb) = a, b
    common = {}
    for base, xa in pa.items():
        xb = pb.get(base)
        if xb is None or base.is_Number or not (xa.is_Rational and xb.is_Rational):
            continue
        if xa > 0 and xb > 0:
            common[base] = min(xa, xb)
        elif xa < 0 and xb < 0:
            common[base] = max(xa, xb)
    if not common:
        return None
    return _gcd(ca, cb), common


def _gcd(a: sp.Expr, b: sp.Expr) -> sp.Expr:
    """The positive greatest common divisor of two rationals (1 for anything else)."""
    if a.is_Rational and b.is_Rational and a != 0 and b != 0:
        return sp.Rational(math.gcd(a.p, b.p), math.lcm(a.q, b.q))
    return sp.S.One


def _over_common_denominator(a: tuple, b: tuple, common: tuple) -> bool:
    """Whether a + b = (x + y) / common denominator with x and y free of fractions: then
    p / (m v) - 1 / (m v) reads (p - 1) / (m v), while B c / (g n) stays apart from
    2 M (g n - 1) / (beta g n)."""
    return all(x >= common[1].get(base, 0) for _, p in (a, b) for base, x in p.items())


def _divide(t: tuple, common: tuple) -> sp.Expr:
    (c, p), (cc, pc) = t, common
    rest = dict(p)
    for base, x in pc.items():
        rest[base] = rest[base] - x
    return _assemble(c / cc, {b: x for b, x in rest.items() if x != 0})


def _add(terms: list[sp.Expr]) -> sp.Expr:
    """A sum with common factors pulled out of pairs of terms, the heaviest factor first."""
    flat: list[sp.Expr] = []
    for t in terms:
        c, p = _factors(t) if t.is_Mul else (None, None)
        if c in (1, -1) and len(p) == 1 and next(iter(p)).is_Add and next(iter(p.values())) == 1:
            t = next(iter(p)) if c == 1 else _add([_neg(u) for u in next(iter(p)).args])
        flat.extend(sp.Add.make_args(t) if t.is_Add else [t])
    logs = [t for t in flat if isinstance(t, sp.log) and t.args[0].is_positive]
    if len(logs) > 1:  # log g + log n -> log(g n)
        flat = [t for t in flat if t not in logs] + [sp.log(sp.Mul(*(t.args[0] for t in logs)))]
    split = [_factors(t) for t in flat]
    while len(split) > 1:
        best = None
        for i, j in combinations(range(len(split)), 2):
            common = _common(split[i], split[j])
            if common is None or (all(x < 0 for x in common[1].values())
                                  and not _over_common_denominator(split[i], split[j], common)):
                continue
            w = _weight(common[1])
            if best is None or w > best[0]:
                best = (w, i, j, common)
        if best is None:
            break
        _, i, j, common = best
        inner = _add([_divide(split[i], common), _divide(split[j], common)])
        coeff, powers = common[0], dict(common[1])
        if inner.is_Add:
            c, extra, inner = _content(inner)
            ipow = {**{b: x for b, x in extra.items()}, inner: sp.S.One}
        else:
            c, ipow = _factors(inner)
        coeff *= c
        for b, x in ipow.items():
            powers[b] = powers.get(b, 0) + x
        split = [s for k, s in enumerate(split) if k not in (i, j)]
        split.append((coeff, {b: x for b, x in powers.items() if x != 0}))
    out = [_assemble(c, p) for c, p in split]
    if len(out) == 1:
        return out[0]
    return sp.Add(*out, evaluate=False)
