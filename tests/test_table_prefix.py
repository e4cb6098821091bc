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
