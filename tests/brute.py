"""Brute force for the search tests: the fastest plan that fits, by pricing every candidate
split with `predict` one at a time (what the solver's priced table must agree with)."""

import itertools
import math

from planner.errors import SpecError
from planner.plan import Plan
from planner.search.hybrid import predict
from planner.spec.hardware import Precision


def fastest_fitting(m, system, global_batch: int, budget: int, splits,
                    precision=Precision.bf16, **pins) -> float:
    """The iteration time of the fastest plan that fits memory, over `splits` (dicts with t,
    p, d, mb and any other Plan keywords such as cp, ep, etp) crossed with every recompute
    and ZeRO 2 / 3 (what the search offers unpinned); `pins` go to every plan. Plans the
    model or the plan rules refuse are skipped."""
    best = math.inf
    for split in splits:
        t, p, d, mb = (split[k] for k in ("t", "p", "d", "mb"))
        extra = {k: v for k, v in split.items() if k not in ("t", "p", "d", "mb")}
        if t * extra.get("cp", 1) * p * d > budget or global_batch % (d * mb):
            continue
        for rec, zero in itertools.product(("none", "selective", "full"), (2, 3)):
            try:
                plan = Plan.split(t, p, d, mb, global_batch, node_size=system.devices_per_node,
                                  recompute=rec, zero=zero, sequence_parallel=t > 1, **extra,
                                  **pins)
                pred = predict(m, system, precision, plan)
            except SpecError:
                continue
            if pred.fits_memory:
                best = min(best, pred.iteration_time_s)
    return best
