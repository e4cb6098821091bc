"""Statistical efficiency and the price of training, shared by the CNN and transformer searches.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", eq. 2.11 and 2.13):
steps to a target loss S(B) = S_min (1 + B_noise / B) and samples E(B) = E_min (1 + B / B_noise),
with E_min = S_min B_noise. Time to train is S(B) x the iteration time; cost to train is that
time x devices x the price per device-hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import SpecError


@dataclass(frozen=True)
class Training:
    """Give the critical batch B_noise and one of S_min (target_steps) or E_min
    (target_samples, in samples: sequences for a transformer). Without a critical batch,
    `target_samples` is a fixed budget (a token budget over the sequence length): whole
    steps of it whatever the batch, with no statistical-efficiency term."""

    critical_batch: float | None
    target_steps: float | None = None
    target_samples: float | None = None
    price_per_device_hour: float | None = None
    deadline_s: float | None = None  # constraint: time to train at most this
    budget_usd: float | None = None  # constraint: cost to train at most this

    @property
    def s_min(self) -> float:
        if self.target_steps is not None:
            return self.target_steps
        return self.target_samples / self.critical_batch

    @property
    def fixed(self) -> bool:
        """A fixed sample budget (no critical batch)."""
        return self.critical_batch is None

    def steps(self, global_batch):
        if self.fixed:
            return whole_steps(self.target_samples / global_batch)
        return self.s_min * (1 + self.critical_batch / global_batch)

    def check(self, *, wants_price: bool) -> None:
        """One-line errors for inconsistent inputs (exit code 2)."""
        if (wants_price or self.budget_usd is not None) and self.price_per_device_hour is None:
            raise SpecError("price_per_device_hour: the device has no price; give "
                            "--price-per-device-hour")
        if self.fixed:
            return
        if not (math.isfinite(self.critical_batch) and self.critical_batch > 0):
            raise SpecError(f"critical_batch: must be positive, got {self.critical_batch}")
        if (self.target_steps is None) == (self.target_samples is None):
            raise SpecError("target_steps: give exactly one of --target-steps (S_min) and "
                            "--target-samples / --target-tokens (E_min)")

    def report(self, global_batch: int, devices: int, iteration_s: float) -> dict:
        """steps, samples, time_to_train_s (and cost_usd with a price) of one plan."""
        steps = self.steps(global_batch)
        out = {"steps": steps, "samples": steps * global_batch,
               "time_to_train_s": steps * iteration_s}
        if self.price_per_device_hour is not None:
            out["cost_usd"] = out["time_to_train_s"] / 3600 * devices * self.price_per_device_hour
        return out


def check_training(training: Training | None, objective, pareto: bool) -> None:
    """The objectives and outputs that need a Training have one, and it is consistent."""
    needs = objective in ("time-to-train", "cost") or pareto
    if needs and training is None:
        raise SpecError("critical_batch: --objective time-to-train / cost and --pareto need "
                        "--tokens, or --critical-batch and one of --target-steps / "
                        "--target-samples / --target-tokens")
    if training is not None:
        training.check(wants_price=objective == "cost" or pareto)


def whole_steps(steps):
    """Steps rounded up to whole ones (a float or an array; the last step may be part-filled),
    forgiving the rounding of a quotient that is whole."""
    import numpy as np

    out = np.ceil(np.asarray(steps, dtype=float) * (1 - 1e-12))
    return int(out) if out.ndim == 0 else out


def token_budget(tokens: float, devices: int, tokens_per_s: float, iteration_s: float,
                 price: dict | None) -> dict:
    """Time and cost of training on a fixed number of tokens (a token budget, as Chinchilla-
    style runs are planned): steps = the tokens over those of one step (global batch x
    sequence), rounded up (a run takes whole steps), time = steps x iteration time,
    device-hours = time x devices, cost = device-hours x the price per device-hour
    (`price`: {"usd", "source"}; None when neither a flag nor the device spec gives one).
    No statistical-efficiency model (`--critical-batch`): the budget fixes the tokens
    whatever the batch."""
    steps = whole_steps(tokens / (tokens_per_s * iteration_s))
    time_s = steps * iteration_s
    device_hours = time_s / 3600 * devices
    return {"tokens": tokens, "steps": steps,
            "time_to_train_s": time_s, "time_to_train_days": time_s / 86400,
            "device_hours": device_hours,
            "price_per_device_hour_usd": None if price is None else price["usd"],
            "price_source": None if price is None else price["source"],
            "cost_usd": None if price is None else device_hours * price["usd"]}
