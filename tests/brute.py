"""Brute force for the search tests: the fastest plan that fits, by pricing every candidate
split with `predict` one at a time (what the solver's priced table must agree with)."""

import math

from planner.errors import SpecError
from planner.plan import Plan, largest_chunk
from planner.search.hybrid import predict
from planner.spec.hardware import Precision


def fastest_fitting(m, system, global_batch: int, budget: int, splits,
                    precision=Precision.bf16, **pins) -> float:
    """The iteration time of the fastest plan that fits memory, over `splits` (dicts with t,
    p, d, mb and any other Plan keywords such as cp, ep, etp) crossed with every recompute
    and ZeRO 2 / 3 (what the search offers unpinned); `pins` go to every plan. Partial
    recomputation tries every layer count short of a whole chunk, where no recomputation
    does not fit (where it does, it is faster than any recomputation). Plans the model or
    the plan rules refuse are skipped."""
    best = math.inf
    for split in splits:
        t, p, d, mb = (split[k] for k in ("t", "p", "d", "mb"))
        extra = {k: v for k, v in split.items() if k not in ("t", "p", "d", "mb")}
        if t * extra.get("cp", 1) * p * d > budget or global_batch % (d * mb):
            continue
        for zero in (2, 3):
            args = dict(t=t, p=p, d=d, mb=mb, zero=zero, **extra, **pins)
            none = _time(m, system, precision, global_batch, "none", args)
            times = [none, _time(m, system, precision, global_batch, "selective", args),
                     _time(m, system, precision, global_batch, "full", args)]
            if none == math.inf and "recompute_layers" not in pins:
                keys = extra | pins
                chunk = largest_chunk(m.layers, p, keys.get("interleave", 1),
                                      keys.get("first_stage_layers"),
                                      keys.get("last_stage_layers"))
                times += [_time(m, system, precision, global_batch, "full",
                                {**args, "recompute_layers": n}) for n in range(1, chunk)]
            best = min([best, *(x for x in times if x is not None)])
    return best


def _time(m, system, precision, global_batch: int, recompute: str, args: dict) -> float | None:
    """One plan's iteration time (inf where it does not fit; None where it is refused)."""
    t, p, d, mb = (args[k] for k in ("t", "p", "d", "mb"))
    rest = {k: v for k, v in args.items() if k not in ("t", "p", "d", "mb")}
    try:
        plan = Plan.split(t, p, d, mb, global_batch, node_size=system.devices_per_node,
                          recompute=recompute, sequence_parallel=t > 1, **rest)
        pred = predict(m, system, precision, plan)
    except SpecError:
        return None
    return pred.iteration_time_s if pred.fits_memory else math.inf
