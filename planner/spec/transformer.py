"""Transformer specs and their exact parameter and FLOP counts.

Counts are itemised per weight matrix, so grouped-query attention, SwiGLU, untied embeddings
and mixture-of-experts fall out of the same code. For the plain GPT layer (kv_heads = heads,
ffn_hidden = 4 h, GeLU, biases) they reduce to the published closed forms, which the tests
hold: parameters 12 l h^2 + 13 l h + (V + s) h (Narayanan et al. SC21, sec. 5.1) and
forward FLOPs 24 B s l h^2 (1 + s / (6 h)) + 2 B s h V (ibid. eq. 3 divided by its 4 passes).

Today's architectures (each key defaults so that older specs are unchanged):

- `head_dim` independent of hidden / heads (Qwen3, GPT-OSS, Gemma): q_dim = heads x head_dim,
  the output projection is q_dim x hidden. `qk_norm`: an RMSNorm of head_dim on q and on k.
- `mla`: multi-head latent attention (DeepSeek-V2/V3, Kimi K2), the matrices of the HF
  DeepseekV3Attention: q_a (h x q_lora_rank), q_a_norm, q_b (q_lora_rank x heads x (nope +
  rope)) or one q (h x heads x (nope + rope)) without q compression; kv_a_proj_with_mqa
  (h x (kv_lora_rank + rope)), kv_a_norm, kv_b (kv_lora_rank x heads x (nope + v)); o
  (heads x v x h).
- `moe.shared_experts` of `moe.shared_expert_ffn_hidden`, `first_dense_layers` dense layers of
  `ffn_hidden` (DeepSeek `first_k_dense_replace`), `moe.router_bias` (GPT-OSS router bias, or
  DeepSeek's stored e_score_correction_bias), `mlp_bias` on expert matrices (GPT-OSS).
- `sliding_window` (tokens) on the layers that `sliding_window_pattern` marks S (F: full
  attention; the pattern repeats over the layers: GPT-OSS and Gemma 2 "SF", Gemma 3 "SSSSSF",
  Mistral 7B "S"); a sliding layer's attention core sees min(window, s) keys per query.
  `attention_sinks`: one learned scalar per head per layer (GPT-OSS).
- `rope_theta`, `rope_scaling` (Llama 3.1's frequency scaling) and the MoE router's kind
  (`moe.router_score`, `router_topk_scale`, `router_groups`, `router_group_topk`): no count
  depends on them; the launchers write them so that the framework builds the published model.
- `moe.latent_size`: LatentMoE (Nemotron 3 Super): the routed experts read and write l values
  (`expert_width`), between a h -> l and a l -> h projection of every token (`latent_params`).
- `mtp_layers` multi-token prediction depths (DeepSeek-V3 sec. 2.2), each the last layer's kind
  or a hybrid model's `mtp_pattern` (`mtp_kinds`), with its 2h -> h projection and norms.
- `layer_pattern`: Nemotron-H's `hybrid_override_pattern`, one character per layer: M a Mamba-2
  mixer, * attention, - a dense MLP, E a MoE FFN; each such layer has one norm. `mamba` holds
  the Mamba-2 sizes (the HF NemotronHMamba2Mixer: in_proj h x (2 d_in + 2 G N + H), depthwise
  conv1d over d_in + 2 G N channels, dt_bias, A_log, D per head, a gated RMSNorm of d_in,
  out_proj d_in x h, d_in = heads x head_dim).

Layers come in kinds (`LayerKind`: a mixer of attention / sliding / mamba or none, then an FFN
of dense / moe or none). `layer_kinds()` gives (kind, count) in first-appearance order, and per
kind `kind_params`, `kind_active_params`, `kind_matmul_flops` (forward matmuls per sequence,
attention core and SSD scan included), `kind_attention_core_flops` and `kind_ssm_scan_flops`
(`ssm_scan_flops()` for one Mamba layer). The whole-model counts are exact sums over kinds;
`layer_params()`, `layer_matmul_flops()` and `attention_core_flops()` are per-layer means
(exact for uniform models, rounded to an integer otherwise): the cost model's per-layer view
until it prices each kind.

The keys are validated by the file schema, `planner.spec.transformer_file.TransformerFile`;
`build_transformer` loads a validated file into `Transformer`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

from planner.errors import SpecError
from planner.spec.base import validate
from planner.spec.transformer_file import (
    MLA,
    PATTERN_MIXERS,
    Mamba,
    RopeScaling,
    TransformerFile,
)


@dataclass(frozen=True)
class LayerKind:
    """One kind of layer: a mixer ("attention", "sliding", "mamba" or None) then an FFN
    ("dense", "moe" or None). Each part present has its norm in front."""

    mixer: str | None
    ffn: str | None

    @property
    def name(self) -> str:
        return "+".join(p for p in (self.mixer, self.ffn) if p)


@dataclass(frozen=True)
class Transformer:
    """A loaded transformer with its derived sizes. Counts are exact integers.

    `ffn_hidden` is the width of the FFN every MoE layer routes to (the expert width) or of
    the dense FFN; `dense_ffn_hidden` that of the first dense layers of a MoE model."""

    name: str
    description: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    seq_len: int
    vocab: int
    ffn_hidden: int
    ffn_kind: str
    tied_embeddings: bool
    bias: bool
    norm: str
    position_embedding: str
    max_positions: int = 0
    token_types: int = 0
    pooler: bool = False
    dropout: float = 0.0
    causal: bool = True  # causal attention mask (decoders); an encoder attends both ways
    experts: int = 1
    top_k: int = 1
    # --- today's architectures (defaults: the layer above) ---
    attn_head_dim: int = 0  # 0: hidden // heads
    qk_norm: bool = False
    qkv_bias: bool | None = None
    out_bias: bool | None = None
    mlp_bias: bool | None = None
    post_norms: bool = False
    shared_experts: int = 0
    shared_expert_ffn_hidden: int = 0
    router_bias: bool = False
    first_dense_layers: int = 0
    dense_ffn_hidden: int = 0  # 0: ffn_hidden
    mla: MLA | None = None
    sliding_window: int = 0
    sliding_window_pattern: str = ""
    attention_sinks: bool = False
    layer_pattern: str = ""
    mamba: Mamba | None = None
    # --- what the launchers write (no count depends on it) ---
    rope_theta: float | None = None  # None: the frameworks' 10,000
    rope_scaling: RopeScaling | None = None
    router_score: str = "softmax"
    router_topk_scale: float | None = None
    router_groups: int | None = None
    router_group_topk: int | None = None
    mtp_layers: int = 0  # multi-token prediction depths (`mtp_kinds` blocks each)
    mtp_pattern: str = ""  # a hybrid model's MTP depth, in `layer_pattern` letters
    moe_latent: int = 0  # LatentMoE: the width the routed experts read and write (0: hidden)

    kind = "transformer"

    # --- sizes ---------------------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        """Query / key head size (MLA: nope + rope)."""
        if self.mla:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
        return self.attn_head_dim or self.hidden // self.heads

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of all query heads: the input of the output projection (MLA: heads x v)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices in one FFN: up and down, plus the gate for SwiGLU / GeGLU."""
        return 3 if self.ffn_kind in ("swiglu", "geglu") else 2

    @property
    def gated_ffn(self) -> bool:
        return self.ffn_matrices == 3

    @property
    def expert_width(self) -> int:
        """The width the routed experts read and write and the tokens travel at: the latent
        width under LatentMoE (Nemotron 3 Super; Megatron-LM `--moe-latent-size`: a
        fc1_latent_proj h -> l before the dispatch, a fc2_latent_proj l -> h after the
        combine), else the hidden size."""
        return self.moe_latent or self.hidden

    def _bias(self, which: bool | None) -> bool:
        return self.bias if which is None else which

    # --- layer kinds ---------------------------------------------------------------------------

    def layer_sequence(self) -> tuple[LayerKind, ...]:
        """The kind of every layer, first to last."""
        if self.layer_pattern:
            return tuple(LayerKind(*PATTERN_MIXERS[c]) for c in self.layer_pattern)
        out = []
        pattern = self.sliding_window_pattern
        for i in range(self.layers):
            mixer = "sliding" if pattern and pattern[i % len(pattern)] == "S" else "attention"
            ffn = "moe" if self.experts > 1 and i >= self.first_dense_layers else "dense"
            out.append(LayerKind(mixer, ffn))
        return tuple(out)

    def layer_kinds(self) -> tuple[tuple[LayerKind, int], ...]:
        """(kind, number of layers of that kind), in order of first appearance."""
        counts: dict[LayerKind, int] = {}
        for k in self.layer_sequence():
            counts[k] = counts.get(k, 0) + 1
        return tuple(counts.items())

    # --- parameters ---------------------------------------------------------------------------

    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" and self.bias else 1)

    def mla_up_weights(self) -> int:
        """Entries of MLA's up projections, q (from its latent, or from h without one) and kv
        (keys' no-RoPE part and values); 0 without MLA."""
        if not self.mla:
            return 0
        a, heads = self.mla, self.heads
        return ((a.q_lora_rank or self.hidden) * heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
                + a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim))

    def attention_weights(self) -> int:
        """Entries of the attention's weight matrices (what its projections multiply by)."""
        h = self.hidden
        if self.mla:
            a, heads = self.mla, self.heads
            down = h * ((a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_head_dim)
            return down + self.mla_up_weights() + heads * a.v_head_dim * h
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h  # Q, K, V, O

    def attention_params(self) -> int:
        """One attention mixer, its norm excluded."""
        params = self.attention_weights()
        if self.mla:
            a = self.mla
            params += (a.q_lora_rank or 0) + a.kv_lora_rank  # q_a_norm, kv_a_norm (RMSNorm)
            q_out = self.heads * self.head_dim
        else:
            q_out = self.q_dim
        if self._bias(self.qkv_bias) and not self.mla:
            params += q_out + 2 * self.kv_dim
        if self._bias(self.out_bias):
            params += self.hidden
        if self.qk_norm:
            params += 2 * self.head_dim
        if self.attention_sinks:
            params += self.heads
        return params

    def _ffn_params(self, width: int, outer: int = 0) -> int:
        """An FFN of inner `width` between `outer` values (default: hidden) in and out."""
        outer = outer or self.hidden
        weights = self.ffn_matrices * outer * width
        return weights + (((self.ffn_matrices - 1) * width + outer)
                          if self._bias(self.mlp_bias) else 0)

    def expert_params(self) -> int:
        """One FFN of `ffn_hidden` (one expert), at `expert_width`."""
        return self._ffn_params(self.ffn_hidden, self.expert_width)

    def latent_params(self) -> int:
        """A LatentMoE layer's two latent projections, h -> l and l -> h (Megatron-LM
        moe_layer.py at d98e8a6: TE linears with the model's linear biases); 0 without."""
        if not self.moe_latent:
            return 0
        h, lat = self.hidden, self.moe_latent
        return 2 * h * lat + ((lat + h) if self._bias(self.mlp_bias) else 0)

    def dense_ffn_params(self) -> int:
        """The FFN of a dense layer (a MoE model's first dense layers: `dense_ffn_hidden`)."""
        return self._ffn_params(self.dense_ffn_hidden or self.ffn_hidden)

    def router_params(self) -> int:
        return (self.hidden + (1 if self.router_bias else 0)) * self.experts

    def shared_expert_params(self) -> int:
        return self.shared_experts * self._ffn_params(self.shared_expert_ffn_hidden
                                                     or self.ffn_hidden)

    def moe_params(self) -> int:
        """A MoE FFN: routed experts, shared experts, router, latent projections."""
        return (self.experts * self.expert_params() + self.shared_expert_params()
                + self.router_params() + self.latent_params())

    def ffn_params(self) -> int:
        """The FFN of a MoE layer (of every layer for a dense model)."""
        return self.moe_params() if self.experts > 1 else self.dense_ffn_params()

    def mamba_inner(self) -> int:
        """d_in = Mamba heads x head dim."""
        return self.mamba.heads * self.mamba.head_dim

    def mamba_conv_dim(self) -> int:
        """Channels of the depthwise conv: x, B and C (d_in + 2 G N)."""
        mb = self.mamba
        return self.mamba_inner() + 2 * mb.n_groups * mb.state_size

    def mamba_weights(self) -> int:
        """in_proj (z, x, B, C, dt) and out_proj entries."""
        d_in = self.mamba_inner()
        return self.hidden * (d_in + self.mamba_conv_dim() + self.mamba.heads) + d_in * self.hidden

    def mamba_params(self) -> int:
        """One Mamba-2 mixer, its pre-norm excluded: in_proj, conv1d, dt_bias, A_log, D, the
        gated RMSNorm and out_proj (HF NemotronHMamba2Mixer)."""
        mb, d_in, conv = self.mamba, self.mamba_inner(), self.mamba_conv_dim()
        params = self.mamba_weights() + conv * mb.conv_kernel + (conv if mb.conv_bias else 0)
        params += 3 * mb.heads + d_in
        if mb.proj_bias:
            params += d_in + conv + mb.heads + self.hidden
        return params

    def mixer_params(self, mixer: str | None) -> int:
        if mixer is None:
            return 0
        return (self.mamba_params() if mixer == "mamba" else self.attention_params()) + (
            self.norm_params() * (2 if self.post_norms else 1))

    def kind_params(self, kind: LayerKind) -> int:
        """One layer of `kind`, its norms included."""
        ffn = {None: 0, "dense": self.dense_ffn_params(), "moe": self.moe_params()}[kind.ffn]
        if kind.ffn:
            ffn += self.norm_params() * (2 if self.post_norms else 1)
        return self.mixer_params(kind.mixer) + ffn

    def kind_active_params(self, kind: LayerKind) -> int:
        """Parameters one token passes through in a layer of `kind` (MoE: top_k experts)."""
        if kind.ffn != "moe":
            return self.kind_params(kind)
        active = (self.top_k * self.expert_params() + self.shared_expert_params()
                  + self.router_params() + self.latent_params())
        return self.kind_params(kind) - self.moe_params() + active

    def layers_params(self) -> int:
        """All layers (embeddings and head excluded): exact."""
        return sum(n * self.kind_params(k) for k, n in self.layer_kinds())

    def layer_params(self) -> int:
        """One layer; the mean layer (rounded) when layers differ."""
        return _mean(self.layers_params(), self.layers)

    def embedding_params(self) -> int:
        """Token embedding (plus learned positions): held by the first pipeline stage."""
        pos = self.max_positions * self.hidden if self.position_embedding == "learned" else 0
        return (self.vocab + self.token_types) * self.hidden + pos

    def head_params(self) -> int:
        """Final norm and (untied) output projection: held by the last pipeline stage."""
        pooler = self.hidden * self.hidden + self.hidden if self.pooler else 0
        return (self.norm_params() + pooler
                + (0 if self.tied_embeddings else self.vocab * self.hidden))

    def mtp_kinds(self) -> tuple[LayerKind, ...]:
        """The layers of one multi-token prediction depth: the last layer's kind (DeepSeek-V3
        sec. 2.2: TRM_k is one of the main model's blocks; a MoE block there), or a hybrid
        model's `mtp_pattern` (Megatron-LM's "main/mtp/mtp" hybrid pattern,
        hybrid_layer_allocation.py at d98e8a6: Nemotron 3 Super's "*E", an attention then a
        MoE layer)."""
        if self.mtp_pattern:
            return tuple(LayerKind(*PATTERN_MIXERS[c]) for c in self.mtp_pattern)
        return (self.layer_sequence()[-1],)

    def mtp_depth_params(self) -> int:
        """One multi-token prediction depth as Megatron-LM builds it
        (multi_token_prediction.py at d98e8a6): the norms of the previous depth's hidden state
        and of the shifted tokens' embedding, their 2h -> h projection, the block, its final
        norm; the embedding and the output layer are the main model's (shared)."""
        h = self.hidden
        return (sum(self.kind_params(k) for k in self.mtp_kinds()) + 2 * h * h
                + 3 * self.norm_params())

    def mtp_params(self) -> int:
        return self.mtp_layers * self.mtp_depth_params() if self.mtp_layers else 0

    def params(self) -> int:
        """Every trained parameter: the layers, embedding and head, and the multi-token
        prediction depths (which DeepSeek-V3's 671B leaves out)."""
        return (self.layers_params() + self.embedding_params() + self.head_params()
                + self.mtp_params())

    def active_params(self) -> int:
        """Parameters a token passes through (MoE: top_k experts), embeddings excluded."""
        return sum(n * self.kind_active_params(k) for k, n in self.layer_kinds())

    # --- forward FLOPs per sequence (2 per multiply-add; matmuls only) -------------------------

    def attention_keys(self, mixer: str) -> int:
        """Keys each query attends to (counted over the full s, as SC21 and PaLM do; a sliding
        layer sees its window)."""
        s = self.seq_len
        return min(self.sliding_window, s) if mixer == "sliding" else s

    def attention_keys_computed(self, mixer: str) -> Fraction:
        """Keys a query attends to on average, counting only the products a causal mask
        leaves (what a kernel that skips masked tiles computes): all of them without a causal
        mask; under one, half of the s (the attention benchmarks' count, Dao 2023), or of a
        window W <= s: query i sees min(i + 1, W), W - W (W - 1) / (2 s) on average."""
        keys = self.attention_keys(mixer)
        if not self.causal:
            return Fraction(keys)
        if mixer == "attention" or keys >= self.seq_len:
            return Fraction(self.seq_len, 2)
        return keys - Fraction(keys * (keys - 1), 2 * self.seq_len)

    def kind_masked_attention_flops(self, kind: LayerKind) -> int:
        """Forward FLOPs of one layer's attention core that a causal mask skips: counted by
        `kind_attention_core_flops` (SC21's and PaLM's full s x s), never computed."""
        if kind.mixer not in ("attention", "sliding"):
            return 0
        skipped = self.attention_keys(kind.mixer) - self.attention_keys_computed(kind.mixer)
        flops = 2 * self.seq_len * skipped * self.heads * (self.head_dim + self.v_head_dim)
        assert flops.denominator == 1, flops  # s^2 / 2 and s W - W (W - 1) / 2 per head
        return int(flops)

    def kind_attention_core_flops(self, kind: LayerKind) -> int:
        """QK^T and scores x V of one layer: what selective recompute repeats (Korthikanti et
        al. 2022); 0 for layers without attention."""
        if kind.mixer not in ("attention", "sliding"):
            return 0
        s, keys = self.seq_len, self.attention_keys(kind.mixer)
        return 2 * s * keys * self.heads * (self.head_dim + self.v_head_dim)

    def ssm_scan_flops(self) -> int:
        """Forward FLOPs of one Mamba-2 layer's SSD scan per sequence, as the chunked algorithm
        runs it (Dao & Gu 2024, sec. 6) with chunks of Q tokens: per chunk C B^T (2 Q^2 N per
        group), the masked product with x (2 Q^2 P per head), the chunk states B^T x and their
        output C h (2 Q N P each per head)."""
        if self.mamba is None:
            return 0
        mb = self.mamba
        q, n, p = mb.chunk_size, mb.state_size, mb.head_dim
        chunks = -(-self.seq_len // q)
        return chunks * (2 * q * q * n * mb.n_groups + mb.heads * (2 * q * q * p + 4 * q * n * p))

    def kind_ssm_scan_flops(self, kind: LayerKind) -> int:
        return self.ssm_scan_flops() if kind.mixer == "mamba" else 0

    def kind_matmul_flops(self, kind: LayerKind) -> int:
        """Forward matmul FLOPs of one layer of `kind` for one sequence: projections, the
        attention core or the SSD scan, the FFN (MoE: top_k experts at `expert_width`, shared
        experts, router, LatentMoE's two projections)."""
        s, h = self.seq_len, self.hidden
        flops = 0
        if kind.mixer in ("attention", "sliding"):
            flops += 2 * s * self.attention_weights() + self.kind_attention_core_flops(kind)
        elif kind.mixer == "mamba":
            flops += 2 * s * self.mamba_weights() + self.ssm_scan_flops()
        m = self.ffn_matrices
        if kind.ffn == "dense":
            flops += 2 * s * m * h * (self.dense_ffn_hidden or self.ffn_hidden)
        elif kind.ffn == "moe":
            flops += 2 * s * m * (self.expert_width * self.ffn_hidden * self.top_k
                                  + h * self.shared_experts
                                  * (self.shared_expert_ffn_hidden or self.ffn_hidden))
            flops += 2 * s * h * self.experts + 2 * s * 2 * h * self.moe_latent
        return flops

    def layers_matmul_flops(self) -> int:
        """All layers' forward matmul FLOPs per sequence: exact."""
        return sum(n * self.kind_matmul_flops(k) for k, n in self.layer_kinds())

    def layer_matmul_flops(self) -> int:
        """Forward matmul FLOPs of one layer for one sequence: projections, the two attention
        products (QK^T and scores x V, counted over the full s x s, as SC21 and PaLM do), FFN;
        the mean layer (rounded) when layers differ."""
        return _mean(self.layers_matmul_flops(), self.layers)

    def attention_core_flops(self) -> int:
        """QK^T and scores x V of one layer (the mean layer, rounded, when layers differ)."""
        total = sum(n * self.kind_attention_core_flops(k) for k, n in self.layer_kinds())
        return _mean(total, self.layers)

    def kind_matrices(self, kind: LayerKind) -> list[tuple[int, int, int]]:
        """The weight matrices of one layer of `kind` as (rows, cols, how many): Q, K, V, O (MLA:
        its down- and up-projections and O; Mamba-2: in_proj and out_proj), the FFN's gate /
        up / down of each dense FFN, routed and shared expert, the router."""
        h, out = self.hidden, []
        if kind.mixer in ("attention", "sliding"):
            if self.mla:
                a, heads = self.mla, self.heads
                qk = a.qk_nope_head_dim + a.qk_rope_head_dim
                out += ([(h, a.q_lora_rank, 1), (a.q_lora_rank, heads * qk, 1)]
                        if a.q_lora_rank else [(h, heads * qk, 1)])
                out += [(h, a.kv_lora_rank + a.qk_rope_head_dim, 1),
                        (a.kv_lora_rank, heads * (a.qk_nope_head_dim + a.v_head_dim), 1),
                        (heads * a.v_head_dim, h, 1)]
            else:
                out += [(h, self.q_dim, 1), (h, self.kv_dim, 2), (self.q_dim, h, 1)]
        elif kind.mixer == "mamba":
            d_in = self.mamba_inner()
            out += [(h, d_in + self.mamba_conv_dim() + self.mamba.heads, 1), (d_in, h, 1)]

        def ffn(width, count, outer=h):
            return [(outer, width, (self.ffn_matrices - 1) * count), (width, outer, count)]

        if kind.ffn == "dense":
            out += ffn(self.dense_ffn_hidden or self.ffn_hidden, 1)
        elif kind.ffn == "moe":
            out += ffn(self.ffn_hidden, self.experts, self.expert_width) + [(h, self.experts, 1)]
            if self.moe_latent:
                out += [(h, self.moe_latent, 1), (self.moe_latent, h, 1)]
            if self.shared_experts:
                out += ffn(self.shared_expert_ffn_hidden or self.ffn_hidden, self.shared_experts)
        return out

    def muon_step_flops(self) -> int:
        """FLOPs of Muon's orthogonalisation over every layer's matrices, once per step: five
        Newton-Schulz iterations on each m x n matrix (m <= n), each X X^T (2 m^2 n), the
        quintic's B = b A + c A^2 (2 m^3) and B X (2 m^2 n) (Jordan et al. 2024, "Muon: an
        optimizer for hidden layers"; Liu et al. 2025, "Muon is scalable for LLM training",
        arXiv 2502.16982, the optimizer Moonlight and Kimi K2 train with)."""
        total = 0
        for kind, n_layers in self.layer_kinds():
            for rows, cols, count in self.kind_matrices(kind):
                m, n = min(rows, cols), max(rows, cols)
                total += n_layers * count * 5 * (4 * m * m * n + 2 * m ** 3)
        return total

    def kind_lora_params(self, kind: LayerKind, rank: int) -> int:
        """LoRA adapters of rank r on one layer's attention projections, the fused QKV and the
        output projection (Hu et al. 2021, eq. 3: W + B A, A r x in, B out x r; NeMo's
        target_modules linear_qkv and linear_proj, what the MLPerf Llama 2 70B LoRA reference
        adapts): r (h + q + 2 kv) + r (q + h); 0 for layers without attention."""
        if not rank or kind.mixer not in ("attention", "sliding"):
            return 0
        return rank * (self.hidden + self.q_dim + 2 * self.kv_dim) + rank * (self.q_dim
                                                                          + self.hidden)

    def lora_params(self, rank: int) -> int:
        """All layers' LoRA adapter parameters: what trains when the base weights are frozen
        (Llama 2 70B at rank 16: 44,564,480)."""
        return sum(n * self.kind_lora_params(k, rank) for k, n in self.layer_kinds())

    def masked_attention_flops(self) -> int:
        """`kind_masked_attention_flops` of one layer (the mean layer, rounded, when layers
        differ)."""
        total = sum(n * self.kind_masked_attention_flops(k) for k, n in self.layer_kinds())
        return _mean(total, self.layers)

    def logit_flops(self) -> int:
        return 2 * self.seq_len * self.hidden * self.vocab

    def mtp_depth_flops(self) -> int:
        """Forward matmul FLOPs of one multi-token prediction depth per sequence: its
        projection of the 2h concatenation, its block, the LM head again."""
        s, h = self.seq_len, self.hidden
        return (2 * s * 2 * h * h + sum(self.kind_matmul_flops(k) for k in self.mtp_kinds())
                + self.logit_flops())

    def forward_flops(self) -> int:
        return (self.layers_matmul_flops() + self.logit_flops()
                + self.mtp_layers * self.mtp_depth_flops())

    def _kinds_run(self) -> tuple[tuple[LayerKind, int], ...]:
        """`layer_kinds` with the multi-token prediction blocks counted too: every block a
        sequence runs."""
        if not self.mtp_layers:
            return self.layer_kinds()
        out = dict(self.layer_kinds())
        for kind in self.mtp_kinds():
            out[kind] = out.get(kind, 0) + self.mtp_layers
        return tuple(out.items())

    def lora_model_flops(self, rank: int, count_masked: bool = False) -> int:
        """`model_flops` when only LoRA adapters train (base weights frozen): every matmul
        with a weight runs forward and its input gradient (2x forward: no weight gradient),
        the attention core and the SSD scan forward and backward (3x), the adapters' GEMMs 3x
        (2 r (in + out) per token each)."""
        kinds = self._kinds_run()
        skipped = 0 if count_masked else sum(
            n * self.kind_masked_attention_flops(k) for k, n in kinds)
        core = sum(n * (self.kind_attention_core_flops(k) + self.kind_ssm_scan_flops(k))
                   for k, n in kinds)
        weights = self.forward_flops() - core
        core -= skipped
        adapters = 2 * self.seq_len * self.lora_params(rank)
        return 3 * core + 2 * weights + 3 * adapters

    def model_flops(self, count_masked: bool = False) -> int:
        """Forward + backward (2x forward) per sequence, no recompute: the MFU numerator
        (PaLM, appendix B). A causal mask's skipped half of the attention products is left
        out (so MFU stays under what the kernels reach at long sequences: counted in full, a
        7B model at s = 131,072 on H100 showed 85 % MFU); `count_masked` counts them as SC21
        eq. 3 and PaLM do (to read those papers' TFLOP/s back as time)."""
        skipped = 0 if count_masked else sum(
            n * self.kind_masked_attention_flops(k) for k, n in self._kinds_run())
        return 3 * (self.forward_flops() - skipped)


def _mean(total: int, count: int) -> int:
    """total / count rounded half up (exact when count divides total)."""
    return (2 * total + count) // (2 * count)


def with_seq_len(m: Transformer, seq_len: int | None) -> Transformer:
    """The model trained at another sequence length (the position table is unchanged)."""
    if seq_len is None or seq_len == m.seq_len:
        return m
    if not 1 <= seq_len <= 10_000_000:
        raise SpecError(f"seq_len: must be in [1, 10000000], got {seq_len}")
    if m.position_embedding == "learned" and seq_len > m.max_positions:
        raise SpecError(f"seq_len: {seq_len} exceeds the {m.max_positions} learned positions "
                        f"of '{m.name}'")
    return dataclasses.replace(m, seq_len=seq_len)


def build_transformer(data: dict, where: str) -> Transformer:
    spec = validate(TransformerFile, data, where)
    moe = spec.moe
    ffn = (moe.expert_ffn_hidden if moe and moe.expert_ffn_hidden else None) or spec.ffn_hidden
    if ffn is None:
        ffn = 4 * spec.hidden
    if spec.head_dim is None and spec.mla is None and spec.heads > spec.hidden:
        raise SpecError(f"{where}: key 'heads': more heads ({spec.heads}) than hidden "
                        f"({spec.hidden})")
    dense = spec.ffn_hidden or 4 * spec.hidden
    return Transformer(
        name=spec.name, description=spec.description, layers=spec.layers, hidden=spec.hidden,
        heads=spec.heads, kv_heads=spec.kv_heads or spec.heads, seq_len=spec.seq_len,
        vocab=spec.vocab, ffn_hidden=ffn, ffn_kind=spec.ffn_kind,
        tied_embeddings=spec.tied_embeddings, bias=spec.bias, norm=spec.norm,
        position_embedding=spec.position_embedding,
        max_positions=spec.max_positions or spec.seq_len, token_types=spec.token_types,
        pooler=spec.pooler, dropout=spec.dropout, causal=spec.causal, experts=moe.experts if moe else 1,
        top_k=moe.top_k if moe else 1,
        attn_head_dim=spec.head_dim or 0, qk_norm=spec.qk_norm, qkv_bias=spec.qkv_bias,
        out_bias=spec.out_bias, mlp_bias=spec.mlp_bias, post_norms=spec.post_norms,
        shared_experts=moe.shared_experts if moe else 0,
        shared_expert_ffn_hidden=(moe.shared_expert_ffn_hidden or 0) if moe else 0,
        router_bias=bool(moe and moe.router_bias), first_dense_layers=spec.first_dense_layers,
        dense_ffn_hidden=dense if dense != ffn else 0, mla=spec.mla,
        sliding_window=spec.sliding_window or 0,
        sliding_window_pattern=spec.sliding_window_pattern or "",
        attention_sinks=spec.attention_sinks, layer_pattern=spec.layer_pattern or "",
        mamba=spec.mamba, rope_theta=spec.rope_theta, rope_scaling=spec.rope_scaling,
        router_score=moe.router_score if moe else "softmax",
        router_topk_scale=moe.router_topk_scale if moe else None,
        router_groups=moe.router_groups if moe else None,
        router_group_topk=moe.router_group_topk if moe else None,
        mtp_layers=spec.mtp_layers, mtp_pattern=spec.mtp_pattern or "",
        moe_latent=(moe.latent_size or 0) if moe else 0,
    )
