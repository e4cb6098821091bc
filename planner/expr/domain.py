"""Which groups of ranks stay in one scale-up domain: the one rule, for a group size given
as a number (the pools' numeric pricing, with no SymPy) or as an expression (the cost model's).

Ranks fill nodes and domains in order, a group being `size` consecutive ranks (Megatron-LM's
tp, cp, ep and pipeline groups; torchtitan's mesh the same)."""

from __future__ import annotations

import functools
import numbers


def whole_nodes(hw, size):
    """Whether a group of `size` ranks is whole nodes (its size a multiple of g)."""
    if isinstance(size, numbers.Integral):
        return size % hw.g == 0
    return _whole_nodes_expr(hw.g, size)


def _algebra(size):
    """The namespace building the conditions: `planner.expr.graph` for its nodes, else SymPy."""
    from planner.expr import graph

    if isinstance(size, graph.Node):
        return graph
    import sympy

    return sympy


def _whole_nodes_expr(g: int, size):
    from planner.expr.unordered import sfloor

    sp = _algebra(size)

    # written in the order SymPy's Piecewise puts it in (`planner.expr.layer._if` builds
    # Piecewise unevaluated)
    return sp.Eq(size, sfloor(size / sp.Integer(g)) * g)


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
    return _within_domain_expr(u, hw.g, size)


@functools.lru_cache(maxsize=256)
def _within_domain_expr(u: int, g: int, size):
    """`within_domain` of a symbolic size on a domain of u devices and nodes of g, kept: every
    choice's expressions ask the same few."""
    from planner.expr.unordered import sfloor

    sp = _algebra(size)

    divides = sp.Eq(sfloor(sp.Integer(u) / size) * size, u)
    return sp.Or(divides, sp.And(_whole_nodes_expr(g, size), size <= u))
