"""The pick among measured configurations (`planner.ranking`): exact regrets on hand-made
jobs, and the vTrain jobs' regret read back from the calibration rows."""

import math

import pytest

from planner import fit_transformer as ft
from planner.ranking import by_job, regret, summarize


def test_regret_is_the_picks_measured_time_over_the_best():
    # the model ranks b first (predicted 1.0), b measured 12 against a's 10: 20 % regret
    assert regret([10.0, 12.0, 15.0], [1.1, 1.0, 2.0]) == pytest.approx(0.2)
    assert regret([10.0, 12.0], [1.0, 2.0]) == 0.0


def test_tied_predictions_take_the_mean_of_their_measurements():
    # a setting priced as free: the model cannot tell a from b, a user takes either
    assert regret([10.0, 12.0, 9.0], [1.0, 1.0, 3.0]) == pytest.approx(11.0 / 9.0 - 1)


def test_jobs_with_one_configuration_leave_nothing_to_pick():
    rows = [("a", 10.0, 1.0), ("a", 11.0, 0.5), ("b", 3.0, 3.0)]
    assert by_job(rows) == {"a": pytest.approx(0.1)}


def test_summary_counts_the_picks_within_one_percent():
    s = summarize([0.0, 0.005, 0.02, 0.3])
    assert (s.jobs, s.within, s.worst) == (4, 0.5, 0.3)
    assert s.median == pytest.approx(0.0125) and s.mean == pytest.approx(0.08125)


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        regret([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        summarize([])


def test_vtrain_regret_agrees_with_sorting_each_job():
    """The regret of the shipped model's pick on vTrain's 12-layer h=1024 jobs, against an
    independent count: sort each job's rows by prediction and by measurement."""
    rows = [r for r in ft._vtrain_rows() if r["hidden"] == 1024 and r["layers"] == 12]
    err = ft.vtrain_errors(ft.Constants.shipped().system(), rows)
    priced = [(r, r["iteration_time_ms"] * math.exp(e)) for r, e in zip(rows, err, strict=True)]
    got = by_job(((r["gpus"], r["global_batch"]), r["iteration_time_ms"], p) for r, p in priced)
    for job, value in got.items():
        mine = sorted((p, r["iteration_time_ms"]) for r, p in priced
                      if (r["gpus"], r["global_batch"]) == job)
        ties = [m for p, m in mine if p <= mine[0][0] * (1 + 1e-9)]  # tied picks: their mean
        assert value == pytest.approx(sum(ties) / len(ties) / min(m for _, m in mine) - 1)
    assert len(got) == 18 and max(got.values()) > 0  # the model does not pick every best
