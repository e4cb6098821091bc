"""Collective communication in the alpha-beta model, as SymPy expressions.

p ranks, message m bytes, alpha latency per step (s), beta bandwidth (B/s), `calls` collective
calls per iteration (each pays the latency terms; the bytes are the total over all calls).
Sources: Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 2005 (sections 4.1-4.5); Patarasuk & Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 2009 (ring allreduce).
"""

from __future__ import annotations

from planner.expr import graph
from planner.expr.unordered import sceil
from planner.vocabulary import Collective  # noqa: F401  (the vocabulary, re-exported)


def one_rank(p) -> bool:
    """p is a number equal to 1: a collective over one rank moves nothing and costs exactly 0.
    (Written as its formula it is 0 only up to rounding: SymPy distributes float factors over
    (p - 1), and the evaluated sum can come out at -1e-21 s.) A symbol is never one rank."""
    if isinstance(p, graph.Node):
        return p.is_number and p == 1
    number = isinstance(p, int | float) or getattr(p, "is_Number", False)  # SymPy's too
    return number and not isinstance(p, bool) and p == 1


def _zero(*operands):
    """Exactly 0, in the algebra of the operands (`planner.expr.graph` or SymPy)."""
    if any(isinstance(x, graph.Node) for x in operands):
        return graph.Integer(0)
    import sympy as sp

    return sp.Integer(0)


def _log2(p):
    if isinstance(p, graph.Node):
        return graph.log(p) / graph.log(2)
    import sympy as sp

    return sp.log(p, 2)


def ring_allreduce(p, m, alpha, beta, calls=1):
    # Patarasuk & Yuan 2009: reduce-scatter + all-gather, each (p-1) steps of m/p bytes.
    # Written with (p - 1) as a factor, which SymPy keeps, so a symbolic p that is 1 (a
    # tensor-parallel degree, the replicas on a node) also costs exactly 0.
    if one_rank(p):
        return _zero(p, m, alpha, beta, calls)
    return (p - 1) * (2 * alpha * calls + 2 * m / (p * beta))


def halving_doubling_allreduce(p, m, alpha, beta, calls=1):
    # Thakur et al. 2005, sec. 4.4 (Rabenseifner): recursive halving reduce-scatter + doubling all-gather.
    if one_rank(p):
        return _zero(p, m, alpha, beta, calls)
    return 2 * _log2(p) * alpha * calls + 2 * (p - 1) / p * m / beta


def tree_allreduce(p, m, alpha, beta, calls=1):
    # Thakur et al. 2005, sec. 4.1: binomial-tree reduce then broadcast, full message each level.
    if one_rank(p):
        return _zero(p, m, alpha, beta, calls)
    return 2 * sceil(_log2(p)) * (alpha * calls + m / beta)


def parameter_server(p, m, alpha, beta, servers, calls=1):
    # Push gradients and pull weights: each of `servers` links carries p*m/servers bytes each way
    # (Li et al., Scaling Distributed ML with the Parameter Server, OSDI 2014; seed paper sec. 3).
    if one_rank(p):
        return _zero(p, m, alpha, beta, servers, calls)
    return 2 * alpha * calls + 2 * p * m / (servers * beta)


def reduce_scatter(p, m, alpha, beta, calls=1):
    # Thakur et al. 2005, sec. 4.3 (ring): p-1 steps of m/p bytes.
    if one_rank(p):
        return _zero(p, m, alpha, beta, calls)
    return (p - 1) * alpha * calls + (p - 1) / p * m / beta


all_gather = reduce_scatter  # same cost, the data flow reversed (Thakur et al. 2005, sec. 4.2)
# Pairwise-exchange all-to-all: p-1 steps, each sending m/p of the rank's m bytes (Thakur et al.
# 2005, sec. 4.5); the same alpha-beta cost as reduce-scatter.
all_to_all = reduce_scatter


def hierarchical_allreduce(g, n, m, alpha_intra, beta_intra, alpha_inter, beta_inter, calls=1):
    """Reduce-scatter inside the node, ring allreduce of m/g across nodes (g rings in parallel,
    each at `beta_inter` per device), all-gather inside the node (NCCL/Horovod hierarchical)."""
    if one_rank(g) and one_rank(n):
        return _zero(g, n, m, alpha_intra, beta_intra, alpha_inter, beta_inter, calls)
    inside = reduce_scatter(g, m, alpha_intra, beta_intra, calls)
    across = ring_allreduce(n, m / g, alpha_inter, beta_inter, calls)
    return 2 * inside + across
