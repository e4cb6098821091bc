"""The structure of a roofline sum: a convex piecewise-affine function of the local batch.

Each layer's time is the max of affine functions of b (compute, memory, and the flat issue
floor of its kernels), so their sum is affine between the layers' corners: where a layer
turns from issue bound to memory or compute bound, and from memory bound to compute bound (its
ridge point). `affine_pieces` reads that structure off the SymPy expression itself, so
`limits` can solve each piece in closed form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import sympy as sp


@dataclass(frozen=True)
class Piece:
    """f(b) = t0 + c b for b in [b_lo, b_hi]."""

    b_lo: float
    b_hi: float
    t0: float
    c: float

    def __call__(self, b: float) -> float:
        return self.t0 + self.c * b


def _affine(expr: sp.Expr, var: sp.Symbol) -> tuple[float, float]:
    import sympy as sp

    poly = sp.Poly(sp.expand(expr), var)
    if poly.degree() > 1:
        raise ValueError(f"not affine in {var}: {expr}")
    c1 = float(poly.coeff_monomial(var))
    c0 = float(poly.coeff_monomial(1))
    return c0, c1


def affine_pieces(expr: sp.Expr, var: sp.Symbol, lo: float = 0.0,
                  hi: float = float("inf")) -> list[Piece]:
    """Split `expr` (a sum of affine terms and Max of affine terms in `var`) into affine pieces."""
    import sympy as sp

    fixed = np.zeros(2)
    maxes: list[np.ndarray] = []  # each (k, 2): the k affine arguments of one Max
    for term in sp.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()  # SymPy merges equal terms: 2*Max(...)
        if isinstance(rest, sp.Max) and coeff > 0:
            maxes.append(float(coeff) * np.array([_affine(a, var) for a in rest.args]))
        else:
            fixed += _affine(term, var)
    cuts = {lo, hi}
    for args in maxes:
        for i in range(len(args)):
            for j in range(i + 1, len(args)):
                d1 = args[i][1] - args[j][1]
                if d1 != 0:
                    x = (args[j][0] - args[i][0]) / d1
                    if lo < x < hi:
                        cuts.add(float(x))
    edges = sorted(cuts)
    pieces = []
    for a, z in zip(edges, edges[1:], strict=False):
        mid = (a + z) / 2 if np.isfinite(z) else max(2 * a, a + 1)
        coef = fixed.copy()
        for args in maxes:
            coef += args[np.argmax(args[:, 0] + args[:, 1] * mid)]
        pieces.append(Piece(a, z, float(coef[0]), float(coef[1])))
    return pieces


def piece_at(pieces: list[Piece], x: float) -> Piece:
    for p in pieces:
        if p.b_lo <= x <= p.b_hi:
            return p
    return pieces[-1] if x > pieces[-1].b_hi else pieces[0]
