"""Limits along the pipeline depth p and the tensor-parallel degree t of a transformer plan.

Along p (or t) with the rest of the plan fixed, the iteration time on the branch of each max
that holds, with its ceilings relaxed, is a Laurent polynomial a_inv / x + a_0 + a_1 x
(+ a_2 x^2): the bubble grows with p while each stage's layers shrink as 1 / p; a tensor
group's ring grows with t while each device's matmuls shrink as 1 / t. Its stationary point or
root is a SymPy closed form in those coefficients; the whole plan a user can run is found on
the full model beside it. `lim` is a `planner.analysis.transformer_limits.TransformerLimits`.
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp

from planner.analysis import branches as br
from planner.analysis.branches import Closed, divisors
from planner.expr import graph
from planner.expr import symbols as S
from planner.expr.rewrite import substitute


def _line(lim, term: str, fixed: dict) -> sp.Expr:
    """The full expression of output `term` with the plan symbols in `fixed` fixed."""
    return substitute(graph.to_sympy(lim.expressions.terms[term]), fixed)


def optimal_pp(lim, d: int) -> tuple[int, Closed | None]:
    """(the best whole p at this t and d on the full model, the stationary point of T(p)
    on the branch holding there: p* = sqrt(a_inv / a_1))."""
    md = lim.model
    ps = np.arange(1, md.layers + 1, dtype=float)
    ok = lim.whole_node(lim.tp * ps * d)
    times = np.where(ok, np.asarray(lim.run(p=ps, d=d, v=1)["time"], dtype=float), np.inf)
    p_int = int(ps[np.argmin(times)])
    fixed = {S.t: lim.tp, S.d: d, S.b: lim.b, S.m: lim.B / (d * lim.b), S.v: 1}
    line = br.relax(br.branch_at(_line(lim, "time", fixed), {S.p: p_int}))
    try:
        coeffs = br.laurent(line, S.p)
    except ValueError:
        return p_int, None
    form = br.laurent_form(S.p, coeffs)
    values = br.laurent_values(coeffs)
    roots = br.solve_for(sp.diff(form, S.p), S.p)
    for root in roots:
        z = br.real_in(root, values, 1.0, float(md.layers))
        if z is not None:
            return p_int, Closed("optimal_pp", root, values,
                                 "stationary point of T(p): the bubble against the stage "
                                 "time")
    for root in roots:  # past the last layer: T(p) falls all the way to one layer a stage
        z = br.real_in(root, values, float(md.layers), math.inf)
        if z is not None:
            return p_int, Closed("optimal_pp", sp.Min(root, md.layers), values,
                                 f"the stationary point of T(p) lies past the model's "
                                 f"{md.layers} layers, so the relaxed T(p) falls to p = L; "
                                 "the layers' whole-stage steps set the best whole p")
    return p_int, None

def tp_comm_bound_from(lim, d: int) -> tuple[int | None, Closed | None]:
    """(the smallest whole t whose tensor-parallel communication is at least its compute,
    on the full model; the root of tp_comm(t) - compute(t) on the branch there)."""
    md = lim.model
    ts = np.array(divisors(math.gcd(md.heads, md.kv_heads)), dtype=float)
    r = lim.run(t=ts, d=d)
    over = np.asarray(r["tp_comm"]) >= np.asarray(r["compute"])
    if not over.any():
        return None, None
    i = int(np.argmax(over))
    t_int = int(ts[i])
    fixed = {S.p: lim.pp, S.d: d, S.b: lim.b, S.m: lim.B / (d * lim.b), S.v: lim.v}
    gap = _line(lim, "tp_comm", fixed) - _line(lim, "compute", fixed)
    lo = float(ts[i - 1]) if i else 1.0
    line = br.relax(br.branch_at(gap, {S.t: t_int}))
    try:
        coeffs = br.laurent(line, S.t)
    except ValueError:
        return t_int, None
    form, values = br.laurent_form(S.t, coeffs), br.laurent_values(coeffs)
    for root in br.solve_for(form, S.t):
        z = br.real_in(root, values, lo, float(t_int))
        if z is not None:
            return t_int, Closed("tp_comm_bound_from", root, values,
                                 "tensor-parallel collectives equal the layer's compute")
    return t_int, Closed("tp_comm_bound_from", sp.Integer(t_int), {},
                         f"a step: at t = {t_int} the group "
                         + ("leaves the node" if t_int > lim.g else "crosses over"))
