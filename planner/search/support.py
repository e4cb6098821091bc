"""Where the chosen plan has no calibration run behind it (its `likely` band says "not
covered": weights sharded with ZeRO-3 / FSDP, gradients sharded with ZeRO-2, LoRA through a
pipeline, or a mixture-of-experts model; `planner.bands`), the fastest plan the data does cover
beside it, and the preference for it, compared in what the search minimised (the time per
sample, the cost or the time to train). For a ZeRO-2 or ZeRO-3 pick the covered plan is the
fastest ZeRO 1 plan (gradients and weights whole, Megatron-LM's distributed optimizer, what
every calibration run holds): the search itself offers stages 2 and 3 only, stage 2 moving what
stages 0 and 1 move and holding less (its dominance rule, `planner.search.hybrid`), so a pick
holds its gradients sharded wherever that is not slower, a framework path no measurement
checks. For a LoRA pick through a pipeline it is the fastest plan without one (pp 1, as every
LoRA run in the data), itself covered the same way.

The preference by default: the covered plan is taken when it is within the error band of the
fastest, i.e. when the two plans' bands overlap. The fastest plan has no band of its own; it is
given the covered plan's spread (the same system, precision, model size and scale): the covered
plan is taken when alt x low <= fastest x high, that is within high / low - 1 of the fastest
(always where the fastest split fits with whole gradients: the same time). Two plans whose
predictions differ by less than the model's own 10th-90th percentile spread on such runs are
not told apart by the model, and then the one the data checks is the safer pick (a search
otherwise walks into the corner its cost model is most optimistic about: the optimizer's
curse). A fraction F instead takes it within 1 + F (0: only a covered plan as good)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from planner import bands
from planner.errors import InfeasibleError, SpecError
from planner.search.solution import Solution

# what a covered alternative holds that the fastest plan does not (the support record's
# `covered_by`): its gradients and weights whole, or no pipeline
ZERO1, NO_PIPELINE = "ZeRO 1", "pp 1"


def with_support(sol: Solution, solve_covered: Callable[[], Solution] | None,
                 prefer: float | None = None, covered_by: str = ZERO1) -> Solution:
    """`sol` with its `support` record where its band is not covered: the note, the covered
    plan `solve_covered` gives (the fastest ZeRO 1 plan for a ZeRO-2 or ZeRO-3 pick, the
    fastest without a pipeline for a pipelined LoRA one; None where none fits or none is
    asked), the tolerance and whether the plan was taken: when its objective value (time per
    sample, cost, time to train) is within 1 + tolerance of the fastest plan's, the tolerance
    being `prefer` F or, with None, the covered plan's band spread (high / low - 1; 0 where it
    has no band)."""
    band = sol.prediction.time_band
    if not band or "low_s" in band:
        return sol
    alt = None
    if solve_covered is not None:
        try:
            alt = solve_covered()
        except (SpecError, InfeasibleError):
            alt = None
    tolerance = prefer if prefer is not None else band_tolerance(alt)
    # compared in what the search minimised (time per sample, cost, time to train: each
    # proportional to the iteration time of its plan, so the band's spread carries over)
    taken = (alt is not None and tolerance is not None
             and alt.objective.value <= (1 + tolerance) * sol.objective.value)
    record = {"note": band["note"], "taken": taken, "covered_by": covered_by,
              "rule": "band" if prefer is None else "fraction", "tolerance": tolerance,
              "fastest_iteration_time_s": sol.prediction.iteration_time_s,
              "objective": sol.objective.name, "fastest_objective": sol.objective.value,
              "alternative": None if alt is None else {
                  "config": alt.plan.to_json(),
                  "iteration_time_s": alt.prediction.iteration_time_s,
                  "objective_value": alt.objective.value,
                  "time_band": alt.prediction.time_band}}
    chosen = alt if taken else sol
    return dataclasses.replace(chosen, support=record)


def band_tolerance(alt: Solution | None) -> float | None:
    """How much slower than the fastest plan the covered `alt` may be predicted and still lie
    within the fastest plan's band: its own band's spread high / low - 1; 0 where it has no
    band either (a mixture-of-experts plan: taken only as fast); None without `alt`."""
    if alt is None:
        return None
    band = alt.prediction.time_band
    if not band or "low_ratio" not in band:
        return 0.0
    return band["high_ratio"] / band["low_ratio"] - 1


def supported_solve(m, system, precision, q, prefer: float | None = None
                    ) -> tuple[Solution, Solution]:
    """(the fastest plan of the transformer search request `q`, `solve`'s pick: the fastest
    plan, or beside an uncovered one the fastest covered plan where `with_support` takes it:
    ZeRO 1 beside ZeRO-2 / ZeRO-3; for LoRA pp 1 and ZeRO 1 beside either; context
    parallelism within the family's calibrated degrees (`planner.bands.covered_cp`) beside a
    plan beyond them). A ZeRO stage, a pipeline or a context-parallel degree the request pins
    is the user's: the fastest plan is the pick (a pinned LoRA pipeline or cp beyond the data
    says it is not covered, with no plan beside it)."""
    from planner.search.hybrid import HybridSolver

    solver = HybridSolver(m, system, precision, q)
    fastest = solver.solve()
    plan = fastest.plan
    pipeline = bands.lora_pipeline(plan)
    most = bands.covered_cp(system.device.name)
    pins = covered_pins(q, plan, most)
    if pins:
        # a second search over the covered plans only
        def covered() -> Solution:
            return HybridSolver(m, system, precision, dataclasses.replace(q, **pins)).solve()

        return fastest, with_support(fastest, covered, prefer, covered_by(pins))
    if q.zero is not None:
        return fastest, fastest
    if plan.cp > most or pipeline:  # the request's own cp or pipeline: none beside it
        return fastest, with_support(fastest, None, prefer, covered_by(
            {"cp_max": most} if plan.cp > most else {"pp": 1}))
    # the fastest ZeRO 1 plan: the best ZeRO 1 twin of the table the search priced (for a
    # ZeRO 2 pick whose split fits at ZeRO 1, that split: the same time, and no stage 1 plan
    # is faster), its runners-up, front and knee ZeRO 1 plans too (`HybridSolver.covered`)
    return fastest, with_support(fastest, solver.covered if plan.zero >= 2 else None,
                                 prefer)


def covered_pins(q, plan, most: int) -> dict:
    """The pins of the search for the covered plan beside `plan`, the fastest of request `q`
    (empty where that takes no second search): a LoRA plan is covered without a pipeline at
    ZeRO 0 / 1 (every LoRA run is pp 1 with whole gradients), any plan at context parallelism
    up to `most` (and then at ZeRO 1 unless the request pins its stage). What the request
    pins is kept: no covered plan where the pin itself is what the data lacks."""
    if ((q.zero is not None and q.zero >= 2) or (q.cp is not None and q.cp > most)
            or (q.lora_rank and q.pp is not None and q.pp > 1)):
        return {}  # the pin itself is uncovered: no plan of the request is
    lora = q.lora_rank and q.pp is None
    beyond = plan.cp > most and q.cp is None
    if not (beyond or lora and (bands.lora_pipeline(plan) or plan.zero >= 2)):
        return {}
    pins = {"cp_max": most} if beyond else {}
    if lora:
        pins |= {"pp": 1, "zero": 1 if q.zero is None else q.zero}
    elif q.zero is None:
        pins["zero"] = 1
    return pins


def covered_by(pins: dict) -> str:
    """What the covered plan holds that the fastest may not (the support record's
    `covered_by`): "ZeRO 1", "pp 1", "cp at most N", or those of them its search pinned."""
    parts = [NO_PIPELINE] if pins.get("pp") == 1 else []
    if "cp_max" in pins:
        parts.append(f"cp at most {pins['cp_max']}")
    return ", ".join(parts) or ZERO1
