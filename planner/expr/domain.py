"""Which groups of ranks stay in one scale-up domain: the one rule, for a group size given
as a number (the pools' numeric pricing, with no SymPy) or as an expression (the cost model's).

Ranks fill nodes and domains in order, a group being `size` consecutive ranks (Megatron-LM's
tp, cp, ep and pipeline groups; torchtitan's mesh the same)."""

from __future__ import annotations

import numbers


def whole_nodes(hw, size):
    """Whether a group of `size` ranks is whole nodes (its size a multiple of g)."""
    if isinstance(size, numbers.Integral):
        return size % hw.g == 0
    import sympy as sp

    return sp.Eq(sp.floor(size / sp.Integer(hw.g)) * hw.g, size)


def within_domain(hw, size):
    """Whether every group of `size` consecutive ranks lies in one scale-up domain: `size`
    divides the domain (no group straddles a boundary), or the group is whole nodes that fit
    one domain (a scheduler keeps such blocks together: SLURM's --segment; MLPerf's GB200 runs
    fill 72-GPU racks in 64-GPU blocks). Otherwise some groups straddle two domains (tp 3 on
    8-GPU nodes: ranks 6, 7, 8), and the slowest group sets the pace of every rank that waits
    on it."""
    u = hw.scale_up
    if isinstance(size, numbers.Integral):
        return u % size == 0 or (whole_nodes(hw, size) and size <= u)
    import sympy as sp

    divides = sp.Eq(sp.floor(sp.Integer(u) / size) * size, u)
    return sp.Or(divides, sp.And(whole_nodes(hw, size), size <= u))
