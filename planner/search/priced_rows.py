"""The transformer search's table of priced rows, kept as the pricing found them: per structure
block, the indexes of the (structure, choice) cells that fit, and each column gathered only
when something reads it. The search prices 10^5-10^6 rows; the driver reads five columns of
them (the split and the batch) and one whole row per plan it reports, so a table of every
column, gathered and then joined, was most of the search's memory traffic and a quarter of
its time (`benchmarks/search_speed.py`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from planner import switches

# a priced row of the search: the structure (`hybrid_space.structures`), the global batch, the
# per-row choices of `hybrid_space.choices` (recompute as RECOMPUTE's index or PARTIAL,
# sequence parallelism, ZeRO, GPipe, the searched switches) and, for PARTIAL rows, the layers
# of each chunk recomputed (0 otherwise); `ds`: the replicas of a ZeRO shard group with hybrid
# sharding (HSDP; 0: all of them); `cover`: a ZeRO 2 row without HSDP whose memory at ZeRO 1
# fits (its ZeRO 1 twin is a covered plan at the same time: `HybridSolver.covered`)
STRUCTURE = ("t", "p", "v", "d", "mb", "cp", "ep", "etp")
CHOICE = ("rec", "sp", "zero", "gpipe", *switches.PER_ROW)
COLUMNS = (*STRUCTURE, "B", *CHOICE, "rl", "ds", "cover")
ROW = np.dtype([(k, np.int64) for k in COLUMNS])
_AT = {**{k: ("st", j) for j, k in enumerate(STRUCTURE)},
       **{k: ("chosen", j) for j, k in enumerate(CHOICE)}}


@dataclasses.dataclass(frozen=True, eq=False)
class Block:
    """The rows one pricing call keeps: the cells (st[si], chosen[ci]) at global batch B;
    `rl` (PARTIAL rows' recomputed layers) and `ds` (HSDP's replicas per shard group) one per
    structure or None (0: none, or `ds_all` for every row), `cover` one per kept row."""

    st: np.ndarray
    B: int
    chosen: np.ndarray
    si: np.ndarray
    ci: np.ndarray
    rl: np.ndarray | None
    ds: np.ndarray | None
    ds_all: int
    cover: np.ndarray

    def __len__(self) -> int:
        return len(self.si)

    def column(self, name: str) -> np.ndarray:
        if name in _AT:
            table, j = _AT[name]
            return (self.st[self.si, j] if table == "st" else self.chosen[self.ci, j])
        if name == "B":
            return np.full(len(self.si), self.B, dtype=np.int64)
        if name == "rl":
            return (np.zeros(len(self.si), dtype=np.int64) if self.rl is None
                    else self.rl[self.si].astype(np.int64))
        if name == "ds":
            return (np.full(len(self.si), self.ds_all, dtype=np.int64) if self.ds is None
                    else self.ds[self.si].astype(np.int64))
        if name == "cover":
            return self.cover.astype(np.int64)
        raise KeyError(name)

    def record(self, j: int) -> dict[str, int]:
        """Row j, every column."""
        s, c = self.st[self.si[j]], self.chosen[self.ci[j]]
        return {**dict(zip(STRUCTURE, map(int, s), strict=True)), "B": int(self.B),
                **dict(zip(CHOICE, map(int, c), strict=True)),
                "rl": 0 if self.rl is None else int(self.rl[self.si[j]]),
                "ds": self.ds_all if self.ds is None else int(self.ds[self.si[j]]),
                "cover": int(self.cover[j])}


class PricedRows:
    """The blocks end to end: `rows[name]` a column (gathered once), `rows.row(i)` one row as a
    dict, `rows[mask or indexes]` those rows as a structured array of `ROW` (`array`)."""

    def __init__(self, blocks: list[Block]):
        self.blocks = [b for b in blocks if len(b)]
        self.offsets = np.cumsum([0, *map(len, self.blocks)])
        self._columns: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.column(key)
        return self.array()[key]

    def column(self, name: str) -> np.ndarray:
        if name not in self._columns:
            if name not in COLUMNS:
                raise KeyError(name)
            self._columns[name] = (np.concatenate([b.column(name) for b in self.blocks])
                                   if self.blocks else np.empty(0, dtype=np.int64))
        return self._columns[name]

    def row(self, i: int) -> dict[str, int]:
        k = int(np.searchsorted(self.offsets, i, side="right")) - 1
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.blocks[k].record(i - int(self.offsets[k]))

    def array(self) -> np.ndarray:
        """Every row and column as a structured array of `ROW` (tests and inspection; the
        search reads columns)."""
        out = np.empty(len(self), dtype=ROW)
        for name in COLUMNS:
            out[name] = self.column(name)
        return out
