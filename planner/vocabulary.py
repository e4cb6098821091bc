"""The plan vocabulary every layer shares, in a leaf module that imports nothing heavy: a
`planner.plan.Plan` and a `planner.prediction.Prediction` can be built, read and written
without SymPy (which `planner.expr` needs to build expressions)."""

from __future__ import annotations

from enum import Enum


class Collective(str, Enum):
    """The data-parallel gradient collective (its cost: `planner.expr.collectives`)."""

    ring = "ring"
    halving_doubling = "halving-doubling"
    tree = "tree"
    parameter_server = "parameter-server"
    hierarchical = "hierarchical"


class Recompute(str, Enum):
    """Activation recomputation (Korthikanti et al. 2022): none, selective (attention core),
    full (every layer's forward again in backward)."""

    none = "none"
    selective = "selective"
    full = "full"

    @property
    def code(self) -> int:
        """The cost model's encoding (0, 1, 2)."""
        return list(Recompute).index(self)


class Schedule(str, Enum):
    """Pipeline schedule: 1F1B (Narayanan et al. SC21) or GPipe (Huang et al. 2019)."""

    one_f_one_b = "1f1b"
    gpipe = "gpipe"


class Kernels(str, Enum):
    """How the non-matmul work runs: fused as Megatron-LM, Transformer Engine and
    torch.compile fuse it, or eager, one PyTorch kernel per op (Hugging Face models, NVIDIA's
    BERT example, torchtitan without torch.compile)."""

    fused = "fused"
    eager = "eager"


# the optimizers a transformer plan prices (their state and step: planner.expr.transformer);
# a CNN's memory model knows the first three
TRANSFORMER_OPTIMIZERS = ("adam", "sgd", "momentum", "adafactor", "muon")
