"""How full a device may be: the usable memory is (1 - headroom) x the device's memory less
its runtime reserve (`Device.usable_memory_bytes`: the driver's share, the CUDA context and the
collective library's buffers, which a real run loses before the model's own bytes). The
headroom keeps a fraction more free, for the allocator's fragmentation: the default 0 none,
`--memory-headroom 0.05` 5 %.
"""

from __future__ import annotations

import dataclasses
import math

from planner.errors import SpecError

DEFAULT_MEMORY_HEADROOM = 0.0


def check_headroom(headroom: float) -> float:
    if (isinstance(headroom, bool) or not isinstance(headroom, int | float)
            or not math.isfinite(headroom) or not 0 <= headroom < 1):
        raise SpecError(f"memory_headroom: must be a fraction in [0, 1), got {headroom!r}")
    return float(headroom)


def usable_bytes(device_bytes: float, headroom: float) -> float:
    """The bytes a plan may use on a device of `device_bytes` (its memory less the runtime
    reserve)."""
    return device_bytes * (1 - check_headroom(headroom))


def filled(memory_bytes: float, device) -> float:
    """The share of `device`'s usable memory (no headroom) `memory_bytes` fill: what
    `planner.bands` judges against the fullest calibration run of the device's family."""
    return memory_bytes / device.usable_memory_bytes


def within(prediction, device_bytes: float, headroom: float):
    """`prediction` (a `planner.prediction.Prediction`) with its capacity the usable bytes and
    `fits_memory` checked against them."""
    cap = usable_bytes(device_bytes, headroom)
    return dataclasses.replace(prediction, memory_capacity_bytes=cap,
                               fits_memory=prediction.memory_bytes_per_device <= cap)
