"""Turn the package's own SymPy expressions into fast numeric functions.

`lambdify` generates and `exec`s Python source. That is safe here because every expression it
sees is built by this package from numbers in validated specs; no text a user wrote is ever
parsed into an expression (there is no `sympify` / `parse_expr` of user input anywhere).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import sympy as sp


def compile_expr(expr: sp.Expr, args: Sequence[sp.Symbol]) -> Callable[..., np.ndarray]:
    fn = sp.lambdify(list(args), expr, modules="numpy")

    def call(*values):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.broadcast_to(np.asarray(fn(*values), dtype=float), np.broadcast(*values).shape)

    return call
