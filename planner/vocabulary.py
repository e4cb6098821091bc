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
