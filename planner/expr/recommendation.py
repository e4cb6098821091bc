"""A recommendation model's step as SymPy expressions: each embedding table's cost per device
under each way of sharding it, and the dense part (data parallel everywhere).

Symbols: B the global batch, D devices; per table (or column shard) R rows, E values per row,
P lookups per sample, f the share of lookups that reach device memory, w bytes per value;
per system M the achievable memory bandwidth, beta a device's share of the link the
all-to-all crosses, alpha its latency, beta_r the ring's bandwidth per device.

The physics (Naumov et al. 2019, DLRM, sec. 3-4; Mudigere et al., ISCA 2022, sec. 4, the
sharding schemes and the fused backward-optimizer of FBGEMM's table-batched embeddings):

- an embedding lookup is memory bound: P f E w bytes read per sample and E w written (the
  pooled vector); the backward reads the pooled gradient (E w) and, fused with row-wise
  Adagrad, reads and writes each looked-up row (2 E w) and its one fp32 accumulator (8 bytes
  read and written) per lookup;
- table-wise (one device holds the table): it looks up the whole global batch and sends the
  pooled vectors of the other devices' samples, B E w (D - 1) / D bytes, in the forward
  all-to-all, and receives their gradients in the backward one;
- row-wise (every device holds R / D rows): each looks up B P f / D rows and reduce-scatters
  partial pooled vectors for the whole batch, B E w (D - 1) / D bytes per device each way;
- column-wise into c shards: c tables of E / c values, each placed table-wise;
- data parallel (a copy on every device): each looks up its own B / D samples, no
  all-to-all; the table's dense gradient is ring-allreduced (2 (D - 1) / D R E w bytes,
  Patarasuk & Yuan 2009) and every row updated (R (3 E w + 8) bytes);
- every device receives its B / D samples' pooled vectors of every table not held data
  parallel, (D - 1) / D of them from the others; an all-to-all takes (D - 1) alpha plus the
  larger of a device's bytes out and in over beta (pairwise exchange, Thakur et al. 2005,
  sec. 4.5), once forward and once backward;
- memory: R E w bytes and R x 4 for the row-wise Adagrad accumulators of what a device holds.
"""

from __future__ import annotations

import functools

import sympy as sp

from planner.expr.collectives import ring_allreduce

B, D = sp.symbols("B D", positive=True)
R, E, P, f, w = sp.symbols("R E P f w", positive=True)
M, beta, alpha, beta_r = sp.symbols("M beta alpha beta_r", positive=True)
ARGS = (B, D, R, E, P, f, w, M, beta, alpha, beta_r)
ACCUMULATOR_BYTES = 4  # row-wise Adagrad: one fp32 per row (FBGEMM EXACT_ROWWISE_ADAGRAD)
MODES = ("table", "row", "data")  # column-wise shards are tables of E / c values


def _lookups(samples, rows_share=1) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) seconds of looking up `samples` samples, a `rows_share` of whose
    lookups land on this device's rows."""
    looked = samples * P * f * rows_share
    fwd = (looked * E * w + samples * E * w) / M
    bwd = (samples * E * w + looked * (2 * E * w + 2 * ACCUMULATOR_BYTES)) / M
    return fwd, bwd


@functools.cache
def terms() -> dict[str, sp.Expr]:
    """Per mode: `<mode>/time` (lookups, forward and backward, on one device holding it),
    `<mode>/send` (bytes out of that device per all-to-all), `<mode>/memory` (bytes on it);
    and `recv` (bytes into a device per all-to-all for one table it does not hold whole)."""
    out = {}
    fwd, bwd = _lookups(B)
    out["table/time"], out["table/send"] = fwd + bwd, B * E * w * (D - 1) / D
    out["table/memory"] = R * (E * w + ACCUMULATOR_BYTES)
    fwd, bwd = _lookups(B, 1 / D)
    out["row/time"], out["row/send"] = fwd + bwd, B * E * w * (D - 1) / D
    out["row/memory"] = R / D * (E * w + ACCUMULATOR_BYTES)
    fwd, bwd = _lookups(B / D)
    update = R * (3 * E * w + 2 * ACCUMULATOR_BYTES) / M
    out["data/time"] = fwd + bwd + update + ring_allreduce(D, R * E * w, alpha, beta_r)
    out["data/send"] = sp.Integer(0)
    out["data/memory"] = R * (E * w + ACCUMULATOR_BYTES)
    out["recv"] = B / D * E * w * (D - 1) / D
    return out
