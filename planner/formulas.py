"""The formulas behind `limits`, as SymPy expressions with a glossary of their symbols.

Every formula is the expression `limits` evaluates, in the aggregate symbols of
`planner.cost.symbols`, with the values that hold for the chosen model, hardware and the
roofline piece at the optimum. Substituting those values gives `value`, which is what
`limits` reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from planner.cost import symbols as S
from planner.errors import SpecError
from planner.scaling import Limits

FORMULAS = ("iteration_time", "speedup", "efficiency", "memory", "optimal_nodes",
            "max_speedup", "required_bandwidth", "time_to_train_batch")


@dataclass(frozen=True)
class Derived:
    name: str
    description: str
    unit: str
    expression: sp.Expr
    values: dict  # symbol -> number, for every free symbol
    note: str = ""

    @property
    def value(self) -> float | None:
        v = self.expression.subs(self.values)
        try:
            return float(v)
        except TypeError:
            return None

    def substituted(self, names: set[str] | None) -> Derived:
        """The same formula with the named symbols (or all, for None) replaced by numbers."""
        subs = {s: v for s, v in self.values.items() if names is None or s.name in names}
        return Derived(self.name, self.description, self.unit, self.expression.subs(subs),
                       {s: v for s, v in self.values.items() if s not in subs}, self.note)


def derive(lim: Limits) -> list[Derived]:
    n_opt, f_opt = lim.optimum
    vals = dict(f_opt.values)
    at_opt = {**vals, S.n: n_opt}
    T = lim.iteration_expr()
    dp = lim.dp
    memory_vals = {**at_opt, S.W: dp.cnn.params,
                   S.q: (float(dp.memory["weights"]) + float(dp.memory["gradients"])
                         + float(dp.memory["optimizer"])) / dp.cnn.params,
                   S.A: float(dp.memory["activations"].subs(S.b, 1))}
    out = [
        Derived("iteration_time", "iteration time T(n) under strong scaling", "s", T, at_opt),
        Derived("speedup", "speed-up over one device at the same global batch", "1",
                S.T1 / T, at_opt),
        Derived("efficiency", "parallel efficiency: speed-up per device", "1",
                S.T1 / (S.g * S.n * T), at_opt),
        Derived("memory", "bytes per device at b = B/(g n)", "B",
                S.W * S.q + S.A * S.B / (S.g * S.n), memory_vals),
        Derived("optimal_nodes", "node count minimising T(n)", "1", f_opt.expression, vals,
                f_opt.note),
        Derived("max_speedup", "speed-up at the optimal node count", "1",
                S.T1 / T.subs(S.n, f_opt.expression), vals, f_opt.note),
    ]
    bw = lim.required_bandwidth()
    if bw is not None:
        out.append(Derived("required_bandwidth", "bandwidth for the target efficiency", "B/s",
                           bw.expression, bw.values, bw.note))
    if lim.critical_batch is not None:
        f = lim.time_to_train_formula()
        out.append(Derived("time_to_train_batch", "global batch minimising the time to train "
                           "(1 + B_noise / B) T(n, B) at n nodes", "samples", f.expression,
                           f.values, f.note))
    return [_only_free(d) for d in out]


def _only_free(d: Derived) -> Derived:
    free = d.expression.free_symbols
    return Derived(d.name, d.description, d.unit, d.expression,
                   {s: v for s, v in d.values.items() if s in free}, d.note)


def select(formulas: list[Derived], names: tuple[str, ...]) -> list[Derived]:
    if not names:
        return formulas
    known = {f.name: f for f in formulas}
    for name in names:
        if name not in FORMULAS:
            raise SpecError(f"formula: unknown name '{name}' (known: {', '.join(FORMULAS)})")
        if name == "time_to_train_batch" and name not in known:
            raise SpecError("formula: 'time_to_train_batch' needs --critical-batch")
        if name not in known:
            raise SpecError(f"formula: '{name}' has no solution for this problem")
    return [known[n] for n in names]


def glossary(d: Derived) -> dict:
    return {s.name: {"value": float(v), "unit": S.GLOSSARY[s].unit,
                     "description": S.GLOSSARY[s].description}
            for s, v in sorted(d.values.items(), key=lambda kv: kv[0].name)}


def as_json(d: Derived) -> dict:
    return {"name": d.name, "description": d.description, "unit": d.unit,
            "expression": sp.sstr(d.expression), "latex": sp.latex(d.expression),
            "python": sp.pycode(d.expression), "symbols": glossary(d), "value": d.value,
            "note": d.note}
