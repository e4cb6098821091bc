"""A CNN cut into contiguous pipeline stages (GPipe: Huang et al., NeurIPS 2019; 1F1B:
Narayanan et al., PipeDream, SOSP 2019), priced for one (nodes n, devices per node g, stages p,
micro-batch mu) as arrays over units (`cnn_layout.units`).

N = n g devices hold d = N / p copies of the pipeline; each copy runs B / d samples per
iteration as m = B / (d mu) micro-batches. A stage's time per micro-batch is its units' forward
and backward roofline at mu samples plus the point-to-point sends of its input and output
activations (and their gradients) on the link between stages:

    iteration = (m + p - 1) x max_j T_j + max_j (allreduce_j + optimizer_j)

(m + p - 1 slots of the slowest stage: the (p - 1)-slot fill-and-drain bubble, Huang et al.
2019 sec. 2.2). After the flush each stage allreduces its weight gradients over its d replicas
and steps its optimizer, all stages at once (stages sharing a node's NICs is not modelled).
Memory of stage j under 1F1B: its weights, gradients and optimizer state plus the activations
of min(m, p - j) micro-batches in flight (Narayanan et al. 2021, sec. 2.2.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.cost.cnn_layout import Group, LayerArrays, allreduce_terms, data_layer_times, link, rates, units
from planner.expr.cnn import DataParallelModel
from planner.expr.collectives import Collective


@dataclass(frozen=True)
class StagePlan:
    iteration_time_s: float
    stage_time_s: float  # the slowest stage, per micro-batch
    bubble_fraction: float  # (p - 1) / (m + p - 1)
    compute_time_s: float  # (m + p - 1) x the slowest stage's compute
    p2p_time_s: float  # (m + p - 1) x the slowest stage's sends
    gradient_comm_s: float
    optimizer_time_s: float
    memory_bytes: float  # the fullest stage
    memory_breakdown: dict
    stages: list[dict]  # {layers, devices, time_s, memory_bytes}


def unit_times_and_sends(dp: DataParallelModel, micro_batch: int,
                         inside_node: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per unit, for one micro-batch: its forward + backward roofline, and the point-to-point
    send of its output activations forward and their gradients back (on the intra-node link
    when a copy of the pipeline sits inside one node)."""
    a, groups = LayerArrays.of(dp.cnn), units(dp.cnn)
    per_layer = data_layer_times(dp, a, micro_batch)
    time = np.array([per_layer[list(u.layers)].sum() for u in groups])
    lk = link(dp, not inside_node)
    out_bytes = np.array([a.outputs[u.layers[-1]] for u in groups]) \
        * dp.options.precision.bytes * micro_batch
    return time, 2 * (lk.alpha + out_bytes / lk.beta)


def stage_time_matrix(time: np.ndarray, send: np.ndarray) -> np.ndarray:
    """(U, U): the time per micro-batch of a stage holding units k..u (k <= u), its sends on
    both boundaries included; inf below the diagonal."""
    U = len(time)
    pre = np.concatenate([[0.0], np.cumsum(time)])
    k, u = np.meshgrid(np.arange(U), np.arange(U), indexing="ij")
    before = np.concatenate([[0.0], send[:-1]])  # the send across the cut before k
    after = np.concatenate([send[:-1], [0.0]])  # ... and after u (none after the last unit)
    return np.where(k <= u, pre[u + 1] - pre[k] + before[k] + after[u], np.inf)


def min_max_cut(cost: np.ndarray, p: int) -> tuple[float, list[int]]:
    """The contiguous cut of U units into p stages minimising the largest cost[k, u] over its
    stages, and that cut (stage index per unit), by dynamic programming over prefixes:
    best[j][u] is the best largest cost of units 0..u on j + 1 stages. Ties go to the earliest
    cut."""
    U = cost.shape[0]
    if p > U:
        return float("inf"), []
    best = cost[0].copy()  # one stage: units 0..u
    choice = []
    for _ in range(1, p):
        # the last stage holds k..u (k >= 1): max(best[k - 1], cost[k, u]), minimised over k
        cand = np.maximum(best[:-1, None], cost[1:, :])  # (k - 1, u)
        arg = np.argmin(cand, axis=0)
        best = cand[arg, np.arange(U)]
        choice.append(arg + 1)  # the first unit of the last stage
    stage_of = [0] * U
    hi = U - 1
    for j in range(p - 1, 0, -1):
        lo = int(choice[j - 1][hi])
        stage_of[lo:hi + 1] = [j] * (hi + 1 - lo)
        hi = lo - 1
    return float(best[U - 1]), stage_of


def slowest_stage_floor(dp: DataParallelModel, p: int, micro_batch: int,
                        inside_node: bool) -> float:
    """The smallest possible slowest stage (sends included, memory aside) of any cut into p
    stages at this micro-batch: the same for every point with this p, micro-batch and link."""
    return min_max_cut(stage_time_matrix(*unit_times_and_sends(dp, micro_batch, inside_node)),
                       p)[0]


class Stages:
    def __init__(self, dp: DataParallelModel, n: int, g: int, p: int, micro_batch: int,
                 micro_batches: int, collective: Collective):
        self.dp, self.n, self.g, self.p = dp, n, g, p
        self.mu, self.m = micro_batch, micro_batches
        cnn, prec = dp.cnn, dp.options.precision
        N = n * g
        if N % p:
            raise ValueError(f"{p} stages do not divide {N} devices")
        self.replicas = N // p
        self.units: list[Group] = units(cnn)
        a = LayerArrays.of(cnn)
        d, mu = prec.bytes, micro_batch
        pick = lambda x: np.array([x[list(u.layers)].sum() for u in self.units])  # noqa: E731
        # A copy of the pipeline sits inside one node when its stages tile the node.
        self.inside_node = p <= g and g % p == 0
        # per unit, per micro-batch: forward + backward, and the send after it
        self.time, self.send = unit_times_and_sends(dp, mu, self.inside_node)
        self.params = pick(a.params)
        state = dp.options.optimizer.state_bytes_per_param
        master = 4 if d < 4 else 0
        self.memory_static = {"weights": self.params * (d + master),
                              "gradients": self.params * d,
                              "optimizer": self.params * state}
        act = pick(a.stored) * d * mu
        act[0] += d * mu * math.prod(cnn.input_shape)
        self.memory_activation = act  # per micro-batch in flight
        self.grad_bytes = np.ceil(self.params * d)
        self.optimizer = self.params * (d + 2 * (4 + state)) / rates(dp)[1]
        per_node = g // p if self.inside_node else 1
        self.latency, self.per_byte = allreduce_terms(dp, collective, self.replicas,
                                                      max(1, min(per_node, self.replicas)))
        self.bucket = dp.options.bucket_bytes

    def in_flight(self, j: int) -> int:
        """Micro-batches whose activations stage j holds under 1F1B."""
        return min(self.m, self.p - j)

    def calls(self, bytes_: float) -> int:
        return max(1, math.ceil(bytes_ / self.bucket)) if bytes_ > 0 else 0

    def evaluate(self, stage_of_unit: list[int] | tuple[int, ...]) -> StagePlan:
        s = list(stage_of_unit)
        U, p = len(self.units), self.p
        if s[0] != 0 or s[-1] != p - 1 or any(y - x not in (0, 1) for x, y in zip(s, s[1:], strict=False)):
            raise ValueError(f"not a contiguous cut into {p} stages: {s}")
        stages = []
        worst = {"time": -1.0}
        grads = []
        for j in range(p):
            idx = [u for u in range(U) if s[u] == j]
            lo, hi = idx[0], idx[-1]
            sends = (self.send[hi] if j < p - 1 else 0.0) + (self.send[lo - 1] if j > 0 else 0.0)
            compute = float(self.time[idx].sum())
            gb = float(self.grad_bytes[idx].sum())
            grad = self.calls(gb) * self.latency + gb * self.per_byte
            opt = float(self.optimizer[idx].sum())
            mem = {k: float(v[idx].sum()) for k, v in self.memory_static.items()}
            mem["activations"] = self.in_flight(j) * float(self.memory_activation[idx].sum())
            if compute + sends > worst["time"]:
                worst = {"time": compute + sends, "compute": compute, "sends": sends}
            grads.append((grad, opt))
            stages.append({"layers": [self.dp.cnn.layers[i].name for u in idx
                                      for i in self.units[u].layers],
                           "devices": self.replicas, "time_s": compute + sends,
                           "memory_bytes": sum(mem.values()), "memory_breakdown": mem})
        slots = self.m + p - 1
        tail = max(gr + op for gr, op in grads)
        gmax, omax = max(grads, key=lambda x: x[0] + x[1])
        fullest = max(stages, key=lambda x: x["memory_bytes"])
        return StagePlan(slots * worst["time"] + tail, worst["time"], (p - 1) / slots,
                         slots * worst["compute"], slots * worst["sends"], gmax, omax,
                         fullest["memory_bytes"], fullest["memory_breakdown"], stages)

    def balanced(self) -> float:
        """The smallest possible slowest-stage compute over all contiguous cuts into p stages
        (sends and memory left out), by dynamic programming over prefixes: best[j][u] is the
        best slowest stage for the first u units on j + 1 stages."""
        pre = np.concatenate([[0.0], np.cumsum(self.time)])
        U, p = len(self.time), self.p
        best = pre[1:].copy()  # one stage: everything so far
        for _ in range(1, p):
            nxt = np.full(U, np.inf)
            for u in range(1, U):
                # last stage holds units k..u (k >= 1): max(best[k-1], pre[u+1] - pre[k])
                k = np.arange(1, u + 1)
                nxt[u] = np.min(np.maximum(best[k - 1], pre[u + 1] - pre[k]))
            best = nxt
        return float(best[-1])

    # --- exact bounds by dynamic programming over contiguous cuts ------------------------------

    def stage_times(self) -> np.ndarray:
        """(U, U): the time per micro-batch of a stage holding units k..u (`stage_time_matrix`)."""
        return stage_time_matrix(self.time, self.send)

    def stage_tails(self) -> np.ndarray:
        """(U, U): a stage's gradient allreduce (ceil(bytes / bucket) calls) and optimizer
        step, for units k..u; inf below the diagonal."""
        U = len(self.units)
        k, u = np.meshgrid(np.arange(U), np.arange(U), indexing="ij")
        gpre = np.concatenate([[0.0], np.cumsum(self.grad_bytes)])
        opre = np.concatenate([[0.0], np.cumsum(self.optimizer)])
        w = gpre[u + 1] - gpre[k]
        calls = np.where(w > 0, np.maximum(1, np.ceil(w / self.bucket)), 0)
        out = calls * self.latency + w * self.per_byte + opre[u + 1] - opre[k]
        return np.where(k <= u, out, np.inf)

    def min_max_cut(self, cost: np.ndarray) -> tuple[float, list[int]]:
        """`min_max_cut` into this point's p stages."""
        return min_max_cut(cost, self.p)

    def bound_and_cuts(self) -> tuple[float, list[list[int]]]:
        """A lower bound on the iteration time of every cut, memory aside ((m + p - 1) x the
        smallest possible slowest stage + the smallest possible slowest gradient tail: each
        term is minimised exactly, over all cuts), and the cuts that reach each term. When one
        of those cuts fits in memory and prices at the bound, it is optimal."""
        if self.p > len(self.units):
            return float("inf"), []
        t_best, t_cut = self.min_max_cut(self.stage_times())
        tail_best, tail_cut = self.min_max_cut(self.stage_tails())
        bound = (self.m + self.p - 1) * t_best + tail_best
        return bound, [t_cut] if t_cut == tail_cut else [t_cut, tail_cut]

    def lower_bound(self) -> float:
        """No cut is faster (see `bound_and_cuts`)."""
        return self.bound_and_cuts()[0]
