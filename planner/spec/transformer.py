"""Transformer specs and their exact parameter and FLOP counts.

Counts are itemised per weight matrix, so grouped-query attention, SwiGLU, untied embeddings
and mixture-of-experts fall out of the same code. For the plain GPT layer (kv_heads = heads,
ffn_hidden = 4 h, GeLU, biases) they reduce to the published closed forms, which the tests
hold: parameters 12 l h^2 + 13 l h + (V + s) h (Narayanan et al. SC21, sec. 5.1) and
forward FLOPs 24 B s l h^2 (1 + s / (6 h)) + 2 B s h V (ibid. eq. 3 divided by its 4 passes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.errors import SpecError
from planner.spec.base import Spec, validate

Size = Annotated[int, Field(ge=1, le=10_000_000)]


class MoE(Spec):
    experts: int = Field(ge=1, le=100_000)
    top_k: int = Field(ge=1, le=100_000)
    expert_ffn_hidden: Size | None = None


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
    ffn_hidden: Size | None = None
    ffn_kind: Literal["gelu", "swiglu"] = "gelu"
    tied_embeddings: bool = True
    bias: bool = True  # biases in every linear layer and in the norms
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position_embedding: Literal["learned", "rotary"] = "learned"
    max_positions: Size | None = None  # learned position table (default seq_len)
    token_types: int = Field(default=0, ge=0, le=1_000_000)  # BERT segment embeddings
    pooler: bool = False  # BERT's h x h pooler on the first token
    moe: MoE | None = None
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _shapes(self) -> TransformerFile:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        kv = self.kv_heads or self.heads
        if kv > self.heads or self.heads % kv:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {kv}")
        if self.moe and self.moe.top_k > self.moe.experts:
            raise ValueError(f"moe.top_k {self.moe.top_k} exceeds moe.experts {self.moe.experts}")
        return self


@dataclass(frozen=True)
class Transformer:
    """A loaded transformer with its derived sizes. Counts are exact integers."""

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
    experts: int = 1
    top_k: int = 1

    kind = "transformer"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices in one FFN: up and down, plus the gate for SwiGLU."""
        return 3 if self.ffn_kind == "swiglu" else 2

    # --- parameters ---------------------------------------------------------------------------

    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" and self.bias else 1)

    def attention_params(self) -> int:
        h, kv = self.hidden, self.kv_dim
        weights = h * h + 2 * h * kv + h * h  # Q, K, V, O
        return weights + ((h + 2 * kv + h) if self.bias else 0)

    def expert_params(self) -> int:
        """One FFN (one expert)."""
        h, f = self.hidden, self.ffn_hidden
        weights = self.ffn_matrices * h * f
        return weights + (((self.ffn_matrices - 1) * f + h) if self.bias else 0)

    def ffn_params(self) -> int:
        router = self.hidden * self.experts if self.experts > 1 else 0
        return self.experts * self.expert_params() + router

    def layer_params(self) -> int:
        return self.attention_params() + self.ffn_params() + 2 * self.norm_params()

    def embedding_params(self) -> int:
        """Token embedding (plus learned positions): held by the first pipeline stage."""
        pos = self.max_positions * self.hidden if self.position_embedding == "learned" else 0
        return (self.vocab + self.token_types) * self.hidden + pos

    def head_params(self) -> int:
        """Final norm and (untied) output projection: held by the last pipeline stage."""
        pooler = self.hidden * self.hidden + self.hidden if self.pooler else 0
        return (self.norm_params() + pooler
                + (0 if self.tied_embeddings else self.vocab * self.hidden))

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters a token passes through (MoE: top_k experts), embeddings excluded."""
        ffn = self.top_k * self.expert_params() + (self.hidden * self.experts
                                                   if self.experts > 1 else 0)
        return self.layers * (self.attention_params() + ffn + 2 * self.norm_params())

    # --- forward FLOPs per sequence (2 per multiply-add; matmuls only) -------------------------

    def layer_matmul_flops(self) -> int:
        """Forward matmul FLOPs of one layer for one sequence: projections, the two attention
        products (QK^T and scores x V, counted over the full s x s, as SC21 and PaLM do), FFN."""
        s, h, kv, f = self.seq_len, self.hidden, self.kv_dim, self.ffn_hidden
        proj = 2 * s * (h * h + 2 * h * kv + h * h)
        attn = 2 * 2 * s * s * h
        ffn = 2 * s * self.ffn_matrices * h * f * self.top_k
        router = 2 * s * h * self.experts if self.experts > 1 else 0
        return proj + attn + ffn + router

    def attention_core_flops(self) -> int:
        """QK^T and scores x V: what selective recompute repeats (Korthikanti et al. 2022)."""
        return 2 * 2 * self.seq_len * self.seq_len * self.hidden

    def logit_flops(self) -> int:
        return 2 * self.seq_len * self.hidden * self.vocab

    def forward_flops(self) -> int:
        return self.layers * self.layer_matmul_flops() + self.logit_flops()

    def model_flops(self) -> int:
        """Forward + backward (2x forward) per sequence, no recompute: the MFU numerator
        (PaLM, appendix B)."""
        return 3 * self.forward_flops()


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
    if spec.heads > spec.hidden:
        raise SpecError(f"{where}: key 'heads': more heads ({spec.heads}) than hidden "
                        f"({spec.hidden})")
    return Transformer(
        name=spec.name, description=spec.description, layers=spec.layers, hidden=spec.hidden,
        heads=spec.heads, kv_heads=spec.kv_heads or spec.heads, seq_len=spec.seq_len,
        vocab=spec.vocab, ffn_hidden=ffn, ffn_kind=spec.ffn_kind,
        tied_embeddings=spec.tied_embeddings, bias=spec.bias, norm=spec.norm,
        position_embedding=spec.position_embedding,
        max_positions=spec.max_positions or spec.seq_len, token_types=spec.token_types,
        pooler=spec.pooler, experts=moe.experts if moe else 1, top_k=moe.top_k if moe else 1,
    )
