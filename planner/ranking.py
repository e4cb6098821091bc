"""The pick among measured configurations: where a job (model, devices, global batch) was
measured in several configurations, how much slower than the fastest of them is the one the
model predicts fastest. A planner is judged by the plan it picks, and the pick is only as good
as the model's ordering of the plans near the top, which a mean error does not show: a model
5 % off on every plan picks right, one that is right on average but 20 % slow on the best plan
picks wrong.

    python benchmarks/ranking.py       # vTrain (in sample and held out), Calculon, MLPerf

`regret` is the measured time of the predicted-fastest configuration over the measured
fastest, less one: 0 where the model picks the fastest. Where the model predicts several
configurations equally fast (a setting it prices as free), it cannot tell them apart and a
user takes any of them: the regret is their mean."""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

WITHIN = 0.01  # the bar: the pick measured within 1 % of the best
TIE = 1e-9  # predictions this close (relative) are one prediction


def regret(measured: Sequence[float], predicted: Sequence[float]) -> float:
    """measured[the predicted-fastest] / min(measured) - 1 over one job's configurations."""
    if len(measured) != len(predicted) or not measured:
        raise ValueError("one prediction per measured configuration, at least one")
    fastest = min(predicted)
    tied = [m for m, p in zip(measured, predicted, strict=True)
            if p <= fastest * (1 + TIE)]
    return statistics.fmean(tied) / min(measured) - 1


@dataclass(frozen=True)
class Summary:
    jobs: int
    median: float
    mean: float
    worst: float
    within: float  # the share of jobs whose pick is within `WITHIN` of the best

    def line(self) -> str:
        return (f"{self.jobs:>4} jobs  within 1 %: {self.within:>4.0%}  regret median "
                f"{self.median:>5.1%}  mean {self.mean:>5.1%}  worst {self.worst:>5.1%}")


def summarize(regrets: Iterable[float]) -> Summary:
    r = list(regrets)
    if not r:
        raise ValueError("no job to summarize")
    return Summary(len(r), statistics.median(r), statistics.fmean(r), max(r),
                   sum(x <= WITHIN for x in r) / len(r))


def by_job(rows: Iterable[tuple[Hashable, float, float]]) -> dict[Hashable, float]:
    """Each job's regret from (job, measured, predicted) rows, jobs with at least two
    configurations only (one configuration leaves nothing to pick)."""
    jobs: dict[Hashable, tuple[list, list]] = {}
    for job, measured, predicted in rows:
        m, p = jobs.setdefault(job, ([], []))
        m.append(measured)
        p.append(predicted)
    return {job: regret(m, p) for job, (m, p) in jobs.items() if len(m) > 1}
