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


def test_priced_rows_read_as_the_rows_gathered_whole():
    """`PricedRows` keeps each pricing call's cells as indexes and gathers a column when read:
    every column, every single row and the structured array it gives are those of the rows
    gathered whole from the same cells (an empty block, HSDP's per-structure replicas and a
    pinned dp_shard included)."""
    from planner.search.priced_rows import CHOICE, COLUMNS, ROW, STRUCTURE, Block, PricedRows

    rng = np.random.default_rng(3)
    blocks, whole = [], []
    for n_st, n_ch, kept, per_structure in ((5, 4, 7, 0), (3, 2, 0, 0), (6, 3, 13, 1),
                                            (2, 5, 1, 1)):
        st = rng.integers(1, 1 << 20, (n_st, len(STRUCTURE)))
        chosen = rng.integers(0, 4, (n_ch, len(CHOICE)))
        si, ci = rng.integers(0, n_st, kept), rng.integers(0, n_ch, kept)
        rl = rng.integers(1, 9, n_st) if per_structure else None
        ds = rng.integers(2, 9, n_st) if per_structure else None
        cover = rng.integers(0, 2, kept).astype(bool)
        B = int(rng.integers(1, 1 << 30))
        blocks.append(Block(st, B, chosen, si, ci, rl, ds, 4, cover))
        rows = np.empty(kept, dtype=ROW)
        for j, k in enumerate(STRUCTURE):
            rows[k] = st[si, j]
        for j, k in enumerate(CHOICE):
            rows[k] = chosen[ci, j]
        rows["B"], rows["cover"] = B, cover
        rows["rl"] = 0 if rl is None else rl[si]
        rows["ds"] = 4 if ds is None else ds[si]
        whole.append(rows)
    table, expected = PricedRows(blocks), np.concatenate(whole)
    assert len(table) == len(expected) == 21
    assert np.array_equal(table.array(), expected)
    for k in COLUMNS:
        assert table[k].tolist() == expected[k].tolist()
    for i in range(len(expected)):
        assert table.row(i) == {k: int(expected[i][k]) for k in COLUMNS}
    mask = expected["cover"] == 1
    assert np.array_equal(table[mask], expected[mask])
    with pytest.raises(IndexError):
        table.row(len(expected))


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


@pytest.mark.parametrize("high", [1 << 6, 1 << 20])
def test_structures_order_is_lexsorts_packed_or_not(high):
    """`hybrid_space._order` sorts the structures by one packed key where the eight columns'
    ranges fit 63 bits and by `np.lexsort` where they do not (2^20 a column does not): either
    way `np.lexsort`'s order, ties kept in place."""
    from planner.search.hybrid_space import _order

    rng = np.random.default_rng(7)
    keys = [rng.integers(1, high, 5000) for _ in range(8)]
    keys[3][::7] = keys[3][0]  # ties in a middle key
    assert np.array_equal(_order(keys), np.lexsort(keys[::-1]))
    assert len(_order([np.empty(0, dtype=np.int64)] * 8)) == 0
