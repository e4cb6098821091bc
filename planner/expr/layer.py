"""One transformer layer's costs as expressions (`planner.expr.graph`): its matmuls by
roofline, its elementwise kernels, its tensor- and expert-parallel collectives and its stored
activations, per micro-batch on one device, for each categorical choice of `Choices`.
`planner.expr.transformer` assembles them into the iteration (stages, pipeline, data
parallelism, memory); the physics of each term is in its docstring and in that module's."""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import NamedTuple

from planner.expr import graph as G
from planner.expr.choices import RECOMPUTE, SCHEDULES, Choices  # noqa: F401 (re-exported)
from planner.expr.collectives import ring_allreduce
from planner.expr.domain import whole_nodes, within_domain
from planner.expr.roofline import bound
from planner.expr.unordered import smax, smin
from planner.expr.vocab import b, c_p, e_p, e_t, t
from planner.spec.hardware import gemm_share

# backward traffic of elementwise kernels over the forward's: a backward kernel reads the saved
# input and the incoming gradient and writes one gradient (3 tensors where forward moves 2)
ELEMENTWISE_BACKWARD = 1.5


def _max(*args):
    return smax(*args)  # unevaluated and unsorted: planner.expr.unordered


def _if(cond, then, otherwise):
    """`then` where `cond` holds, else `otherwise` (a condition that is a constant decides at
    once; as SymPy, `planner.expr.graph.to_sympy` builds it unevaluated otherwise: its
    evaluation would only put the relations in canonical order)."""
    return G.Piecewise((then, cond), (otherwise, True))


def overlapped(comm, window, slowdown):
    """What a collective of `comm` seconds adds to the `window` seconds of compute it overlaps.
    Compute runs 1 + slowdown times slower while the collective's kernels share the device (they
    hold SMs and HBM bandwidth: Lee et al. 2025, "Characterizing compute-communication overlap
    in GPU-accelerated distributed deep learning", arXiv 2507.03114, 18.9 % on average over
    A100, H100, MI250 and MI210; 24 of an H100's 132 SMs for one NCCL all-gather is 18 %), so
    over comm seconds of overlap it loses comm slowdown / (1 + slowdown): the pair takes
    max(window + comm slowdown / (1 + slowdown), comm), not max(window, comm)."""
    return _max(comm * slowdown / (1 + slowdown), comm - window)


RING, DEVICE = "ring", "device"  # how a group's traffic crosses the NICs (`across_bw`)


def across_bw(hw, crossing: str):
    """The NIC bandwidth one rank's traffic gets where its group leaves the scale-up domain: a
    ring that enters and leaves each node once (a tp or etp group holding all g devices of
    its nodes: NCCL runs a channel per NIC) has the node's whole NICs, no faster than the
    scale-up hops that feed them (`RING`); traffic every device of a node sends at once
    (all-to-all, point-to-point, the data-parallel sync) a 1 / g share (`DEVICE`)."""
    return min(hw.nic_bw, hw.intra_bw) if crossing == RING else hw.nic_bw / hw.g


@functools.lru_cache(maxsize=256)
def ring_link(hw, size):
    """(bandwidth, latency) of a ring over a group of `size` consecutive ranks: the scale-up
    link within a domain (`within_domain`); a group of whole nodes beyond it the node's NICs
    (`RING`); a group straddling a boundary with part of a node (tp 3 on 8-GPU nodes) only a
    device's share of them (`DEVICE`): its crossing ranks' own NICs, the rest of the node's
    serving the other groups. Kept per (rates, size): every choice's layers ask the same."""
    (inside, whole), part = links(hw, RING), links(hw, DEVICE)[1]
    pick = ((inside, within_domain(hw, size)), (whole, whole_nodes(hw, size)), (part, True))
    return tuple(G.Piecewise(*((link[k], cond) for link, cond in pick)) for k in (0, 1))


def links(hw, crossing: str):
    """((bandwidth, latency) inside the scale-up domain, the same across it): the one place
    a group's link is chosen (tp, ep, etp, cp, pp and the data-parallel sync's symbols)."""
    return (hw.intra_bw, hw.intra_lat), (across_bw(hw, crossing), hw.inter_lat)


def hop(hw, within, crossing: str, size, size_across=None):
    """One message of `size` bytes (`size_across` where it leaves the domain, if that
    differs): on the scale-up link where `within` holds, else over the NICs."""
    (bw_in, lat_in), (bw_out, lat_out) = links(hw, crossing)
    return _if(within, lat_in + size / bw_in,
               lat_out + (size if size_across is None else size_across) / bw_out)


def ring(ranks, size, bw, lat):
    """Ring allreduce of `size` bytes over `ranks` at bandwidth `bw` and latency `lat`: the one
    formula of `planner.expr.collectives` (exactly 0 on one rank)."""
    return ring_allreduce(ranks, size, lat, bw)


class LayerParts(NamedTuple):
    """One layer's costs per micro-batch on one of its t devices."""

    proj: G.Expr  # the projections' and the FFN's GEMMs, forward
    core: G.Expr  # the attention core or the SSM scan, forward
    elem: G.Expr  # the elementwise kernels, forward
    elem_bwd: G.Expr  # the elementwise kernels, backward
    tp: G.Expr  # the tensor-parallel collectives, every pass
    ep: G.Expr  # the expert-parallel exchanges, every pass
    core_bwd: G.Expr  # the attention core's (or scan's) backward
    tp_forward: G.Expr  # the forward's share of `tp` (an evaluation step's)
    ep_forward: G.Expr  # the forward's share of `ep`: the dispatch and the combine
    again: G.Expr  # what the recompute modules run again in the backward


class LayerCosts:
    """The per-layer expressions of one (model, hardware rates, choices)."""

    def __init__(self, model, hw, choices: Choices, cp: G.Expr = c_p, ep: G.Expr = e_p,
                 etp: G.Expr = e_t):
        """`cp`, `ep`, `etp`: the context-, expert- and expert-tensor-parallel degrees, the
        symbols c_p, e_p and e_t or numbers (limits fix them; etp = t is Megatron's default)."""
        self.model, self.hw, self.choices = model, hw, choices
        self.cp, self.ep, self.etp = (G.of(x) for x in (cp, ep, etp))
        # tokens of one micro-batch on one device: context parallelism splits the sequence
        self.tokens = b * model.seq_len / self.cp
        self.capacity = (G.Integer(1) if choices.capacity_factor == 1
                         else G.Float(choices.capacity_factor))
        self.routed_held = self._routed_held()
        self.tp_ring = self._tp_ring()

    def _routed_held(self) -> G.Expr:
        """The routed experts' saved activations as held, over their count at the tokens
        routed (balanced, or padded to the capacity factor): Megatron-LM's sync-free path
        (`rank_capacity`) saves them in the dispatch and fused grouped experts' buffers,
        sized once at the rank's budget (`--moe-expert-rank-capacity-factor` x the balanced
        count: token_dispatcher.py `num_permuted_tokens`); the paged stash (`paged_stash`)
        packs them into pages sized at its own factor of the balanced count at the
        schedule's peak (paged_stash.py `allocate_stash_buffers` at d98e8a6)."""
        c = self.choices
        if c.paged_stash:
            return G.Float(c.paged_stash)
        return G.Float(c.rank_capacity) if c.rank_capacity else self.capacity

    def _tp_ring(self) -> G.Expr:
        """One ring allreduce of a micro-batch's b s h activations over the t ranks (an
        all-gather plus a reduce-scatter of the same volume with sequence parallelism): on the
        scale-up link while t <= u; a group larger than the domain holds all g devices of each
        of its nodes, and nothing else leaves the node during its collective: NCCL runs one
        ring channel per NIC, so the node's whole NIC bandwidth serves it, the NVLink hops
        being the other bound. A collective is a kernel too (exactly 0 on one rank)."""
        return self._tp_allreduce(self.tokens * self.model.hidden * self.hw.value_bytes)

    def _tp_allreduce(self, size) -> G.Expr:
        """One ring allreduce of `size` bytes over the t ranks of a tensor-parallel group
        (`_tp_ring`), a kernel at least (exactly 0 on one rank)."""
        hw = self.hw
        ring_t = ring(t, size, *ring_link(hw, t))
        return _if(t > 1, self._kernel(ring_t, False), 0) if self._floor_s else ring_t

    def _current_scaling(self) -> bool:
        return bool(self.choices.fp8_current_scaling and self.hw.per_tensor_fp8)

    def _norm_fused(self, kind) -> tuple:
        """(bytes per token, kernels) Transformer Engine's norms save by quantizing their own
        output (`Precision.norm_fused_saving` a value) where Megatron-LM builds the norm into
        the GEMM's module (TELayerNormColumnParallelLinear: the attention's QKV, a Mamba
        mixer's in_proj, a dense FFN's FC1; gpt_layer_specs.py at d98e8a6); a MoE layer's
        pre-FFN norm and multi-head latent attention's input norm are their own modules;
        none with eager kernels."""
        if self.choices.kernels != "fused":
            return (0, 0)
        per_value, kernels = self.hw.norm_fused[1 if self._current_scaling() else 0]
        fused = (int(kind.mixer == "mamba" or (kind.mixer in ("attention", "sliding")
                                                and not self.model.mla))
                 + int(kind.ffn == "dense"))
        return per_value * fused * self.model.hidden, kernels * fused

    def _amax_reduction(self) -> G.Expr:
        """One all-reduce of an fp32 amax over the t ranks: with current scaling and sequence
        parallelism Transformer Engine reduces the amax of each column-parallel input before
        its all-gather (forward) and of each row-parallel output gradient (backward)
        (module/linear.py, layernorm_linear.py at d0067d0: set_quantizer_amax_reduction_group
        with the tp group), one latency-bound collective each, a kernel at least."""
        if not (self._current_scaling() and self.choices.sequence_parallel):
            return G.Integer(0)
        return self._tp_allreduce(4)

    def _tp_comm(self, blocks) -> tuple:
        """Tensor-parallel communication of one layer, every pass: one allreduce-equivalent per
        block (the mixer, a dense or shared-expert FFN) forward and one backward, a second
        forward when the forward is recomputed (Megatron-LM: 4 per layer, 6 recomputed;
        Narayanan et al. SC21 sec. 3.2). With `tp_overlap` each is cut into t chunks pipelined
        with the block's GEMMs, themselves cut into t row chunks (forward time `chunked`,
        backward twice that): the reduce-scatter's last chunk shows (the all-gather's first is
        the rank's own shard), the rest only where it outlasts the GEMM (Wang et al. 2023,
        "Overlap communication with dependent computation via decomposition", sec. 4), and
        the thinner chunked GEMMs' extra time counts here too. Under fp8 current scaling each
        block's amax all-reduces (`_amax_reduction`) come with its collectives.
        In the backward the recipes' Transformer Engine userbuffers run the column-parallel
        GEMMs' collectives in bulk (NVIDIA's MLPerf tp_overlap configs: qkv_dgrad,
        qkv_wgrad, fc1_dgrad, fc1_wgrad `bulk`; training_results_v5.0 conf/tp_overlap/
        h100tp8mbs1.yaml): the dgrad's reduce-scatter beside the whole weight-gradient GEMM,
        unchunked, and only the row-parallel dgrad's all-gather is a chunked ring exchange
        (proj_dgrad, fc2_dgrad `ring_exchange`).
        `blocks`: (GEMM time, chunked, the row-parallel GEMM's time, chunked) per block.
        Returns (every pass, the forward's share: one pass per block, as an evaluation step
        runs the layer)."""
        full, amax = self.choices.recompute == "full", self._amax_reduction()
        total, forward = G.Integer(0), G.Integer(0)
        for block in blocks:
            fwd, bwd = self._tp_passes(*block)
            total += (2 if full else 1) * (fwd + amax) + bwd + amax
            forward += fwd + amax
        return total, forward

    def _tp_passes(self, gemm, chunked, row, row_chunked) -> tuple:
        """(forward, backward) time of one block's tensor-parallel collectives (`_tp_comm`)."""
        ring_t = self.tp_ring
        if not self.choices.tp_overlap:
            return ring_t, ring_t
        slower = chunked - gemm
        # the all-gather's first chunk is the rank's own shard (no wait), the
        # reduce-scatter's last shows: 1 / t of its half of the ring
        first, slow = ring_t / (2 * t), self.hw.overlap_slowdown
        fwd = first + overlapped(ring_t - first, chunked, slow) + slower
        # backward: the row-parallel dgrad's all-gather ring-exchanged with its GEMM in chunks
        # (its first chunk local), the column-parallel dgrad's reduce-scatter in bulk beside
        # the whole weight-gradient GEMMs of the block's other layers
        half = ring_t / 2
        bwd = (first + overlapped(half - first, row_chunked, slow) + row_chunked - row
               + overlapped(half, gemm - row, slow))
        return fwd, bwd

    def _moe_exchange(self) -> G.Expr:
        """Expert-parallel communication of one MoE layer, one exchange (the dispatch or the
        combine of one pass). Megatron-LM's all-to-all dispatcher (moe/token_dispatcher.py):
        each rank sends its sequence-parallel share of the routed tokens (b s top_k h / t; the
        latent width under LatentMoE) to the experts' ranks and gets them back, an all-to-all
        each way over e_p ranks, then all-gathers them over the e_t ranks sharing each expert
        (and reduce-scatters before the combine); not overlapped unless `ep_overlap` (in the
        assembly).
        Megatron folds the expert grid over the
        same ranks as the dense one, e_t fastest then e_p (parallel_state.py, order
        "tp-ep-dp-pp"): the group is inside the scale-up domain while e_t e_p <= u, else the
        share of each rank's peers on other domains goes over the node's NICs."""
        md, hw, ep, et = self.model, self.hw, self.ep, self.etp
        u = hw.scale_up
        routed = self.tokens * md.top_k * md.expert_width * hw.value_bytes * self.capacity / t
        leaves = 1 - _max(u / et, 1) / ep
        a2a = hop(hw, within_domain(hw, et * ep), DEVICE, routed * (ep - 1) / ep,
                  routed * leaves)
        bw, lat = ring_link(hw, et)
        gather = (et - 1) * (lat + routed / bw)
        a2a, gather = self._kernel(a2a, False), self._kernel(gather, False)
        return _if(ep > 1, a2a, 0) + _if(et > 1, gather, 0)

    def _moe_comm(self) -> G.Expr:
        """Every pass's `_moe_exchange`: dispatch and combine, forward and backward (and a
        recomputed forward's two)."""
        return (6 if self.choices.recompute == "full" else 4) * self._moe_exchange()

    def _matmul(self, rows, inner, cols, count=1, kept=False, sixteen=False, native=False):
        """One matmul kernel: FLOPs at the matmul rate or operands at the memory bandwidth,
        whichever is slower (roofline, Williams et al. 2009), and never faster than the host
        issues a kernel. The rate falls with the GEMM's thinnest dimension n as n^2 / (n^2 +
        n_half^2) (`gemm_share`; 1-byte fp8 / fp4 operands take their own n_half,
        `gemm_half_dim_fp8`): a thin operand leaves output tiles and SM waves underfilled and
        the K loop too short to hide its prologue (the saturating curve of vTrain, Bang et al.
        2024, fig. 4, and of the cuBLAS shape sweeps in NVIDIA's matmul performance guide).
        `kept`: one of attention's products, which an fp8 / fp4 recipe keeps out of the GEMMs'
        format (`attention_rate`); `sixteen`: a GEMM the recipe leaves 16-bit (the LM head,
        unless `fp8_output_proj`); `native`: issued by a library's C++ loop (`_kernel`)."""
        hw = self.hw
        if sixteen:
            rate, operand_bytes = self._sixteen_bit()
        else:
            rate, operand_bytes = self.attention_rate() if kept else (
                hw.matmul_flops, 1 if hw.gemm_only else hw.value_bytes)  # fp8 / fp4: 1 byte
        half = hw.gemm_half_dim_fp8 if operand_bytes == 1 else hw.gemm_half_dim
        if half:
            rate = rate * gemm_share(smin(rows, inner, cols), half)
        time = bound(2 * rows * inner * cols * count,
                     operand_bytes * (rows * inner + inner * cols + rows * cols) * count,
                     rate, hw.mem_bw)
        return self._kernel(time, native=native)

    def _kernel(self, work, compute=True, native=False, calls=1):
        """One kernel of `work` seconds, every kernel's time going through here. Issued by
        the host, never faster than the host issues it (`launch_s`: the A100 fit, to eager
        runs, whose large-GEMM rate absorbs what large kernels pay beyond their work). Under
        CUDA graphs the kernels run back to back with no host in the loop, and a compute kernel
        (`compute`) takes its work plus the GPU's fixed time per kernel (`kernel_gpu_s`: its
        start, prologue and last wave; t_0 of `planner.fit_gemm`'s fit of t_0 + work to XLA's
        GEMM tables, about 6 us), but never more than issued by the host: a kernel longer
        than the host's issue time ran back to back in the eager runs the rates were fitted
        to, its t_0 inside them. A collective, whose latency its own terms carry, only has
        t_0 as its floor. `native`: a kernel a library's own C++ loop issues back to back
        (tp overlap's chunk GEMMs), priced as under CUDA graphs without them. `calls` equal
        kernels sharing `work`: calls x each one's time, written as the floors times calls (n
        max(w / n, f) = max(w, n f), one division fewer in every row the search prices)."""
        host, graphs = self.hw.launch_s, self._graphs
        if compute and (graphs or native and self.hw.kernel_gpu_s):
            graphed = work + calls * self.hw.kernel_gpu_s
            return smin(graphed, _max(work, calls * host)) if host else graphed
        return _max(work, calls * self._floor_s) if self._floor_s else work

    @property
    def _graphs(self) -> bool:
        """CUDA graphs issue the kernels and the GPU's own time per kernel is known."""
        return bool(self.choices.cuda_graphs and self.hw.kernel_gpu_s)

    @property
    def _floor_s(self) -> float:
        """The shortest any kernel takes: the host's issue time, or under CUDA graphs (no
        host in the loop) the GPU's own time per kernel where that is shorter."""
        hw = self.hw
        return min(hw.launch_s, hw.kernel_gpu_s) if self._graphs else hw.launch_s

    def attention_rate(self) -> tuple[float, int]:
        """(FLOP/s, bytes per operand) of attention's products as unfused GEMMs: an fp8 / fp4
        recipe keeps them at 16 bits (Transformer Engine quantises only its Linear layers'
        GEMMs: Micikevicius et al. 2022, sec. 4), in fp8 with `fp8_attention` (TE's fp8
        dot-product attention, whatever the GEMMs' format); otherwise the GEMMs' rate."""
        hw = self.hw
        if hw.gemm_only and self.choices.fp8_attention:
            return hw.attention_fp8_flops or hw.matmul_flops, 1
        return self._sixteen_bit()

    def _sixteen_bit(self) -> tuple[float, int]:
        """(FLOP/s, bytes per operand) of a GEMM kept out of an fp8 / fp4 recipe's format: the
        device's 16-bit rate (in a 16-bit or wider recipe, the GEMMs' own)."""
        return self.hw.sixteen_bit_flops, self.hw.value_bytes

    def _kernels(self, count, bytes_moved):
        """`count` memory-bound kernels sharing `bytes_moved` of HBM traffic, each taking at
        least the host's kernel issue time (`_kernel`)."""
        return self._kernel(bytes_moved / self.hw.mem_bw, calls=count)

    def parts(self) -> LayerParts:
        """`LayerParts`, the means over the model's layer kinds (a stage of a mixed model
        holds its kinds in their proportions)."""
        md = self.model
        kinds = md.layer_kinds()
        parts = [self._kind_parts(k) for k, _ in kinds]
        return LayerParts(*(sum(n * part[i] for part, (_, n) in zip(parts, kinds, strict=True))
                            / md.layers for i in range(len(LayerParts._fields))))

    def _kind_parts(self, kind):
        md, tok, hw = self.model, self.tokens, self.hw
        h, a = md.hidden, md.heads
        mm = self._matmul
        proj, core, core_bwd = G.Integer(0), G.Integer(0), None
        # per tp block: (GEMM time, chunked, its row-parallel GEMM's time, chunked); MoE traffic
        blocks, moe_comm, moe_exchange = [], G.Integer(0), G.Integer(0)

        def block(*shapes):
            """A tensor-parallel block's GEMMs (rows, inner, cols), the row-parallel one
            last: their time, noted with their time cut into t row chunks (what --tp-overlap
            runs), the row-parallel GEMM's apart, for `_tp_comm`."""
            times = [mm(*shape) for shape in shapes]
            chunks = times
            if self.choices.tp_overlap:
                # Transformer Engine's userbuffers loop issues the t chunk GEMMs from C++
                # (CommOverlapP2PBase::split_overlap_ag / _rs, common/comm_gemm_overlap/
                # comm_gemm_overlap.cpp at d0067d0), not one per Python op: each its work and
                # the GPU's own time per kernel (`_kernel(native=True)`), the block one host
                # issue at least
                chunks = [t * mm(rows / t, inner, cols, native=True)
                          for rows, inner, cols in shapes]
                if self._floor_s:
                    chunks = [_max(x, self._floor_s) for x in chunks]
            blocks.append((sum(times), sum(chunks), times[-1], chunks[-1]))
            return sum(times)

        if kind.mixer in ("attention", "sliding"):
            if md.mla:  # DeepSeek-V2 sec. 2.1: the down projections are not split by tp
                la = md.mla
                proj += block(
                    (tok, h, (la.q_lora_rank or 0) + la.kv_lora_rank + la.qk_rope_head_dim),
                    *self._mla_up_shapes(),
                    (tok, G.Integer(a * la.v_head_dim) / t, h))
            else:
                proj += block((tok, h, G.Integer(md.q_dim + 2 * md.kv_dim) / t),
                              (tok, G.Integer(md.q_dim) / t, h))
            # each context-parallel rank holds s / c_p queries against all keys (a sliding
            # layer: its window); Megatron's load-balanced causal chunks (2 c_p of them, rank
            # i taking i and 2 c_p - 1 - i) give every rank the same share of the products
            sq, keys = md.seq_len / self.cp, md.attention_keys(kind.mixer)
            if self.choices.flash_attention and hw.flash:
                core, core_bwd = self._flash(kind, sq, keys)
            else:  # flash attention skips the masked tiles on any device
                done = self._keys_done(kind) if self.choices.flash_attention else keys
                core = (mm(sq, md.head_dim, done, b * a / t, kept=True)
                        + mm(sq, done, md.v_head_dim, b * a / t, kept=True))
        elif kind.mixer == "mamba":  # Mamba-2: in_proj (z, x, B, C, dt), out_proj; heads / tp
            d_in, heads = md.mamba_inner(), md.mamba.heads
            proj += block((tok, h, G.Integer(d_in + md.mamba_conv_dim() + heads) / t),
                          (tok, G.Integer(d_in) / t, h))
            # the chunked SSD scan is its own kernel, on the tensor cores (Dao & Gu 2024), in
            # 16 bits under an fp8 / fp4 recipe
            scan = md.ssm_scan_flops() * b / (self.cp * t) / hw.sixteen_bit_flops
            core = self._kernel(scan)
        gates = md.ffn_matrices - 1
        if kind.ffn == "dense":
            f = md.dense_ffn_hidden or md.ffn_hidden
            proj += block((tok, h, G.Integer(gates * f) / t), (tok, G.Integer(f) / t, h))
        elif kind.ffn == "moe":
            # the router on this rank's sequence-parallel tokens; then each of its E / e_p
            # experts as a grouped GEMM on the tokens routed to it, f split e_t ways: top_k of
            # E per token, from the e_p ranks of the group and gathered over e_t, times the
            # capacity factor (few tokens per expert make thin GEMMs). The expert grid spans
            # the same t c_p d ranks as the dense one, so each expert's tokens are shared by
            # t c_p d / (e_t e_p) ranks: b s top_k e_p e_t / (E t c_p) rows each.
            f, experts, et, w = md.ffn_hidden, md.experts, self.etp, md.expert_width
            rows = tok * md.top_k * self.ep * et * self.capacity / (experts * t)
            proj += mm(tok / t, h, experts)
            proj += (mm(rows, w, G.Integer(gates * f) / et, experts / self.ep)
                     + mm(rows, G.Integer(f) / et, w, experts / self.ep))
            if md.moe_latent:  # LatentMoE: h -> l before the dispatch, l -> h after the
                # combine, whole on each rank's sequence-parallel tokens (TE "duplicated")
                proj += mm(tok / t, h, w) + mm(tok / t, w, h)
            if md.shared_experts:  # tensor-parallel like a dense FFN (its own gather/scatter)
                fs = (md.shared_expert_ffn_hidden or f) * md.shared_experts
                proj += block((tok, h, G.Integer(gates * fs) / t), (tok, G.Integer(fs) / t, h))
            moe_comm, moe_exchange = self._moe_comm(), self._moe_exchange()
        traffic = tok * self.elementwise_bytes_per_token(kind)
        # backward: 1.5x the traffic in twice the kernels (each gradient kernel, plus the bias
        # and norm-weight reductions and the residual gradient sums)
        elem = self._kernels(self.elementwise_kernels(kind), traffic)
        elem_bwd = self._kernels(2 * self.elementwise_kernels(kind),
                                 G.Float(ELEMENTWISE_BACKWARD) * traffic)
        if kind.mixer == "attention":  # ring attention merges its steps after them
            merge_fwd, merge_bwd = self._cp_merge()
            elem, elem_bwd = elem + merge_fwd, elem_bwd + merge_bwd
        if kind.mixer in ("attention", "sliding"):  # all-to-all context parallelism's copies
            copies = self._cp_a2a_copies()
            casts_fwd, casts_bwd = self._attention_casts()
            elem, elem_bwd = elem + copies + casts_fwd, elem_bwd + copies + casts_bwd
        if kind.ffn == "moe" and self.choices.paged_stash:  # beside the layer's GEMMs
            stash, slowdown = self._stash_copies(kind), hw.overlap_slowdown
            elem += overlapped(stash, proj, slowdown)
            elem_bwd += overlapped(stash, 2 * proj, slowdown)
        tp_all, tp_forward = self._tp_comm(blocks)
        return LayerParts(proj, core, elem, elem_bwd, tp_all, moe_comm,
                          2 * core if core_bwd is None else core_bwd, tp_forward,
                          2 * moe_exchange, self._recomputed_modules(kind))

    def _stash_copies(self, kind) -> G.Expr:
        """The paged stash's copies of one MoE layer per pass: after the forward its routed
        experts' saved tensors (fc1's input, fc1's output, the activation's output) are
        copied into the stash's pages, before the backward back out (paged_stash.py
        `paged_stash_copy_kernel` / `paged_stash_pop_kernel` at d98e8a6), each a kernel
        reading and writing the tokens routed, on the stash's own streams: they overlap the
        layers' GEMMs as a collective does, slowing them while they share the device
        (`overlapped`)."""
        return self._kernels(3, 2 * self.routed_saved_bytes(kind))

    def stash_working_bytes(self) -> G.Expr:
        """What the paged stash adds to the activations beyond its pages: the MoE layer
        running holds its routed experts' tensors in the buffers sized at the rank's budget
        (`rank_capacity`) until they are copied in (forward) and once copied out
        (backward)."""
        c = self.choices
        if not c.paged_stash:
            return G.Integer(0)
        return self.routed_saved_bytes() * G.Float(c.rank_capacity)

    def _normed_parts(self, kind) -> int:
        """The norms of a layer of `kind` that `recompute_norms` frees and runs again: a
        TransformerLayer's input_layernorm before attention and pre_mlp_layernorm before its
        FFN (Megatron-LM transformer_layer.py at d98e8a6; a Mamba layer's own norm is not)."""
        return int(kind.mixer in ("attention", "sliding")) + int(bool(kind.ffn))

    def _recomputed_modules(self, kind) -> G.Expr:
        """The backward's extra work of Megatron-LM's recompute modules (output-discarding
        checkpoints, tensor_parallel/random.py CheckpointWithoutOutput at d98e8a6), per layer of
        `kind` and micro-batch:
        - `recompute_norms`: each norm once more (read and write h a token), and in an fp8 /
          fp4 recipe its output cast again, the GEMMs having kept the 16-bit original
          (`set_save_original_input`);
        - `recompute_moe_act`: the routed experts' activation once more on their top_k
          tokens (read fc1's output, write f), cast again for fc2's weight gradient in an fp8 /
          fp4 recipe (moe/experts.py);
        - `recompute_mla_up`: MLA's two up projections (q and kv) and RoPE once more
          (multi_latent_attention.py `qkv_up_proj_and_rope_apply`)."""
        md, c, hw, tok = self.model, self.choices, self.hw, self.tokens
        vb, h, gemm = hw.value_bytes, md.hidden, hw.gemm_only
        cast = hw.quantize_bytes if gemm else 0
        work = G.Integer(0)
        if c.recompute_norms and (n := self._normed_parts(kind)):
            work += self._kernels(n * (2 if gemm else 1), tok * n * h * (2 * vb + cast))
        if c.recompute_moe_act and kind.ffn == "moe":
            f_in = (1 if c.fp8_activation_input and gemm else vb) * (md.ffn_matrices - 1)
            rows = tok * md.top_k * self.capacity / t  # this rank's routed copies, f / e_t each
            work += self._kernels(2 if gemm else 1,
                                  rows * md.ffn_hidden * (f_in + vb + cast))
        if c.recompute_mla_up and md.mla and kind.mixer in ("attention", "sliding"):
            work += (sum(self._matmul(*shape) for shape in self._mla_up_shapes())
                     + self._kernels(1, tok * 2 * self._rotary_width() * vb / t))
        return work

    def _mla_up_shapes(self) -> tuple:
        """(rows, inner, cols) of MLA's two up projections on this rank, q (from the q latent,
        or h without one) and kv (keys' no-RoPE part and values), split over tp by heads."""
        la, a = self.model.mla, self.model.heads
        return ((self.tokens, la.q_lora_rank or self.model.hidden,
                 G.Integer(a * (la.qk_nope_head_dim + la.qk_rope_head_dim)) / t),
                (self.tokens, la.kv_lora_rank,
                 G.Integer(a * (la.qk_nope_head_dim + la.v_head_dim)) / t))

    def _cp_merge(self):
        """Forward and backward time of merging ring attention's c_p steps (Transformer
        Engine's AttnFuncWithCPAndKVP2P, context_parallel.py at d0067d0), after the steps'
        kernels (not overlapping the ring: the forward corrections wait for the last step,
        each dk, dv add for its receive). Forward: the first step's output rescaled by its
        softmax statistics, each later one rescaled and added into the output (a fused kernel,
        read 2 and written 1 value of the output's width, in 16 bits); with fp8 attention each
        step's fp8 output dequantised to fp32 first (read 1, write 4), merged in fp32 (read
        8, write 4), the result cast back and quantised again (22 + 17 bytes a later step,
        TE's fp8 path). Backward: each step's dq added into dq and its dk, dv into the buffer
        that travels the ring (read 2, write 1 value). With load-balanced causal chunks the
        steps past a rank's diagonal take half its queries or keys: 3 / 4 of a value a step on
        average (a non-causal layer's whole). Priced as c_p memory-bound kernels a pass (TE
        corrects the output one step at a time), each paying its issue (`_kernels`), as the
        steps' attention calls do (`_flash`). 0 at c_p = 1, and with all-to-all context
        parallelism (`cp_a2a`: one attention call a pass, nothing to merge)."""
        md, vb, cp = self.model, self.hw.value_bytes, self.cp
        if self.choices.cp_a2a:
            return G.Integer(0), G.Integer(0)
        q = self.tokens * G.Integer(md.heads * md.v_head_dim) / t  # output values of a rank
        dq = self.tokens * G.Integer(md.q_dim) / t
        kv = self.tokens * G.Integer(md.kv_dim + md.kv_heads * md.v_head_dim) / t
        later = (G.Rational(3, 4) if md.causal else 1) * (cp - 1)  # in whole-rank sizes
        if self.choices.fp8_attention and self.hw.gemm_only:
            fwd_bytes = q * (22 + 17 * later)
        else:
            fwd_bytes = q * vb * (2 + 3 * later)
        fwd = self._kernels(cp, fwd_bytes)
        bwd = self._kernels(cp, (dq + kv) * 3 * vb * later)
        return _if(cp > 1, fwd, 0), _if(cp > 1, bwd, 0)

    def _cp_a2a_widths(self):
        """(bytes a value, the values of Q, K, V and O on this rank's s / c_p tokens) that
        all-to-all context parallelism exchanges each pass (`cp_a2a`: Transformer Engine's
        AttnFuncWithCPAndQKVOA2A, context_parallel.py at d0067d0, as DeepSpeed Ulysses, Jacobs
        et al. 2023): Q, K and V before the attention and O after it in the forward, dO before
        and dQ, dK, dV after it in the backward, the same widths. With a per-tensor fp8
        attention recipe they travel as fp8 (1 byte: TE quantizes Q, K, V before the
        exchange and the kernel's output and gradients are fp8); MXFP8 quantizes after it."""
        hw = self.hw
        fp8 = self.choices.fp8_attention and hw.gemm_only and hw.attention_format == "fp8"
        return (1 if fp8 else hw.value_bytes), self._attention_tensors()

    def _attention_tensors(self) -> list:
        """The values of Q, K, V and O (the attention's output, before the projection) on
        this rank's tokens: each head's query-key width for Q and K, its value width for V
        and O, K and V over the key-value heads, all split over the t ranks."""
        md = self.model
        widths = (md.q_dim, md.kv_dim, md.kv_heads * md.v_head_dim, md.heads * md.v_head_dim)
        return [self.tokens * G.Integer(w) / t for w in widths]

    def cp_a2a_pass(self) -> G.Expr:
        """One pass's all-to-alls of all-to-all context parallelism (`_cp_a2a_widths`): four
        exchanges over the c_p ranks, each sending (c_p - 1) / c_p of a tensor to the others,
        not overlapped (the attention waits for its inputs, the next layer for its output).
        The group sits next to tp (t c_p consecutive ranks): inside the scale-up domain while
        t c_p <= u, else the share of each rank's peers on other domains crosses the NICs.
        0 at c_p = 1 or with ring attention."""
        if not self.choices.cp_a2a:
            return G.Integer(0)
        hw, cp = self.hw, self.cp
        vb, tensors = self._cp_a2a_widths()
        leaves = 1 - _max(hw.scale_up / t, 1) / cp
        inside = within_domain(hw, t * cp)
        total = sum(self._kernel(hop(hw, inside, DEVICE, x * vb * (cp - 1) / cp,
                                     x * vb * leaves), False) for x in tensors)
        return _if(cp > 1, total, 0)

    def _attention_casts(self):
        """Forward and backward time of the casts around fp8 dot-product attention
        (`fp8_attention`), which Megatron's fused QKV projection does not write in fp8 (no
        --fp8-multi-head-attention): Transformer Engine's FusedAttnFunc (pytorch/attention/
        dot_product_attention/backends.py at d0067d0) quantizes Q, K and V before the kernel
        and dO before its backward (`combine_and_quantize`, utils.py):
        - per-tensor fp8: Q, K and V concatenated (read and write 16 bits) and cast (read 16
          bits, write 1 byte); under current scaling an amax read and a scale kernel first
          (Float8CurrentScalingQuantizer), and the kernel writes O and dQ, dK, dV in 16 bits
          (NVTE_DPA_FP8CS_O_in_F16=1, the default); under delayed scaling it writes them in
          fp8 and each is dequantized (read 1 byte, write 16 bits);
        - MXFP8: each of Q, K, V and dO quantized where it lies, rowwise and columnwise with
          its block scales (`Precision.quantize_bytes`), the outputs in 16 bits.
        Memory-bound kernels, each paying its issue (`_kernels`). 0 without fp8 attention."""
        hw = self.hw
        if not (self.choices.fp8_attention and hw.gemm_only):
            return G.Integer(0), G.Integer(0)
        vb = hw.value_bytes
        q, k, v, out = self._attention_tensors()
        qkv = q + k + v
        if hw.attention_format == "mxfp8":
            cast = hw.quantize_bytes
            return self._kernels(3, qkv * cast), self._kernels(1, out * cast)
        if self._current_scaling():
            return (self._kernels(4, qkv * (4 * vb + 1)),  # cat, amax, scale, cast
                    self._kernels(3, out * (2 * vb + 1)))  # amax, scale, cast of dO
        dequantize = 1 + vb
        return (self._kernels(2, qkv * (3 * vb + 1)) + self._kernels(1, out * dequantize),
                self._kernels(1, out * (vb + 1)) + self._kernels(1, qkv * dequantize))

    def _cp_a2a_copies(self) -> G.Expr:
        """One pass's layout copies around all-to-all context parallelism's exchanges (TE's
        flash_attn_a2a_communicate): each of the four tensors moved to head-major order
        before its exchange or after it (a contiguous copy) and its sequence chunks reordered
        on the other side (an index_select), each reading and writing the tensor: 8 memory-
        bound kernels a pass. 0 at c_p = 1 or with ring attention."""
        if not self.choices.cp_a2a:
            return G.Integer(0)
        vb, tensors = self._cp_a2a_widths()
        return _if(self.cp > 1, self._kernels(8, 4 * vb * sum(tensors)), 0)

    def _keys_done(self, kind):
        """Keys a query attends to on average, as a kernel that skips masked tiles computes
        them (`Transformer.attention_keys_computed`)."""
        k = self.model.attention_keys_computed(kind.mixer)
        return G.Rational(k.numerator, k.denominator)

    def _flash_direction(self, direction: str) -> str:
        """The curve a fused attention's `direction` ("fwd", "bwd") runs at: with fp8
        dot-product attention the kernel's rate on the recipe's operands (`attention_format`:
        per-tensor fp8, or MXFP8's blocks) where benchmarked, else its per-tensor fp8 rate
        where that is, else the 16-bit one. Transformer Engine runs the backward in fp8 too
        unless NVTE_FP8_DPA_BWD=0 (pytorch/attention/dot_product_attention/backends.py at
        d0067d0)."""
        if self.choices.fp8_attention and self.hw.gemm_only:
            for fmt in dict.fromkeys((self.hw.attention_format, "fp8")):
                if self.hw.flash.has(f"{fmt}_{direction}"):
                    return f"{fmt}_{direction}"
        return direction

    def _flash(self, kind, queries, keys):
        """Forward and backward time of a fused attention kernel (FlashAttention, cuDNN) at
        the device's measured rate (`Hardware.flash`, fitted by `planner.fit_flash`): the
        FLOPs it does, 2 q k (d_qk + d_v) per head over the keys it computes (`_keys_done`),
        the backward 2.5x the forward (it recomputes the scores: Dao 2023, sec. 4); each at
        R[d] k' / (k' + k_half), d the mean of the query-key and value head widths, k' the
        keys of one kernel call (s / c_p with ring attention), a causal mask adding its extra
        keys to k_half (with ring attention on the one diagonal step of c_p). All-to-all
        context parallelism (`cp_a2a`) runs one call a pass over every key for h / c_p of the
        heads: the same FLOPs at the whole sequence's rate. Each call pays its own issue
        (`_kernel`: c_p calls a pass with ring attention, one with the all-to-all)."""
        md, curve = self.model, self.hw.flash
        flops = (2 * queries * self._keys_done(kind) * (md.head_dim + md.v_head_dim) * b
                 * md.heads / t)
        calls = 1 if self.choices.cp_a2a else self.cp  # kernel calls the keys are split into
        width, per_call = (md.head_dim + md.v_head_dim) / 2, keys / calls
        masked = 1 / calls if md.causal else 0
        fwd = flops / curve.achieved(self._flash_direction("fwd"), width, per_call, masked)
        bwd = G.Rational(5, 2) * flops / curve.achieved(self._flash_direction("bwd"), width,
                                                         per_call, masked)
        return self._kernel(fwd, calls=calls), self._kernel(bwd, calls=calls)

    def elementwise_kernels(self, kind=None) -> int:
        """Non-matmul kernels in one layer's forward, as Megatron runs them: two norms, two
        bias-dropout-adds, bias-GeLU; without flash attention the softmax, the attention
        dropout and the copy of the context back to (s, b, h) (flash attention fuses them);
        rotary embeddings one fused kernel; with an fp8 / fp4 GEMM precision one cast per GEMM
        input (Transformer Engine). Eager PyTorch adds the kernels `_eager_ops` lists."""
        md = self.model
        kind = kind or md.layer_kinds()[0][0]
        # current scaling (Transformer Engine Float8CurrentScalingQuantizer::quantize_impl,
        # csrc/quantizer.cpp at d0067d0): a scale kernel before each cast, and an amax kernel
        # before the output projection's (the norms and the activation compute the amax of
        # the QKV, FC1 and FC2 inputs in their own kernels: normalization.cpp and
        # activation.cpp, FUSED_NORM_AMAX_FP8 and FUSED_ACTIVATION_AMAX_FP8)
        casts = (9 if self._current_scaling() else 4) if self.hw.gemm_only else 0
        casts -= self._norm_fused(kind)[1]  # the casts the norms run inside themselves
        rope = int(md.position_embedding == "rotary" and kind.mixer in ("attention", "sliding"))
        eager = sum(n for n, _ in self._eager_ops(kind)) if self.choices.kernels == "eager" else 0
        # routing and token permutation; LoRA adapters
        moe = sum(n for n, _ in [*self._moe_ops(kind), *self._lora_ops(kind)])
        return 5 + (1 if self.choices.flash_attention else 3) + casts + rope + eager + moe

    def _eager_ops(self, kind=None):
        """What PyTorch eager runs beyond Megatron's fused kernels, per layer forward: (kernels,
        bytes per token) pairs, the bytes inside the tensor-parallel region already / t. Each
        op reads its inputs and writes its output through HBM (the GEMM bias rides in the
        GEMM's epilogue, norms are one kernel each, as in both):
        - dropout before each residual add is its own kernel (read and write h), not fused
          into a bias-dropout-add;
        - SwiGLU: silu (read and write f) and the product (read 2 f, write f), not 3 f fused;
        - rotary embeddings as x cos + rotate_half(x) sin (neg, cat, two products, a sum:
          5.5 reads and 4.5 writes of q and k) where a fused kernel reads and writes them once;
        - attention without flash: the scale and the mask each read and write the scores,
          and Q, K, V and the context are copied between (s, b, h) and (b, a, s, d) for the
          batched GEMMs; with flash attention (PyTorch SDPA) only the context is copied back.
        Source: the modules of NVIDIA DeepLearningExamples' BERT (modeling.py), Hugging Face
        transformers' GPT-2 / Llama and torchtitan's Llama, op by op."""
        md, vb, c = self.model, self.hw.value_bytes, self.choices
        kind = kind or md.layer_kinds()[0][0]
        h, attends = md.hidden, kind.mixer in ("attention", "sliding")
        ops = []
        if md.dropout:
            ops.append((bool(kind.mixer) + bool(kind.ffn), 2 * h * vb * (bool(kind.mixer)
                                                                        + bool(kind.ffn))))
        if md.gated_ffn and kind.ffn:
            ops.append((1, G.Integer(2 * self._ffn_width(kind) * vb) / t))
        if not attends:
            return ops
        if md.position_embedding == "rotary":
            ops.append((9, G.Integer(8 * self._rotary_width() * vb) / t))
        if c.flash_attention:
            ops.append((1, G.Integer(2 * md.q_dim * vb) / t))
        else:
            scores = md.heads * md.attention_keys(kind.mixer)
            # 5 kernels: the context copy is among Megatron's non-flash kernels already
            ops.append((5, G.Integer((4 * scores + 2 * (2 * md.q_dim + 2 * md.kv_dim)) * vb)
                        / t))
        return ops

    def _moe_ops(self, kind=None):
        """What a MoE layer runs beyond its GEMMs and all-to-alls, per forward: (kernels,
        bytes per token) pairs, the routed tokens being this rank's sequence-parallel share
        (/ t), each copied top_k times (times the capacity factor). Megatron-LM's router and
        all-to-all dispatcher (megatron/core/transformer/moe/router.py, token_dispatcher.py
        MoEAlltoAllTokenDispatcher, moe_utils.py; at d98e8a6), op by op:
        - routing: the score function and top-k over the E logits, the routing map and the
          probabilities, the load-balancing loss's scores and sum (6 kernels, fp32 scores
          read and written about four times: 17 bytes per expert with the 1-byte map);
        - the tokens-per-expert count and its copy to the host, which the dropless dispatcher
          waits for (`_maybe_dtoh_and_synchronize`): the host's queue of kernels runs dry
          there, an idle kernel issue (2 kernels); none with `rank_capacity`, whose buffers
          are sized before the step (sync-free);
        - permutation 1: the gather indices, then each token copied to its top_k experts'
          rows (read and write top_k h; 2 kernels), before the dispatch all-to-all;
        - with several local experts (E > e_p), `sort_chunks_by_idxs` regroups the received
          tokens by local expert and the combine sorts them back (read and write top_k h,
          one kernel each);
        - un-permutation: each token's top_k expert outputs weighted by their probabilities
          and summed back into one row (read top_k h, write h; 1 kernel).
        Under LatentMoE the tokens move at the latent width l, not h, and an fp8 / fp4 recipe
        casts the two latent projections' inputs (h and l).
        The kernel count per op is the unfused one; `--moe-permute-fusion` fuses index and
        copy (a kernel less, the same traffic)."""
        md, vb = self.model, self.hw.value_bytes
        if (kind or md.layer_kinds()[0][0]).ffn != "moe":
            return []
        h, k, w = md.hidden, md.top_k * self.capacity, md.expert_width
        sorted_ = _if(self.ep < md.experts, 1, 0)  # several experts on this rank
        ops = [(6, G.Integer(md.experts * (vb + 17)) / t),
               *([] if self.choices.rank_capacity else [(2, G.Integer(0))]),
               (2, 2 * k * w * vb / t),
               (2 * sorted_, sorted_ * 4 * k * w * vb / t),
               (1, (k + 1) * w * vb / t)]
        if md.moe_latent and self.hw.gemm_only:  # the latent projections' input casts
            ops.append((2, self.hw.quantize_bytes * G.Integer(h + w) / t))
        return ops

    def _lora_ops(self, kind=None):
        """LoRA adapters on a layer's attention projections, per forward: (kernels, bytes per
        token). A rank-r adapter is two GEMMs of inner or outer width r, about 2 r FLOPs a
        byte, far below any GPU's ridge point: memory-bound, so priced by their HBM traffic
        (the base GEMM's input read again, r values written and read, the output of width
        out written and added to the base output: read + write) with three kernels (A, B, the
        add) per adapted projection: the fused QKV (input h, output (q + 2 kv) / t) and the
        output projection (input q / t, output h). Their backward is the elementwise factor
        of it."""
        md, vb, r = self.model, self.hw.value_bytes, self.choices.lora_rank
        kind = kind or md.layer_kinds()[0][0]
        if not r or kind.mixer not in ("attention", "sliding"):
            return []
        qkv, proj = G.Integer(md.q_dim + 2 * md.kv_dim) / t, md.hidden
        return [(3, (md.hidden + 2 * r + 3 * qkv) * vb),
                (3, (G.Integer(md.q_dim) / t + 2 * r + 3 * proj) * vb)]

    def elementwise_bytes_per_token(self, kind=None):
        """HBM traffic of one layer's forward non-matmul kernels per token, as Megatron fuses
        them: two norms (read + write h), bias-GeLU (read + write f; SwiGLU reads 2 f), two
        bias-dropout-adds (read 2 h, write h, a 1-byte mask) outside the TP region; inside it
        the fused scale-mask-softmax (read + write a keys) and attention dropout (read + write +
        mask a keys), unless flash attention keeps the scores on chip (Dao et al. 2022), and
        the fused rotary embedding (read + write q and k). Eager PyTorch adds `_eager_ops`.
        `kind`: a layer kind of the model (default: its first)."""
        md, vb = self.model, self.hw.value_bytes
        kind = kind or md.layer_kinds()[0][0]
        h, a = md.hidden, md.heads
        outside = 2 * 2 * h * vb + 2 * (3 * h * vb + h)
        f = self._ffn_width(kind)
        ffn = (3 if md.gated_ffn else 2) * f * vb
        attends = kind.mixer in ("attention", "sliding")
        scores = (0 if self.choices.flash_attention or not attends
                  else a * md.attention_keys(kind.mixer) * (2 * vb + 2 * vb + 1))
        rope = (2 * self._rotary_width() * vb
                if attends and md.position_embedding == "rotary" else 0)
        # fp8 / fp4 GEMMs: each GEMM input (h for QKV and FC1, q_dim / t and f / t for the
        # output projection and FC2) is read at 16 bits and written in the format, in both
        # layouts, with its scales (`Precision.quantize_bytes`); under current scaling the
        # output projection's read once more first for its amax
        casts = self.hw.quantize_bytes
        fc1_input, routed = h, G.Integer(0)
        if kind.ffn == "moe":
            # the routed experts' FC1 reads the permuted tokens, top_k rows of each (times
            # the capacity factor) at the expert width, this rank's sequence-parallel share
            # gathered over the e_t ranks sharing each expert (the rows `_kind_parts` gives
            # its grouped GEMMs): Transformer Engine's GroupedLinear quantizes its whole input
            # (split_quantize over the experts' m_splits, module/grouped_linear.py at
            # d0067d0); h is cast for the shared experts' FC1 only (LatentMoE's projection:
            # `_moe_ops`)
            fc1_input = h if md.shared_experts else 0
            routed = casts * md.top_k * self.capacity * self.etp * md.expert_width / t
        cast_outside = casts * (h + fc1_input) - self._norm_fused(kind)[0]  # norms quantize some
        cast_inside = casts * (md.q_dim + f)
        if self._current_scaling():  # the attention output read once more for its amax
            cast_inside += vb * md.q_dim
        eager = (sum(bytes_ for _, bytes_ in self._eager_ops(kind)) if self.choices.kernels == "eager"
                 else G.Integer(0))
        moe = sum((bytes_ for _, bytes_ in [*self._moe_ops(kind), *self._lora_ops(kind)]),
                  G.Integer(0))
        return (outside + G.Rational(cast_outside)
                + G.Rational(ffn + scores + rope + cast_inside) / t
                + routed + eager + moe)

    def _rotary_width(self) -> int:
        """Values per token the rotary embedding turns: all of q and k, or with multi-head
        latent attention only the rope part of each query head and the one shared rope key
        (DeepSeek-V2 sec. 2.1.3)."""
        md = self.model
        if md.mla:
            return (md.heads + 1) * md.mla.qk_rope_head_dim
        return md.q_dim + md.kv_dim

    def _ffn_width(self, kind) -> int:
        """Inner width of a layer kind's FFN per token: a dense FFN's, or the top_k routed
        experts' and the shared experts' together; 0 without one."""
        return sum(self._ffn_widths(kind))

    def _ffn_widths(self, kind) -> tuple[int, int]:
        """(the routed experts', the rest's) inner width per token of a layer kind's FFN: a
        MoE FFN's top_k routed experts and its shared experts, a dense FFN's (0, its width)."""
        md = self.model
        if kind.ffn == "moe":
            return (md.ffn_hidden * md.top_k,
                    (md.shared_expert_ffn_hidden or md.ffn_hidden) * md.shared_experts)
        return 0, ((md.dense_ffn_hidden or md.ffn_hidden) if kind.ffn else 0)

    def activation_bytes_per_layer(self, recompute: str):
        """Stored activations of one layer, the mean over the model's layer kinds (a stage
        holds its kinds in their proportions): `kind_activation_bytes`."""
        md = self.model
        return sum(n * self.kind_activation_bytes(recompute, k)
                   for k, n in md.layer_kinds()) / md.layers

    def offloaded_bytes_per_layer(self, recompute: str):
        """Of `activation_bytes_per_layer`, what Megatron-LM's fine-grained activation offload
        moves to host memory: the inputs of the modules it offloads (TransformerConfig
        .offload_modules: attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1,
        moe_act). A layer's attention part goes whole; of an FFN only the norm's input, and
        for routed experts their input and the activation's input (fc1's output); Mamba
        mixers, dense FFN insides, shared experts and masks stay. A fully recomputed layer
        keeps only its input, which is not among them."""
        md = self.model
        if recompute == "full":
            return G.Integer(0)
        sbh = self.tokens * md.hidden * G.Rational(self.hw.value_bytes, 2)
        split = self.choices.sequence_parallel
        total = G.Integer(0)
        for kind, n in md.layer_kinds():
            outside, inside = G.Integer(0), G.Integer(0)
            if kind.mixer in ("attention", "sliding"):
                qkvo = (2 * md.heads * (md.head_dim + md.v_head_dim) if md.mla
                        else 2 * (md.q_dim + md.kv_dim))
                outside += 4
                inside += G.Rational(2 * qkvo, md.hidden)
            if kind.ffn:
                outside += 2  # mlp_norm's input
            if kind.ffn == "moe":
                fc1 = (4 if md.gated_ffn else 2) * md.ffn_hidden * md.top_k
                if self.choices.fp8_activation_input:  # held (and moved) at 1 byte
                    fc1 = Fraction(fc1, 2)
                inside += (G.Rational(fc1, md.hidden) + 2 * md.top_k * self.etp
                           * G.Rational(md.expert_width, md.hidden)) * self.routed_held
            total += n * sbh * ((outside / t if split else outside) + inside / t)
        return total / md.layers

    def kind_activation_bytes(self, recompute: str, kind):
        """Stored activations of one layer of `kind` (`_saved`), the routed experts' as held
        (`routed_held`)."""
        kept, routed = self._saved(recompute, kind)
        return kept + routed * self.routed_held

    def routed_saved_bytes(self, kind=None) -> G.Expr:
        """The routed experts' saved activations of one MoE layer of `kind` (default: the
        model's MoE kind) and micro-batch on this rank, at the tokens routed: what the paged
        stash copies in and out (`_saved`; 0 for a dense layer)."""
        kind = kind or next((k for k, _ in self.model.layer_kinds() if k.ffn == "moe"), None)
        return G.Integer(0) if kind is None else self._saved("none", kind)[1]

    def _saved(self, recompute: str, kind) -> tuple[G.Expr, G.Expr]:
        """(the stored activations of one layer of `kind` but the routed experts', the routed
        experts' at the tokens routed), bytes per s b h at 16 bits (scaled for
        other widths), tensor by tensor as Korthikanti et al. 2022 (Table 2) count them. Each
        part (mixer, FFN) stores outside the tensor-parallel region its norm's input and output
        (4) and, with dropout, a 1-byte mask (1): their 10 for the two parts of a GPT layer.
        With frozen base weights (LoRA on the attention projections) a dense FFN's GEMMs save
        no inputs (Transformer Engine's Linear keeps its input only for the weight gradient:
        `backward_needs_input = weight.requires_grad`, module/linear.py at d0067d0): neither
        the FFN norm's output nor fc2's input is held.
        Inside it: attention stores Q, K, V and the output projection's input, of widths
        q_dim, kv_dim, kv_dim, q_dim (their 8 for multi-head attention; grouped queries store
        narrower K and V), and the scores without flash attention (5 a keys / h); a Mamba-2
        mixer its in_proj output (z, x B C, dt), the conv output, the scan output and the
        gated norm's output (the out_proj input); the FFN its inner activations (their 16 for a
        4 h GeLU FFN, scaled to the width, 3 / 2 gated, top_k routed experts plus the shared
        ones, and the routed experts' input, top_k h per token gathered over e_t, at the latent
        width under LatentMoE with the l -> h projection's input). Sequence
        parallelism splits the outside part over t too; full recomputation keeps only the
        layer's input. Eager SwiGLU saves silu's output for the product's backward too (f).
        With `fp8_activation_input` fc1's output, the activation function's input, is held at
        1 byte (Megatron-LM's activation_func_fp8_input_store: mlp.py at d98e8a6 casts it to
        fp8 for the backward)."""
        md, c = self.model, self.choices
        s, h, a = md.seq_len, md.hidden, md.heads
        sbh = s / self.cp * b * h * G.Rational(self.hw.value_bytes, 2)  # this rank's s / c_p
        split = c.sequence_parallel
        if recompute == "full":
            return 2 * sbh / (t if split else 1), G.Integer(0)
        parts = bool(kind.mixer) + bool(kind.ffn)
        outside = G.Integer(parts * (5 if md.dropout else 4))
        outside = outside / t if split else outside
        inside, core = G.Integer(0), G.Integer(0)
        if kind.mixer in ("attention", "sliding"):
            # values of Q, K, V and O per token (MLA: per head q and k of nope + rope, v and o)
            qkvo = (2 * md.heads * (md.head_dim + md.v_head_dim) if md.mla
                    else 2 * (md.q_dim + md.kv_dim))
            inside += G.Rational(2 * qkvo, h)
            if not (recompute == "selective" or c.flash_attention):
                core = G.Integer(5 * a * md.attention_keys(kind.mixer)) / (h * t)
        elif kind.mixer == "mamba":
            d_in, conv = md.mamba_inner(), md.mamba_conv_dim()
            inside += G.Rational(2 * (d_in + conv + md.mamba.heads) + 2 * conv + 4 * d_in, h)
        gated = G.Rational(3, 2) if md.gated_ffn else 1
        # the routed experts' saved tensors apart, at the tokens routed (`routed_held` scales
        # them to the buffers they are held in); a FFN's own widths: routed and the rest
        routed = G.Integer(0)
        width_r, width_s = self._ffn_widths(kind)
        if kind.ffn == "dense":
            inside += 16 * G.Rational(md.dense_ffn_hidden or md.ffn_hidden, 4 * h) * gated
            if c.lora_rank:  # frozen fc1 and fc2 keep no inputs: the norm's output, fc2's
                outside -= G.Integer(2) / t if split else 2
                inside -= 2 * G.Rational(self._ffn_width(kind), h)
        elif kind.ffn == "moe":
            inside += 16 * G.Rational(width_s, 4 * h) * gated
            routed += 16 * G.Rational(width_r, 4 * h) * gated
            # the routed experts' fc1 input: the dispatched top_k copies of this rank's tokens,
            # gathered over e_t (Megatron saves them for the expert GEMMs' backward), at the
            # experts' width; LatentMoE's l -> h projection keeps its input (l per token)
            lat = G.Rational(md.expert_width, h)
            routed += 2 * md.top_k * self.etp * lat
            inside += 2 * lat if md.moe_latent else 0
        fc1_out = 2 if md.gated_ffn else 1
        if c.fp8_activation_input and kind.ffn:  # fc1's output, the activation's input, in fp8
            inside -= G.Rational(fc1_out * width_s, h)
            routed -= G.Rational(fc1_out * width_r, h)
        if c.kernels == "eager" and md.gated_ffn and kind.ffn:  # eager SwiGLU also keeps silu's output
            inside += G.Rational(2 * width_s, h)
            routed += G.Rational(2 * width_r, h)
        if c.fp8_activations:
            fp8_outside, fp8_inside, fp8_routed = self._fp8_saved_inputs(kind)
            outside += fp8_outside / t if split else fp8_outside
            inside += fp8_inside
            routed += fp8_routed
        freed_outside, freed_inside, freed_routed = self._recompute_freed(kind)
        outside -= freed_outside / t if split else freed_outside
        return (sbh * (outside + inside / t - freed_inside / t + core),
                sbh * (routed - freed_routed) / t)

    def _recompute_freed(self, kind) -> tuple[G.Expr, G.Expr, G.Expr]:
        """What the recompute modules free of `_saved`'s counts (outside, inside the
        tensor-parallel region, the routed experts' at the tokens routed), each tensor as that
        count holds it:
        - `recompute_norms`: each recomputed norm's output as held (2 at 16 bits, 1 in fp8
          under `fp8_activations`; a LoRA dense FFN's is not held anyway). The GEMMs reading
          it keep the 16-bit original instead of their fp8 copy (`set_save_original_input`),
          whose storage the checkpoint frees; only LatentMoE's h -> l projection keeps its
          fp8 copy (`MoELayer.set_for_recompute_pre_mlp_layernorm` sets the shared experts');
        - `recompute_moe_act`: the routed experts' activation output, fc2's input (2 f per
          routed copy; 1 under `fp8_activations`), and eager SwiGLU's silu output beside it;
        - `recompute_mla_up`: MLA's Q, K and V (the attention's output, the out projection's
          input, stays)."""
        md, c = self.model, self.choices
        h = md.hidden
        outside, inside, routed = G.Integer(0), G.Integer(0), G.Integer(0)
        if c.recompute_norms:  # each norm output as held, with `_fp8_saved_inputs`'s changes
            fp8, lora = c.fp8_activations, bool(c.lora_rank)
            if kind.mixer in ("attention", "sliding"):
                outside += 1 if fp8 and not lora else 2
            if kind.ffn == "dense" and not lora:
                outside += 1 if fp8 else 2
            elif kind.ffn == "moe":  # the router's 16-bit copy and the shared experts' fp8 one
                outside += 2 + (1 if fp8 and md.shared_experts else 0)
        if c.recompute_moe_act and kind.ffn == "moe":
            act_out = G.Rational(md.ffn_hidden * md.top_k, h)
            routed += act_out * (1 if c.fp8_activations else 2)
            if c.kernels == "eager" and md.gated_ffn:
                routed += 2 * act_out
        if c.recompute_mla_up and md.mla and kind.mixer in ("attention", "sliding"):
            inside += G.Rational(2 * md.heads * (2 * md.head_dim + md.v_head_dim), h)
        return outside, inside, routed

    def _fp8_saved_inputs(self, kind) -> tuple[G.Expr, G.Expr, G.Expr]:
        """What saving each fp8 GEMM's input at 1 byte changes in `_saved`'s counts (outside,
        inside the tensor-parallel region, the routed experts'): Transformer Engine's Linear keeps
        the fp8 cast it ran the GEMM on (module linear.py: `saved_inputmat = inputmat`), so
        the norm outputs feeding the QKV / in_proj and fc1 GEMMs and fc2's input are held at
        half their 16-bit count (nothing else keeps the 16-bit tensor). The out-projection's
        input is the attention's output, which flash attention keeps at 16 bits for its own
        backward: the fp8 copy comes on top (without flash, only the Linear needs it, in fp8).
        A MoE FFN's norm output stays 16-bit (the router, a plain linear, saves it); its
        shared experts (and LatentMoE's h -> l projection) keep an fp8 copy beside it; the
        routed experts' dispatched input and their fc2 input are fp8. With LoRA the frozen
        projections keep no input of their own and the adapters keep the 16-bit ones, so the
        attention and dense FFN parts change nothing."""
        md, h = self.model, self.model.hidden
        outside, inside, routed = G.Integer(0), G.Integer(0), G.Integer(0)
        width_r, width_s = self._ffn_widths(kind)
        if kind.mixer == "mamba":
            outside -= 1
            inside -= G.Rational(md.mamba_inner(), h)  # the gated norm's output, out_proj's
        elif kind.mixer and not self.choices.lora_rank:  # LoRA's adapters keep 16 bits
            outside -= 1
            o = G.Rational(md.heads * md.v_head_dim if md.mla else md.q_dim, h)
            inside += o if self.choices.flash_attention else -o
        if kind.ffn == "dense" and not self.choices.lora_rank:  # LoRA keeps neither
            outside -= 1
            inside -= G.Rational(self._ffn_width(kind), h)
        elif kind.ffn == "moe":
            # the shared experts' and LatentMoE's h -> l projection's TE linears each keep
            # an fp8 copy of the norm output
            outside += (1 if md.shared_experts else 0) + (1 if md.moe_latent else 0)
            lat = G.Rational(md.expert_width, h)
            inside -= G.Rational(width_s, h)
            routed -= G.Rational(width_r, h) + md.top_k * self.etp * lat
            inside -= lat if md.moe_latent else 0  # the l -> h projection's input
        return outside, inside, routed
