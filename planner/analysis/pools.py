"""What limits a plan over several pools and what would change it (`planner solve -H CLUSTER`
reports them beside the plan):

- the bottleneck: the pool whose stages set the pipeline's slot (a pipeline across pools) or
  whose replicas finish last (replicas across pools);
- the balanced batch shares of replicas across pools, in closed form: with d_k replicas on
  pool k, a slot of T_k per micro-batch and p stages, all pools finish together when
  (m_k + p - 1) T_k is one time T for every k; with sum_k d_k m_k = N micro-batches,

      T = (N + (p - 1) sum_k d_k) / sum_k (d_k / T_k),   m_k = T / T_k - p + 1

  (for p = 1: each pool's share of the batch proportional to its replicas' speed d_k / T_k);
  the search's integer m_k sit next to these;
- the break-even bandwidth between pools: the least bandwidth per node of the links between
  pools at which the plan is still faster than the best plan on one pool alone. The plan's
  iteration time only grows as that bandwidth falls, so it is found by bisection on the
  plan's own price. For a pipeline across pools it is also a closed form: a stage j at a
  boundary between pools sends 2 (alpha + v g / beta + r) per slot (v bytes per send, g
  devices per node sharing the node's links, r the re-gather), so with the slot the target
  allows, S = (T_target - tail) / (m + p - 1), the plan holds while

      beta >= 2 v g / (S - t_j - 2 alpha - 2 r)   for every boundary stage j

  (t_j the stage's compute per micro-batch); the tests check the two agree;
- the error band: no calibration run spans node kinds, so a mixed plan's band is read from
  its pools' own (`planner.bands`): every pool's stages at the 10th (90th) percentile of
  measured / predicted of that pool's comparable runs, the plan re-timed with them (the
  slowest stage or replica group under those ratios, the sync at the largest).
"""

from __future__ import annotations

import math

from planner.cost import pools as cost
from planner.cost.pools import MixedPlan
from planner.search.memory_fit import filled
from planner.spec.cluster import Cluster
from planner.spec.hardware import Precision
from planner.spec.transformer import Transformer


def stage_slots(m: Transformer, cluster: Cluster, precision: Precision,
                plan: MixedPlan) -> list[list[float]]:
    """Per group and stage: its time per micro-batch slot (compute and sends)."""
    shape = plan.shape
    part = {k: cost.parts(m, cluster.pools[k], precision, shape)
            for g in plan.groups for k in {s.pool for s in g.stages}}
    return [cost.group_slots(cluster, part, g, shape.width) for g in plan.groups]


def bottleneck(m: Transformer, cluster: Cluster, precision: Precision,
               plan: MixedPlan) -> dict:
    """The pool that sets the pace: {"pool", "measure", "by_pool": {pool: seconds}}. For a
    pipeline across pools the measure is each pool's slowest stage per slot; for replicas
    across pools each pool's (m_k + p - 1) slots."""
    names = [p.name for p in cluster.pools]
    slots = stage_slots(m, cluster, precision, plan)
    by_pool: dict[str, float] = {}
    if len(plan.groups) == 1:
        measure = "slowest stage per micro-batch slot, s"
        for s, t in zip(plan.groups[0].stages, slots[0], strict=True):
            by_pool[names[s.pool]] = max(by_pool.get(names[s.pool], 0.0), t)
    else:
        measure = "pipeline time of its replicas, s"
        for g, t in zip(plan.groups, slots, strict=True):
            name = names[g.stages[0].pool]
            by_pool[name] = max(by_pool.get(name, 0.0), (g.micro_batches + plan.pp - 1) * max(t))
    return {"pool": max(by_pool, key=by_pool.get), "measure": measure, "by_pool": by_pool}


def balanced_micro_batches(slots: list[float], replicas: list[int], p: int,
                           micro_batches: int) -> list[float]:
    """The real-valued micro-batches per replica of each pool at which every pool's replicas
    finish together (module docstring), for `micro_batches` in all."""
    speed = sum(d / t for d, t in zip(replicas, slots, strict=True))
    together = (micro_batches + (p - 1) * sum(replicas)) / speed
    return [together / t - p + 1 for t in slots]


def break_even_between_Bps(m: Transformer, cluster: Cluster, precision: Precision,
                           plan: MixedPlan, seconds_per_sample: float) -> float | None:
    """The least bandwidth per node between pools at which `plan` takes less than
    `seconds_per_sample`; None when it does not even at the links it has. Bisection on log
    bandwidth (the time only grows as the bandwidth falls) to 1e-9 relative."""
    B = plan.global_batch

    def faster(node_Bps: float) -> bool:
        priced = cost.price(m, cluster.at_between(node_Bps), precision, plan)
        return priced.iteration_time_s / B < seconds_per_sample

    used = sorted({s.pool for g in plan.groups for s in g.stages})
    now = min(cluster.between_node_Bps(cluster.pools[a], cluster.pools[b])
              for a in used for b in used if a < b)
    if not faster(now):
        return None
    lo, hi = math.log(1e-3), math.log(now)  # 1 mB/s per node: no plan is faster there
    if faster(math.exp(lo)):
        return math.exp(lo)
    while hi - lo > 1e-9:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if faster(math.exp(mid)) else (mid, hi)
    return math.exp(hi)


def pipeline_break_even_Bps(m: Transformer, cluster: Cluster, precision: Precision,
                            plan: MixedPlan, seconds_per_sample: float) -> float | None:
    """The module docstring's closed form for a pipeline across pools (one group)."""
    (g,) = plan.groups
    shape, p = plan.shape, plan.pp
    part = {k: cost.parts(m, cluster.pools[k], precision, shape) for k in {s.pool for s in
                                                                             g.stages}}
    priced = cost.price(m, cluster, precision, plan)
    slot = (seconds_per_sample * plan.global_batch - priced.sync_s) / (g.micro_batches + p - 1)
    need = 0.0
    for j, s in enumerate(g.stages):
        a, b = (j, j + 1) if j + 1 < p else (j - 1, j)
        if g.stages[a].pool == g.stages[b].pool:
            continue
        pk, pair = part[s.pool], [cluster.pools[g.stages[a].pool], cluster.pools[g.stages[b].pool]]
        devices = max(x.system.devices_per_node for x in pair)
        room = (slot - cost.stage_time(pk, s.layers, j == p - 1)
                - 2 * cluster.between_latency_s(*pair) - 2 * pk.regather)
        if room <= 0:
            return None
        need = max(need, 2 * pk.send_bytes * devices / room)
    return need


def time_band(m: Transformer, cluster: Cluster, precision: Precision, plan: MixedPlan) -> dict:
    """Where the measured iteration time of `plan` likely lies (module docstring), in the form
    of a one-system prediction's `time_band`; "not covered" when a pool's band is."""
    from planner import bands

    names = [p.name for p in cluster.pools]
    used = sorted({s.pool for g in plan.groups for s in g.stages})
    devices = sum(plan.devices_on(k) for k in used)
    priced = cost.price(m, cluster, precision, plan)
    # each pool's fullest stage, as a share of its device's usable memory (`bands.REACH`)
    full = {k: filled(max(priced.memory_bytes[gi][j] for gi, g in enumerate(plan.groups)
                          for j, s in enumerate(g.stages) if s.pool == k),
                      cluster.pools[k].system.device) for k in used}
    per = {k: bands.band(bands.features(m, cluster.pools[k].system.device.name, precision,
                                        plan.shape.zero, devices, cp=plan.shape.cp,
                                        full=full[k]))
           for k in used}
    missing = next((k for k, b in per.items() if b.low is None), None)
    if missing is not None:  # the band's note says "not covered: ..."
        return {"runs": 0, "group": None, "note": f"{per[missing].note} (pool {names[missing]})"}
    slots = stage_slots(m, cluster, precision, plan)

    def timed(ratio: dict[int, float]) -> float:
        pipe = max((g.micro_batches + plan.pp - 1)
                   * max(ratio[s.pool] * t for s, t in zip(g.stages, slot, strict=True))
                   for g, slot in zip(plan.groups, slots, strict=True))
        return pipe + priced.sync_s * max(ratio.values())

    low, high = timed({k: b.low for k, b in per.items()}), timed(
        {k: b.high for k, b in per.items()})
    t = priced.iteration_time_s
    groups = "; ".join(f"{names[k]}: {b.group}" for k, b in per.items())
    return {"low_s": low, "high_s": high, "low_ratio": low / t, "high_ratio": high / t,
            "runs": sum(b.runs for b in per.values()), "group": groups,
            "note": "each pool's stages at the 10th / 90th percentile of measured / predicted "
                    f"of its own comparable runs ({groups}); no calibration run spans node "
                    "kinds"}
