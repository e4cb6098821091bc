"""Brute force for the search tests: the fastest plan that fits, over every candidate split
built as a `Plan` (so the plan's own rules and the model's checks refuse what they refuse) and
priced all at once by the vectorised cost engine (`planner.cost.transformer.iteration` on
arrays), independent of the search's structures, choices and pruning."""

import math

import numpy as np

from planner import switches
from planner.cost.transformer import PARTIAL, Hardware, iteration
from planner.errors import SpecError
from planner.plan import Plan, check_for_model, largest_chunk
from planner.search.hybrid import _check_system
from planner.search.memory_fit import DEFAULT_MEMORY_HEADROOM, usable_bytes
from planner.spec.hardware import Precision


def fastest_fitting(m, system, global_batch: int, budget: int, splits,
                    precision=Precision.bf16, zeros=(2, 3), **pins) -> float:
    """The iteration time of the fastest plan that fits memory, over `splits` (dicts with t,
    p, d, mb and any other Plan keywords such as cp, ep, etp) crossed with every recompute
    and ZeRO 2 / 3 (what the search offers unpinned; `zeros` to pin one); `pins` go to every
    plan. Partial
    recomputation tries every layer count short of a whole chunk (where no recomputation
    does not fit: where it does, it is faster than any recomputation). Plans the model or
    the plan rules refuse are skipped."""
    plans, tried = [], set()  # tried: the partial plans of the search's own rule (below)
    for split in splits:
        t, p, d, mb = (split[k] for k in ("t", "p", "d", "mb"))
        extra = {k: v for k, v in split.items() if k not in ("t", "p", "d", "mb")}
        if t * extra.get("cp", 1) * p * d > budget or global_batch % (d * mb):
            continue
        for zero in zeros:
            args = dict(t=t, p=p, d=d, mb=mb, zero=zero, **extra, **pins)
            plans += [x for x in (_plan(m, system, global_batch, r, args)
                                  for r in ("none", "selective", "full")) if x]
            if "recompute_layers" not in pins:
                keys = extra | pins
                chunk = largest_chunk(m.layers, p, keys.get("interleave", 1),
                                      keys.get("first_stage_layers"),
                                      keys.get("last_stage_layers"))
                partial = [x for x in (_plan(m, system, global_batch, "full",
                                             {**args, "recompute_layers": n})
                                       for n in range(1, chunk)) if x]
                tried.update(id(x) for x in partial)
                plans += partial
    if not plans:
        return math.inf
    time_s, memory = priced(m, system, precision, plans)
    cap = usable_bytes(system.device.usable_memory_bytes, DEFAULT_MEMORY_HEADROOM)
    fits = memory <= cap
    # partial recomputation is tried where no recomputation of the same plan does not fit
    fits_none = {_key(x): ok for x, ok in zip(plans, fits, strict=True)
                 if x.recompute.value == "none"}
    keep = np.array([ok and (id(x) not in tried or not fits_none.get(_key(x), True))
                     for x, ok in zip(plans, fits, strict=True)])
    return float(time_s[keep].min()) if keep.any() else math.inf


def _key(plan: Plan) -> tuple:
    return (plan.tp, plan.pp, plan.dp, plan.micro_batch, plan.cp, plan.ep, plan.etp,
            plan.interleave, plan.zero)


def _plan(m, system, global_batch: int, recompute: str, args: dict) -> Plan | None:
    """The plan, or None where the plan, the model or the system refuses it."""
    t, p, d, mb = (args[k] for k in ("t", "p", "d", "mb"))
    rest = {k: v for k, v in args.items() if k not in ("t", "p", "d", "mb")}
    try:
        plan = Plan.split(t, p, d, mb, global_batch, node_size=system.devices_per_node,
                          recompute=recompute, sequence_parallel=t > 1, **rest)
        check_for_model(m, plan)
    except SpecError:
        return None
    return plan


def priced(m, system, precision, plans: list[Plan]) -> tuple[np.ndarray, np.ndarray]:
    """(iteration time, memory per device) of every plan, in one call of the cost engine on
    arrays (the plans share their switches: the pins)."""
    shared = {s.name: getattr(plans[0], s.name) for s in switches.SWITCHES}
    for plan in plans:
        assert switches.values(plan) == shared, "the plans of one call share their switches"
        _check_system(system, precision, plan)
    col = lambda f: np.array([f(x) for x in plans])  # noqa: E731
    cfg = {"t": col(lambda x: x.tp), "p": col(lambda x: x.pp), "d": col(lambda x: x.dp),
           "mb": col(lambda x: x.micro_batch), "acc": col(lambda x: x.accumulation),
           "v": col(lambda x: x.interleave), "cp": col(lambda x: x.cp),
           "ep": col(lambda x: x.ep), "etp": col(lambda x: x.etp),
           "rl": col(lambda x: x.recompute_layers or 1),
           "recompute": col(lambda x: PARTIAL if x.recompute_layers else x.recompute.code),
           "sp": col(lambda x: int(x.sequence_parallel)), "zero": col(lambda x: x.zero),
           "gpipe": col(lambda x: int(x.schedule.value == "gpipe")), **shared}
    out = iteration(m, Hardware.of(system, precision), cfg, ("time", "memory"))
    return np.asarray(out["time"], dtype=float), np.asarray(out["memory"], dtype=float)
