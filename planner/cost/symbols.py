"""The one vocabulary of symbols. Every expression in the package uses these objects."""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

# Decision variables
n = sp.Symbol("n", positive=True)  # nodes
g = sp.Symbol("g", positive=True)  # devices used per node
b = sp.Symbol("b", positive=True)  # local batch per device (samples)
B = sp.Symbol("B", positive=True)  # global batch (samples)

# Aggregates used by the closed forms of `limits` / `derive`
t0 = sp.Symbol("t_0", nonnegative=True)  # per-iteration compute time that does not scale with b
c = sp.Symbol("c", positive=True)  # compute time per sample per device
alpha = sp.Symbol("alpha_inter", nonnegative=True)  # latency of one collective step
beta = sp.Symbol("beta_inter", positive=True)  # bandwidth of the collective's bottleneck link
M = sp.Symbol("M", positive=True)  # gradient bytes communicated per iteration
k = sp.Symbol("k", positive=True)  # collective calls per iteration (gradient buckets)
s = sp.Symbol("s", positive=True)  # parameter servers
alpha_i = sp.Symbol("alpha_intra", nonnegative=True)
beta_i = sp.Symbol("beta_intra", positive=True)
h0 = sp.Symbol("h_0", nonnegative=True)  # backward time that can hide communication: h0 + h1 b
h1 = sp.Symbol("h_1", nonnegative=True)
T1 = sp.Symbol("T_1", positive=True)  # single-device iteration time at the global batch
W = sp.Symbol("W", positive=True)  # parameters
q = sp.Symbol("q", positive=True)  # bytes per parameter (weights, master, gradient, state)
A = sp.Symbol("A", positive=True)  # activation bytes per sample kept for backward
B_noise = sp.Symbol("B_noise", positive=True)  # critical batch (McCandlish et al. 2018)

# Transformer parallel plan (Narayanan et al. SC21 notation); b is the micro-batch there
t = sp.Symbol("t", positive=True)  # tensor-parallel degree
p = sp.Symbol("p", positive=True)  # pipeline stages
d = sp.Symbol("d", positive=True)  # data-parallel replicas
m = sp.Symbol("m", positive=True)  # micro-batches per iteration (gradient accumulation)
v = sp.Symbol("v", positive=True)  # interleaved model chunks per pipeline stage


@dataclass(frozen=True)
class Meaning:
    description: str
    unit: str


GLOSSARY: dict[sp.Symbol, Meaning] = {
    n: Meaning("number of nodes", "1"),
    g: Meaning("devices used per node", "1"),
    b: Meaning("local batch per device", "samples"),
    B: Meaning("global batch", "samples"),
    t0: Meaning("compute time per iteration independent of the local batch (weight traffic)", "s"),
    c: Meaning("compute time per sample per device (forward + backward, roofline)", "s"),
    alpha: Meaning("latency per step of the collective on its bottleneck link", "s"),
    beta: Meaning("achievable bandwidth per device of the collective's bottleneck link", "B/s"),
    M: Meaning("gradient bytes allreduced per iteration (|W| x bytes per value)", "B"),
    k: Meaning("collective calls per iteration (gradient buckets)", "1"),
    s: Meaning("parameter servers", "1"),
    alpha_i: Meaning("latency per step on the intra-node link", "s"),
    beta_i: Meaning("achievable bandwidth per device on the intra-node link", "B/s"),
    h0: Meaning("backward time after the first gradient bucket, part independent of b", "s"),
    h1: Meaning("backward time after the first gradient bucket, per sample", "s"),
    T1: Meaning("iteration time of one device processing the whole global batch", "s"),
    W: Meaning("model parameters", "1"),
    q: Meaning("bytes per parameter: weights, fp32 master, gradient, optimizer state", "B"),
    A: Meaning("activation bytes per sample kept for the backward pass", "B"),
    B_noise: Meaning("critical batch: steps to the target S(B) = S_min (1 + B_noise / B)",
                     "samples"),
    t: Meaning("tensor-parallel degree", "devices"),
    p: Meaning("pipeline-parallel stages", "stages"),
    d: Meaning("data-parallel replicas", "replicas"),
    m: Meaning("micro-batches per iteration (gradient accumulation steps)", "micro-batches"),
    v: Meaning("interleaved model chunks per pipeline stage", "chunks"),
}
