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
LoRA run in the data), itself covered the same way. Every covered plan also keeps to the
context- and expert-parallel degrees its family's runs reach and fills no more of a device's
memory than the family's fullest run (`planner.bands.REACH`: the memory bound searched as a
headroom of 1 - that share).

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
from planner.search.memory_fit import filled, within
from planner.search.solution import Alternative, Solution

# what a covered alternative holds that the fastest plan does not (the support record's
# `covered_by`): its gradients and weights whole, or no pipeline
ZERO1, NO_PIPELINE = "ZeRO 1", "pp 1"
CP_AT_MOST = "cp at most "  # the covered cp bound's label, "cp at most N" (`covered_by`)
EP_AT_MOST = "ep at most "  # and the covered ep bound's, "ep at most N"
FULL_AT_MOST = "memory at most "  # and the memory's, "memory at most 94.2%" (of the usable)


def with_support(sol: Solution, solve_covered: Callable[[], Solution] | None,
                 prefer: float | None = None, covered_by: str = ZERO1,
                 spread: float | None = None, note: str | None = None,
                 headroom: float | None = None) -> Solution:
    """`sol` with its `support` record where its band is not covered: the note, the covered
    plan `solve_covered` gives (the fastest ZeRO 1 plan for a ZeRO-2 or ZeRO-3 pick, the
    fastest without a pipeline for a pipelined LoRA one; None where none fits or none is
    asked), the tolerance and whether the plan was taken: when its objective value (time per
    sample, cost, time to train) is within 1 + tolerance of the fastest plan's, the tolerance
    being `prefer` F or, with None, the covered plan's band spread (high / low - 1; 0 where it
    has no band; `spread` where given: a plan covered but for one feature takes the spread of
    the band it would have without it). `note`: why `sol` is not covered, where not its
    band's own; `headroom`: the memory headroom the covered plan's search kept (the family's
    fullest run: `covered_pins`), recorded so that a user can search it again."""
    band = sol.prediction.time_band
    if not band or "low_s" in band:
        return sol
    alt = None
    if solve_covered is not None:
        try:
            alt = solve_covered()
        except (SpecError, InfeasibleError):
            alt = None
    tolerance = (prefer if prefer is not None else spread if spread is not None and alt
                 else band_tolerance(alt))
    # compared in what the search minimised (time per sample, cost, time to train: each
    # proportional to the iteration time of its plan, so the band's spread carries over)
    taken = (alt is not None and tolerance is not None
             and alt.objective.value <= (1 + tolerance) * sol.objective.value)
    record = {"note": note or band["note"], "taken": taken, "covered_by": covered_by,
              "rule": "band" if prefer is None else "fraction", "tolerance": tolerance,
              "fastest_iteration_time_s": sol.prediction.iteration_time_s,
              "fastest_zero": sol.plan.zero, "memory_headroom": headroom,
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
    return None if alt is None else band_tolerance_of(alt.prediction.time_band) or 0.0


def band_tolerance_of(band: dict | None) -> float | None:
    """A `time_band`'s spread, high / low - 1 (None where it has none): `Band.spread` of
    its JSON form."""
    if not band or "low_ratio" not in band:
        return None
    return band["high_ratio"] / band["low_ratio"] - 1


def supported_solve(m, system, precision, q, prefer: float | None = None
                    ) -> tuple[Solution, Solution]:
    """(the fastest plan of the transformer search request `q`, `solve`'s pick: the fastest
    plan, or beside an uncovered one the fastest covered plan where `with_support` takes it).
    The covered plan holds its gradients and weights whole (ZeRO 1), keeps to the context-
    parallel degrees the family's runs reach (`planner.bands.covered_cp`), for a
    mixture-of-experts model to the expert-parallel degrees its MoE runs reach
    (`planner.bands.covered_ep`) and, for LoRA, has no pipeline; where none at the covered
    ep lies within the band, the plan covered in all but its ep is weighed next. What the
    request pins is the user's: where a pin is itself what no run checks (a cp or ep beyond
    the data, a LoRA pipeline), or the model is one no run covers (mixture-of-experts at
    ZeRO 0 / 1), the pick says it is not covered and names no plan beside it; a pinned
    ZeRO 2 / 3 is the pick with no record (its `likely` band says it)."""
    from planner.search.hybrid import HybridSolver

    solver = HybridSolver(m, system, precision, q)
    fastest = solver.solve()
    band = fastest.prediction.time_band
    if not band or "low_s" in band:
        return fastest, fastest
    plan, device = fastest.plan, system.device.name
    most = bands.covered_cp(device)
    ep_most = bands.covered_ep(device) if m.experts > 1 else None
    full_most = bands.covered(device, "full")
    beyond = most is not None and plan.cp > most
    beyond_ep = ep_most is not None and plan.ep > ep_most
    beyond_full = full_most is not None and fullness(fastest, system) > full_most
    pipeline = bands.lora_pipeline(plan)
    label = covered_by(pipeline, most if beyond else None, ep_most if beyond_ep else None,
                       full_most if beyond_full else None)
    # a pinned ep beyond the data is the user's: the plan beside the fastest keeps it and
    # is covered in all else (below)
    ep_pinned = beyond_ep and q.ep is not None
    pins = covered_pins(q, plan, most, None if ep_pinned else ep_most, full_most, beyond_full)
    if pins is None:
        if q.zero is not None and q.zero >= 2:
            return fastest, fastest  # a pinned stage is the user's (its band says so)
        return fastest, with_support(fastest, None, prefer, label)

    def search(pins: dict) -> Callable[[], Solution]:
        """The fastest plan of the request with `pins` added: a second search (its memory
        reported against the request's own capacity, the bound being the search's only)."""
        return lambda: as_requested(HybridSolver(m, system, precision,
                                                 dataclasses.replace(q, **pins)).solve(),
                                    system.device.usable_memory_bytes, q.memory_headroom)

    def covered(pins: dict) -> Callable[[], Solution]:
        if "pp" not in pins and pins["zero"] == 1 and q.zero is None:
            # only the stage: the best ZeRO 1 twin of the table the search priced (for a ZeRO 2
            # pick whose split fits at ZeRO 1, that split: the same time, and no stage 1 plan
            # is faster; its runners-up, front and knee ZeRO 1 plans too:
            # `HybridSolver.covered`), searched again with the cp, ep and memory bounds
            # `pins` hold where that twin goes beyond them
            def twin() -> Solution:
                alt = solver.covered()
                ep_bound, room = pins.get("ep_max"), pins.get("memory_headroom")
                out = ((most is not None and alt.plan.cp > most)
                       or (ep_bound is not None and alt.plan.ep > ep_bound)
                       or (room is not None and fullness(alt, system) > 1 - room))
                return search(pins)() if out else alt

            return twin
        return search(pins)

    # (the fastest plan's features as if its ep were covered)
    as_covered_ep = {"ep": ep_most} if beyond_ep else {}
    if ep_pinned:
        pick, spread = None, bands.band(bands.plan_features(
            m, device, precision, plan, zero=pins["zero"], ep=ep_most)).spread
    else:
        pick = with_support(fastest, covered(pins), prefer, label,
                            headroom=pins.get("memory_headroom"))
        if pick.support["taken"]:
            return fastest, pick
        alt = pick.support["alternative"]
        spread = band_tolerance_of(alt and alt["time_band"])
        if spread is None:  # no covered plan fits: the spread the fastest's shape would have
            # at ZeRO 1 and the covered ep (else the next plans would be taken only as fast)
            spread = bands.band(bands.plan_features(m, device, precision, plan, zero=1,
                                                    **as_covered_ep)).spread
    # no covered plan lies within the band (or the user pinned the ep): the next best
    # supported, the bounds the search kept dropped one by one (the ep the fastest goes
    # beyond, then the memory bound) while what is left still fixes something the fastest
    # lacks (ZeRO 1, the covered cp, for LoRA no pipeline, the memory bound while kept),
    # weighed with the covered plan's spread
    dropped: list[str] = []
    second = None
    for key, on in (("ep_max", beyond_ep), ("memory_headroom", "memory_headroom" in pins)):
        if not on:
            continue
        dropped.append(key)
        kept_full = beyond_full and "memory_headroom" not in dropped
        if not (beyond or pipeline or plan.zero >= 2 or kept_full):
            break
        relaxed = {k: v for k, v in pins.items() if k not in dropped}
        # why the fastest is not covered, less what this step no longer fixes (its own
        # band's note where the rest would be covered)
        why = bands.band(bands.plan_features(
            m, device, precision, plan, **as_covered_ep,
            **({"full": fullness(fastest, system)} if kept_full else {})))
        second = with_support(fastest, covered(relaxed), prefer,
                              covered_by(pipeline, most if beyond else None, None,
                                         full_most if kept_full else None), spread=spread,
                              note=None if why.low is not None else why.note,
                              headroom=relaxed.get("memory_headroom"))
        if second.support["taken"]:
            return fastest, second
    # (with the ep pinned `covered_pins` gave pins only where the ep step runs: `second` set)
    return fastest, pick if pick is not None else second


def covered_pins(q, plan, most: int | None, ep_most: int | None = None,
                 full_most: float | None = None, beyond_full: bool = False) -> dict | None:
    """The pins that keep the search for the covered plan beside `plan` (the fastest of
    request `q`, not covered) to what the calibration runs hold: ZeRO 1, cp up to `most`
    (None: the family has no run, so no degree is covered), ep up to `ep_most` (a
    mixture-of-experts model; None: no bound), the memory filled up to `full_most` of the
    usable (the family's fullest run, a headroom of 1 - `full_most`; None: no bound;
    `beyond_full`: `plan` fills more), for LoRA pp 1; the request's own pins are kept. None
    where nothing beside it can be covered: the request pins what no run checks (ZeRO 2 / 3,
    a cp beyond `most`, an ep beyond `ep_most`, a LoRA pipeline), or the plan is uncovered
    for another reason only (a mixture-of-experts model at ZeRO 0 / 1 on a family with too
    few MoE runs)."""
    beyond = most is not None and plan.cp > most
    beyond_ep = ep_most is not None and plan.ep > ep_most
    pipeline = bands.lora_pipeline(plan)
    if ((q.zero is not None and q.zero >= 2) or (beyond and q.cp is not None)
            or (beyond_ep and q.ep is not None) or (pipeline and q.pp is not None)):
        return None  # the pin itself is uncovered: no plan of the request is
    if not (beyond or beyond_ep or beyond_full or pipeline or plan.zero >= 2):
        return None
    pins = {"zero": 1 if q.zero is None else q.zero}
    if full_most is not None and 1 - full_most > q.memory_headroom:
        pins["memory_headroom"] = 1 - full_most
    if q.cp is None and most is not None:  # never above the request's own bound
        pins["cp_max"] = most if q.cp_max is None else min(most, q.cp_max)
    if q.ep is None and ep_most is not None:
        pins["ep_max"] = ep_most if q.ep_max is None else min(ep_most, q.ep_max)
    if q.lora_rank and q.pp is None:
        pins["pp"] = 1
    return pins


def as_requested(sol: Solution, device_bytes: float, headroom: float) -> Solution:
    """`sol` with its plans' memory set against the request's usable memory (`device_bytes`
    less `headroom`) where a covered search bounded it lower (`covered_pins`' headroom)."""
    return dataclasses.replace(
        sol, prediction=within(sol.prediction, device_bytes, headroom),
        alternatives=[Alternative(a.plan, within(a.prediction, device_bytes, headroom))
                      for a in sol.alternatives])


def fullness(sol: Solution, system) -> float:
    """The share of a device's usable memory `sol`'s plan fills by the model (whatever
    headroom its request kept: what `planner.bands` judges)."""
    return filled(sol.prediction.memory_bytes_per_device, system.device)


def covered_by(pipeline: bool, cp_max: int | None, ep_max: int | None = None,
               full_max: float | None = None) -> str:
    """What the covered plan holds that the fastest lacks (the support record's
    `covered_by`): no pipeline ("pp 1", a LoRA plan), the covered cp degrees ("cp at most N"),
    the covered ep degrees ("ep at most N"), the memory of the fullest run ("memory at most
    94.2%" of the usable; the bound searched exactly is the record's `memory_headroom`),
    several of them, or else its gradients and weights whole ("ZeRO 1")."""
    parts = [NO_PIPELINE] if pipeline else []
    parts += [f"{label}{n}" for label, n in ((CP_AT_MOST, cp_max), (EP_AT_MOST, ep_max))
              if n is not None]
    if full_max is not None:
        parts.append(f"{FULL_AT_MOST}{full_max:.1%}")
    return ", ".join(parts) or ZERO1


def covered_parts(label: str) -> tuple[bool, int | None, int | None, float | None]:
    """(no pipeline, the covered cp bound, the covered ep bound, the covered memory's share
    of the usable; each None where the label has none) that a `covered_by` label says: the
    label read back where it is worded for the user (`planner.cli.solve_cmd`)."""
    parts = label.split(", ")

    def bound(prefix: str, read=int):
        return next((read(x.removeprefix(prefix)) for x in parts if x.startswith(prefix)),
                    None)

    full = bound(FULL_AT_MOST, lambda x: round(float(x.removesuffix("%")) / 100, 4))
    return NO_PIPELINE in parts, bound(CP_AT_MOST), bound(EP_AT_MOST), full
