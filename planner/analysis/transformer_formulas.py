"""The formulas behind the transformer `limits`, as `planner.formulas.Derived` (expression in
the glossary's symbols, their values here, and the value `limits` reports). Each is built only
when asked for: the limits behind some of them search the full model."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import sympy as sp

from planner.analysis import branches as br
from planner.analysis.branches import Closed
from planner.analysis.transformer_limits import TransformerLimits, time_form
from planner.analysis.transformer_lines import optimal_pp, tp_comm_bound_from
from planner.errors import InfeasibleError, SpecError
from planner.expr import graph
from planner.expr import symbols as S
from planner.expr.rewrite import substitute
from planner.expr.transformer import memory_form
from planner.formulas import Derived, Holds, uses

DIMENSIONLESS = "dimensionless"


def _derived(name: str, description: str, unit: str, expr: sp.Expr, values: dict,
             note: str = "", display: sp.Expr | None = None, where: tuple = (),
             holds: tuple = ()) -> Derived:
    d = Derived(name, description, unit, expr, values, note, display, where, holds)
    return dataclasses.replace(d, values={k: v for k, v in values.items() if k in uses(d)})


def _closed(description: str, unit: str, scale: sp.Expr | int = 1):
    """A builder for a limit given as a `Closed` (None when it has no closed form)."""
    def build(lim: TransformerLimits, closed: Closed | None) -> Derived | None:
        if closed is None:
            return None
        values = {**closed.values, S.t: lim.tp, S.p: lim.pp}
        return _derived(closed.name, description, unit, scale * closed.expression, values,
                        closed.note)
    return build


def _of_d(lim: TransformerLimits) -> tuple[sp.Expr, tuple, dict]:
    """The iteration time as a function of the data-parallel degree d at this t x p and
    micro-batch: (its form in the aggregates, the parts that move with d, the values). The
    aggregates (tau, H, M, ...) do not depend on d; the micro-batches m = B / (d b) and the
    replicas sharing a node r = min(d, max(floor(u / (t p)), 1)) do (with r = 1 at every d
    where t p fills the scale-up domain)."""
    where = [(S.m, S.B / (S.d * S.b))]
    if lim.aggregates[S.r] != 1:
        where.append((S.r, sp.Min(S.d, sp.Max(sp.floor(S.u / (S.t * S.p)), 1))))
    form = lim.one_replica_per_node(time_form(lim.choices))
    return form, tuple(where), {**lim.plan_point, S.u: float(lim.hw.scale_up)}


def _iteration_time(lim: TransformerLimits) -> Derived:
    form, where, values = _of_d(lim)
    return _derived("iteration_time", "iteration time of the plan: pipeline slots, exposed "
                    "data-parallel communication, optimizer step", "s",
                    substitute(form, dict(where)), values, display=form, where=where)


def _bubble(lim: TransformerLimits) -> Derived:
    slots = S.m + (S.p - 1) / S.v  # the pipeline slots of time_form (SC21, eq. 1-2)
    return _derived("bubble_fraction", "pipeline bubble over the micro-batches' own time "
                    "(SC21, eq. 1)", DIMENSIONLESS, sp.simplify((slots - S.m) / S.m),
                    lim.plan_point)


def _memory(lim: TransformerLimits) -> Derived:
    return _derived("memory", "bytes per device: weights, gradients, optimizer state by ZeRO "
                    "stage, first-stage activations", "B",
                    graph.to_sympy(memory_form(lim.choices)), lim.plan_point,
                    holds=_in_flight(lim))


def _in_flight(lim: TransformerLimits) -> tuple[Holds, ...]:
    """With a pipeline the first stage holds the activations of the micro-batches in flight,
    which grow with m = B / (d b) until the schedule's warm-up is full: A_act holds for every
    m from that point on (found on the full model), else only at the plan's own m."""
    if lim.pp == 1:
        return ()
    m0 = lim.B / (lim.dp * lim.b)

    def acts(m: float) -> float:
        return float(np.asarray(lim.run(d=lim.B / (m * lim.b))["activations"]))

    full = acts(1e6)
    m_full = next((m for m in range(1, 4 * lim.pp * lim.v + 1)
                   if math.isclose(acts(m), full, rel_tol=1e-12)), None)
    why = ("the activations of the micro-batches in flight on the first stage, read at this "
           "m; planner evaluate prices whole plans")
    if m_full is not None and m0 >= m_full:
        return (Holds(S.B / (S.d * S.b), float(m_full), math.inf, why),)
    return (Holds(S.B / (S.d * S.b), m0, m0, why),)


def _mfu(lim: TransformerLimits) -> Derived:
    form, where, values = _of_d(lim)
    shown = S.F_seq * S.B / (S.t * S.p * S.d * S.T_iter * S.P_peak)
    values = {**values, S.F_seq: float(lim.model.model_flops()),
              S.P_peak: lim.system.device.peak_flops(lim.precision)}
    return _derived("mfu", "model FLOPs utilisation: model FLOPs of the batch over devices x "
                    "time x peak (PaLM, appendix B)", DIMENSIONLESS,
                    substitute(shown, {S.T_iter: substitute(form, dict(where))}), values,
                    display=shown, where=(*where, (S.T_iter, form)))


def _optimal_devices(lim: TransformerLimits) -> Derived:
    d = lim.optimal_dp
    return _derived("optimal_devices", "devices t p d* minimising T(d) at this t x p",
                    "devices", S.t * S.p * d.expression, {**d.values}, d.note)


def _max_speedup(lim: TransformerLimits) -> Derived:
    d = lim.optimal_dp
    speedup = S.T_d1 / substitute(br.relax(lim.d_form), {S.d: d.expression})
    return _derived("max_speedup", "speed-up of T(d*) over one data-parallel replica",
                    DIMENSIONLESS, speedup, {**d.values, S.T_d1: float(lim.d_time(1.0))},
                    d.note)


def _comm_bound(lim: TransformerLimits) -> Derived | None:
    return _closed("devices from which data-parallel communication is no longer hidden",
                   "devices", S.t * S.p)(lim, lim.comm_bound_from())


def _useful(lim: TransformerLimits) -> Derived:
    u = lim.max_useful_devices()
    return _derived("max_useful_devices", "devices at one smallest efficient micro-batch per "
                    "replica", "devices", u.expression, u.values, u.note)


def _at_dp(lim: TransformerLimits) -> int:
    return lim.pinned_dp or lim.dp


def _optimal_pp(lim: TransformerLimits) -> Derived | None:
    return _closed(f"pipeline depth minimising T(p) at tp {lim.tp}, dp {_at_dp(lim)}",
                   "stages")(lim, optimal_pp(lim, _at_dp(lim))[1])


def _tp_bound(lim: TransformerLimits) -> Derived | None:
    return _closed(f"tensor-parallel degree whose collectives equal its compute (pp "
                   f"{lim.pp}, dp {_at_dp(lim)})", "devices")(
        lim, tp_comm_bound_from(lim, _at_dp(lim))[1])


def _bandwidth(lim: TransformerLimits) -> Derived | None:
    return _closed("inter-node bandwidth per device for the target efficiency", "B/s")(
        lim, lim.required_bandwidth(lim.best_whole_dp()[0]))


def _ttt(lim: TransformerLimits) -> Derived | None:
    return _closed("global batch minimising the time to train (McCandlish et al. 2018)",
                   "samples")(lim, lim.time_to_train_batch(lim.best_whole_dp()[0]))


BUILDERS: dict[str, Callable[[TransformerLimits], Derived | None]] = {
    "iteration_time": _iteration_time, "bubble_fraction": _bubble, "memory": _memory,
    "mfu": _mfu, "optimal_devices": _optimal_devices, "max_speedup": _max_speedup,
    "comm_bound_from": _comm_bound, "max_useful_devices": _useful, "optimal_pp": _optimal_pp,
    "tp_comm_bound_from": _tp_bound, "required_bandwidth": _bandwidth,
    "time_to_train_batch": _ttt,
}
FORMULAS = tuple(BUILDERS)


def derive(lim: TransformerLimits, names: tuple[str, ...] = ()) -> list[Derived]:
    """The formulas `names` (all when empty); a named one with no closed form for this plan is
    a one-line error, an unnamed one is left out."""
    for name in names:
        if name not in BUILDERS:
            raise SpecError(f"formula: unknown name '{name}' for transformers (known: "
                            f"{', '.join(FORMULAS)})")
        if name == "time_to_train_batch" and lim.critical_batch is None:
            raise SpecError("formula: 'time_to_train_batch' needs --critical-batch")
    out = []
    for name in names or FORMULAS:
        if name == "time_to_train_batch" and lim.critical_batch is None:
            continue
        f = BUILDERS[name](lim)
        if f is None and names:  # a well-formed problem: infeasible (exit 1), as for CNNs
            raise InfeasibleError(f"infeasible: formula '{name}' has no closed form for this "
                                  "plan (planner limits gives the bound on the full model, or "
                                  "says it is never reached)", (name,))
        if f is not None:
            out.append(f)
    return out
