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
from planner.cost.collectives import Collective
from planner.cost.data_parallel import DataParallelModel


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
        d, mu = prec.bytes, micro_batch
        per_layer = data_layer_times(dp, a, mu)
        pick = lambda x: np.array([x[list(u.layers)].sum() for u in self.units])  # noqa: E731
        self.time = pick(per_layer)  # per unit, per micro-batch
        # A copy of the pipeline sits inside one node when its stages tile the node.
        self.inside_node = p <= g and g % p == 0
        lk = link(dp, not self.inside_node)
        out_bytes = np.array([a.outputs[u.layers[-1]] for u in self.units]) * d * mu
        self.send = 2 * (lk.alpha + out_bytes / lk.beta)  # activation forward, gradient back
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

    def lower_bound(self) -> float:
        """No cut is faster: the slowest stage is at least the mean and the largest unit, and
        the slowest gradient tail at least the mean one (calls >= bytes / bucket)."""
        slowest = self.balanced()
        total = float(self.grad_bytes.sum())
        tail = (total * (self.per_byte + self.latency / self.bucket)
                + float(self.optimizer.sum())) / self.p
        return (self.m + self.p - 1) * slowest + tail
