"""A recommendation model's step on D devices for one placement of its tables, from the
expressions of `planner.expr.recommendation`: the busiest device's embedding work (its lookups
and the two all-to-alls) and the dense part every device runs on its B / D samples.

A placement gives each table a `Shard` list: one shard on one device (table-wise), c shards of
E / c values on devices of their own choosing (column-wise), or the whole table spread over
every device (row-wise) or copied to every device (data parallel).

The dense part (bottom MLP, interaction, top MLP), data parallel: 3 x its forward FLOPs per
sample (forward, and the backward's two matmuls per layer) at the device's achievable matmul
rate, the ring allreduce of its fp32 gradients, and Adagrad's step on it; it is not
overlapped with the embedding work (what a step without TorchRec's pipelining runs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from planner.cost.transformer import Hardware
from planner.expr import recommendation as ex
from planner.expr.collectives import ring_allreduce
from planner.expr.layer import DEVICE, RING
from planner.expr.layer import links as links_of
from planner.spec.hardware import Precision, System
from planner.spec.recommendation import Recommendation

# column-wise shard counts offered, each dividing the table's dim into shards of 8 values or
# more (HugeCTR's MLPerf planner splits hot tables up to the GPU count; TorchRec's column-wise
# sharding takes any divisor)
COLUMN_SPLITS = (2, 4, 8, 16)
MIN_SHARD_DIM = 8
DENSE_BYTES = 4  # fp32 master weights and gradients of the dense layers
ADAGRAD_STATE = 4  # Adagrad: one fp32 accumulator per dense parameter


@dataclass(frozen=True)
class Links:
    alltoall_Bps: float  # a device's share of the link the all-to-all crosses
    alltoall_latency_s: float
    ring_Bps: float  # per device, a ring allreduce across the devices


def links(system: System, hw: Hardware, devices: int) -> Links:
    """Inside one scale-up domain: its links; beyond: the all-to-all at a device's share of its
    node's NICs (each device exchanges with every other at once), the ring at the node's NICs
    capped by the scale-up link (one NCCL ring per NIC)."""
    inside, device = links_of(hw, DEVICE)
    if devices <= hw.scale_up:
        return Links(inside[0], inside[1], inside[0])
    _, ring = links_of(hw, RING)
    return Links(device[0], device[1], ring[0])


@dataclass(frozen=True)
class Option:
    """One way to hold one table: `mode` table / column / row / data; `shards` pieces of
    `dim` values each (column: c of them; else 1)."""

    table: int
    mode: str
    shards: int
    dim: int
    time_s: float  # per device holding a shard (row / data: on every device)
    send_bytes: float  # per all-to-all, out of that device
    memory_bytes: float
    recv_bytes: float  # per all-to-all, into every device (0 for data parallel)


@dataclass(frozen=True)
class Costs:
    """Every option of every table, the dense part and the links, for one (model, system,
    precision, devices, global batch)."""

    options: tuple[Option, ...]
    dense_time_s: float
    dense_memory_bytes: float
    links: Links
    devices: int
    capacity_bytes: float

    def of(self, table: int) -> list[Option]:
        return [o for o in self.options if o.table == table]


@functools.lru_cache(maxsize=64)
def _program():
    from planner.numeric import Program

    return Program(ex.terms(), ex.ARGS)


def costs(m: Recommendation, system: System, precision: Precision, devices: int,
          batch: int, capacity_bytes: float) -> Costs:
    hw = Hardware.of(system, precision)
    ln = links(system, hw, devices)
    rows, dims, pools, freq, table, mode, shards = [], [], [], [], [], [], []
    for i, t in enumerate(m.tables):
        offers = [("table", 1)] + [("column", c) for c in COLUMN_SPLITS
                                   if t.dim % c == 0 and t.dim // c >= MIN_SHARD_DIM
                                   and c <= devices]
        offers += [("row", 1), ("data", 1)] if devices > 1 else []
        for kind, c in offers:
            rows.append(t.rows)
            dims.append(t.dim // c)
            pools.append(t.pooling)
            freq.append(t.frequency)
            table.append(i)
            mode.append(kind)
            shards.append(c)
    out = _program()(batch, devices, np.array(rows, float), np.array(dims, float),
                     np.array(pools, float), np.array(freq, float), m.value_bytes,
                     hw.mem_bw, ln.alltoall_Bps, ln.alltoall_latency_s, ln.ring_Bps)
    options = []
    for j, kind in enumerate(mode):
        key = "table" if kind == "column" else kind
        value = {k: float(np.broadcast_to(out[f"{key}/{k}"], (len(mode),))[j])
                 for k in ("time", "send", "memory")}
        recv = 0.0 if kind == "data" else float(np.broadcast_to(out["recv"], (len(mode),))[j])
        # `recv`: the table's pooled vectors into a device, all c column shards together
        options.append(Option(table[j], kind, shards[j], dims[j], value["time"],
                              value["send"], value["memory"], recv * shards[j]))
    return Costs(tuple(options), *_dense(m, hw, ln, devices, batch), ln, devices,
                 capacity_bytes)


def _dense(m: Recommendation, hw: Hardware, ln: Links, devices: int, batch: int):
    """(seconds, bytes per device) of the dense part on B / D samples."""
    local = batch / devices
    params = m.dense_params()
    compute = 3 * m.dense_flops_per_sample() * local / hw.matmul_flops
    sync = float(ring_allreduce(devices, params * DENSE_BYTES, ln.alltoall_latency_s,
                                ln.ring_Bps))
    step = params * (2 * DENSE_BYTES + 2 * ADAGRAD_STATE + DENSE_BYTES) / hw.mem_bw
    # activations kept for the backward: every dense layer's output and the interaction's
    # input, fp32, for the local samples
    widths = sum(o for _, o in m.dense_layers()) + m.interaction_width + m.dense_features
    memory = params * (2 * DENSE_BYTES + ADAGRAD_STATE) + local * widths * DENSE_BYTES
    return compute + sync + step, memory


@dataclass(frozen=True)
class Placed:
    """One table's placement: its option and the device of each shard (row / data: all)."""

    option: Option
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Priced:
    iteration_time_s: float
    embedding_time_s: float  # the busiest device's lookups and all-to-alls
    dense_time_s: float
    per_device_time_s: tuple[float, ...]  # embedding work per device
    per_device_memory_bytes: tuple[float, ...]
    fits: bool


def price(c: Costs, placed: list[Placed]) -> Priced:
    """The step time and per-device memory of a placement (one `Placed` per table)."""
    n = c.devices
    busy, memory, send = np.zeros(n), np.full(n, c.dense_memory_bytes), np.zeros(n)
    recv = 0.0
    for p in placed:
        o = p.option
        if o.mode in ("row", "data"):
            busy += o.time_s
            memory += o.memory_bytes
            send += o.send_bytes
        else:
            for d in p.devices:
                busy[d] += o.time_s
                memory[d] += o.memory_bytes
                send[d] += o.send_bytes
        recv += o.recv_bytes  # the table's pooled vectors into every device (all shards)
    a2a = np.array([alltoall(s, recv, n, c.links) for s in send])
    per = busy + 2 * a2a
    embedding = float(per.max())
    return Priced(embedding + c.dense_time_s, embedding, c.dense_time_s, tuple(per.tolist()),
                  tuple(memory.tolist()), bool((memory <= c.capacity_bytes).all()))


def alltoall(send: float, recv: float, devices: int, ln: Links) -> float:
    """One all-to-all on a device sending `send` bytes and receiving `recv` (pairwise
    exchange, Thakur et al. 2005, sec. 4.5): (D - 1) latencies and the larger direction."""
    if devices == 1:
        return 0.0
    return (devices - 1) * ln.alltoall_latency_s + max(send, recv) / ln.alltoall_Bps
