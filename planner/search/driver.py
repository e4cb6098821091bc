"""The one solver driver every model family's search runs through. A family prices its plans
as rows (`Rows`: each row's iteration time, devices, nodes, global batch, the family's own
gates such as memory and pins) and turns a row back into a `Plan` and a `Prediction`; the
driver owns the rest, written once: the objective and its tie-break, the time and cost to
train, the deadline and budget gates, CP-SAT over the priced table (`planner.search.table`,
where a table with no allowed row names its smallest conflicting set of gates), the Pareto
front, the knee and the `Solution`.

Over a priced table CP-SAT's minimum is an exact argmin of the rows every gate allows (what
`solve` proves optimal), and the conflict it reports is the smallest set of gates no row
passes together.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from planner.errors import SpecError
from planner.plan import Plan
from planner.prediction import Prediction
from planner.search import table as core
from planner.search.objective import Objective, other_objective
from planner.search.solution import Solution, front_entry
from planner.search.training import Training


@dataclass
class Rows:
    """One family's priced plans, one element per row."""

    time_s: np.ndarray  # iteration time
    devices: np.ndarray
    nodes: np.ndarray
    batch: np.ndarray  # global batch
    gates: list[core.Gate] = field(default_factory=list)  # the family's (memory, pins, ...)
    group: np.ndarray | None = None  # runners-up: one per group (None: every row its own)
    points: int = 0  # configurations priced
    # 1 / efficiency's denominator, one device's time for the row's whole batch (CNNs)
    single_device_s: np.ndarray | None = None


@dataclass(frozen=True)
class Ask:
    """What every search is asked, whatever the family."""

    objective: Objective
    training: Training | None = None
    # a token budget as a fixed sample budget (its tokens over the sequence length)
    token_budget: Training | None = None
    top: int = 0
    fewest_nodes_within: float | None = None
    time_limit_s: float = 10.0
    workers: int = 1
    pareto: bool = False
    knee_tolerance: float = core.DEFAULT_KNEE_TOLERANCE


class Family(Protocol):
    """What a family's search gives the driver."""

    def rows(self, explain: bool = False) -> Rows: ...
    def plan(self, row: int) -> Plan: ...
    def predict(self, plan: Plan) -> Prediction: ...


def train_arrays(training: Training, time_s, devices, batch) -> tuple[np.ndarray, np.ndarray]:
    """(time to train, cost to train) per row: S(B) steps of the iteration time (McCandlish
    et al. 2018), and the device-hours they take at the price per device-hour (0 without)."""
    ttt = time_s * training.steps(np.asarray(batch, dtype=float))
    return ttt, ttt / 3600 * devices * (training.price_per_device_hour or 0.0)


def objective_arrays(ask: Ask, rows: Rows, train) -> tuple[np.ndarray, np.ndarray]:
    """(objective, tie-break) per row: the iteration time times the objective's factor
    (`planner.search.objective`), ties to the fewer device-seconds."""
    obj, t, n, b = ask.objective, rows.time_s, rows.devices, rows.batch
    if obj is Objective.time_to_train:
        return train[0], train[1] if ask.training.price_per_device_hour else train[0] * n
    if obj is Objective.cost:
        return train[1], train[0]
    if obj is Objective.token_budget:
        values = t * ask.token_budget.steps(b)
    elif obj is Objective.throughput:
        values = t / b  # seconds per sample: 1 / throughput
    elif obj is Objective.efficiency:
        values = t * n / rows.single_device_s
    else:
        values = t
    return values, other_objective(obj, values, n, b)


def training_gates(training: Training | None, train) -> list[core.Gate]:
    """The deadline and the budget, as gates on the time and cost to train."""
    gates = []
    if training is not None and training.deadline_s is not None:
        gates.append(core.Gate("deadline", f"time to train <= {training.deadline_s:g} s (the "
                               f"fastest plan that fits takes {train[0].min():.4g} s)",
                               train[0] <= training.deadline_s))
    if training is not None and training.budget_usd is not None:
        gates.append(core.Gate("budget", f"cost to train <= {training.budget_usd:g} USD (the "
                               f"cheapest plan that fits costs {train[1].min():.4g} USD)",
                               train[1] <= training.budget_usd))
    return gates


@dataclass
class Priced:
    """The table CP-SAT searches and what it was built from."""

    table: core.Table
    rows: Rows
    train: tuple[np.ndarray, np.ndarray] | None


def price(ask: Ask, rows: Rows) -> Priced:
    """The table of `rows` for `ask`: objective, tie-break, every gate."""
    train = (train_arrays(ask.training, rows.time_s, rows.devices, rows.batch)
             if ask.training is not None else None)
    obj, other = objective_arrays(ask, rows, train)
    if not np.all(np.isfinite(obj)):
        raise SpecError("the cost model gave a non-finite value; check the hardware numbers")
    gates = [*rows.gates, *training_gates(ask.training, train)]
    return Priced(core.Table(obj, other, rows.devices, rows.nodes, gates, rows.group), rows,
                  train)


def solve(family: Family, ask: Ask, *,
          note: Callable[[tuple[str, ...]], str] | None = None,
          training_report: Callable[[Plan, float], dict | None] | None = None) -> Solution:
    """The best plan of `family` for `ask`, with runners-up, the Pareto front and the knee as
    asked. `note` adds context to an infeasibility's message; `training_report` the chosen
    plan's training run (default: `Training.report`)."""
    t0 = time.perf_counter()
    priced = price(ask, family.rows())
    build = time.perf_counter() - t0
    found = core.solve(priced.table, top=ask.top, within=ask.fewest_nodes_within,
                       time_limit_s=ask.time_limit_s, workers=ask.workers,
                       explain=lambda: price(ask, family.rows(explain=True)).table, note=note)
    plan = family.plan(found.best)
    pred = family.predict(plan)
    alternatives = [(p, family.predict(p)) for p in map(family.plan, found.alternatives)]
    value = float(priced.table.objective[found.best])
    report = None  # a fixed token budget reports as `Solution.token_budget`
    if ask.training is not None and not ask.training.fixed:
        report = (training_report or _report(ask.training))(plan, pred.iteration_time_s)
    return Solution(
        status=found.status, plan=plan, prediction=pred,
        objective={"name": ask.objective.value, "value": value, "solver_value": found.value,
                   "unit": ask.objective.unit},
        alternatives=alternatives, solve_time_s=found.solve_time_s, build_time_s=build,
        branches=found.branches, points=priced.rows.points, rows=len(priced.table),
        gap=found.gap, training=report,
        pareto=pareto(family, ask, priced) if ask.pareto else None,
        knee=knee(ask, priced, found.best))


def _report(training: Training):
    return lambda plan, iteration_s: training.report(plan.global_batch, plan.devices,
                                                     iteration_s)


def knee(ask: Ask, priced: Priced, chosen: int) -> dict | None:
    """Where scaling stops (`planner.search.table.knee`), measured in the objective when it is
    a time, the time to train for the cost, the iteration time for the efficiency."""
    if ask.objective is Objective.cost:
        time_s = priced.train[0]
    elif ask.objective is Objective.efficiency:
        time_s = priced.rows.time_s
    else:
        time_s = priced.table.objective
    return core.knee(time_s, priced.table.devices, priced.table.allowed(), chosen,
                     ask.knee_tolerance, core.KNEE_MEASURES[ask.objective.value])


def pareto(family: Family, ask: Ask, priced: Priced) -> list[dict]:
    """The non-dominated (time-to-train, cost) plans among the rows every gate allows."""
    ok = np.flatnonzero(priced.table.allowed())
    ttt, cost = priced.train[0][ok], priced.train[1][ok]
    front = []
    for j in core.pareto_front(ttt, cost, priced.table.devices[ok]):
        plan = family.plan(int(ok[j]))
        front.append(front_entry(plan, ttt[j], cost[j], ask.training.steps(plan.global_batch)))
    return front
