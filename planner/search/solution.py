"""The answer of a search, the same type for every model family.

Every field reads as attributes: `sol.objective.value`, `sol.training.time_to_train_s`,
`sol.knee.devices`, `sol.pareto[0].config.nodes`, `sol.alternatives[0].plan`. The records
(`Record`) are read-only dicts as well, so `sol.objective["value"]`, `**sol.training` and the
JSON documents built from them stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from planner.plan import Plan
from planner.prediction import Prediction


class Record(dict):
    """A read-only dict whose keys read as attributes (`rec.devices` is `rec["devices"]`); a
    nested dict is a `Record` too. It serialises as the dict it is (JSON, YAML, pickle);
    `dict(rec)` gives a copy to change."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r} (fields: "
                                 f"{', '.join(self) or 'none'})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def _read_only(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} is read-only (dict(x) gives a copy to change)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only
    __ior__ = _read_only

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {k for k in self if isinstance(k, str)})

    def __reduce__(self):
        return (type(self), (dict(self),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


class ObjectiveValue(Record):
    """What the search minimised: `name` (throughput, time-to-train, ...), `value` (the
    expression at the answer), `solver_value` (what the search compared), `unit`."""

    __slots__ = ()
    name: str
    value: float
    solver_value: float
    unit: str


class TrainingReport(Record):
    """The chosen plan's training run (McCandlish et al. 2018): `steps`, `samples`,
    `time_to_train_s`, with a price `cost_usd`, for a transformer `tokens`."""

    __slots__ = ()
    steps: float
    samples: float
    time_to_train_s: float
    cost_usd: float
    tokens: float


class Knee(Record):
    """Where scaling stops (`planner.search.table.knee`): the fewest `devices` within
    `tolerance` of the best time, the best (`best_devices`, `best_time_s`), the last
    doubling's speed-up, the chosen plan's `scaling_efficiency` against `base_devices`."""

    __slots__ = ()
    devices: int
    time_s: float
    tolerance: float
    measure: str
    best_devices: int
    best_time_s: float
    last_doubling_speedup: float | None
    last_doubling_from_devices: int | None
    scaling_efficiency: float
    base_devices: int


class FrontPoint(Record):
    """One plan of the (time-to-train, cost) Pareto front: `config` (the plan's JSON fields
    as a `Record`), `time_to_train_s`, `cost_usd`, `steps`."""

    __slots__ = ()
    config: Record
    time_to_train_s: float
    cost_usd: float
    steps: float


class SearchInfo(Record):
    """How the search went: configurations priced (`points`), table `rows`, CP-SAT
    `branches`, `gap`, `build_time_s`, `solve_time_s` (the JSON document's `search`)."""

    __slots__ = ()
    points: int
    rows: int
    branches: int
    gap: float
    build_time_s: float
    solve_time_s: float


class Alternative(NamedTuple):
    """A runner-up: `plan` and `prediction` (a pair, as before: `for plan, pred in ...`)."""

    plan: Plan
    prediction: Prediction


def record(value: Any, cls: type[Record] = Record) -> Any:
    """`value` with every dict a read-only `Record` (the outermost a `cls`), lists and tuples
    kept as such; anything else as it is."""
    if isinstance(value, dict):
        return cls({k: record(v) for k, v in value.items()})
    if isinstance(value, list):
        return [record(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(record(v) for v in value)
    return value


@dataclass(frozen=True)
class Solution:
    status: str  # optimal | feasible
    plan: Plan
    prediction: Prediction
    objective: ObjectiveValue  # name, value (the expression at the answer), solver_value, unit
    alternatives: list[Alternative]  # runners-up, best first: (plan, prediction)
    solve_time_s: float
    build_time_s: float
    branches: int
    points: int  # configurations priced
    rows: int  # rows of the table CP-SAT searched
    gap: float
    training: TrainingReport | None = None  # steps, samples, time_to_train_s (cost_usd, tokens)
    pareto: list[FrontPoint] | None = None  # non-dominated (time-to-train, cost), fastest first
    knee: Knee | None = None  # where scaling stops (`search.table.knee`)
    # a transformer plan no calibration run covers: the covered alternative and whether it
    # was taken (`planner.search.support`)
    support: Record | None = None
    # with a token budget (`tokens=`): its steps, time, device-hours and cost
    # (`planner.search.training.token_budget`), as the JSON document's `token_budget`
    token_budget: Record | None = None

    def __post_init__(self):
        """The searches build dicts; each becomes its attribute record here."""
        def put(name, value):
            object.__setattr__(self, name, value)

        put("objective", record(self.objective, ObjectiveValue))
        put("alternatives", [Alternative(*alt) for alt in self.alternatives])
        if self.training is not None:
            put("training", record(self.training, TrainingReport))
        if self.pareto is not None:
            put("pareto", [record(p, FrontPoint) for p in self.pareto])
        if self.knee is not None:
            put("knee", record(self.knee, Knee))
        if self.support is not None:
            put("support", record(self.support))
        if self.token_budget is not None:
            put("token_budget", record(self.token_budget))

    @property
    def config(self) -> Plan:
        """The plan (the name data-parallel code used)."""
        return self.plan

    @property
    def search(self) -> SearchInfo:
        """How the search went, as the JSON document's `search`."""
        return SearchInfo(points=self.points, rows=self.rows, branches=self.branches,
                          gap=self.gap, build_time_s=self.build_time_s,
                          solve_time_s=self.solve_time_s)


def front_entry(plan: Plan, time_to_train_s: float, cost_usd: float, steps: float) -> dict:
    return {"config": plan.to_json(), "time_to_train_s": float(time_to_train_s),
            "cost_usd": float(cost_usd), "steps": float(steps)}
