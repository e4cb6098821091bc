"""The transformer spec file's schema: the `TransformerFile` pydantic model (the YAML / JSON keys,
their ranges and defaults) with its nested `MoE`, `MLA` and `Mamba` blocks, and the checks that
tie the keys together (head and kv-head divisibility, first dense layers, sliding-window and
Nemotron-H layer patterns, MLA head sizes).

What each key means, and how the loaded model counts parameters and FLOPs from it, is documented
in `planner.spec.transformer`, which loads a validated file into its `Transformer` dataclass
(`build_transformer`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.spec.base import Spec

Size = Annotated[int, Field(ge=1, le=10_000_000)]
Count = Annotated[int, Field(ge=1, le=100_000)]

# one character per layer, as Nemotron-H's hybrid_override_pattern
PATTERN_MIXERS = {"M": ("mamba", None), "*": ("attention", None), "-": (None, "dense"),
                  "E": (None, "moe")}


class MoE(Spec):
    experts: int = Field(ge=1, le=100_000)
    top_k: int = Field(ge=1, le=100_000)
    expert_ffn_hidden: Size | None = None
    shared_experts: int = Field(default=0, ge=0, le=1_000)
    shared_expert_ffn_hidden: Size | None = None  # default: expert_ffn_hidden
    router_bias: bool = False  # one value per expert next to the router weight
    # LatentMoE (Nemotron 3 Super; Megatron-LM --moe-latent-size): the routed experts read and
    # write this width, between a hidden -> latent and a latent -> hidden projection
    latent_size: Size | None = None
    # how the router scores and picks experts (no parameters or FLOPs of their own; the
    # launchers write them): softmax (Mixtral, Qwen3) or sigmoid scores (DeepSeek-V3, whose
    # router_bias is then the expert bias of auxiliary-loss-free balancing), the factor the
    # chosen weights are scaled by, and group-limited routing (top `router_group_topk` of
    # `router_groups` expert groups first)
    router_score: Literal["softmax", "sigmoid"] = "softmax"
    router_topk_scale: float | None = Field(default=None, gt=0, le=1_000)
    router_groups: int | None = Field(default=None, ge=1, le=100_000)
    router_group_topk: int | None = Field(default=None, ge=1, le=100_000)

    @model_validator(mode="after")
    def _groups(self) -> MoE:
        if (self.router_groups is None) != (self.router_group_topk is None):
            raise ValueError("router_groups and router_group_topk go together")
        if self.router_groups is not None:
            if self.experts % self.router_groups:
                raise ValueError(f"experts {self.experts} do not divide into router_groups "
                                 f"{self.router_groups}")
            if self.router_group_topk > self.router_groups:
                raise ValueError(f"router_group_topk {self.router_group_topk} exceeds "
                                 f"router_groups {self.router_groups}")
        return self


class RopeScaling(Spec):
    """Llama 3.1's rotary frequency scaling (rope_type "llama3" in its config.json): wavelengths
    above original_max_positions / low_freq_factor divided by `factor`, below
    original_max_positions / high_freq_factor kept, smoothly in between."""

    type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0, le=1_000)
    low_freq_factor: float = Field(default=1.0, gt=0, le=1_000)
    high_freq_factor: float = Field(default=4.0, gt=0, le=1_000)
    original_max_positions: Size = 8192


class MLA(Spec):
    """Multi-head latent attention (DeepSeek-V2 sec. 2.1; HF DeepseekV3Attention)."""

    q_lora_rank: Size | None = None  # None: q is projected directly (DeepSeek-V2-Lite)
    kv_lora_rank: Size
    qk_nope_head_dim: Size
    qk_rope_head_dim: Size
    v_head_dim: Size


class Mamba(Spec):
    """Mamba-2 mixer sizes (Dao & Gu 2024; HF Mamba2Mixer / NemotronHMamba2Mixer)."""

    state_size: Size
    heads: Count
    head_dim: Size
    n_groups: Count = 1
    conv_kernel: int = Field(default=4, ge=1, le=1_000)
    expand: int | None = Field(default=None, ge=1, le=1_000)  # informational: d_in = heads x head_dim
    chunk_size: Size = 128
    conv_bias: bool = True
    proj_bias: bool = False


class TransformerFile(Spec):
    kind: Literal["transformer"]
    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    layers: int = Field(ge=1, le=100_000)
    hidden: Size
    heads: int = Field(ge=1, le=100_000)
    seq_len: Size
    vocab: int = Field(ge=1, le=100_000_000)
    kv_heads: int | None = Field(default=None, ge=1, le=100_000)
    head_dim: Size | None = None  # default hidden / heads
    ffn_hidden: Size | None = None
    ffn_kind: Literal["gelu", "swiglu", "geglu", "relu2"] = "gelu"
    tied_embeddings: bool = True
    bias: bool = True  # biases in every linear layer and in the norms
    qkv_bias: bool | None = None  # default: bias
    out_bias: bool | None = None  # attention output projection; default: bias
    mlp_bias: bool | None = None  # FFN and expert matrices; default: bias
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    post_norms: bool = False  # Gemma 2/3: a norm after attention and after the FFN as well
    qk_norm: bool = False
    # none: no position embedding (NoPE: the causal mask alone orders the tokens; Kazemnejad
    # et al. 2023, and the NoPE layers of Llama 4 / SmolLM3)
    position_embedding: Literal["learned", "rotary", "none"] = "learned"
    max_positions: Size | None = None  # learned position table (default seq_len)
    # rotary embedding base theta (config.json rope_theta); None: the frameworks' 10,000. It
    # changes no count; the launchers write it
    rope_theta: float | None = Field(default=None, gt=0, le=1e12)
    rope_scaling: RopeScaling | None = None
    token_types: int = Field(default=0, ge=0, le=1_000_000)  # BERT segment embeddings
    pooler: bool = False  # BERT's h x h pooler on the first token
    # hidden dropout probability after attention and after the FFN (Megatron-LM's default
    # 0.1 for GPT and BERT; 0 for Llama-lineage models): > 0 stores a 1-byte mask per value
    dropout: float = Field(default=0.0, ge=0, lt=1)
    causal: bool = True  # a decoder's causal mask; false for an encoder (BERT)
    moe: MoE | None = None
    first_dense_layers: int = Field(default=0, ge=0, le=100_000)
    mla: MLA | None = None
    sliding_window: Size | None = None
    sliding_window_pattern: str | None = Field(default=None, min_length=1, max_length=100_000)
    attention_sinks: bool = False
    layer_pattern: str | None = Field(default=None, min_length=1, max_length=100_000)
    mamba: Mamba | None = None
    # multi-token prediction depths (DeepSeek-V3 sec. 2.2; Megatron-LM --mtp-num-layers): each
    # a block of the last layer's kind after its own projection, with the LM head run again
    mtp_layers: int = Field(default=0, ge=0, le=64)
    # a hybrid model's MTP depth in layer_pattern letters (Megatron-LM's "main/mtp/mtp"
    # hybrid pattern: Nemotron 3 Super's "*E"); default: one block of the last layer's kind
    mtp_pattern: str | None = Field(default=None, min_length=1, max_length=64)
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _shapes(self) -> TransformerFile:
        if self.head_dim is None and self.mla is None and self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads} "
                             "(set head_dim)")
        kv = self.kv_heads or self.heads
        if kv > self.heads or self.heads % kv:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {kv}")
        if self.moe and self.moe.top_k > self.moe.experts:
            raise ValueError(f"moe.top_k {self.moe.top_k} exceeds moe.experts {self.moe.experts}")
        if self.first_dense_layers and not self.moe:
            raise ValueError("first_dense_layers needs moe")
        if self.mtp_layers and self.layer_pattern is not None and self.mtp_pattern is None:
            raise ValueError("mtp_layers with a layer_pattern needs mtp_pattern (the hybrid "
                             "layers of one depth, as Megatron-LM's main/mtp/mtp pattern)")
        if self.mtp_pattern is not None:
            if not self.mtp_layers:
                raise ValueError("mtp_pattern needs mtp_layers")
            if self.layer_pattern is None:
                raise ValueError("mtp_pattern needs a layer_pattern (a hybrid model)")
            bad = set(self.mtp_pattern) - set(PATTERN_MIXERS)
            if bad:
                raise ValueError(f"mtp_pattern: unknown layer {sorted(bad)[0]!r} (M Mamba-2, "
                                 "* attention, - MLP, E MoE)")
            if "M" in self.mtp_pattern and self.mamba is None:
                raise ValueError("mtp_pattern has Mamba layers (M) but no mamba sizes")
            if "E" in self.mtp_pattern and self.moe is None:
                raise ValueError("mtp_pattern has MoE layers (E) but no moe")
        if self.mtp_layers and self.position_embedding not in ("rotary", "none"):
            raise ValueError("mtp_layers needs rotary or no position embedding (Megatron-LM "
                             "runs multi-token prediction with rope or none only)")
        if self.first_dense_layers >= self.layers:
            raise ValueError(f"first_dense_layers {self.first_dense_layers} leaves no MoE layer "
                             f"of {self.layers}")
        if self.sliding_window_pattern is not None:
            if set(self.sliding_window_pattern) - set("SF"):
                raise ValueError(f"sliding_window_pattern {self.sliding_window_pattern[:40]!r}: "
                                 "use S (sliding) and F (full) only")
            if self.sliding_window is None:
                raise ValueError("sliding_window_pattern needs sliding_window")
        if self.layer_pattern is not None:
            bad = set(self.layer_pattern) - set(PATTERN_MIXERS)
            if bad:
                raise ValueError(f"layer_pattern: unknown layer {sorted(bad)[0]!r} (M Mamba-2, "
                                 "* attention, - MLP, E MoE)")
            if len(self.layer_pattern) != self.layers:
                raise ValueError(f"layer_pattern has {len(self.layer_pattern)} layers, layers "
                                 f"is {self.layers}")
            if "M" in self.layer_pattern and self.mamba is None:
                raise ValueError("layer_pattern has Mamba layers (M) but no mamba sizes")
            if "E" in self.layer_pattern and self.moe is None:
                raise ValueError("layer_pattern has MoE layers (E) but no moe")
            if self.first_dense_layers:
                raise ValueError("first_dense_layers and layer_pattern: write the dense layers "
                                 "into the pattern")
        elif self.mamba is not None:
            raise ValueError("mamba needs a layer_pattern with M layers")
        if (self.rope_theta is not None or self.rope_scaling is not None) and \
                self.position_embedding != "rotary":
            raise ValueError("rope_theta / rope_scaling need position_embedding: rotary")
        if self.mla is not None and self.head_dim is not None:
            raise ValueError("mla sets its own head sizes: drop head_dim")
        return self
