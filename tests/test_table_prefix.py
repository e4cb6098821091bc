"""The priced-table solver orders only the best PREFIX rows first: gates and runners-up that
reach past them must give the answer of the whole table (against a brute-force lexsort)."""

import numpy as np
import pytest

from planner.search import table as core


def _table(n, seed, gates=(), group=None):
    rng = np.random.default_rng(seed)
    obj = rng.integers(0, n // 3, n).astype(float)  # many ties in the objective
    other = rng.integers(0, 5, n).astype(float)
    devices = rng.integers(1, 64, n)
    return core.Table(obj, other, devices, devices, list(gates), group)


def _brute(t: core.Table) -> np.ndarray:
    order = np.lexsort((np.arange(len(t)), t.devices, core.snapped(t.other),
                        core.snapped(t.objective)))
    return order[t.allowed()[order]]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_gate_past_the_prefix_gives_the_whole_tables_best(seed):
    n = 3 * core.PREFIX
    base = _table(n, seed)
    rank = np.empty(n, dtype=np.int64)
    rank[_brute(base)] = np.arange(n)
    gate = core.Gate("late", "only the worse half", rank > n // 2)
    t = _table(n, seed, [gate])
    found = core.solve(t)
    assert found.status == "optimal" and found.best == _brute(t)[0]


def test_runners_up_past_the_prefix():
    n = 3 * core.PREFIX
    t = _table(n, 2)
    order = _brute(t)
    group = np.zeros(n, dtype=np.int64)  # the best 2 x PREFIX rows are one plan
    group[order[2 * core.PREFIX:]] = np.arange(1, n - 2 * core.PREFIX + 1)
    t.group = group
    found = core.solve(t, top=3)
    assert found.best == order[0]
    assert list(found.alternatives) == list(order[2 * core.PREFIX:2 * core.PREFIX + 3])


def test_prefix_order_is_the_full_orders_prefix():
    t = _table(5 * core.PREFIX, 3)
    part, full = t.order(limit=core.PREFIX), t.order()
    assert len(part) >= core.PREFIX
    assert np.array_equal(part, full[:len(part)])


def test_stacked_rows_are_numpys_join_of_the_structured_rows():
    """`stack_rows` joins the search's `ROW` arrays as int64 words: the same rows, fields and
    order as numpy's (field by field) concatenation, an empty part included."""
    from planner.search.hybrid import COLUMNS, ROW, stack_rows

    rng = np.random.default_rng(3)
    parts = [rng.integers(-5, 1 << 40, (n, len(COLUMNS))).view(ROW).reshape(-1)
             for n in (7, 0, 13, 1)]
    joined = stack_rows(parts)
    assert joined.dtype == ROW and np.array_equal(joined, np.concatenate(parts))
    assert joined["cover"].tolist() == np.concatenate([p["cover"] for p in parts]).tolist()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_knee_reads_each_device_counts_best_time_as_a_loop_does(seed):
    """The knee's best time per device count (hashed counts, then located) against a plain
    loop over the allowed rows."""
    rng = np.random.default_rng(seed)
    n = 500
    devices = rng.choice([8, 16, 64, 256, 1024], n)
    time_s = rng.uniform(1.0, 10.0, n) / np.sqrt(devices)
    allowed = rng.random(n) < 0.8
    knee = core.knee(time_s, devices, allowed, chosen=int(np.argmin(time_s)))
    best = {}
    for d, t, ok in zip(devices.tolist(), time_s.tolist(), allowed.tolist(), strict=True):
        if ok:
            best[d] = min(best.get(d, np.inf), t)
    t_best = min(best.values())
    d_best = min(d for d, t in best.items() if t == t_best)
    assert knee["best_time_s"] == t_best and knee["best_devices"] == d_best
    assert knee["devices"] == min(d for d, t in best.items() if t <= t_best * 1.10)
