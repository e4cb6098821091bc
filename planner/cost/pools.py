"""One iteration of a plan whose stages or replicas run on different kinds of node, priced
from the same expressions as a plan on one system: each stage from its own device's per-layer
parts (`TransformerExpressions.stage_parts`, compiled per pool), the gradient sync and the
memory through the very forms the one-system model is written in (`exposed_form`,
`memory_form`), fed each stage's own aggregates.

A mixed plan is a tuple of replica groups (`Group`): each a pipeline of stages, every stage on
one pool with its own layer count, run by `replicas` copies on `micro_batches` micro-batches
each. Two shapes are searched (`planner.search.pools`): one group whose stages sit on several
pools (a pipeline across node kinds, as Metis, USENIX ATC 2024, places them) and one group per
pool with the same stages (data-parallel replicas on different pools with unequal shares of
the batch). The terms:

- a stage's time per micro-batch: n layers x its device's layer time (forward, backward,
  recomputation, tensor-parallel traffic) and, on the last stage, the output layer;
- the pipeline: (m + p - 1) slots of the slowest stage's time and sends (Narayanan et al.
  SC21, eq. 1-2, as the one-system model prices it), per group; the slowest group sets the
  pace;
- a send: b s h / t bytes per rank each way per slot (SC21 sec. 4.1), on the scale-up link
  while the group's stages on that pool fit one domain, over the pool's NICs beyond, and over
  the link between pools where the boundary crosses pools;
- the gradient sync of each stage position: NCCL's ring over every replica holding those
  layers (all groups' at that position), at the slowest link it crosses, exposed beyond the
  backward of that stage's last micro-batch (`exposed_form`); the optimizer step on the
  stage's ZeRO shard. Stages sync at once, so the slowest position's sync and step add,
  and the training loop's host sync once a step (`KernelCosts.step_sync_us`, the slowest
  host's);
- memory per stage and pool: weights, gradients and optimizer state of the stage's own
  layers (the embedding on the first, the output layer on the last) sharded over the
  replicas, and the activations of min(p - j, m) micro-batches in flight on stage j (1F1B).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from planner.cost.transformer import Hardware, iteration
from planner.expr.choices import RECOMPUTE, STAGE_OUTPUTS
from planner.expr.domain import within_domain
from planner.spec.cluster import Cluster, Pool
from planner.spec.hardware import Precision
from planner.spec.transformer import Transformer


@dataclass(frozen=True)
class Stage:
    pool: int  # index into the cluster's pools
    layers: int


@dataclass(frozen=True)
class Group:
    """Replicas of one pipeline: `replicas` copies, each running `micro_batches` micro-batches."""

    stages: tuple[Stage, ...]
    replicas: int
    micro_batches: int


@dataclass(frozen=True)
class Shape:
    """What every stage of a mixed plan shares."""

    tp: int
    micro_batch: int
    recompute: str = "full"
    sequence_parallel: bool = True
    zero: int = 1
    overlap: bool = True
    # the other switches every stage is priced with, (name, value) pairs in name order (only
    # those off their defaults; `planner.switches` names them)
    switches: tuple[tuple[str, object], ...] = ()
    cp: int = 1  # context parallel: each stage's sequence split over cp ranks beside its tp

    @property
    def width(self) -> int:
        """Devices of one stage of one replica: tp x cp."""
        return self.tp * self.cp


@dataclass(frozen=True)
class MixedPlan:
    shape: Shape
    groups: tuple[Group, ...]

    @property
    def pp(self) -> int:
        return len(self.groups[0].stages)

    @property
    def global_batch(self) -> int:
        return sum(g.replicas * g.micro_batches for g in self.groups) * self.shape.micro_batch

    def devices_on(self, pool: int) -> int:
        return sum(g.replicas * self.shape.width * sum(s.pool == pool for s in g.stages)
                   for g in self.groups)


@dataclass(frozen=True)
class Parts:
    """One pool's per-layer parts at one shape (`STAGE_OUTPUTS`, floats) and its links."""

    values: dict
    hw: Hardware

    def __getattr__(self, name):
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def parts(m: Transformer, pool: Pool, precision: Precision, shape: Shape) -> Parts:
    """The per-layer parts of `pool`'s device at `shape`."""
    return _parts(m, Hardware.of(pool.system, precision), shape)


@functools.lru_cache(maxsize=1024)
def _parts(m: Transformer, hw: Hardware, shape: Shape) -> Parts:
    cfg = {"t": shape.tp, "cp": shape.cp, "p": 2, "d": 1, "mb": shape.micro_batch, "acc": 1,
           "v": 1,
           "recompute": RECOMPUTE.index(shape.recompute), "sp": int(shape.sequence_parallel),
           "zero": shape.zero, "gpipe": 0, "overlap": shape.overlap, **dict(shape.switches)}
    values = iteration(m, hw, cfg, STAGE_OUTPUTS)
    return Parts({k: float(np.asarray(v).ravel()[0]) for k, v in values.items()}, hw)


@functools.lru_cache(maxsize=16)
def forms(overlap: bool, zero: int):
    """The one-system model's sync and memory forms as a program of their aggregates."""
    from planner.expr import vocab as S
    from planner.expr.choices import Choices
    from planner.expr.graph import compile_graphs
    from planner.expr.transformer import exposed_form, memory_form

    c = Choices(overlap=overlap, zero=zero)
    args = (S.M, S.d, S.r, S.beta_i, S.alpha_i, S.beta, S.alpha, S.H, S.v, S.m, S.sigma, S.ell,
            S.Psi, S.Psi_t, S.delta, S.gamma_g, S.kappa, S.A_act, S.W_q, S.p)
    return compile_graphs({"exposed": exposed_form(c), "memory": memory_form(c)}, args)


@dataclass(frozen=True)
class Links:
    """(bandwidth per device, latency) of one hop or ring, and the scale-up link's."""

    bw: float
    lat: float
    intra_bw: float
    intra_lat: float


def pool_links(p: Parts) -> Links:
    """A pool's own: its NICs shared by the node's devices (`across_bw`'s DEVICE share)."""
    hw = p.hw
    return Links(hw.nic_bw / hw.g, hw.inter_lat, hw.intra_bw, hw.intra_lat)


def between_links(cluster: Cluster, pools: list[int], part: list[Parts]) -> Links:
    """The slowest of every pool's own links and every link between them."""
    own = [pool_links(part[k]) for k in pools]
    bw, lat = min(x.bw for x in own), max(x.lat for x in own)
    for i in pools:
        for j in pools:
            if i < j:
                a, b = cluster.pools[i], cluster.pools[j]
                g = max(a.system.devices_per_node, b.system.devices_per_node)
                bw = min(bw, cluster.between_node_Bps(a, b) / g)
                lat = max(lat, cluster.between_latency_s(a, b))
    return Links(bw, lat, min(x.intra_bw for x in own), max(x.intra_lat for x in own))


def hop(p: Parts, links: Links, bytes_, inside: bool) -> float:
    """One send of `bytes_`: on the scale-up link `inside` the domain, else over `links`."""
    if inside:
        return p.hw.intra_lat + bytes_ / p.hw.intra_bw
    return links.lat + bytes_ / links.bw


@dataclass(frozen=True)
class Priced:
    iteration_time_s: float
    pipeline_s: float  # the slowest group's (m + p - 1) slots
    sync_s: float  # the slowest stage position's exposed sync and optimizer step, the host sync
    slot_s: tuple[float, ...]  # per group
    memory_bytes: tuple[tuple[float, ...], ...]  # per group, per stage
    fits: bool


def stage_time(p: Parts, layers: int, last: bool) -> float:
    return layers * p.layer_time + (p.logit_time if last else 0.0)


def sends(cluster: Cluster, part: list[Parts], group: Group, j: int, width: int) -> float:
    """Stage j's sends per slot: its boundary with the next stage (the last stage: with the
    one before), forward and backward, and without sequence parallelism the re-gather
    (`width`: a stage's tp x cp devices)."""
    st = group.stages
    if len(st) == 1:
        return 0.0
    a, b = (j, j + 1) if j + 1 < len(st) else (j - 1, j)
    k = st[j].pool
    p = part[k]
    on_pool = sum(s.pool == k for s in st)
    inside = within_domain(p.hw, width * on_pool)
    one = hop(p, pool_links(p), p.send_bytes, inside)
    if st[a].pool != st[b].pool:
        pair = sorted({st[a].pool, st[b].pool})
        one = max(one, hop(p, between_links(cluster, pair, part), p.send_bytes, False))
    return 2 * (one + p.regather)


def group_slots(cluster: Cluster, part: dict, group: Group, width: int) -> list[float]:
    """Each stage of `group`: its time per micro-batch slot, compute and sends."""
    last = len(group.stages) - 1
    return [stage_time(part[s.pool], s.layers, j == last)
            + sends(cluster, part, group, j, width) for j, s in enumerate(group.stages)]


def layer_aggregates(values, layers, acts=0.0) -> dict:
    """The forms' aggregates of `layers` layers alone (no embedding, output layer or
    multi-token prediction depth): `values` a pool's per-layer parts (`Parts` or a dict of
    arrays), `acts` the activations held."""
    get = values.__getitem__ if isinstance(values, dict) else values.__getattr__
    return {"Psi": layers * get("layer_params"), "H": layers * get("layer_backward"),
            "A_act": acts, "ell": layers,
            "W_q": layers * get("layer_params") * get("weight_copy_bytes")}


def stage_aggregates(p: Parts, layers, j, pp: int, in_flight) -> dict:
    """The forms' aggregates of stage j (of pp) holding `layers` layers (j, layers and
    in_flight scalars or arrays of stages)."""
    j = np.asarray(j)
    if pp == 1:
        outer = p.single_params
    else:
        outer = np.where(j == 0, p.embedding_params, 0.0) + np.where(j == pp - 1,
                                                                      p.head_params, 0.0)
    acts = (layers * p.layer_activations * in_flight + p.transient_activations
            + np.where(j == pp - 1, p.logit_activations, 0.0))
    # the quantized weights: the layers', and the multi-token prediction depths' where the
    # stage holds the output layer (`head_params` holds them with it)
    mtp = p.mtp_params if pp == 1 else np.where(j == pp - 1, p.mtp_params, 0.0)
    agg = layer_aggregates(p, layers, acts)
    return {**agg, "Psi": agg["Psi"] + outer, "W_q": agg["W_q"] + mtp * p.weight_copy_bytes}


def sync_and_memory(shape: Shape, agg: dict, p: Parts, links: Links, ranks: int,
                    per_node: int, micro_batches: int, pp: int):
    """(exposed sync + optimizer step, memory) of one stage through the one-system forms;
    `ranks` replicas of it, whose gradients are reduced and ZeRO-sharded over ranks x cp
    (Megatron-LM's data-parallel group with context parallelism, as the forms' d)."""
    zero, ranks = shape.zero, ranks * shape.cp
    size = agg["Psi"] * (p.grad_bytes if not zero else (p.grad_bytes + p.weight_bytes) / 2)
    out = forms(shape.overlap, zero)(
        size, ranks, per_node, links.intra_bw, links.intra_lat, links.bw, links.lat, agg["H"],
        1, micro_batches, p.hw.overlap_slowdown, agg["ell"], agg["Psi"], agg["Psi"],
        p.weight_bytes, p.grad_bytes, p.state_bytes, agg["A_act"], agg["W_q"], pp)
    step = agg["Psi"] * p.optimizer_per_param / (ranks if zero else 1)
    return out["exposed"] + step, out["memory"]


def replicas_per_node(p: Parts, shape: Shape, pp: int, ranks) -> int:
    """Ranks of one stage's gradient group on a node, as the one-system model counts them
    (min(max(floor(u / (t p)), 1), d cp)); `ranks` replicas (scalar or array)."""
    return np.minimum(max(p.hw.scale_up // (shape.tp * pp), 1), np.asarray(ranks) * shape.cp)


def price(m: Transformer, cluster: Cluster, precision: Precision, plan: MixedPlan,
          memory_cap=None) -> Priced:
    """The iteration time and per-stage memory of `plan` (`memory_cap`: bytes per pool
    index, for `fits`)."""
    shape = plan.shape
    used = sorted({s.pool for g in plan.groups for s in g.stages})
    part = {k: parts(m, cluster.pools[k], precision, shape) for k in used}
    pp = plan.pp
    slots, pipes = [], []
    for g in plan.groups:
        slot = max(group_slots(cluster, part, g, shape.width))
        slots.append(slot)
        pipes.append((g.micro_batches + pp - 1) * slot)
    # the sync and memory of every stage position, at once for the positions that share
    # their pools (so their links): the slowest group's sync sets each position's
    ranks = sum(g.replicas for g in plan.groups)
    tails, memory = np.zeros(pp), np.zeros((len(plan.groups), pp))
    here = [tuple(sorted({g.stages[j].pool for g in plan.groups})) for j in range(pp)]
    for pools_here in dict.fromkeys(here):
        js = np.array([j for j in range(pp) if here[j] == pools_here])
        links = (pool_links(part[pools_here[0]]) if len(pools_here) == 1
                 else between_links(cluster, list(pools_here), part))
        per_node = min(int(replicas_per_node(part[k], shape, pp, ranks)) for k in pools_here)
        for gi, g in enumerate(plan.groups):
            for k in dict.fromkeys(g.stages[j].pool for j in js):
                on = np.array([j for j in js if g.stages[j].pool == k])
                layers = np.array([g.stages[j].layers for j in on])
                agg = stage_aggregates(part[k], layers, on, pp,
                                       np.minimum(pp - on, g.micro_batches))
                sync, mem = sync_and_memory(shape, agg, part[k], links, ranks, per_node,
                                            g.micro_batches, pp)
                tails[on] = np.maximum(tails[on], sync)
                memory[gi, on] = mem
    fits = True
    if memory_cap is not None:
        fits = all(memory[gi][j] <= memory_cap[s.pool] for gi, g in enumerate(plan.groups)
                   for j, s in enumerate(g.stages))
    # and the training loop's host sync once a step: the slowest host's sets it
    pipeline = max(pipes)
    tail = float(tails.max()) + max(part[k].host_sync for k in used)
    return Priced(pipeline + tail, pipeline, tail, tuple(slots),
                  tuple(tuple(float(v) for v in x) for x in memory), fits)
