"""Hybrid-parallel transformer training: time and memory of one iteration.

Every function takes the configuration as numpy arrays (one element per candidate), so the
solver prices hundreds of thousands of splits in a few array passes and `evaluate` is the same
code on arrays of length one. The physics, by term:

- compute: each matmul of a layer by roofline (FLOPs at the achievable matmul rate, or its
  operands at the achievable memory bandwidth, whichever is slower), backward = 2x forward;
  elementwise work (norms, softmax, GeLU, dropout, residuals) as the HBM traffic of Megatron's
  fused kernels (`elementwise_bytes_per_token`); flash attention keeps the scores on chip.
- tensor parallel: Megatron's two allreduces of b s h per layer forward and two backward (a
  third pair when the forward is recomputed), ring cost on the intra-node link while t <= g
  (Narayanan et al. SC21, sec. 3.2); sequence parallel replaces each by a reduce-scatter and an
  all-gather of the same volume (Korthikanti et al. sec. 4.2.2).
- pipeline: (m + (p - 1) / v) slots of one micro-batch's stage time, m = micro-batches per
  iteration (SC21 eq. 1-2), plus the point-to-point sends of b s h / t (scatter/gather) per
  chunk boundary; the slowest stage (ceil(L / p) layers, the output layer on the last) sets
  the pace.
- data parallel: ring allreduce (or reduce-scatter + all-gather with ZeRO, same volume; ZeRO-3
  re-gathers the weights in every micro-batch's forward and backward, Rajbhandari et al. 2020),
  hierarchical when several replicas share a node, exposed beyond one micro-batch's backward
  when overlapped.
- memory: weights, gradients and mixed-precision Adam state (2 + 2 + 12 bytes per parameter,
  ZeRO sec. 3.1) sharded by the ZeRO stage; activations per Korthikanti et al. Table 2 with the
  first stage holding p micro-batches in flight (1F1B; times 1 + (p - 1) / (p v) interleaved),
  m for GPipe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.spec.hardware import Precision, System
from planner.spec.transformer import Transformer

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe")
# Adam state per parameter: fp32 master weights + two fp32 moments in mixed precision (ZeRO
# paper, sec. 3.1); in fp32 training the weights are the master copy, leaving the moments
ADAM_STATE_BYTES = {True: 12, False: 8}  # keyed by "mixed precision"
# backward traffic of elementwise kernels over the forward's: a backward kernel reads the saved
# input and the incoming gradient and writes one gradient (3 tensors where forward moves 2)
ELEMENTWISE_BACKWARD = 1.5


@dataclass(frozen=True)
class Hardware:
    """The rates the model needs, in SI units, for one system and precision."""

    g: int
    matmul_flops: float  # achievable FLOP/s of large matmuls
    mem_bw: float  # achievable HBM bytes/s
    intra_bw: float
    intra_lat: float
    nic_bw: float  # one node's network bandwidth (all NICs)
    inter_lat: float
    memory_bytes: float
    value_bytes: int  # bytes per activation / weight value at this precision

    @classmethod
    def of(cls, system: System, precision: Precision) -> Hardware:
        dev = system.device
        eff = dev.efficiency.matmul or dev.efficiency.compute
        return cls(
            g=system.devices_per_node,
            matmul_flops=dev.peak_flops(precision) * eff,
            mem_bw=dev.memory_bandwidth_Bps * dev.efficiency.memory,
            intra_bw=system.intra_node.bandwidth_Bps,
            intra_lat=system.intra_node.latency_s,
            nic_bw=system.inter_node_bandwidth_Bps,
            inter_lat=system.inter_node.latency_s,
            memory_bytes=dev.memory_bytes,
            value_bytes=precision.bytes,
        )


def _ring(ranks, size, bw, lat):
    """Ring allreduce of `size` bytes over `ranks` (Patarasuk and Yuan 2009; Thakur et al. 2005)."""
    r = np.maximum(ranks, 1)
    return np.where(r > 1, 2 * (r - 1) / r * size / bw + 2 * (r - 1) * lat, 0.0)


def _matmul(flops, bytes_, hw: Hardware):
    """Roofline of one matmul (Williams et al. 2009)."""
    return np.maximum(flops / hw.matmul_flops, bytes_ / hw.mem_bw)


def layer_forward_time(m: Transformer, hw: Hardware, t, mb, flash: bool = True):
    """Forward time of one layer for a micro-batch of `mb` sequences on one of `t` devices:
    (matmul part, attention-core part, elementwise part)."""
    s, h, kv, f, a = m.seq_len, m.hidden, m.kv_dim, m.ffn_hidden, m.heads
    tok = mb * s
    vb = hw.value_bytes

    def mm(rows, inner, cols, count=1):
        return _matmul(2 * rows * inner * cols * count,
                       vb * (rows * inner + inner * cols + rows * cols) * count, hw)

    proj = (mm(tok, h, (h + 2 * kv) / t) + mm(tok, h / t, h)
            + mm(tok, h, (m.ffn_matrices - 1) * f / t, m.top_k) + mm(tok, f / t, h, m.top_k))
    if m.experts > 1:
        proj = proj + mm(tok, h, m.experts)
    core = mm(s, m.head_dim, s, mb * a / t) + mm(s, s, m.head_dim, mb * a / t)
    elementwise = tok * elementwise_bytes_per_token(m, hw, t, flash) / hw.mem_bw
    return proj, core, elementwise


def elementwise_bytes_per_token(m: Transformer, hw: Hardware, t, flash: bool):
    """HBM traffic of one layer's forward non-matmul kernels per token, as Megatron fuses them:
    two norms (read + write h), bias-GeLU (read + write f; SwiGLU reads 2 f), two
    bias-dropout-adds (read 2 h, write h, a 1-byte mask) outside the TP region; inside it the
    fused scale-mask-softmax (read + write a s) and attention dropout (read + write + mask a s),
    unless flash attention keeps the scores on chip (Dao et al. 2022)."""
    h, f, a, s, vb = m.hidden, m.ffn_hidden, m.heads, m.seq_len, hw.value_bytes
    outside = 2 * 2 * h * vb + 2 * (3 * h * vb + h)
    ffn = (3 if m.ffn_kind == "swiglu" else 2) * f * vb * m.top_k
    scores = 0 if flash else a * s * (2 * vb + 2 * vb + 1)
    return outside + (ffn + scores) / t


def activation_bytes_per_layer(m: Transformer, hw: Hardware, t, mb, recompute: str, sp,
                               flash: bool = True):
    """Stored activations of one layer (Korthikanti et al. 2022, Table 2; 16-bit values,
    scaled for other widths). `sp`: sequence parallel (the 10 s b h outside the TP region
    is split too)."""
    s, h, a = m.seq_len, m.hidden, m.heads
    sbh = s * mb * h * hw.value_bytes / 2
    outside = np.where(sp, 10 / t, 10.0)
    if recompute == "full":
        return 2 * sbh / np.where(sp, t, 1)
    core = 0 if recompute == "selective" or flash else 5 * a * s / (h * t)
    # the FFN intermediate is f / h wider than 4 h: scale the 16 s b h of the MLP block
    mlp = 16 * (m.ffn_hidden / (4 * h)) * (1.5 if m.ffn_kind == "swiglu" else 1) * m.top_k
    return sbh * (outside + (8 + mlp) / t + core)


def iteration(m: Transformer, hw: Hardware, cfg: dict) -> dict:
    """Time and memory of one iteration for arrays of configurations.

    cfg keys (arrays or scalars): t, p, d, mb, acc, v, recompute (0/1/2), sp (0/1), zero,
    gpipe (0/1), overlap (bool)."""
    t, p, d, mb, acc, v = (np.asarray(cfg[k], dtype=float) for k in ("t", "p", "d", "mb",
                                                                     "acc", "v"))
    rec = np.asarray(cfg["recompute"])
    sp = np.asarray(cfg["sp"]).astype(bool) & (t > 1)
    zero, gpipe = np.asarray(cfg["zero"]), np.asarray(cfg["gpipe"]).astype(bool)
    overlap = bool(cfg.get("overlap", True))
    flash = bool(cfg.get("flash", True))
    s, h, g, vb = m.seq_len, m.hidden, hw.g, hw.value_bytes
    tok = mb * s

    # --- compute per micro-batch ---
    proj, core, elem = layer_forward_time(m, hw, t, mb, flash)
    fwd = proj + core + elem
    recompute_extra = np.select([rec == 2, rec == 1], [fwd, core], 0.0)
    # forward, backward (matmuls 2x, elementwise 1.5x), recomputation
    layer_time = 3 * (proj + core) + (1 + ELEMENTWISE_BACKWARD) * elem + recompute_extra
    logit = 3 * _matmul(2 * tok * h * m.vocab / t,
                        vb * (tok * h + h * m.vocab / t + tok * m.vocab / t), hw)

    # --- tensor parallel: 4 collectives of b s h per layer, 6 with a recomputed forward ---
    tp_intra = t <= g
    tp_bw = np.where(tp_intra, hw.intra_bw, hw.nic_bw / g)
    tp_lat = np.where(tp_intra, hw.intra_lat, hw.inter_lat)
    n_coll = np.where(rec == 2, 6, 4)
    tp_layer = n_coll * _ring(t, tok * h * vb, tp_bw, tp_lat)

    # --- the slowest stage ---
    q, r = np.floor_divide(m.layers, p), np.mod(m.layers, p)
    per_layer = layer_time + tp_layer
    stage = np.where(p > 1, np.maximum((q + (r > 0)) * per_layer, q * per_layer + logit),
                     m.layers * per_layer + logit)
    compute_stage = np.where(p > 1, np.maximum((q + (r > 0)) * layer_time, q * layer_time
                                               + logit), m.layers * layer_time + logit)
    tp_stage = stage - compute_stage

    # --- pipeline point-to-point: b s h / t per chunk boundary, forward and backward ---
    p2p_inter = t * p > g
    p2p_bw = np.where(p2p_inter, hw.nic_bw / g, hw.intra_bw)
    p2p_lat = np.where(p2p_inter, hw.inter_lat, hw.intra_lat)
    p2p = np.where(p > 1, 2 * v * (p2p_lat + tok * h * vb / t / p2p_bw), 0.0)

    slot = stage + p2p  # one micro-batch through the slowest stage
    slots = acc + (p - 1) / v
    pipeline = slots * slot
    bubble = (p - 1) / v * (compute_stage + tp_stage)

    # --- data parallel gradient sync ---
    stage_params = (q + (r > 0)) * m.layer_params() + np.maximum(m.embedding_params(),
                                                                   m.head_params())
    local_params = stage_params / t
    grad_bytes = local_params * vb
    replicas_per_node = np.clip(np.floor(g / (t * p)), 1, None)
    k = np.minimum(replicas_per_node, d)  # replicas reduced inside a node first
    inter_ranks = np.ceil(d / k)
    dp = (_ring(k, grad_bytes, hw.intra_bw, hw.intra_lat)
          + _ring(inter_ranks, grad_bytes / k, hw.nic_bw / g, hw.inter_lat))
    layers_here = q + (r > 0)
    window = np.where(overlap, 2 * fwd * layers_here, 0.0)  # one micro-batch's backward
    dp_exposed = np.maximum(0.0, dp - window)
    # ZeRO-3 gathers the weights again for every micro-batch's forward and backward (an
    # all-gather is half a ring allreduce), hidden behind that micro-batch's compute when
    # overlapped (Rajbhandari et al. 2020, sec. 7.2.3)
    gather = dp / 2
    per_mb = np.maximum(0.0, 2 * gather - np.where(overlap, 3 * fwd * layers_here, 0.0))
    dp_exposed = dp_exposed + np.where(zero == 3, acc * per_mb, 0.0)

    # --- optimizer step: read/write master, moments, gradient; write the 16-bit copy ---
    opt_params = local_params / np.where(zero >= 1, d, 1)
    adam = ADAM_STATE_BYTES[vb < 4]
    optimizer = opt_params * (2 * adam + 2 * vb + vb) / hw.mem_bw

    total = pipeline + dp_exposed + optimizer

    # --- memory per device (first stage: most micro-batches in flight) ---
    weights = local_params * vb / np.where(zero >= 3, d, 1)
    grads = local_params * vb / np.where(zero >= 2, d, 1)
    opt_state = local_params * adam / np.where(zero >= 1, d, 1)
    per_layer_act = np.select(
        [rec == 2, rec == 1],
        [activation_bytes_per_layer(m, hw, t, mb, "full", sp, flash),
         activation_bytes_per_layer(m, hw, t, mb, "selective", sp, flash)],
        activation_bytes_per_layer(m, hw, t, mb, "none", sp, flash))
    # Korthikanti et al. sec. 4.2.3: interleaving with v chunks holds 1 + (p - 1) / (p v) x more
    in_flight = np.where(gpipe, acc, np.minimum(p, acc)
                         * np.where(v > 1, 1 + (p - 1) / (p * v), 1.0))
    acts = (q + (r > 0)) * per_layer_act * in_flight
    # a fully recomputed layer rebuilds its full activations during backward
    acts = acts + np.where(rec == 2, activation_bytes_per_layer(m, hw, t, mb, "none", sp, flash), 0)
    logits_mem = 4 * tok * m.vocab / t  # fp32 logits of one micro-batch, last stage
    acts = np.maximum(acts, acts / np.maximum(in_flight, 1) + logits_mem)
    memory = weights + grads + opt_state + acts

    compute_time = acc * compute_stage
    return {
        "time": total,
        "compute": compute_time,
        "tp_comm": acc * tp_stage,
        "pp_bubble": bubble,
        "pp_comm": slots * p2p,
        "dp_comm_exposed": dp_exposed,
        "optimizer": optimizer,
        "memory": memory,
        "weights": weights,
        "gradients": grads,
        "optimizer_state": opt_state,
        "activations": acts,
    }


def hardware_flops_per_sequence(m: Transformer, recompute: str) -> int:
    """FLOPs executed per sequence including recomputation (SC21 eq. 3 for full recompute)."""
    extra = {"none": 0, "selective": m.layers * m.attention_core_flops(),
             "full": m.layers * m.layer_matmul_flops()}[recompute]
    return m.model_flops() + extra
