"""Recommendation models (DLRM, Naumov et al. 2019; DCNv2, Wang et al. WWW 2021): embedding
tables looked up by sparse features and pooled, a bottom MLP over the dense features, a feature
interaction, and a top MLP. `planner.search.placement` places the tables on devices.

YAML (`kind: recommendation`):

    kind: recommendation
    name: dlrm-dcnv2
    dense_features: 13
    embedding_dim: 128            # per table unless a table gives its own `dim`
    value_bytes: 4                # bytes per embedding value (fp32 tables)
    global_batch: 55296           # the batch it trains at (solve's default)
    tables:
      - {rows: 40000000, pooling: 3}      # pooling: lookups per sample (multi-hot size)
      - {rows: 39060, pooling: 2, name: cat_1}
    bottom_mlp: [512, 256, 128]   # the last width is the embedding dim
    interaction: {kind: dcnv2, layers: 3, low_rank: 512}   # or {kind: dot}
    top_mlp: [1024, 1024, 512, 256, 1]

`frequency` (optional, per table, 0-1]: the share of its lookups that reach memory (a cache or
a skewed access pattern serves the rest); default 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from planner.spec.base import Spec, validate

MAX_TABLES = 4096


class TableSpec(Spec):
    rows: int = Field(ge=1, le=10**12)
    pooling: float = Field(gt=0, le=10**6)  # lookups per sample
    dim: int | None = Field(default=None, ge=1, le=65536)
    name: str | None = Field(default=None, min_length=1)
    frequency: float = Field(default=1.0, gt=0, le=1)


class InteractionSpec(Spec):
    kind: Literal["dot", "dcnv2"]
    layers: int = Field(default=3, ge=1, le=64)  # dcnv2: cross layers
    low_rank: int | None = Field(default=None, ge=1, le=65536)  # dcnv2: the U V^T rank


class RecommendationSpec(Spec):
    kind: str = Field(pattern="^recommendation$")
    name: str = Field(min_length=1)
    description: str = ""
    dense_features: int = Field(ge=0, le=65536)
    embedding_dim: int = Field(ge=1, le=65536)
    value_bytes: int = Field(default=4, ge=1, le=8)
    global_batch: int | None = Field(default=None, ge=1, le=2**40)  # the batch it trains at
    tables: list[TableSpec] = Field(min_length=1, max_length=MAX_TABLES)
    bottom_mlp: list[int] = Field(default_factory=list, max_length=64)
    interaction: InteractionSpec
    top_mlp: list[int] = Field(min_length=1, max_length=64)
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> RecommendationSpec:
        if any(w < 1 or w > 2**20 for w in (*self.bottom_mlp, *self.top_mlp)):
            raise ValueError("key 'bottom_mlp' / 'top_mlp': widths are 1 to 1,048,576")
        if self.bottom_mlp and self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(f"key 'bottom_mlp': its last width ({self.bottom_mlp[-1]}) must be "
                             f"the embedding dim ({self.embedding_dim}), which the "
                             f"interaction combines it with")
        names = [t.name or f"table_{i}" for i, t in enumerate(self.tables)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"key 'tables': two tables named {twice[0]!r}")
        if self.interaction.kind == "dot" and any(
                (t.dim or self.embedding_dim) != self.embedding_dim for t in self.tables):
            raise ValueError("key 'interaction': dot products need every table at the "
                             "embedding dim")
        return self


@dataclass(frozen=True)
class Table:
    name: str
    rows: int
    dim: int
    pooling: float  # lookups per sample
    frequency: float  # share of the lookups that reach device memory


@dataclass(frozen=True)
class Recommendation:
    name: str
    description: str
    dense_features: int
    embedding_dim: int
    value_bytes: int
    tables: tuple[Table, ...]
    bottom_mlp: tuple[int, ...]
    interaction: str  # "dot" or "dcnv2"
    cross_layers: int
    low_rank: int | None
    top_mlp: tuple[int, ...]
    global_batch: int | None = None

    kind = "recommendation"  # the model family, as Transformer.kind and CNN.kind name theirs

    @property
    def interaction_width(self) -> int:
        """Features entering the interaction: the bottom MLP's output (or the dense features)
        beside every table's pooled vector."""
        dense = self.bottom_mlp[-1] if self.bottom_mlp else self.dense_features
        return dense + sum(t.dim for t in self.tables)

    @property
    def top_input(self) -> int:
        """The top MLP's input width: DCNv2's cross network keeps its input's width; DLRM's dot
        interaction gives the bottom output and the pairwise dot products (Naumov et al.
        2019, sec. 3)."""
        if self.interaction == "dcnv2":
            return self.interaction_width
        vectors = len(self.tables) + 1
        return self.embedding_dim + vectors * (vectors - 1) // 2

    def dense_layers(self) -> list[tuple[int, int]]:
        """(in, out) of every dense matmul per sample: bottom MLP, cross layers (U and V of
        rank r, or a full F x F matrix without `low_rank`), top MLP."""
        out, width = [], self.dense_features
        for w in self.bottom_mlp:
            out.append((width, w))
            width = w
        if self.interaction == "dcnv2":
            f = self.interaction_width
            for _ in range(self.cross_layers):
                out += ([(f, self.low_rank), (self.low_rank, f)] if self.low_rank
                        else [(f, f)])
        width = self.top_input
        for w in self.top_mlp:
            out.append((width, w))
            width = w
        return out

    def dense_params(self) -> int:
        """Weights and biases of the dense layers; a low-rank cross layer has one bias of F
        (x0 * (U (V^T x) + b) + x, Wang et al. 2021, eq. 2 with W = U V^T), not one per
        factor."""
        params = sum(i * o + o for i, o in self.dense_layers())
        if self.interaction == "dcnv2" and self.low_rank:
            params -= self.cross_layers * self.low_rank  # V^T x has no bias
        return params

    def dense_flops_per_sample(self) -> int:
        """Forward FLOPs of the dense layers per sample (2 per multiply-add); the dot
        interaction adds its pairwise products, DCNv2 its elementwise x0 * (.) terms."""
        flops = sum(2 * i * o for i, o in self.dense_layers())
        if self.interaction == "dot":
            vectors = len(self.tables) + 1
            flops += vectors * (vectors - 1) * self.embedding_dim
        else:
            flops += 2 * self.cross_layers * self.interaction_width
        return flops

    def embedding_params(self) -> int:
        return sum(t.rows * t.dim for t in self.tables)


def build_recommendation(data: dict, where: str) -> Recommendation:
    spec = validate(RecommendationSpec, data, where)
    tables = tuple(Table(t.name or f"table_{i}", t.rows, t.dim or spec.embedding_dim, t.pooling,
                         t.frequency) for i, t in enumerate(spec.tables))
    return Recommendation(spec.name, spec.description, spec.dense_features, spec.embedding_dim,
                          spec.value_bytes, tables, tuple(spec.bottom_mlp),
                          spec.interaction.kind, spec.interaction.layers,
                          spec.interaction.low_rank, tuple(spec.top_mlp), spec.global_batch)
