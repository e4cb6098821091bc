"""What a search minimises: one enum for every model family.

Every objective is the iteration time times a factor of (devices N, global batch B) at a fixed
point: 1 (iteration time), 1 / B (time per sample = 1 / throughput), N / T_1(B) (1 /
efficiency), tokens / (B s) (time to process a token budget), S(B) (time to train, McCandlish
et al. 2018) or S(B) N price (cost to train).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from planner.errors import SpecError

if TYPE_CHECKING:
    import numpy as np


class Objective(str, Enum):
    throughput = "throughput"
    iteration_time = "iteration-time"
    efficiency = "efficiency"
    token_budget = "token-budget"
    time_to_train = "time-to-train"
    cost = "cost"

    @property
    def unit(self) -> str:
        return UNITS[self]

    @property
    def needs_training(self) -> bool:
        """Needs the statistical-efficiency inputs (critical batch and a target)."""
        return self in (Objective.time_to_train, Objective.cost)


UNITS = {Objective.throughput: "s/sample", Objective.iteration_time: "s",
         Objective.efficiency: "1/efficiency", Objective.token_budget: "s",
         Objective.time_to_train: "s", Objective.cost: "USD"}

# What each family can price: efficiency needs one device's time for the whole batch (a CNN
# has it; a large transformer does not fit one device); a token budget counts tokens.
SUPPORTED = {
    "cnn": tuple(o for o in Objective if o is not Objective.token_budget),
    "transformer": tuple(o for o in Objective if o is not Objective.efficiency),
}
WHY_NOT = {("cnn", Objective.token_budget): "a CNN has no tokens",
           ("transformer", Objective.efficiency): "one device cannot run the whole batch"}


def objective_for(value, family: str) -> Objective:
    """The objective named `value`, checked against what `family` supports (exit 2 if not)."""
    try:
        obj = value if isinstance(value, Objective) else Objective(value)
    except ValueError:
        allowed = ", ".join(o.value for o in SUPPORTED[family])
        raise SpecError(f"objective: unknown value {value!r} (allowed: {allowed})") from None
    if obj not in SUPPORTED[family]:
        allowed = ", ".join(o.value for o in SUPPORTED[family])
        raise SpecError(f"objective: {obj.value} applies to "
                        f"{'transformer' if family == 'cnn' else 'CNN'} models only "
                        f"({WHY_NOT[family, obj]}); {family} objectives: {allowed}")
    return obj


def other_objective(objective: Objective, values: np.ndarray, devices: np.ndarray,
                    batch: np.ndarray) -> np.ndarray:
    """What ties in `values` are broken by (lower wins): for a time, the device-seconds it
    costs (per sample, or to train); for the cost to train, the time to train (the price per
    device-hour is a constant, so cost / devices is proportional to the time)."""
    if objective is Objective.cost:
        return values / devices
    if objective is Objective.iteration_time:
        return values * devices / batch
    return values * devices
