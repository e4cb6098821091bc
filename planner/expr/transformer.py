"""Hybrid-parallel transformer training: one iteration's time and memory as expressions
(`planner.expr.graph`, which `limits` and `derive` read as SymPy).

The free symbols are the plan's integers (t tensor-parallel, p pipeline stages, d data-parallel
replicas, b micro-batch, m micro-batches per iteration, v interleaved chunks, c_p context-, e_p
expert- and e_t expert-tensor-parallel ranks); the model and the system enter as numbers. Every
categorical choice (recompute and its partial layer count, sequence parallel, ZeRO stage, and
every switch of `planner.switches`: `planner.expr.choices.Choices`) gets its own expressions,
so `limits` and `derive` read plain formulas and the search prices each choice with one
compiled numpy program. The physics,
by term:

- compute: each matmul of a layer by roofline (FLOPs at the achievable matmul rate, or its
  operands at the achievable memory bandwidth, whichever is slower; Williams et al. 2009),
  backward = 2x forward; elementwise work (norms, softmax, GeLU, dropout, residuals) as the HBM
  traffic of Megatron's fused kernels (or eager PyTorch's, one kernel per op); flash attention
  keeps the scores on chip and runs at its kernel's measured rate where the device spec has one
  (by head dimension and keys per call; causal masks doing half the products; its backward
  2.5x the forward's FLOPs; `planner.fit_flash`), as two thin GEMMs elsewhere. A GEMM's rate
  falls with its thinnest dimension, and no kernel (GEMM, elementwise or collective) runs faster
  than the host issues it: the two device constants `kernels.gemm_half_dim` and
  `kernels.launch_us` (fitted by `python -m planner.fit_transformer` for the A100, the half
  dimension of Hopper and Blackwell by `python -m planner.fit_gemm` to GEMM benchmarks).
  fp8 / fp4 run only the GEMMs in the low format, paying a cast per GEMM input; activations,
  weights, gradients and communication stay 16-bit (Micikevicius et al. 2022, "FP8 formats
  for deep learning"), but with the fp8 weight gather the layers' weights are held and
  all-gathered at 1 byte.
- tensor parallel: one allreduce of b s h per tensor-parallel block (the mixer, a dense or
  shared-expert FFN) forward and one backward (again when the forward is recomputed), ring
  cost on the intra-node link while t <= g (Narayanan et al. SC21, sec. 3.2), on the node's
  NICs together beyond (one NCCL channel per NIC); sequence parallel replaces each by a
  reduce-scatter and an all-gather of the same volume (Korthikanti et al. 2022, sec. 4.2.2);
  with tp overlap each is pipelined in t chunks with its block's GEMMs.
- mixture of experts: the expert grid (e_t x e_p x expert data parallel) folded over the same
  ranks as the dense one; tokens dispatched and combined by all-to-all over e_p and gathered
  over e_t (Megatron-LM's all-to-all dispatcher), grouped expert GEMMs on the tokens routed to
  each expert times the capacity factor.
- pipeline: (m + (p - 1) / v) slots of one micro-batch's stage time (SC21 eq. 1-2), plus the
  point-to-point sends of b s h / t per chunk boundary (and, without sequence parallelism,
  the receiving stage's all-gather over tp, SC21 sec. 4.1); the slowest stage (ceil(L / p) layers,
  the output layer on the last; or the pinned first / last stages and an even split of the
  rest) sets the pace.
- data parallel: ring allreduce of the gradients (with ZeRO a reduce-scatter of the gradients
  and an all-gather of the weights, each at its own width; ZeRO-3 re-gathers the weights in
  every micro-batch's forward and backward, Rajbhandari et al. 2020),
  as NCCL's one pipelined ring through every replica, exposed beyond one micro-batch's backward
  when overlapped; with HSDP the ZeRO collectives run inside groups of z replicas and the
  gradient shards are allreduced across the d / z groups.
- memory: weights, gradients and mixed-precision Adam state (2 + 2 + 12 bytes per parameter,
  ZeRO sec. 3.1; with bf16 weights the gradients are accumulated and reduced in fp32, 4 bytes,
  as Megatron-LM and PyTorch FSDP2 do by default) sharded by the ZeRO stage; activations per
  Korthikanti et al. Table 2 with the first stage holding min(p, m) micro-batches in flight
  (1F1B), m for GPipe, and interleaved the chunks of Megatron-LM's warm-up (1 + (p - 1) / (p v)
  times p for m > p, Korthikanti et al. sec. 4.2.3; exactly m when m = p, which runs every
  forward first). Full recomputation keeps each layer's input; partial recomputation (the
  first N layers of each chunk, Megatron-LM's block method) keeps the other layers whole.
"""

from __future__ import annotations

import dataclasses
import functools

from planner.compiled import Compiled
from planner.expr import graph as G
from planner.expr import vocab as S
from planner.expr.choices import OUTPUTS
from planner.expr.collectives import all_gather
from planner.expr.layer import (
    DEVICE,
    RECOMPUTE,
    SCHEDULES,
    Choices,
    LayerCosts,
    _if,
    _max,
    across_bw,
    hop,
    overlapped,
    ring,
    within_domain,
)
from planner.expr.rewrite import substitute
from planner.expr.unordered import sceil, sfloor, smin
from planner.expr.vocab import b, c_p, d, e_p, e_t, m, p, t, v

__all__ = ["OUTPUTS", "PLAN_SYMBOLS", "RECOMPUTE", "SCHEDULES", "Choices", "TransformerExpressions",
           "allreduce_form", "build_program", "exposed_form", "memory_form", "ring", "time_form"]

# optimizer state per trained parameter, in fp32 values, beside the fp32 master copy that mixed
# precision keeps (ZeRO paper, sec. 3.1; in fp32 training the weights are the master copy):
# SGD none, momentum one, Adam two moments (Kingma & Ba 2015), Adafactor its factored second
# moment, m + n values per m x n matrix and no first moment by default (Shazeer & Stern 2018,
# sec. 4-5: next to nothing per parameter), Muon one momentum (Jordan et al. 2024)
OPTIMIZER_STATE = {"sgd": 0, "momentum": 1, "adam": 2, "adafactor": 0, "muon": 1}
ADAM_STATE_BYTES = {True: 12, False: 8}  # keyed by "mixed precision"
PLAN_SYMBOLS = (t, p, d, b, m, v, c_p, e_p, e_t, S.n_r, S.d_s)


class TransformerExpressions(LayerCosts):
    """The expressions of one (model, hardware rates, choices): the layer costs of
    `LayerCosts` assembled into one iteration's time and memory (`terms`)."""

    def __init__(self, model, hw, choices: Choices, cp: G.Expr = c_p, ep: G.Expr = e_p,
                 etp: G.Expr = e_t):
        super().__init__(model, hw, choices, cp, ep, etp)
        self.terms = self._build()

    def _build(self) -> dict[str, G.Expr]:
        md, hw, c = self.model, self.hw, self.choices
        # u: devices on one scale-up (NVLink) domain, where
        # tp, cp, ep and the first tier of the gradient allreduce stay (u = g but on NVL72)
        h, u, vb, L = md.hidden, hw.scale_up, hw.value_bytes, md.layers
        # gradients as accumulated and reduced: fp32 with bf16 weights, unless kept in bf16
        gb = 2 if c.grad_reduce_bf16 and vb == 2 else hw.grad_bytes
        tok = self.tokens
        full, selective = c.recompute == "full", c.recompute == "selective"

        # --- compute per micro-batch; tensor- and expert-parallel communication per layer ---
        parts = self.parts()
        proj, core, elem, elem_bwd, tp_layer, ep_layer, core_bwd = parts[:7]
        fwd = proj + core + elem
        extra = fwd if full else core if selective else 0
        # forward, backward (matmuls 2x: input and weight gradients, only the input's when
        # the weights are frozen (LoRA); a fused attention kernel's own backward),
        # recomputation
        grads = 1 if c.lora_rank else 2
        # (and what the recompute modules run again in the backward)
        layer = (1 + grads) * proj + core + core_bwd + elem + elem_bwd + extra + parts.again
        # the LM head stays at 16 bits in an fp8 / fp4 recipe: Megatron-LM's output layer is
        # its own ColumnParallelLinear, not a Transformer Engine layer (gpt_model.py at
        # d98e8a6; TE's only with --fp8-output-proj and mxfp8), as torchtitan's float8
        # documentation configures it too (filter_fqns=["output"], float8.md at b5bcd76);
        # `fp8_output_proj` runs it in the MXFP8 recipe
        logit_fwd = self._matmul(tok, h, G.Integer(md.vocab) / t,
                                 sixteen=not c.fp8_output_proj)
        logit = (1 + grads) * logit_fwd
        if not c.grad_accumulation_fusion and not c.lora_rank:
            # the output layer's weight gradient too, on the last stage
            layer = layer + self._unfused_accumulation()
            logit = logit + self._kernels(1, 2 * vb * G.Integer(md.vocab * h) / t)

        size = tok * h * vb
        # --- context parallel: K and V of this rank's s / c_p tokens go round a ring of c_p
        # ranks, c_p - 1 steps per layer, overlapped with the attention core (Megatron-LM's
        # ring attention; Liu et al. 2023). Backward sends K, V and their gradients (twice the
        # bytes against twice the core); a recomputed forward (full or selective) runs it
        # again. The group sits inside the node next to tp until t c_p > g. All-to-all
        # context parallelism (`cp_a2a`) instead exchanges Q, K, V and O in line each pass,
        # on an attention layer (`cp_a2a_pass`) ---
        kv = 2 * tok * G.Integer(md.kv_dim) / t * vb
        cp_step = hop(hw, within_domain(hw, t * self.cp), DEVICE, kv)
        ring = (self.cp - 1) * cp_step
        slow = hw.overlap_slowdown
        a2a = self.cp_a2a_pass()

        def ep_overlapped(comm, window):
            """A layer's all-to-alls with `ep_overlap`: Megatron-LM's combined 1F1B hides a
            chunk's exchanges behind another micro-batch's chunk only in the steady state,
            where a forward and a backward pair up (schedules.py
            combined_1f1b_schedule_for_interleaved_pipelining at d98e8a6); the warm-up's
            forwards and the cool-down's backwards run alone, all-to-alls exposed. Rank k's
            warm-up is 2 (p - k - 1) + (v - 1) p + 1 of its m v chunk forwards (1 of m without
            a pipeline: the first forward and the last backward), p v over the ranks on
            average, so min(p, m) / m of the passes show their exchanges whole."""
            alone = smin(p, m) / m
            return alone * comm + (1 - alone) * overlapped(comm, window, slow)

        def cp_passes(kinds, core, core_bwd):
            """(forward, backward) context-parallel time of a layer of `kinds` (the mean over
            them) beside its attention `core` and `core_bwd`."""
            if not c.cp_a2a:
                return overlapped(ring, core, slow), overlapped(2 * ring, core_bwd, slow)
            share = G.Rational(sum(n for k, n in kinds if k.mixer in ("attention", "sliding")),
                               sum(n for _, n in kinds))
            return a2a * share, a2a * share

        cp_fwd, cp_bwd = cp_passes(md.layer_kinds(), core, core_bwd)
        cp_layer = (2 if full or selective else 1) * cp_fwd + cp_bwd

        ep, moe = self.ep, sum(n for k, n in md.layer_kinds() if k.ffn == "moe")
        # one layer's weights on this device: the routed experts' (their mean share of a
        # layer) split e_t e_p ways, the rest t ways
        experts_per_layer = G.Rational(moe * md.experts * md.expert_params(), L)
        layer_weights = ((md.layer_params() - experts_per_layer) / t
                         + experts_per_layer / (self.etp * ep))

        # --- the layer weights' casts to the GEMM format (fp8 / fp4 recipes): Transformer
        # Engine's weight cache (`weight_cache`) casts them at the step's first micro-batch
        # and holds the copies (W_q below; the one cast a step is not priced: at most one
        # micro-batch's share). Uncached, or under ZeRO 3, whose weights are whole only
        # while their layer runs (FSDP2: TE caches nothing), every micro-batch casts every
        # weight, read at 16 bits and written in both layouts (`quantize_bytes`), one cast
        # per weight GEMM (QKV, output projection, fc1, fc2). Held in the format (the fp8
        # gather) they need no cast; uncached, the layout the held copy lacks (Hopper's fp8
        # transpose) is made for each micro-batch's backward and freed, its time not priced:
        # the Hopper LoRA runs, which keep no transposes, show none of it ---
        quantized = hw.weight_copy_bytes
        held = hw.held_weight_bytes if c.fp8_weight_gather else 0
        cached = bool(quantized) and c.weight_cache and c.zero < 3
        if quantized and not cached and not c.fp8_weight_gather:
            layer = layer + self._kernels(4, layer_weights * hw.quantize_bytes)

        # --- multi-token prediction (DeepSeek-V3 sec. 2.2; Megatron-LM places the depths on
        # the last stage, after the output layer): per depth the 2h -> h projection (a
        # column-parallel TE linear), its blocks (`mtp_kinds`: one of the last layer's kind, or
        # a hybrid model's pattern) with their collectives, and the LM head again; as
        # (compute, tp, cp, ep, offload) like a kept layer ---
        mtp_kept, mtp_forward = (G.Integer(0),) * 5, G.Integer(0)
        if md.mtp_layers:
            depth = [G.Integer(0)] * 4  # compute, tp, cp, ep of one depth's blocks
            depth_fwd = self._matmul(tok, 2 * h, G.Integer(h) / t) + logit_fwd
            for kind in md.mtp_kinds():
                kind_parts = self._kind_parts(kind)
                m_proj, m_core, m_elem, m_elem_bwd, m_tp, m_ep, m_core_bwd = kind_parts[:7]
                m_cp_fwd, m_cp_bwd = cp_passes(((kind, 1),), m_core, m_core_bwd)
                depth_fwd += (m_proj + m_core + m_elem + kind_parts.tp_forward + m_cp_fwd
                              + kind_parts.ep_forward)
                m_fwd = m_proj + m_core + m_elem
                m_layer = ((1 + grads) * m_proj + m_core + m_core_bwd + m_elem + m_elem_bwd
                           + (m_fwd if full else m_core if selective else 0) + kind_parts.again)
                m_cp = (2 if full or selective else 1) * m_cp_fwd + m_cp_bwd
                if c.ep_overlap:  # behind the block, as a layer's behind its own
                    m_ep = ep_overlapped(m_ep, m_layer)
                depth = [a + x for a, x in zip(depth, (m_layer, m_tp, m_cp, m_ep), strict=True)]
            depth[0] += (1 + grads) * self._matmul(tok, 2 * h, G.Integer(h) / t) + logit
            mtp_kept = (*(md.mtp_layers * x for x in depth), G.Integer(0))
            mtp_forward = md.mtp_layers * depth_fwd

        # --- the slowest stage: ceil(L / p) layers, or floor(L / p) and the output layer; with
        # pinned first / last stages, those and ceil(rest / others) on the others ---
        # --- partial recomputation: of a stage's n layers, the first recompute_layers of
        # each of its v chunks are recomputed (Megatron-LM's block method), the rest keep
        # their activations; a stage then costs n kept layers plus the recomputed ones' extra
        # forward, collectives included (`again`) ---
        partial = full and c.partial
        if partial:
            kept_costs = LayerCosts(md, hw, dataclasses.replace(c, recompute="none",
                                                                partial=False),
                                    self.cp, self.ep, self.etp).parts()
            tp_kept, ep_kept = kept_costs[4], kept_costs[5]
            cp_kept = cp_fwd + cp_bwd

        def recomputed(n):
            """Layers recomputed on a stage of n layers."""
            return smin(S.n_r * v, n)

        if c.uneven:
            first, last = (G.Integer(c.first_stage_layers or 0),
                           G.Integer(c.last_stage_layers or 0))
            others = p - int(bool(c.first_stage_layers)) - int(bool(c.last_stage_layers))
            middle = _if(others > 0, sceil((L - first - last) / others), 0)
            first = first if c.first_stage_layers else middle
            last = last if c.last_stage_layers else middle
            here = _max(first, middle, last)
            # a bubble slot is the largest chunk: the busiest stage's ceil(n / v) layers
            # (`planner.plan.stage_chunks`: = n / v where its layers divide into the chunks)
            chunks = here / sceil(here / v)

            def slowest(per_layer, again=0, tail=logit):
                cost = _stage_cost(per_layer, again, recomputed if partial else None)
                return _max(cost(first), cost(middle), cost(last) + tail)
        else:
            here, fewer = sceil(L / p), sfloor(L / p)
            # v chunks of ceil(L / (p v)) layers at most (fewer where L does not divide into
            # p v, as Megatron-LM's --pipeline-model-parallel-layout places them): a bubble
            # slot is the largest chunk, 1 / chunks of the stage (= v for an even split)
            chunks = here / sceil(L / (p * v))
            # the layout gives the L - p v floor(L / (p v)) layers left over one each to chunks
            # 1, 2, ... (model order, round-robin over the stages): the last stage, which also
            # runs the output layer, holds v floor(L / (p v)) + floor((left + 1) / p) of them
            # (floor(L / p) when the chunks are even or v = 1). Memory is priced at ceil(L / p)
            # layers on the first stage's micro-batches: with uneven chunks the stage holding
            # the most layer-micro-batches in the interleaved warm-up may be the second.
            whole_chunks = sfloor(L / (p * v))
            last = _if(v > 1, v * whole_chunks
                       + sfloor((L - p * v * whole_chunks + 1) / p), fewer)

            def slowest(per_layer, again=0, tail=logit):
                cost = _stage_cost(per_layer, again, recomputed if partial else None)
                return _if(p > 1, _max(cost(here), cost(last) + tail), cost(L) + tail)

        if c.ep_overlap:  # what outlasts the other micro-batch's layer, in the steady state
            ep_layer = ep_overlapped(ep_layer, layer)

        # --- activation offload: what Megatron offloads of each layer's saved activations goes
        # to host memory during the forward and comes back before its backward over the
        # device's share of the host link, hidden behind that layer's forward / backward
        # compute where shorter ---
        saved = self.activation_bytes_per_layer(c.recompute)
        off_layer, moved = G.Integer(0), G.Integer(0)
        if c.offload_activations:
            moved = self.offloaded_bytes_per_layer(c.recompute)
            copy = moved / hw.host_bw
            off_layer = _max(0, copy - fwd) + _max(0, copy - (layer - fwd))

        # per layer (kept, and the extra of a recomputed one): compute, then each
        # communication term, cumulated for the breakdown
        if partial:
            kept = (layer - fwd, tp_kept, cp_kept, ep_kept, off_layer)
            again = (fwd, tp_layer - tp_kept, cp_layer - cp_kept, ep_layer - ep_kept, 0)
        else:
            kept, again = (layer, tp_layer, cp_layer, ep_layer, off_layer), (0,) * 5
        # the last stage's tail: the output layer, then the multi-token prediction depths
        stage, compute_stage, tp_stage, cp_stage, ep_stage = (
            slowest(sum(kept[:k]), sum(again[:k]), logit + sum(mtp_kept[:k]))
            for k in (5, 1, 2, 3, 4))

        # --- pipeline point-to-point: b s h / t per chunk boundary, forward and backward.
        # Without sequence parallelism the boundary tensor is whole on each of the t ranks:
        # each sends its 1 / t and the receiving stage all-gathers it over the scale-up link
        # before its first layer (Narayanan et al. SC21, sec. 4.1, scatter / gather); with
        # it, each rank's sequence shard is all its next stage needs ---
        send = size / t
        regather = G.Integer(0)
        if not c.sequence_parallel:
            regather = all_gather(t, size, hw.intra_lat, hw.intra_bw)
            regather = _if(t > 1, self._kernel(regather, False), 0)
        p2p = _if(p > 1, 2 * v * (hop(hw, within_domain(hw, t * self.cp * p), DEVICE, send)
                                 + regather), 0)
        # interleaved, the sends overlap the chunks' compute (Megatron-LM's default
        # overlap_p2p_comm, which it turns off without interleaving: arguments.py at d98e8a6):
        # per chunk, its two sends behind its forward and backward, v of them a slot
        if c.pp_overlap:
            p2p = _if(v > 1, overlapped(p2p, stage, slow), p2p)
        slots = m + (p - 1) / chunks

        # --- an evaluation step: the forward of every micro-batch through the pipeline, its
        # forward collectives and sends (half of p2p), nothing saved, reduced or stepped (what
        # MLPerf logs as validation_step_time). The all-to-all overlap is a training schedule
        # (Megatron-LM runs its combined 1F1B only `not forward_only`: schedules.py at
        # d98e8a6), so an evaluation step's exchanges show; ZeRO 3's gathers are added below ---
        fwd_layer = fwd + parts.tp_forward + cp_fwd + parts.ep_forward
        forward_stage = slowest(fwd_layer, 0, logit_fwd + mtp_forward)
        forward = slots * (forward_stage + p2p / 2)

        # --- data parallel gradient sync: NCCL's ring through every replica ---
        expert_params = here * experts_per_layer / (self.etp * ep)
        # the embedding and output layer, vocabulary-parallel over tp: the first stage holds
        # the embedding, the last the output layer (tied: a copy of the embedding, Megatron-LM's
        # shared word embeddings), one stage both (and, tied, once)
        emb, head = md.embedding_params(), md.head_params()
        head_copy = head + (md.vocab * h if md.tied_embeddings else 0)
        outer = _if(p > 1, max(emb, head_copy), emb + head) / t
        local_params = here * (md.layer_params() - experts_per_layer) / t + outer + expert_params
        # multi-token prediction: the last stage also holds the depths (their routed experts
        # split e_t e_p ways like the layers') and, pipelined and untied, a copy of the
        # embedding they read (gpt_model.py builds it where mtp_process): the busier of the
        # first and the last stage then holds the most
        expert_state, mtp_whole, mtp_last = expert_params, G.Integer(0), G.Integer(0)
        # the weights Transformer Engine quantizes on the stage that holds the most: its
        # layers' (and the multi-token prediction depths', not their embedding copy)
        quantized_params = here * layer_weights
        if md.mtp_layers:
            mtp_experts = (md.mtp_layers * md.experts * md.expert_params()
                           * sum(k.ffn == "moe" for k in md.mtp_kinds()))
            mtp_exp = G.Integer(mtp_experts) / (self.etp * ep)
            mtp_whole = G.Integer(md.mtp_params() - mtp_experts) / t + mtp_exp
            mtp_last = mtp_whole + G.Integer(0 if md.tied_embeddings else md.vocab * h) / t
            share = ((md.layer_params() - experts_per_layer) / t
                     + experts_per_layer / (self.etp * ep))
            first_params = here * share + G.Integer(emb) / t
            last_params = last * share + G.Integer(head_copy) / t + mtp_last
            local_params = _if(p > 1, _max(first_params, last_params), local_params + mtp_whole)
            quantized_params = _if(p > 1, _max(here * layer_weights,
                                               last * layer_weights + mtp_whole),
                                   quantized_params + mtp_whole)
            last_experts = last * experts_per_layer / (self.etp * ep) + mtp_exp
            expert_state = _if(p > 1, _max(expert_params, last_experts), expert_params + mtp_exp)
        if c.fp8_output_proj:
            # the LM head as a Transformer Engine linear caches its MXFP8 copies like the
            # layers' (the depths reuse the same output weight): on the last stage
            head_q = G.Integer(md.vocab * h) / t
            quantized_params = _if(p > 1, _max(quantized_params,
                                               last * layer_weights + mtp_whole + head_q),
                                   quantized_params + head_q)
        # the parameters that train: all, or with frozen base weights the LoRA adapters (of
        # each adapted projection, A of QKV and B of the output projection whole on every tp
        # rank, the other split: NeMo's LoRA on column- / row-parallel linears)
        train = local_params
        if c.lora_rank:
            r = c.lora_rank
            attn = sum(n for k, n in md.layer_kinds() if k.mixer in ("attention", "sliding"))
            per_layer = r * 2 * h + G.Integer(r * (2 * md.q_dim + 2 * md.kv_dim)) / t
            train = here * G.Rational(attn, L) * per_layer
        master = 4 if vb < 4 else 0
        kappa = 4 * OPTIMIZER_STATE[c.optimizer] + master
        if c.optimizer == "muon" and not c.lora_rank:
            # Muon steps the layers' matrices; the embedding and output layer take AdamW
            # (Liu et al. 2025, sec. 2.2): their share of the state at Adam's width
            kappa = (kappa * (train - outer) + ADAM_STATE_BYTES[vb < 4] * outer) / train
        # Muon's Newton-Schulz orthogonalisation of the stage's matrices, as 16-bit GEMMs at
        # the large-GEMM rate (an fp8 recipe quantises only the layers' GEMMs), the work split
        # over the tp ranks (and by ZeRO over the replicas, as the optimizer step is: Liu et
        # al. 2025's distributed Muon)
        muon = G.Integer(0)
        if c.optimizer == "muon" and not c.lora_rank:
            muon = (here * G.Rational(md.muon_step_flops(), L) / t
                    / hw.sixteen_bit_flops)
        # bytes per weight as the devices hold and all-gather them: with the fp8 gather the
        # layers' weights in the recipe's format (Transformer Engine's Float8Tensor / NVFP4
        # parameters, `Precision.held_weight_bytes`; their norms, biases and router, under
        # 0.1 %, counted with them), the embedding and output layer at 16 bits (Megatron-LM
        # keeps them outside TE's quantized modules)
        layer_wb = G.const(hw.held_weight_bytes) if c.fp8_weight_gather else vb
        wb = ((layer_wb * (local_params - outer) + vb * outer) / local_params
              if c.fp8_weight_gather else vb)
        # the trained weights' bytes as stepped and gathered: LoRA's adapters stay 16-bit
        # whatever format its frozen base weights are held in
        train_wb = vb if c.lora_rank else wb
        # the cached quantized copies of the layers' weights (Transformer Engine's weight
        # workspace, `Precision.weight_copy_bytes`); weights held in fp8 are their rowwise
        # copy already, so only the rest (Hopper's transpose, MXFP8's columnwise copy)
        copy_bytes = G.const(max(quantized - held, 0) if cached else 0)
        weight_copies = quantized_params * copy_bytes

        # --- memory per device (first stage: most micro-batches in flight) ---
        def _in_flight(rank):
            """Micro-batches (in whole stages) whose activations stage `rank` holds at its
            peak. 1F1B: min(p - rank, m). Interleaved (Megatron-LM's schedules.py): a warm-up
            of 2 (p - rank - 1) + (v - 1) p chunk forwards (one more with the all-to-all
            overlap), one more in the steady state, all m v at once when they do not
            outnumber it (m = p runs every forward first); for m >= p + (p - 1) / v on rank 0
            that is Korthikanti et al.'s 1 + (p - 1) / (p v) x p."""
            warmup = 2 * (p - rank - 1) + (v - 1) * p + int(c.ep_overlap)
            return _if(v > 1, smin(m * v, warmup + 1) / v,
                       smin(p - rank, m))

        act_layer = saved - moved  # what stays on the device
        # a fully recomputed layer rebuilds its full activations during backward
        rebuilt = self.activation_bytes_per_layer("none") if full else 0
        # stored per micro-batch by a stage of n layers (partial: the kept layers whole)
        held = _stage_cost(rebuilt if partial else act_layer, act_layer - rebuilt,
                           recomputed if partial else None)
        # beside the held micro-batches, one layer's transient tensors: the fully recomputed
        # layer's rebuilt activations, the paged stash's layer in its budget-sized buffers
        transient = rebuilt + self.stash_working_bytes()
        # fp32 logits of one micro-batch on the last stage, once per multi-token prediction
        # depth too, with each depth's block activations
        logits = mtp_logits = (
            4 * tok * G.Integer(md.vocab) / t * (1 + md.mtp_layers)
            + (md.mtp_layers * sum(self.kind_activation_bytes(c.recompute, k)
                                   for k in md.mtp_kinds()) if md.mtp_layers else 0))
        gpipe = c.schedule == "gpipe"
        # the last stage holds its own warm-up's micro-batches and their logits (1F1B runs
        # each micro-batch's loss backward right after its forward: one at a time)
        on_last = m if gpipe else _in_flight(p - 1)
        logits = logits * m if gpipe else logits
        if not c.uneven:
            acts = held(here) * (m if gpipe else _in_flight(0)) + transient
            acts = _max(acts, held(here) * on_last + transient + logits)
        else:  # the first two stages (the most in flight) and the last
            if gpipe:
                acts = held(here) * m
            else:
                acts = _max(held(first) * _in_flight(0), held(middle) * _in_flight(1))
            acts = _max(acts + transient, held(last) * on_last + transient + logits)
        if c.offload_activations:  # and the moved part of the layer computing and of the one in transfer
            acts = acts + 2 * moved

        # the aggregates the forms are written in, as expressions of the plan
        self.aggregates = {
            # the gradient sync as an allreduce of M bytes: the gradients allreduced, or with
            # ZeRO reduce-scattered (gamma_g) and the updated weights all-gathered (delta), half
            # a ring each (Rajbhandari et al. 2020, sec. 7); ZeRO-3 only reduce-scatters (the
            # next forward's gathers, priced per micro-batch, bring the weights)
            S.tau: stage, S.tau_p2p: p2p,
            S.M: train * (gb if not c.zero else (gb + train_wb) / 2 if c.zero < 3
                          else G.Rational(gb, 2)),  # ZeRO-3 gathers in each pass
            # gradients are reduced over the d c_p ranks holding the same weights
            S.r: smin(_max(sfloor(u / (t * p)), 1), d * self.cp),
            S.beta_i: hw.intra_bw, S.alpha_i: hw.intra_lat, S.beta: across_bw(hw, DEVICE),
            S.alpha: hw.inter_lat,
            S.H: (grads * proj + core_bwd + elem_bwd) * here,  # one micro-batch's backward
            S.ell: here,
            # read/write master, moments, gradient; write the 16-bit copy
            S.T_opt: train * (2 * kappa + 2 * gb + train_wb) / hw.mem_bw + muon,
            S.Psi: local_params, S.Psi_t: train, S.delta: wb, S.gamma_g: gb, S.kappa: kappa,
            S.A_act: acts, S.W_q: weight_copies,
            S.sigma: hw.overlap_slowdown,
            # the training loop's one host sync a step (`host_sync`): the host's time after
            # it, which the device waits for (`KernelCosts.step_sync_us`); an evaluation step
            # has none (NeMo's validation steps, as logged, show none)
            S.T_sync: (G.Float(hw.step_sync_s) if hw.step_sync_s and c.host_sync
                       else G.Integer(0)),
        }
        if c.dp_shard:  # HSDP: the shard group is d_s replicas' c_p ranks each
            self.aggregates[S.z] = S.d_s * self.cp
        # the routed experts' share of M, reduced over the t c_p d / (e_t e_p) ranks holding
        # the same experts (HSDP splits that group into the same d / d_s instances; with LoRA
        # the experts are frozen base weights)
        experts = bool(moe) and not c.lora_rank
        if experts:
            group = t * self.cp * d / (self.etp * ep)
            self.aggregates.update({
                S.M_e: self.aggregates[S.M] * expert_state / train, S.d_e: group,
                S.r_e: smin(_max(sfloor(u / (self.etp * ep * p)), 1), group)})
        # the forms' d is the group the gradients are reduced and ZeRO-sharded over: d c_p
        # (Megatron-LM's data-parallel group with context parallelism)
        whole = lambda form: substitute(form, {**self.aggregates, d: d * self.cp})  # noqa: E731
        if c.zero == 3:
            # ZeRO 3 gathers each layer's weights in every micro-batch's forward, an evaluation
            # step's too: one of the two all-gathers `exposed_form` prices, behind the
            # micro-batch's forward but for the first layer's (FSDP's forward prefetch)
            gather = allreduce_form(S.Psi * S.delta, *_shard_group(c)) / 2
            shown = (smin(gather, overlapped(gather, forward_stage, S.sigma) + gather / S.ell)
                     if c.overlap else gather)
            forward = forward + whole(m * shown)
        self.forms = {"time": time_form(c, experts), "memory": memory_form(c)}
        shard = _shards(c)

        def experts_unsharded(per_param, stage):
            # ZeRO shards the routed experts' state over the t c_p d / (e_t e_p) ranks holding
            # the same experts (Megatron's expert-data-parallel group), not over d c_p: the
            # forms shard every parameter d c_p ways, so add what differs (0 at e_t e_p = t)
            # (with HSDP both groups shrink by the d / dp_shard replicating groups)
            group = (S.d_s if c.dp_shard else d) * self.cp
            return (expert_state * per_param * (self.etp * ep / t - 1) / group
                    if c.zero >= stage else G.Integer(0))

        opt_extra = experts_unsharded((2 * kappa + 2 * gb + layer_wb) / hw.mem_bw, 1)
        state_extra = {"weights": experts_unsharded(layer_wb, 3),
                       "gradients": experts_unsharded(gb, 2),
                       "optimizer_state": experts_unsharded(kappa, 1)}
        # one stage's parts per layer, for plans whose stages differ (`planner.cost.pools`
        # assembles them with the forms above): a pipeline over several kinds of device
        self.stage_parts = {
            "layer_time": sum(kept), "logit_time": logit + sum(mtp_kept),
            "layer_backward": grads * proj + core_bwd + elem_bwd,
            "layer_params": (md.layer_params() - experts_per_layer) / t
            + experts_per_layer / (self.etp * ep),
            "embedding_params": G.Integer(emb) / t,
            "head_params": G.Integer(head_copy) / t + mtp_last,
            "single_params": G.Integer(emb + head) / t + mtp_whole,
            "layer_activations": act_layer, "transient_activations": transient,
            "logit_activations": mtp_logits,
            "send_bytes": send, "regather": regather,
            "grad_bytes": G.Integer(gb), "weight_bytes": wb,
            "state_bytes": kappa,
            "optimizer_per_param": (2 * kappa + 2 * gb + train_wb) / hw.mem_bw,
            "weight_copy_bytes": copy_bytes, "mtp_params": mtp_whole,
            "host_sync": self.aggregates[S.T_sync],
        }
        memory = whole(self.forms["memory"]) + sum(state_extra.values())
        return {
            **self.stage_parts,
            "time": substitute(self.forms["time"], {**self.aggregates, d: d * self.cp,
                                                    v: chunks}) + opt_extra,
            "compute": m * compute_stage,
            "tp_comm": m * _max(0, tp_stage - compute_stage),
            "cp_comm": m * _max(0, cp_stage - tp_stage),
            "ep_comm": m * _max(0, ep_stage - cp_stage),
            "offload": m * _max(0, stage - ep_stage),
            "pp_bubble": (p - 1) / chunks * stage,
            "pp_comm": slots * p2p,
            "forward": forward,
            "dp_comm_exposed": whole(exposed_form(c, experts)),
            "optimizer": whole(S.T_opt / shard[1]) + opt_extra,
            "memory": memory,
            "weights": (whole(S.Psi * S.delta / shard[3] + S.W_q)
                        + state_extra["weights"]),
            "gradients": whole(S.Psi_t * S.gamma_g / shard[2]) + state_extra["gradients"],
            "optimizer_state": (whole(S.Psi_t * S.kappa / shard[1])
                                + state_extra["optimizer_state"]),
            "activations": acts,
            # the memory with the gradients whole: a ZeRO 2 plan's at ZeRO 1 (the same time,
            # stage 1 moving what stage 2 moves), which the search's covered plan needs
            "memory_zero1": (memory - state_extra["gradients"]
                             + whole(S.Psi_t * S.gamma_g * (1 - 1 / shard[2]))),
        }

    def _unfused_accumulation(self) -> G.Expr:
        """Unfused gradient accumulation (Megatron-LM --no-gradient-accumulation-fusion;
        PyTorch autograd and FSDP2 accumulate so): each weight-gradient GEMM writes its
        gradient at the model's width and a kernel per weight reads it and adds it into the
        main gradient, where the fused GEMM adds in its epilogue (which reads and writes the
        main gradient either way): 2 vb bytes more per weight of the mean layer on this
        device (the routed experts split e_t e_p ways), per micro-batch, and one kernel per
        linear weight (two per mixer and per dense FFN, two per local expert, the router and
        LatentMoE's two projections)."""
        md, vb = self.model, self.hw.value_bytes
        moe = sum(n for k, n in md.layer_kinds() if k.ffn == "moe")
        experts = G.Rational(moe * md.experts * md.expert_params(), md.layers)
        weights = (md.layer_params() - experts) / t + experts / (self.etp * self.ep)
        kernels = sum(n * ((2 if k.mixer else 0) + (2 if k.ffn == "dense" else 0)
                           + (2 * md.experts / self.ep + 1 + (2 if md.moe_latent else 0)
                              if k.ffn == "moe" else 0))
                      for k, n in md.layer_kinds()) / md.layers
        return self._kernels(kernels, 2 * vb * weights)


def _stage_cost(per_layer, again, recomputed):
    """A stage's cost as a function of its n layers: n x `per_layer`, plus `again` for each of
    its `recomputed(n)` recomputed layers (partial recomputation; None: none apart)."""
    if recomputed is None:
        return lambda n: n * per_layer
    return lambda n: n * per_layer + recomputed(n) * again


def _shards(c: Choices) -> dict[int, G.Expr]:
    """What ZeRO stage 1 (optimizer state), 2 (+ gradients) and 3 (+ weights) divide by
    (Rajbhandari et al. 2020, sec. 5): the d replicas, or with HSDP the z of one group."""
    group = S.z if c.dp_shard else d
    return {stage: group if c.zero >= stage else G.Integer(1) for stage in (1, 2, 3)}


def _shard_group(c: Choices) -> tuple[G.Expr, G.Expr]:
    """(ranks, ranks on one node) of the group ZeRO shards over: all d replicas, or HSDP's z
    neighbouring ones (Megatron-LM's intra-instance group: consecutive data-parallel ranks)."""
    if not c.dp_shard:
        return d, S.r
    return S.z, smin(S.r, S.z)


def sync_form(c: Choices, experts: bool = False) -> G.Expr:
    """The gradient sync of one iteration: `allreduce_form` of M over the d replicas.
    `experts`: the routed experts' M_e of M goes over their own d_e ranks, r_e of them on a
    domain (Megatron-LM's distributed.py keeps the expert-parallel parameters in their own
    buffers, reduced over the expert data-parallel group: strided by e_t e_p, so past
    e_t e_p >= u each rank's share crosses its NIC). With HSDP each group is split into the
    same d / z instances (`_hsdp_sync`); one instance (z = d) is exactly the sync without."""
    dense = S.M - S.M_e if experts else S.M
    if not c.dp_shard:
        sync = allreduce_form(dense, d, S.r)
        return sync + allreduce_form(S.M_e, S.d_e, S.r_e) if experts else sync
    grads = S.Psi_t * S.gamma_g  # the gradient bytes M's all-reduce across instances moves
    if not experts:
        return _hsdp_sync(S.M, grads, S.z, d, S.r)
    # the expert data-parallel group in the same d / z instances; each part its share of grads
    return (_hsdp_sync(dense, grads * dense / S.M, S.z, d, S.r)
            + _hsdp_sync(S.M_e, grads * S.M_e / S.M, S.d_e * S.z / d, S.d_e, S.r_e))


def _hsdp_sync(size, grads, z, ranks, per_node) -> G.Expr:
    """HSDP's sync of one group of `ranks` (`per_node` of them on a node) split into
    instances of z: the reduce-scatter of `size` bytes (and ZeRO 1 / 2's all-gather of the
    weights) inside each instance, then each rank's 1 / z shard of the `grads` bytes
    allreduced across the ranks / z instances, one rank of each, max(1, per_node / z) of them
    on a node (Megatron-LM param_and_grad_buffer.py with num_distributed_optimizer_instances
    > 1; PyTorch HSDP)."""
    return (allreduce_form(size, z, smin(per_node, z))
            + allreduce_form(grads / z, ranks / z, _max(sfloor(per_node / z), 1)))


def allreduce_form(size: G.Expr = S.M, ranks: G.Expr = d, per_node: G.Expr = S.r
                   ) -> G.Expr:
    """The data-parallel gradient allreduce as NCCL runs it: one ring through all d replicas,
    r of them on each of the ceil(d / r) nodes. Every replica moves 2 (d - 1) / d M bytes over
    NVLink, and each node's NICs carry that for its r replicas; the pipelined chunks keep both
    busy at once, so the slower sets the pace while every step's latency adds:
    2 (r - 1) alpha_i + 2 (N - 1) alpha + 2 (d - 1) / d M max(1 / beta_i, 1 / (r beta)), the
    NIC term only beyond one node. On one node this is the ring over the node's replicas. Checked
    against published nccl-tests bus bandwidths (docs/nccl-check.md). `size`: the bytes (a
    reduce-scatter and an all-gather of `size` each move half of this). `ranks`, `per_node`:
    another group than the d replicas, r of them on a node (HSDP's)."""
    nodes = sceil(ranks / per_node)
    latency = 2 * (per_node - 1) * S.alpha_i + 2 * (nodes - 1) * S.alpha
    return latency + 2 * (ranks - 1) / ranks * size * G.Max(
        1 / S.beta_i, _if(ranks > per_node, 1 / (per_node * S.beta), 0), evaluate=False)


def sync_window() -> G.Expr:
    """The backward the overlapped gradient sync runs behind. A stage's gradients are ready
    at the end of its last micro-batch's backward, whose bucketed reduce hides the sync (H);
    with v interleaved chunks, Megatron-LM's schedule runs the last min(m, p) micro-batches'
    backward chunk by chunk (pipeline_parallel/schedules.py enables each chunk's grad sync at
    its last micro-batch, one bucket group per chunk), so the last chunk's gradients are ready
    (v - 1) min(m, p) H / v before the end and each chunk's reduce runs behind the chunks
    still in backward: W = H (1 + (v - 1) min(m, p)) / v (H at v = 1)."""
    return S.H * (1 + (v - 1) * smin(m, p)) / v


def exposed_form(c: Choices, experts: bool = False) -> G.Expr:
    """Data-parallel communication left exposed: overlapped, the sync beyond the backward of
    `sync_window` (and never less than the sigma / (1 + sigma) share the slowed compute
    beside it pays, nor than the last chunk's own 1 / v beyond its backward). ZeRO-3 gathers
    the weights again in every micro-batch's forward and backward (an all-gather is half a
    ring allreduce, two of them), hidden behind that micro-batch's forward and backward, 3/2
    H, when overlapped (Rajbhandari et al. 2020, sec. 7.2.3); each layer's gather is
    prefetched behind the layer before it, so the first layer's, in the forward and in the
    backward (two all-gathers of one of the stage's ell layers: sync / ell), shows in every
    micro-batch (PyTorch FSDP's forward / backward prefetch). The gathers move the weights at
    their own width, inside the shard group."""
    sync = sync_form(c, experts)
    exposed = sync
    if c.overlap:  # behind the backward; the last chunk's share behind its own at least
        exposed = _max(overlapped(sync, sync_window(), S.sigma), (sync - S.H) / v)
    if c.zero == 3:
        # two all-gathers of the weights
        gather = allreduce_form(S.Psi * S.delta, *_shard_group(c))
        hidden = smin(gather, overlapped(gather, G.Rational(3, 2) * S.H, S.sigma)
                      + gather / S.ell)
        exposed = exposed + m * (hidden if c.overlap else gather)
    return exposed


def time_form(c: Choices, experts: bool = False) -> G.Expr:
    """The iteration time: (m + (p - 1) / v) pipeline slots of one micro-batch's stage time
    and sends (Narayanan et al. SC21, eq. 1-2), the exposed data-parallel communication, the
    optimizer step on the ZeRO shard, and the host's time after the step's sync. `experts`:
    the routed experts' gradients synced over their own group (`sync_form`)."""
    return ((m + (p - 1) / v) * (S.tau + S.tau_p2p) + exposed_form(c, experts)
            + S.T_opt / _shards(c)[1] + S.T_sync)


def memory_form(c: Choices) -> G.Expr:
    """Bytes per device: weights (delta), gradients (gamma_g) and optimizer state (kappa) per
    parameter, sharded by the ZeRO stage (Rajbhandari et al. 2020, sec. 3.1 and 5), the
    quantized copies of the layers' weights an fp8 / fp4 recipe caches (W_q, never sharded),
    plus the activations of the first stage."""
    shard = _shards(c)
    return (S.Psi * S.delta / shard[3] + S.W_q
            + S.Psi_t * (S.gamma_g / shard[2] + S.kappa / shard[1]) + S.A_act)


def build_program(model, hw, choices: tuple[Choices, ...], outputs: tuple[str, ...] = OUTPUTS
                  ) -> Compiled:
    """One numpy program computing `outputs` (default: all) of every choice in `choices`,
    named "j/output" for choice j: the sub-expressions the choices share (the matmul
    rooflines, the stage's layers, the allreduce) are computed once for all of them. Built
    from the expressions each time; `planner.cost.programs.program` keeps them."""
    exprs = {f"{j}/{k}": e for j, c in enumerate(choices)
             for k, e in expressions(model, hw, c).terms.items() if k in outputs}
    return G.compile_graphs(exprs, PLAN_SYMBOLS)


@functools.lru_cache(maxsize=256)
def expressions(model, hw, choices: Choices) -> TransformerExpressions:
    """The expressions of one choice, built once per process: the search's program for a
    batch of choices and the winner's own program (every output) share them."""
    return TransformerExpressions(model, hw, choices)
