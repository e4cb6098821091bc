"""Bytes per device for data-parallel training, by part.

Mixed precision keeps an fp32 master copy of the weights beside the 16-bit one (Micikevicius et
al., "Mixed Precision Training", ICLR 2018); momentum keeps one fp32 value per parameter, Adam two
(Kingma & Ba 2015); activations of every layer are kept for the backward pass.
"""

from __future__ import annotations

import math
from enum import Enum

import sympy as sp

from planner.spec.cnn import CNN
from planner.spec.hardware import Precision


class Optimizer(str, Enum):
    sgd = "sgd"
    momentum = "momentum"
    adam = "adam"

    @property
    def state_bytes_per_param(self) -> int:
        return {"sgd": 0, "momentum": 4, "adam": 8}[self.value]


def breakdown(cnn: CNN, precision: Precision, optimizer: Optimizer, b: sp.Expr) -> dict:
    d = precision.bytes
    params = cnn.params
    master = 4 if d < 4 else 0
    stored = math.prod(cnn.input_shape) + sum(
        l.activation_elements for l in cnn.layers if l.type != "flatten"
    )
    return {
        "weights": sp.Float(params * (d + master)),
        "gradients": sp.Float(params * d),
        "optimizer": sp.Float(params * optimizer.state_bytes_per_param),
        "activations": d * stored * b,
    }
