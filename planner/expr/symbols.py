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

# Names `derive` gives to parts of a formula (display only: each stands for an expression)
T_iter = sp.Symbol("T_iter", positive=True)  # iteration time T(n)
n_star = sp.Symbol("n_star", positive=True)  # the node count minimising T(n)

# Transformer parallel plan (Narayanan et al. SC21 notation); b is the micro-batch there
t = sp.Symbol("t", positive=True)  # tensor-parallel degree
p = sp.Symbol("p", positive=True)  # pipeline stages
d = sp.Symbol("d", positive=True)  # data-parallel replicas
m = sp.Symbol("m", positive=True)  # micro-batches per iteration (gradient accumulation)
v = sp.Symbol("v", positive=True)  # interleaved model chunks per pipeline stage
c_p = sp.Symbol("c_p", positive=True)  # context-parallel ranks (the sequence split c_p ways)
e_p = sp.Symbol("e_p", positive=True)  # expert-parallel ranks (the experts split e_p ways)
e_t = sp.Symbol("e_t", positive=True)  # expert tensor-parallel ranks (each expert split e_t ways)
# with partial recomputation: the first n_r layers of each pipeline chunk recomputed
n_r = sp.Symbol("n_r", positive=True)
# with hybrid sharding (HSDP): the data-parallel replicas of one ZeRO shard group
d_s = sp.Symbol("d_s", positive=True)

# Aggregates of one transformer iteration: `derive` and `limits` write its time and memory in
# them (planner/expr/transformer.py gives each its expression in the plan symbols)
tau = sp.Symbol("tau", positive=True)  # one micro-batch through the slowest stage
tau_p2p = sp.Symbol("tau_p2p", nonnegative=True)  # pipeline sends per micro-batch slot
r = sp.Symbol("r", positive=True)  # data-parallel replicas on one node
u = sp.Symbol("u", positive=True)  # devices of one scale-up domain (r = min(d, u / (t p)))
H = sp.Symbol("H", nonnegative=True)  # one micro-batch's backward on a stage
ell = sp.Symbol("ell", positive=True)  # layers on the slowest stage
T_opt = sp.Symbol("T_opt", nonnegative=True)  # optimizer step before ZeRO sharding
T_sync = sp.Symbol("T_sync", nonnegative=True)  # the host's time a step the device waits for
Psi = sp.Symbol("Psi", positive=True)  # parameters per device before ZeRO sharding
Psi_t = sp.Symbol("Psi_t", positive=True)  # of those, the ones that train (LoRA: adapters)
delta = sp.Symbol("delta", positive=True)  # bytes per weight value
gamma_g = sp.Symbol("gamma_g", positive=True)  # bytes per gradient value (accumulated and reduced)
kappa = sp.Symbol("kappa", positive=True)  # optimizer state bytes per parameter
A_act = sp.Symbol("A_act", nonnegative=True)  # activation bytes held on the first stage
W_q = sp.Symbol("W_q", nonnegative=True)  # bytes of the layers' quantized weight copies
z = sp.Symbol("z", positive=True)  # ranks of one ZeRO shard group (HSDP; d without it)
# a mixture of experts: the routed experts' share of M, reduced over their own group
M_e = sp.Symbol("M_e", nonnegative=True)
d_e = sp.Symbol("d_e", positive=True)  # expert-data-parallel ranks (t c_p d / (e_t e_p))
r_e = sp.Symbol("r_e", positive=True)  # of those, on one scale-up domain
sigma = sp.Symbol("sigma", nonnegative=True)  # compute slowdown beside a collective
# a cost along one plan variable x, on one smooth branch: a_inv / x + a_0 + a_1 x + a_2 x^2
a_inv = sp.Symbol("a_inv", real=True)
a_0 = sp.Symbol("a_0", real=True)
a_1 = sp.Symbol("a_1", real=True)
a_2 = sp.Symbol("a_2", real=True)
T_d1 = sp.Symbol("T_d1", positive=True)  # iteration time with one data-parallel replica
F_seq = sp.Symbol("F_seq", positive=True)  # model FLOPs per sequence, forward + backward
P_peak = sp.Symbol("P_peak", positive=True)  # peak FLOP/s of one device at the precision


@dataclass(frozen=True)
class Meaning:
    description: str
    unit: str


GLOSSARY: dict[sp.Symbol, Meaning] = {
    n: Meaning("number of nodes", "nodes"),
    g: Meaning("devices used per node", "devices/node"),
    b: Meaning("local batch per device", "samples"),
    B: Meaning("global batch", "samples"),
    t0: Meaning("compute time per iteration independent of the local batch (the optimizer "
                "step, weight traffic, and the kernels' issue floor where it binds)", "s"),
    c: Meaning("compute time per sample per device (forward + backward, roofline)", "s/sample"),
    alpha: Meaning("latency per step of the collective on its bottleneck link", "s"),
    beta: Meaning("achievable bandwidth per device of the collective's bottleneck link", "B/s"),
    M: Meaning("bytes of the gradient sync as one allreduce: |W| x bytes per gradient value "
               "(ZeRO: half of that and half of the weights' bytes, a reduce-scatter and an "
               "all-gather)", "B"),
    k: Meaning("collective calls per iteration (gradient buckets)", "calls"),
    s: Meaning("parameter servers", "servers"),
    alpha_i: Meaning("latency per step on the intra-node link", "s"),
    beta_i: Meaning("achievable bandwidth per device on the intra-node link", "B/s"),
    h0: Meaning("backward time after the first gradient bucket, part independent of b", "s"),
    h1: Meaning("backward time after the first gradient bucket, per sample", "s/sample"),
    T1: Meaning("iteration time of one device processing the whole global batch", "s"),
    W: Meaning("model parameters", "parameters"),
    q: Meaning("bytes per parameter: weights, fp32 master, gradient, optimizer state",
               "B/parameter"),
    A: Meaning("activation bytes per sample kept for the backward pass", "B/sample"),
    B_noise: Meaning("critical batch: steps to the target S(B) = S_min (1 + B_noise / B)",
                     "samples"),
    T_iter: Meaning("iteration time T(n) (formula iteration_time)", "s"),
    n_star: Meaning("node count minimising T(n) (formula optimal_nodes)", "nodes"),
    t: Meaning("tensor-parallel degree", "devices"),
    p: Meaning("pipeline-parallel stages", "stages"),
    d: Meaning("data-parallel replicas", "replicas"),
    m: Meaning("micro-batches per iteration (gradient accumulation steps)", "micro-batches"),
    v: Meaning("interleaved model chunks per pipeline stage", "chunks"),
    c_p: Meaning("context-parallel degree (ranks sharing one sequence)", "devices"),
    e_p: Meaning("expert-parallel degree (ranks sharing one MoE layer's experts)", "devices"),
    e_t: Meaning("expert tensor-parallel degree (ranks sharing each expert's matrices)",
                 "devices"),
    n_r: Meaning("layers of each pipeline chunk recomputed (partial recomputation: "
                 "Megatron-LM's block method)", "layers"),
    d_s: Meaning("data-parallel replicas of one ZeRO / FSDP shard group under hybrid sharding "
                 "(HSDP: --dp-shard)", "replicas"),
    tau: Meaning("time of one micro-batch through the slowest pipeline stage (forward, "
                 "backward, recompute, tensor-parallel collectives)", "s"),
    tau_p2p: Meaning("pipeline point-to-point sends per micro-batch slot", "s"),
    r: Meaning("data-parallel replicas on one node (their traffic shares its NICs)",
               "replicas"),
    u: Meaning("devices of one scale-up domain: those the intra-node link joins (a node; an "
               "NVL72 rack)", "devices"),
    H: Meaning("one micro-batch's backward on a stage: what hides the gradient sync", "s"),
    ell: Meaning("transformer layers on the slowest pipeline stage", "layers"),
    T_opt: Meaning("optimizer step on the device's parameters before ZeRO sharding", "s"),
    T_sync: Meaning("the host's time per step that the device waits for: the training loop's "
                    "one host sync a step (KernelCosts.step_sync_us)", "s"),
    Psi: Meaning("parameters per device before ZeRO sharding (stage / t)", "parameters"),
    Psi_t: Meaning("parameters per device that train, before ZeRO sharding (Psi; with frozen "
                   "base weights, the LoRA adapters)", "parameters"),
    delta: Meaning("bytes per weight value", "B/parameter"),
    gamma_g: Meaning("bytes per gradient value, as accumulated and reduced (fp32 in bf16 "
                   "training)", "B/parameter"),
    kappa: Meaning("optimizer state bytes per parameter (fp32 master + Adam moments)",
                   "B/parameter"),
    A_act: Meaning("activation bytes held on the first pipeline stage", "B"),
    W_q: Meaning("bytes of the quantized copies of the device's layer weights that an fp8 / "
                 "fp4 recipe holds across a step (Transformer Engine's weight cache: "
                 "rowwise and columnwise data with their scales)", "B"),
    z: Meaning("ranks of one ZeRO / FSDP shard group under hybrid sharding (HSDP): the d / z "
               "groups each hold a whole copy of the sharded state", "replicas"),
    M_e: Meaning("of M, the routed experts' bytes: reduced over the expert-data-parallel "
                  "group, not with the dense gradients", "B"),
    d_e: Meaning("expert-data-parallel ranks: those holding the same experts, t c_p d / "
                 "(e_t e_p) (Megatron-LM's expert data-parallel group)", "ranks"),
    r_e: Meaning("expert-data-parallel ranks on one scale-up domain (their traffic shares its "
                 "NICs): min(d_e, u / (e_t e_p p))", "ranks"),
    sigma: Meaning("how much slower compute runs while an overlapped collective shares the "
                   "device (its kernels hold SMs and HBM bandwidth; Lee et al. 2025)",
                   "fraction of the compute time"),
    a_inv: Meaning("coefficient of 1/x of the cost along the plan variable x (its smooth "
                   "branch at the optimum)", "s x"),
    a_0: Meaning("part of the cost along the plan variable x independent of x", "s"),
    a_1: Meaning("coefficient of x of the cost along the plan variable x", "s / x"),
    a_2: Meaning("coefficient of x^2 of the cost along the plan variable x", "s / x^2"),
    T_d1: Meaning("iteration time with one data-parallel replica (the same t, p and "
                  "micro-batch, the whole global batch)", "s"),
    F_seq: Meaning("model FLOPs per sequence, forward + backward, no recompute (PaLM, "
                   "appendix B)", "FLOP"),
    P_peak: Meaning("peak FLOP/s of one device at the training precision (datasheet)",
                    "FLOP/s"),
}
