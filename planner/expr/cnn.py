"""Data-parallel training of a CNN on a system: one iteration as SymPy expressions.

T_iter(n, g, b) = T_fwd(b) + T_bwd(b) + T_opt + exposed(T_comm(n, g), T_hide(b))

with b the local batch, n nodes, g devices per node. Gradients are allreduced in buckets
(PyTorch DDP's 25 MiB default, Li et al., "PyTorch Distributed", VLDB 2020); with overlap the
allreduce starts when the first bucket is full and hides under the rest of the backward pass,
so only max(0, T_comm - T_hide) is exposed.

With a parameter server run asynchronously (`Options.softsync`, the n-softsync protocol of
Zhang, Gupta, Lian and Liu, "Staleness-aware async-SGD for distributed deep learning", IJCAI
2016, sec. 2.2; Gupta, Zhang and Milthorpe, ICDM 2016) no learner waits for another: one
round of lambda = n g gradients takes the slowest of three resources instead of their sum
(`async_parts`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import sympy as sp

from planner.expr import collectives as coll
from planner.expr import memory, roofline
from planner.expr.collectives import Collective
from planner.expr.memory import Optimizer
from planner.expr.symbols import b, g, n
from planner.numeric import compile_expr
from planner.spec.cnn import CNN
from planner.spec.hardware import Precision, System

DEFAULT_BUCKET_BYTES = 25 * 2**20
_ROOFLINE = {name: sp.Function(name) for name in ("T_fwd", "T_bwd", "T_hide")}


@dataclass(frozen=True)
class Options:
    precision: Precision
    optimizer: Optimizer = Optimizer.momentum
    bucket_bytes: float = DEFAULT_BUCKET_BYTES
    servers: int = 1
    # n of the n-softsync protocol: the parameter server updates after every lambda / n
    # gradients, learners never wait (None: synchronous, the seed paper's parameter server)
    softsync: int | None = None


@dataclass(frozen=True)
class LinkParams:
    """alpha (s) and beta (B/s per device) of the bottleneck link of a collective."""

    alpha: float
    beta: float


class DataParallelModel:
    """All expressions for one (model, system, options). Built once, evaluated many times."""

    def __init__(self, cnn: CNN, system: System, options: Options):
        self.cnn, self.system, self.options = cnn, system, options
        dev, prec = system.device, options.precision
        fwd = roofline.forward_work(cnn, prec)
        bwd = roofline.backward_work(cnn, prec)
        self.grad_bytes = cnn.params * prec.bytes
        self.calls = max(1, math.ceil(self.grad_bytes / options.bucket_bytes))
        # The roofline sums stay opaque functions of b in the expressions (T_fwd(b), ...):
        # numerics evaluate them from per-layer arrays, `expand` writes them out in full.
        self.roofline = {
            "T_fwd": roofline.RooflineSum.of(fwd, dev, prec),
            "T_bwd": roofline.RooflineSum.of(bwd, dev, prec),
            "T_hide": roofline.RooflineSum.of(self._after_first_bucket(bwd), dev, prec),
        }
        self.t_fwd, self.t_bwd, self.t_hide = (_ROOFLINE[k](b) for k in self.roofline)
        self.t_compute = self.t_fwd + self.t_bwd
        self.compute_sum = self.roofline["T_fwd"] + self.roofline["T_bwd"]
        # Optimizer step: read gradient, read+write master weights and state (memory bound).
        touched = cnn.params * (prec.bytes + 2 * (4 + options.optimizer.state_bytes_per_param))
        self.t_opt = sp.Float(touched / (dev.efficiency.memory * dev.memory_bandwidth_Bps))
        self.memory = memory.breakdown(cnn, prec, options.optimizer, b)
        self.memory_total = sp.Add(*self.memory.values())

    def _after_first_bucket(self, bwd: list[roofline.Work]) -> list[roofline.Work]:
        """Backward work left once the first gradient bucket is full (in backward order)."""
        filled = 0.0
        for i, w in enumerate(bwd):
            filled += w.bytes_fixed / 2  # bytes_fixed counts weights read + gradients written
            if filled >= min(self.options.bucket_bytes, self.grad_bytes):
                return bwd[i + 1 :]
        return []

    # --- links ---------------------------------------------------------------------------------

    @property
    def intra(self) -> LinkParams:
        link = self.system.intra_node
        return LinkParams(link.latency_s, link.bandwidth_Bps)

    @property
    def flat_inter(self) -> LinkParams:
        """A flat collective across nodes runs one ring per NIC (NCCL), so its bandwidth per
        rank is the node's aggregate NIC bandwidth, capped by the intra-node link."""
        sysm = self.system
        beta = sysm.inter_node_bandwidth_Bps
        if sysm.devices_per_node > 1:
            beta = min(beta, sysm.intra_node.bandwidth_Bps)
        return LinkParams(sysm.inter_node.latency_s, beta)

    @property
    def hier_inter(self) -> LinkParams:
        """Inter-node stage of the hierarchical allreduce: g concurrent rings share the NICs."""
        sysm = self.system
        return LinkParams(sysm.inter_node.latency_s, sysm.inter_node_bandwidth_Bps)

    # --- communication -------------------------------------------------------------------------

    def flat(self, collective: Collective, p, m, link: LinkParams, calls=None) -> sp.Expr:
        a, bw, k = link.alpha, link.beta, self.calls if calls is None else calls
        if collective is Collective.ring:
            return coll.ring_allreduce(p, m, a, bw, k)
        if collective is Collective.halving_doubling:
            return coll.halving_doubling_allreduce(p, m, a, bw, k)
        if collective is Collective.tree:
            return coll.tree_allreduce(p, m, a, bw, k)
        if collective is Collective.parameter_server:
            return coll.parameter_server(p, m, a, bw, self.options.servers, k)
        raise ValueError(collective)

    @functools.cache  # noqa: B019 - one model object per CLI call; cache lives with it
    def t_comm(self, collective: Collective) -> sp.Expr:
        """Gradient exchange time per iteration, in n and g."""
        m = sp.Float(self.grad_bytes)
        if collective is Collective.hierarchical:
            intra, inter = self.intra, self.hier_inter
            # per device: g rings of m/g share the node's NICs -> beta_inter / g each
            hier = coll.hierarchical_allreduce(
                g, n, m, intra.alpha, intra.beta, inter.alpha, inter.beta / g, self.calls
            )
            # One device exchanges nothing: exactly 0, not the rounding residue of the formula.
            return sp.Piecewise((0, sp.Eq(n * g, 1)), (hier, True))
        inside = self.flat(collective, g, m, self.intra)
        across = self.flat(collective, n * g, m, self.flat_inter)
        return sp.Piecewise((0, sp.Eq(n * g, 1)), (inside, sp.Eq(n, 1)), (across, True))

    def asynchronous(self, collective: Collective) -> bool:
        return collective is Collective.parameter_server and self.options.softsync is not None

    @functools.cache  # noqa: B019
    def async_parts(self) -> dict[str, sp.Expr]:
        """One round of the n-softsync parameter server (every learner pushing one gradient
        and pulling the weights once), by the resource that serves it; the round takes the
        slowest (no learner waits for another, so nothing else adds up):
        - `learner`: a learner's compute, then its own push and pull of the m gradient bytes
          (over its 1 / g share of the node's NICs across nodes, its own link inside one);
        - `server_links`: the servers' links carry every learner's push and pull, 2 n g m / s
          bytes (the seed's parameter-server traffic, Li et al. OSDI 2014), now spread over
          the round instead of after a barrier;
        - `server_updates`: the server applies an update after every (n g) / softsync
          gradients, softsync updates per round, each the optimizer step of its 1 / s share
          of the weights (Zhang et al. 2016, sec. 2.2).
        One device exchanges nothing."""
        m, k, s = sp.Float(self.grad_bytes), self.calls, self.options.servers
        inside, across = self.intra, self.flat_inter
        own_inside = 2 * inside.alpha * k + 2 * m / inside.beta
        own_across = 2 * across.alpha * k + 2 * m * g / across.beta
        links_inside = 2 * g * m / (s * inside.beta)
        links_across = 2 * n * g * m / (s * across.beta)
        one, node = sp.Eq(n * g, 1), sp.Eq(n, 1)
        learner = self.t_compute + sp.Piecewise((0, one), (own_inside, node), (own_across, True))
        links = sp.Piecewise((0, one), (links_inside, node), (links_across, True))
        updates = self.options.softsync * self.t_opt / s
        return {"learner": learner, "server_links": links, "server_updates": updates,
                "round": sp.Piecewise((self.t_compute + self.t_opt, one),
                                      (sp.Max(learner, links, updates, evaluate=False), True))}

    def exposed(self, collective: Collective, overlap: bool) -> sp.Expr:
        if self.asynchronous(collective):  # what the round adds to the learner's compute
            return self.async_parts()["round"] - self.t_compute
        comm = self.t_comm(collective)
        # evaluate=False: SymPy would otherwise try to order the Piecewise against 0 (slow).
        return sp.Max(0, comm - self.t_hide, evaluate=False) if overlap else comm

    def iteration_time(self, collective: Collective, overlap: bool) -> sp.Expr:
        """One iteration; with the asynchronous parameter server one round of n g gradients
        (`async_parts`), whose optimizer steps run on the servers."""
        if self.asynchronous(collective):
            return self.async_parts()["round"]
        return self.t_compute + self.t_opt + self.exposed(collective, overlap)

    def single_device_time(self) -> sp.Expr:
        """One device, no communication: the baseline of speed-up."""
        return self.t_compute + self.t_opt

    # --- numeric -------------------------------------------------------------------------------

    @functools.cache  # noqa: B019
    def numeric(self, name: str, collective: Collective | None = None, overlap: bool = True):
        """A vectorised numpy function (n, g, b) -> value for one named expression."""
        exprs = {
            "compute": lambda: self.t_compute,
            "forward": lambda: self.t_fwd,
            "backward": lambda: self.t_bwd,
            "hide": lambda: self.t_hide,
            "optimizer": lambda: self.t_opt,
            "memory": lambda: self.memory_total,
            "comm": lambda: self.t_comm(collective),
            "exposed": lambda: self.exposed(collective, overlap),
            "iteration": lambda: self.iteration_time(collective, overlap),
            **{f"async.{k}": (lambda k=k: self.async_parts()[k])
               for k in ("learner", "server_links", "server_updates")},
            **{f"memory.{k}": (lambda v=v: v) for k, v in self.memory.items()},
        }
        return self.numeric_expr(exprs[name]())

    @functools.cache  # noqa: B019
    def numeric_expr(self, expr: sp.Expr):
        """Any expression of this model as a vectorised numpy function of (n, g, b)."""
        return compile_expr(expr, (n, g, b), self.roofline)

    def expand(self, expr: sp.Expr) -> sp.Expr:
        """`expr` with every roofline sum T_*(x) written out layer by layer."""
        for name, rs in self.roofline.items():
            expr = expr.replace(_ROOFLINE[name], rs.expr)
        return expr
