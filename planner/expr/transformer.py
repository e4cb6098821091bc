"""Hybrid-parallel transformer training: one iteration's time and memory as SymPy expressions.

The free symbols are the plan's integers (t tensor-parallel, p pipeline stages, d data-parallel
replicas, b micro-batch, m micro-batches per iteration, v interleaved chunks); the model and the
system enter as numbers. Every categorical choice (recompute, sequence parallel, ZeRO stage,
schedule, overlap, flash attention) gets its own expressions, so `limits` and `derive` read
plain formulas and the search prices each choice with one compiled numpy program. The physics,
by term:

- compute: each matmul of a layer by roofline (FLOPs at the achievable matmul rate, or its
  operands at the achievable memory bandwidth, whichever is slower; Williams et al. 2009),
  backward = 2x forward; elementwise work (norms, softmax, GeLU, dropout, residuals) as the HBM
  traffic of Megatron's fused kernels; flash attention keeps the scores on chip. A GEMM's rate
  falls with its thinnest dimension, and no kernel (GEMM, elementwise or collective) runs faster
  than the host issues it: the two device constants `kernels.gemm_half_dim` and
  `kernels.launch_us` (fitted by `python -m planner.fit_transformer`). fp8 / fp4 run only the
  GEMMs in the low format, paying a cast per GEMM input; activations, weights, gradients and
  communication stay 16-bit (Micikevicius et al. 2022, "FP8 formats for deep learning").
- tensor parallel: Megatron's two allreduces of b s h per layer forward and two backward (a
  third pair when the forward is recomputed), ring cost on the intra-node link while t <= g
  (Narayanan et al. SC21, sec. 3.2), on the node's NICs together beyond (one NCCL channel per
  NIC); sequence parallel replaces each by a reduce-scatter and an
  all-gather of the same volume (Korthikanti et al. 2022, sec. 4.2.2).
- pipeline: (m + (p - 1) / v) slots of one micro-batch's stage time (SC21 eq. 1-2), plus the
  point-to-point sends of b s h / t per chunk boundary; the slowest stage (ceil(L / p) layers,
  the output layer on the last) sets the pace.
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

import functools
from dataclasses import dataclass

import sympy as sp

from planner.expr import symbols as S
from planner.expr.collectives import ring_allreduce
from planner.expr.rewrite import substitute
from planner.expr.roofline import bound
from planner.expr.symbols import b, c_p, d, e_p, m, p, t, v
from planner.numeric import Program

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe")
# Adam state per parameter: fp32 master weights + two fp32 moments in mixed precision (ZeRO
# paper, sec. 3.1); in fp32 training the weights are the master copy, leaving the moments
ADAM_STATE_BYTES = {True: 12, False: 8}  # keyed by "mixed precision"
# backward traffic of elementwise kernels over the forward's: a backward kernel reads the saved
# input and the incoming gradient and writes one gradient (3 tensors where forward moves 2)
ELEMENTWISE_BACKWARD = 1.5
PLAN_SYMBOLS = (t, p, d, b, m, v, c_p, e_p)
OUTPUTS = ("time", "compute", "tp_comm", "cp_comm", "ep_comm", "pp_bubble", "pp_comm", "dp_comm_exposed",
           "optimizer", "memory", "weights", "gradients", "optimizer_state", "activations")


@dataclass(frozen=True)
class Choices:
    """The categorical choices of a plan: each combination has its own expressions."""

    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    schedule: str = "1f1b"
    overlap: bool = True
    flash_attention: bool = True


def _max(*args):
    # evaluate=False: SymPy would otherwise try to order the arguments (slow, and pointless
    # for expressions that are compared numerically)
    return sp.Max(*args, evaluate=False)


def _if(cond, then, otherwise):
    return sp.Piecewise((then, cond), (otherwise, True))


def ring(ranks, size, bw, lat):
    """Ring allreduce of `size` bytes over `ranks` at bandwidth `bw` and latency `lat`: the one
    formula of `planner.expr.collectives` (exactly 0 on one rank)."""
    return ring_allreduce(ranks, size, lat, bw)


class TransformerExpressions:
    """The expressions of one (model, hardware rates, choices)."""

    def __init__(self, model, hw, choices: Choices, cp: sp.Expr = c_p, ep: sp.Expr = e_p):
        """`cp`, `ep`: the context- and expert-parallel degrees, the symbols c_p and e_p or
        numbers (limits fix them)."""
        self.model, self.hw, self.choices = model, hw, choices
        self.cp, self.ep = (sp.Integer(x) if isinstance(x, int) else x for x in (cp, ep))
        # tokens of one micro-batch on one device: context parallelism splits the sequence
        self.tokens = b * model.seq_len / self.cp
        self.terms = self._build()

    def _matmul(self, rows, inner, cols, count=1):
        """One matmul kernel: FLOPs at the matmul rate or operands at the memory bandwidth,
        whichever is slower (roofline, Williams et al. 2009), and never faster than the host
        issues a kernel. The rate falls with the GEMM's thinnest dimension n as n / (n + n_half):
        a thin operand leaves output tiles and SM waves underfilled and the K loop too short to
        hide its prologue (the saturating curve of vTrain, Bang et al. 2024, fig. 4, and of the
        cuBLAS shape sweeps in NVIDIA's matmul performance guide)."""
        hw = self.hw
        rate = hw.matmul_flops
        if hw.gemm_half_dim:
            thin = sp.Min(rows, inner, cols, evaluate=False)
            rate = rate * thin**2 / (thin**2 + hw.gemm_half_dim**2)
        operand_bytes = 1 if hw.gemm_only else hw.value_bytes  # fp8 / fp4 operands: 1 byte
        time = bound(2 * rows * inner * cols * count,
                     operand_bytes * (rows * inner + inner * cols + rows * cols) * count,
                     rate, hw.mem_bw)
        return _max(time, hw.launch_s) if hw.launch_s else time

    def _kernels(self, count, bytes_moved):
        """`count` memory-bound kernels sharing `bytes_moved` of HBM traffic, each taking at
        least the host's kernel issue time."""
        hw = self.hw
        if not hw.launch_s:
            return bytes_moved / hw.mem_bw
        return count * _max(bytes_moved / (count * hw.mem_bw), hw.launch_s)

    def forward_parts(self):
        """Forward time of one layer per micro-batch on one of t devices: (projections and
        FFN, attention core or SSM scan, elementwise kernels), the mean over the model's
        layer kinds (a stage of a mixed model holds its kinds in their proportions)."""
        return self.parts()[:3]

    def parts(self):
        """`forward_parts` and the backward elementwise kernels, means over the layer kinds."""
        md = self.model
        kinds = md.layer_kinds()
        parts = [self._kind_parts(k) for k, _ in kinds]
        return tuple(sum(n * part[i] for part, (_, n) in zip(parts, kinds, strict=True))
                     / md.layers for i in range(4))

    def _kind_parts(self, kind):
        md, tok, hw = self.model, self.tokens, self.hw
        h, a = md.hidden, md.heads
        mm = self._matmul
        proj, core = sp.Integer(0), sp.Integer(0)
        if kind.mixer in ("attention", "sliding"):
            if md.mla:  # DeepSeek-V2 sec. 2.1: the down projections are not split by tp
                la = md.mla
                qk = la.qk_nope_head_dim + la.qk_rope_head_dim
                proj += mm(tok, h, (la.q_lora_rank or 0) + la.kv_lora_rank + la.qk_rope_head_dim)
                proj += mm(tok, la.q_lora_rank or h, sp.Integer(a * qk) / t)
                proj += mm(tok, la.kv_lora_rank,
                           sp.Integer(a * (la.qk_nope_head_dim + la.v_head_dim)) / t)
                proj += mm(tok, sp.Integer(a * la.v_head_dim) / t, h)
            else:
                proj += (mm(tok, h, sp.Integer(md.q_dim + 2 * md.kv_dim) / t)
                         + mm(tok, sp.Integer(md.q_dim) / t, h))
            # each context-parallel rank holds s / c_p queries against all keys (a sliding
            # layer: its window); Megatron's load-balanced causal chunks (2 c_p of them, rank
            # i taking i and 2 c_p - 1 - i) give every rank the same share of the products
            sq, keys = md.seq_len / self.cp, md.attention_keys(kind.mixer)
            core = (mm(sq, md.head_dim, keys, b * a / t)
                    + mm(sq, keys, md.v_head_dim, b * a / t))
        elif kind.mixer == "mamba":  # Mamba-2: in_proj (z, x, B, C, dt), out_proj; heads / tp
            d_in, heads = md.mamba_inner(), md.mamba.heads
            proj += (mm(tok, h, sp.Integer(d_in + md.mamba_conv_dim() + heads) / t)
                     + mm(tok, sp.Integer(d_in) / t, h))
            # the chunked SSD scan is its own kernel, on the tensor cores (Dao & Gu 2024)
            scan = md.ssm_scan_flops() * b / (self.cp * t) / hw.matmul_flops
            core = _max(scan, hw.launch_s) if hw.launch_s else scan
        gates = md.ffn_matrices - 1
        if kind.ffn == "dense":
            f = md.dense_ffn_hidden or md.ffn_hidden
            proj += mm(tok, h, sp.Integer(gates * f) / t) + mm(tok, sp.Integer(f) / t, h)
        elif kind.ffn == "moe":
            # the router; then each of this rank's E / e_p experts as a grouped GEMM on the
            # tokens routed to it: top_k of E per token, balanced, from the e_p ranks of the
            # group (few tokens per expert make thin GEMMs)
            f, experts = md.ffn_hidden, md.experts
            rows = tok * md.top_k * self.ep / experts
            proj += mm(tok, h, experts)
            proj += (mm(rows, h, sp.Integer(gates * f) / t, experts / self.ep)
                     + mm(rows, sp.Integer(f) / t, h, experts / self.ep))
            if md.shared_experts:
                fs = (md.shared_expert_ffn_hidden or f) * md.shared_experts
                proj += mm(tok, h, sp.Integer(gates * fs) / t) + mm(tok, sp.Integer(fs) / t, h)
        traffic = tok * self.elementwise_bytes_per_token(kind)
        # backward: 1.5x the traffic in twice the kernels (each gradient kernel, plus the bias
        # and norm-weight reductions and the residual gradient sums)
        return (proj, core, self._kernels(self.elementwise_kernels(), traffic),
                self._kernels(2 * self.elementwise_kernels(),
                              sp.Float(ELEMENTWISE_BACKWARD) * traffic))

    def elementwise_kernels(self) -> int:
        """Non-matmul kernels in one layer's forward, as Megatron runs them: two norms, two
        bias-dropout-adds, bias-GeLU; without flash attention the softmax, the attention
        dropout and the copy of the context back to (s, b, h) (flash attention fuses them);
        with an fp8 / fp4 GEMM precision one cast per GEMM input (Transformer Engine)."""
        casts = 4 if self.hw.gemm_only else 0
        return 5 + (1 if self.choices.flash_attention else 3) + casts

    def elementwise_bytes_per_token(self, kind=None):
        """HBM traffic of one layer's forward non-matmul kernels per token, as Megatron fuses
        them: two norms (read + write h), bias-GeLU (read + write f; SwiGLU reads 2 f), two
        bias-dropout-adds (read 2 h, write h, a 1-byte mask) outside the TP region; inside it
        the fused scale-mask-softmax (read + write a keys) and attention dropout (read + write +
        mask a keys), unless flash attention keeps the scores on chip (Dao et al. 2022).
        `kind`: a layer kind of the model (default: its first)."""
        md, vb = self.model, self.hw.value_bytes
        kind = kind or md.layer_kinds()[0][0]
        h, a = md.hidden, md.heads
        outside = 2 * 2 * h * vb + 2 * (3 * h * vb + h)
        if kind.ffn == "moe":
            f = md.ffn_hidden * md.top_k + (md.shared_expert_ffn_hidden or md.ffn_hidden) \
                * md.shared_experts
        else:
            f = (md.dense_ffn_hidden or md.ffn_hidden) if kind.ffn else 0
        ffn = (3 if md.gated_ffn else 2) * f * vb
        attends = kind.mixer in ("attention", "sliding")
        scores = (0 if self.choices.flash_attention or not attends
                  else a * md.attention_keys(kind.mixer) * (2 * vb + 2 * vb + 1))
        # fp8 / fp4 GEMMs: each GEMM input (h for QKV and FC1, q_dim / t and f / t for the
        # output projection and FC2) is read at 16 bits and written at 8 (Transformer Engine's
        # cast with its amax fused in; Micikevicius et al. 2022, sec. 4)
        casts = 3 if self.hw.gemm_only else 0
        cast_outside = casts * 2 * h
        cast_inside = casts * (h + f)
        return outside + cast_outside + sp.Integer(ffn + scores + cast_inside) / t

    def activation_bytes_per_layer(self, recompute: str):
        """Stored activations of one layer (Korthikanti et al. 2022, Table 2; 16-bit values,
        scaled for other widths); sequence parallelism splits the 10 s b h outside the TP
        region too."""
        md, c = self.model, self.choices
        s, h, a = md.seq_len, md.hidden, md.heads
        sbh = s / self.cp * b * h * sp.Rational(self.hw.value_bytes, 2)  # this rank's s / c_p
        split = c.sequence_parallel
        if recompute == "full":
            return 2 * sbh / (t if split else 1)
        outside = 10 / t if split else 10
        core = 0 if recompute == "selective" or c.flash_attention else sp.Integer(5 * a * s) / (h * t)
        # the FFN intermediate is f / h wider than 4 h: scale the 16 s b h of the MLP block
        mlp = (16 * sp.Rational(md.ffn_hidden, 4 * h) * (sp.Rational(3, 2) if md.gated_ffn
                                                        else 1) * md.top_k)
        return sbh * (outside + (8 + mlp) / t + core)

    def _build(self) -> dict[str, sp.Expr]:
        md, hw, c = self.model, self.hw, self.choices
        # g: devices sharing a node's NICs; u: devices on one scale-up (NVLink) domain, where
        # tp, cp, ep and the first tier of the gradient allreduce stay (u = g but on NVL72)
        h, g, u, vb, L = md.hidden, hw.g, hw.scale_up, hw.value_bytes, md.layers
        tok = self.tokens
        full, selective = c.recompute == "full", c.recompute == "selective"

        # --- compute per micro-batch ---
        proj, core, elem, elem_bwd = self.parts()
        fwd = proj + core + elem
        extra = fwd if full else core if selective else 0
        # forward, backward (matmuls 2x: input and weight gradients), recomputation
        layer = 3 * (proj + core) + elem + elem_bwd + extra
        logit = 3 * self._matmul(tok, h, sp.Integer(md.vocab) / t)

        # --- tensor parallel: 4 collectives of b s h per layer, 6 with a recomputed forward ---
        size = tok * h * vb
        # a group larger than the node holds all g devices of each of its nodes, and nothing
        # else leaves the node during its collective: NCCL runs one ring channel per NIC, so
        # the node's whole NIC bandwidth serves it, the NVLink hops being the other bound
        tp_ring = _if(t <= u, ring(t, size, hw.intra_bw, hw.intra_lat),
                      ring(t, size, min(hw.nic_bw, hw.intra_bw), hw.inter_lat))
        if hw.launch_s:  # a collective is a kernel too (exactly 0 on one rank)
            tp_ring = _if(t > 1, _max(tp_ring, hw.launch_s), 0)
        tp_layer = (6 if full else 4) * tp_ring

        # --- context parallel: K and V of this rank's s / c_p tokens go round a ring of c_p
        # ranks, c_p - 1 steps per layer, overlapped with the attention core (Megatron-LM's
        # ring attention; Liu et al. 2023). Backward sends K, V and their gradients (twice the
        # bytes against twice the core); a recomputed forward (full or selective) runs it
        # again. The group sits inside the node next to tp until t c_p > g.
        kv = 2 * tok * sp.Integer(md.kv_dim) / t * vb
        cp_step = _if(t * self.cp <= u, hw.intra_lat + kv / hw.intra_bw,
                      hw.inter_lat + kv / (hw.nic_bw / g))
        cp_layer = (4 if full or selective else 3) * _max(0, (self.cp - 1) * cp_step - core)

        # --- expert parallel: each MoE layer dispatches its tokens' top_k copies to the
        # experts' ranks and combines them back, an all-to-all of b s top_k h over e_p ranks
        # each way, forward and backward (again for a recomputed forward), not overlapped
        # (Megatron-LM's alltoall token dispatcher; Lepikhin et al. 2021). The group sits next
        # to tp and cp: inside the node while t c_p e_p <= g, else the share of the traffic
        # whose peers are on other nodes goes over the node's NICs.
        ep, moe = self.ep, sum(n for k, n in md.layer_kinds() if k.ffn == "moe")
        routed = tok * md.top_k * h * vb
        inside = hw.intra_lat + routed * (ep - 1) / ep / hw.intra_bw
        leaves = 1 - _max(u / (t * self.cp), 1) / ep
        across = hw.inter_lat + routed * leaves / (hw.nic_bw / g)
        a2a = _if(ep > 1, _if(t * self.cp * ep <= u, inside, across), 0)
        ep_layer = sp.Rational(moe, L) * (6 if full else 4) * a2a

        # --- the slowest stage: ceil(L / p) layers, or floor(L / p) and the output layer ---
        here, fewer = sp.ceiling(L / p), sp.floor(L / p)

        def slowest(per_layer):
            return _if(p > 1, _max(here * per_layer, fewer * per_layer + logit),
                       L * per_layer + logit)

        stage, compute_stage = slowest(layer + tp_layer + cp_layer + ep_layer), slowest(layer)
        tp_stage, cp_stage = slowest(layer + tp_layer), slowest(layer + tp_layer + cp_layer)

        # --- pipeline point-to-point: b s h / t per chunk boundary, forward and backward ---
        send = size / t
        p2p = sp.Piecewise((2 * v * (hw.inter_lat + send / (hw.nic_bw / g)),
                            (p > 1) & (t * self.cp * p > u)),
                           (2 * v * (hw.intra_lat + send / hw.intra_bw), p > 1), (0, True))
        slots = m + (p - 1) / v

        # --- data parallel gradient sync: inside the node first, then across nodes ---
        # the routed experts' weights are split e_p ways (their mean share of a layer)
        experts_per_layer = sp.Rational(moe * md.experts * md.expert_params(), L)
        expert_params = here * experts_per_layer / (t * ep)
        local_params = (here * (md.layer_params() - experts_per_layer)
                        + max(md.embedding_params(), md.head_params())) / t + expert_params
        adam = ADAM_STATE_BYTES[vb < 4]

        # --- memory per device (first stage: most micro-batches in flight) ---
        # Korthikanti et al. sec. 4.2.3: interleaving with v chunks holds 1 + (p - 1) / (p v) x more
        in_flight = (m if c.schedule == "gpipe"
                     else sp.Min(p, m, evaluate=False) * _if(v > 1, 1 + (p - 1) / (p * v), 1))
        acts = here * self.activation_bytes_per_layer(c.recompute) * in_flight
        if full:  # a fully recomputed layer rebuilds its full activations during backward
            acts = acts + self.activation_bytes_per_layer("none")
        logits = 4 * tok * sp.Integer(md.vocab) / t  # fp32 logits of one micro-batch, last stage
        acts = _max(acts, acts / _max(in_flight, 1) + logits)

        # the aggregates the forms are written in, as expressions of the plan
        self.aggregates = {
            S.tau: stage, S.tau_p2p: p2p, S.M: local_params * vb,
            # gradients are reduced over the d c_p ranks holding the same weights
            S.r: sp.Min(_max(sp.floor(u / (t * p)), 1), d * self.cp, evaluate=False),
            S.beta_i: hw.intra_bw, S.alpha_i: hw.intra_lat, S.beta: hw.nic_bw / g,
            S.alpha: hw.inter_lat,
            S.H: 2 * fwd * here,  # one micro-batch's backward on the stage
            # read/write master, moments, gradient; write the 16-bit copy
            S.T_opt: local_params * (2 * adam + 3 * vb) / hw.mem_bw,
            S.Psi: local_params, S.delta: vb, S.kappa: adam, S.A_act: acts,
        }
        # the forms' d is the group the gradients are reduced and ZeRO-sharded over: d c_p
        # (Megatron-LM's data-parallel group with context parallelism)
        whole = lambda form: substitute(form, {**self.aggregates, d: d * self.cp})  # noqa: E731
        self.forms = {"time": time_form(c), "memory": memory_form(c)}
        shard = _shards(c)

        def experts_unsharded(per_param, stage):
            # ZeRO shards the routed experts' state over the d c_p / e_p ranks holding the same
            # experts (Megatron's expert-data-parallel group), not over d c_p: the forms shard
            # every parameter d c_p ways, so add back what the experts keep (0 at e_p = 1)
            return (expert_params * per_param * (ep - 1) / (d * self.cp) if c.zero >= stage
                    else sp.Integer(0))

        opt_extra = experts_unsharded((2 * adam + 3 * vb) / hw.mem_bw, 1)
        state_extra = {"weights": experts_unsharded(vb, 3),
                       "gradients": experts_unsharded(vb, 2),
                       "optimizer_state": experts_unsharded(adam, 1)}
        return {
            "time": whole(self.forms["time"]) + opt_extra,
            "compute": m * compute_stage,
            "tp_comm": m * _max(0, tp_stage - compute_stage),
            "cp_comm": m * _max(0, cp_stage - tp_stage),
            "ep_comm": m * _max(0, stage - cp_stage),
            "pp_bubble": (p - 1) / v * stage,
            "pp_comm": slots * p2p,
            "dp_comm_exposed": whole(exposed_form(c)),
            "optimizer": whole(S.T_opt / shard[1]) + opt_extra,
            "memory": whole(self.forms["memory"]) + sum(state_extra.values()),
            "weights": whole(S.Psi * S.delta / shard[3]) + state_extra["weights"],
            "gradients": whole(S.Psi * S.delta / shard[2]) + state_extra["gradients"],
            "optimizer_state": whole(S.Psi * S.kappa / shard[1]) + state_extra["optimizer_state"],
            "activations": acts,
        }


def _shards(c: Choices) -> dict[int, sp.Expr]:
    """What ZeRO stage 1 (optimizer state), 2 (+ gradients) and 3 (+ weights) divide by
    (Rajbhandari et al. 2020, sec. 5)."""
    return {stage: d if c.zero >= stage else sp.Integer(1) for stage in (1, 2, 3)}


def allreduce_form() -> sp.Expr:
    """The data-parallel gradient allreduce: a ring over the r replicas of a node, then a ring
    over ceil(d / r) nodes carrying M / r each (NCCL's hierarchical allreduce)."""
    return (ring(S.r, S.M, S.beta_i, S.alpha_i)
            + ring(sp.ceiling(d / S.r), S.M / S.r, S.beta, S.alpha))


def exposed_form(c: Choices) -> sp.Expr:
    """Data-parallel communication left exposed: the allreduce beyond one micro-batch's
    backward when overlapped. ZeRO-3 gathers the weights again in every micro-batch's forward
    and backward (an all-gather is half a ring allreduce, two of them), hidden behind that
    micro-batch's forward and backward, 3/2 H, when overlapped (Rajbhandari et al. 2020,
    sec. 7.2.3)."""
    sync = allreduce_form()
    exposed = _max(0, sync - S.H) if c.overlap else sync
    if c.zero == 3:
        exposed = exposed + m * (_max(0, sync - sp.Rational(3, 2) * S.H) if c.overlap else sync)
    return exposed


def time_form(c: Choices) -> sp.Expr:
    """The iteration time: (m + (p - 1) / v) pipeline slots of one micro-batch's stage time
    and sends (Narayanan et al. SC21, eq. 1-2), the exposed data-parallel communication, and
    the optimizer step on the ZeRO shard."""
    return ((m + (p - 1) / v) * (S.tau + S.tau_p2p) + exposed_form(c)
            + S.T_opt / _shards(c)[1])


def memory_form(c: Choices) -> sp.Expr:
    """Bytes per device: weights and gradients (delta each) and optimizer state (kappa) per
    parameter, sharded by the ZeRO stage (Rajbhandari et al. 2020, sec. 3.1 and 5), plus the
    activations of the first stage."""
    shard = _shards(c)
    return S.Psi * (S.delta / shard[3] + S.delta / shard[2] + S.kappa / shard[1]) + S.A_act


@functools.lru_cache(maxsize=128)
def program(model, hw, choices: tuple[Choices, ...]) -> Program:
    """One numpy program computing every output of every choice in `choices`, keyed
    (choice index, output name): the sub-expressions the choices share (the matmul rooflines,
    the stage's layers, the allreduce) are computed once for all of them."""
    exprs = {(j, k): e for j, c in enumerate(choices)
             for k, e in TransformerExpressions(model, hw, c).terms.items()}
    return Program(exprs, PLAN_SYMBOLS)
