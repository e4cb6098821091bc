"""Where the chosen plan has no calibration run behind it (its `likely` band says "not
covered": weights sharded with ZeRO-3 / FSDP, or a mixture-of-experts model; `planner.bands`),
the fastest plan the data does cover beside it, and the preference for it. For a ZeRO-3 pick
the covered plan is the fastest ZeRO 2 plan: stage 2 moves what stages 0 and 1 move, holds
less and steps a shard (the search's own dominance rule, `planner.search.hybrid`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from planner.errors import InfeasibleError, SpecError
from planner.search.solution import Solution


def with_support(sol: Solution, solve_zero2: Callable[[], Solution],
                 prefer: float | None) -> Solution:
    """`sol` with its `support` record where its band is not covered: the note, the fastest
    ZeRO 2 plan for a ZeRO-3 pick (None where none fits), and whether it was taken: with
    `prefer` F it is, when its iteration time is within 1 + F of the fastest plan's."""
    band = sol.prediction.time_band
    if not band or "low_s" in band:
        return sol
    alt = None
    if sol.plan.zero == 3:
        try:
            alt = solve_zero2()
        except (SpecError, InfeasibleError):
            alt = None
    fastest = sol.prediction.iteration_time_s
    taken = (alt is not None and prefer is not None
             and alt.prediction.iteration_time_s <= (1 + prefer) * fastest)
    record = {"note": band["note"], "taken": taken,
              "fastest_iteration_time_s": fastest,
              "alternative": None if alt is None else {
                  "config": alt.plan.to_json(),
                  "iteration_time_s": alt.prediction.iteration_time_s,
                  "time_band": alt.prediction.time_band}}
    chosen = alt if taken else sol
    return dataclasses.replace(chosen, support=record)
