"""The answer of a search, the same type for every model family."""

from __future__ import annotations

from dataclasses import dataclass

from planner.plan import Plan
from planner.prediction import Prediction


@dataclass(frozen=True)
class Solution:
    status: str  # optimal | feasible
    plan: Plan
    prediction: Prediction
    objective: dict  # name, value (the expression at the answer), solver_value, unit
    alternatives: list[tuple[Plan, Prediction]]  # runners-up, best first
    solve_time_s: float
    build_time_s: float
    branches: int
    points: int  # configurations priced
    rows: int  # rows of the table CP-SAT searched
    gap: float
    training: dict | None = None  # steps, samples, time_to_train_s (cost_usd, tokens)
    pareto: list[dict] | None = None  # non-dominated (time-to-train, cost) plans, fastest first
    knee: dict | None = None  # where scaling stops (`search.table.knee`)

    @property
    def config(self) -> Plan:
        """The plan (the name data-parallel code used)."""
        return self.plan


def front_entry(plan: Plan, time_to_train_s: float, cost_usd: float, steps: float) -> dict:
    return {"config": plan.to_json(), "time_to_train_s": float(time_to_train_s),
            "cost_usd": float(cost_usd), "steps": float(steps)}
