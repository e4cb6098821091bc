"""The formulas behind the transformer `limits`, as `planner.formulas.Derived` (expression in
the glossary's symbols, their values here, and the value `limits` reports). Each is built only
when asked for: the limits behind some of them search the full model."""

from __future__ import annotations

from collections.abc import Callable

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
from planner.formulas import Derived

DIMENSIONLESS = "dimensionless"


def _derived(name: str, description: str, unit: str, expr: sp.Expr, values: dict,
             note: str = "") -> Derived:
    free = expr.free_symbols
    return Derived(name, description, unit, expr, {k: v for k, v in values.items()
                                                   if k in free}, note)


def _closed(description: str, unit: str, scale: sp.Expr | int = 1):
    """A builder for a limit given as a `Closed` (None when it has no closed form)."""
    def build(lim: TransformerLimits, closed: Closed | None) -> Derived | None:
        if closed is None:
            return None
        values = {**closed.values, S.t: lim.tp, S.p: lim.pp}
        return _derived(closed.name, description, unit, scale * closed.expression, values,
                        closed.note)
    return build


def _iteration_time(lim: TransformerLimits) -> Derived:
    form = time_form(lim.choices)
    if lim.aggregates[S.r] == 1:
        form = substitute(form, {S.r: sp.Integer(1)})
    return _derived("iteration_time", "iteration time of the plan: pipeline slots, exposed "
                    "data-parallel communication, optimizer step", "s", form, lim.plan_point)


def _bubble(lim: TransformerLimits) -> Derived:
    slots = S.m + (S.p - 1) / S.v  # the pipeline slots of time_form (SC21, eq. 1-2)
    return _derived("bubble_fraction", "pipeline bubble over the micro-batches' own time "
                    "(SC21, eq. 1)", DIMENSIONLESS, sp.simplify((slots - S.m) / S.m),
                    lim.plan_point)


def _memory(lim: TransformerLimits) -> Derived:
    return _derived("memory", "bytes per device: weights, gradients, optimizer state by ZeRO "
                    "stage, first-stage activations", "B",
                    graph.to_sympy(memory_form(lim.choices)),
                    lim.plan_point)


def _mfu(lim: TransformerLimits) -> Derived:
    expr = S.F_seq * S.B / (S.t * S.p * S.d * S.T_iter * S.P_peak)
    values = {**lim.plan_point, S.F_seq: float(lim.model.model_flops()),
              S.P_peak: lim.system.device.peak_flops(lim.precision),
              S.T_iter: float(lim.run(d=float(lim.dp))["time"])}
    return _derived("mfu", "model FLOPs utilisation: model FLOPs of the batch over devices x "
                    "time x peak (PaLM, appendix B)", DIMENSIONLESS, expr, values)


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
