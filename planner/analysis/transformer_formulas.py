"""The formulas behind the transformer `limits`, as `planner.formulas.Derived` (expression in
the glossary's symbols, their values here, and the value `limits` reports)."""

from __future__ import annotations

import sympy as sp

from planner.analysis.transformer_limits import TransformerLimits
from planner.cost import symbols as S
from planner.errors import SpecError
from planner.expr.transformer import memory_form, time_form
from planner.formulas import Derived

FORMULAS = ("iteration_time", "bubble_fraction", "memory", "mfu", "optimal_devices",
            "max_speedup", "comm_bound_from", "max_useful_devices", "optimal_pp",
            "tp_comm_bound_from", "required_bandwidth", "time_to_train_batch")


def _free(expr: sp.Expr, values: dict) -> dict:
    free = expr.free_symbols
    return {k: v for k, v in values.items() if k in free}


def derive(lim: TransformerLimits) -> list[Derived]:
    c, at = lim.choices, lim.plan_point
    T = time_form(c)
    slots = S.m + (S.p - 1) / S.v
    peak = lim.system.device.peak_flops(lim.precision)
    mfu_values = {**at, S.F_seq: float(lim.model.model_flops()), S.P_peak: peak,
                  S.T_iter: lim_time(lim)}
    out = [
        Derived("iteration_time", "iteration time of the plan: pipeline slots, exposed "
                "data-parallel communication, optimizer step", "s", T, _free(T, at)),
        Derived("bubble_fraction", "pipeline bubble over the micro-batches' own time (SC21, "
                "eq. 1)", "dimensionless", sp.simplify((slots - S.m) / S.m),
                {S.p: lim.pp, S.m: at[S.m], S.v: lim.v}),
        Derived("memory", "bytes per device: weights, gradients, optimizer state by ZeRO "
                "stage, first-stage activations", "B", memory_form(c),
                _free(memory_form(c), at)),
        Derived("mfu", "model FLOPs utilisation: model FLOPs of the batch over devices x time "
                "x peak", "dimensionless",
                S.F_seq * S.B / (S.t * S.p * S.d * S.T_iter * S.P_peak),
                _free(S.F_seq * S.B / (S.t * S.p * S.d * S.T_iter * S.P_peak), mfu_values)),
    ]
    d_star = lim.optimal_dp
    out.append(Derived("optimal_devices", "devices t p d* minimising T(d) at this t x p",
                       "devices", S.t * S.p * d_star.expression,
                       _free(S.t * S.p * d_star.expression, {**d_star.values}),
                       d_star.note))
    relaxed = lim.d_form.replace(sp.ceiling, lambda x: x)
    speedup = S.T_d1 / substitute_d(relaxed, d_star.expression)
    sp_values = {**d_star.values, S.T_d1: float(lim.d_time(1.0))}
    out.append(Derived("max_speedup", "speed-up of T(d*) over one data-parallel replica",
                       "dimensionless", speedup, _free(speedup, sp_values), d_star.note))
    comm = lim.comm_bound_from()
    if comm is not None:
        e = S.t * S.p * comm.expression
        out.append(Derived("comm_bound_from", "devices from which data-parallel "
                           "communication is no longer hidden", "devices", e,
                           _free(e, comm.values), comm.note))
    useful = lim.max_useful_devices()
    out.append(Derived("max_useful_devices", "devices at one smallest efficient micro-batch "
                       "per replica", "devices", useful.expression, useful.values, useful.note))
    at_dp = lim.pinned_dp or lim.dp
    for name, (_, closed) in (("optimal_pp", lim.optimal_pp(at_dp)),
                              ("tp_comm_bound_from", lim.tp_comm_bound_from(at_dp))):
        if closed is not None:
            unit = "stages" if name == "optimal_pp" else "devices"
            out.append(Derived(name, f"{name.replace('_', ' ')} at dp {at_dp} (a closed form "
                               "on the branch holding there)", unit, closed.expression,
                               _free(closed.expression, closed.values), closed.note))
    d_whole = lim.best_whole_dp()[0]
    for closed, unit, desc in ((lim.required_bandwidth(d_whole), "B/s",
                                "inter-node bandwidth per device for the target efficiency"),
                               (lim.time_to_train_batch(d_whole), "samples",
                                "global batch minimising the time to train")):
        if closed is not None:
            out.append(Derived(closed.name, desc, unit, closed.expression,
                               _free(closed.expression, closed.values), closed.note))
    return out


def substitute_d(expr: sp.Expr, value: sp.Expr) -> sp.Expr:
    return expr.xreplace({S.d: value})


def lim_time(lim: TransformerLimits) -> float:
    return float(lim.run(d=float(lim.dp))["time"])


def select(formulas: list[Derived], names: tuple[str, ...]) -> list[Derived]:
    if not names:
        return formulas
    known = {f.name: f for f in formulas}
    for name in names:
        if name not in FORMULAS:
            raise SpecError(f"formula: unknown name '{name}' for transformers (known: "
                            f"{', '.join(FORMULAS)})")
        if name == "time_to_train_batch" and name not in known:
            raise SpecError("formula: 'time_to_train_batch' needs --critical-batch")
        if name not in known:
            raise SpecError(f"formula: '{name}' has no closed form for this plan")
    return [known[n] for n in names]
