"""Plans over a cluster of several kinds of node, solved exactly.

For every subset of the pools (every pool alone, every pair, ..., all of them) the best plan
that uses each pool of the subset:

- one pool: the one-system search (`planner.search.hybrid`) with the pool's node count as the
  budget;
- several pools, two shapes, each a CP-SAT model per (tensor-parallel degree, micro-batch,
  recomputation, pipeline depth, replicas, global batch):
  * a pipeline across pools: integer layers per stage and the pool of every stage (one-hot),
    each stage priced from its own device's per-layer costs, sends across pools on the link
    between them, the stage's gradient sync and optimizer step as a table over its layer
    count (element constraints), memory per stage on its own device; the iteration time,
    (m + p - 1) x the slowest stage plus the slowest sync, minimised;
  * replicas across pools: the same pipeline on each pool, an integer number of replicas and
    of micro-batches per replica on each (their products summing to the batch), the
    cross-pool sync as a table over the replicas in all.
  The pool sizes are upper bounds (whole nodes), so leaving slow nodes idle is a choice.

The shapes are priced in numpy first with a lower bound of each (layers spread at the pools'
combined speed, no memory limit, no sync); CP-SAT solves them in the order of their bounds
until the next bound is no better than the best plan found, which is what makes the answer
proven: every shape left unsolved has a bound at or above it. The best of the subsets that
contain a subset is never slower than that subset's best (the mixed search starts from it).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
from ortools.sat.python import cp_model

from planner import bands, rules, switches
from planner.cost import pools as cost
from planner.cost.pools import Group, MixedPlan, Shape, Stage
from planner.cost.transformer import RECOMPUTE, Hardware, iteration
from planner.errors import InfeasibleError, SpecError
from planner.plan import stage_layers
from planner.search.hybrid_space import Search, candidate_batches
from planner.search.memory_fit import filled, usable_bytes
from planner.search.objective import Objective
from planner.search.support import FULL_AT_MOST, band_tolerance_of, supported_solve
from planner.spec.cluster import Cluster
from planner.spec.hardware import Precision
from planner.spec.transformer import Transformer

SCALE = 1e7  # CP-SAT works in integers: times in units of 0.1 us
MICRO_BATCHES = (1, 2, 4, 8)
MAX_MODELS = 4000  # CP-SAT models one subset may solve before it reports `feasible`
# switches a mixed plan prices (at the values given); the others must keep their defaults
MIXED_SWITCHES = {s.name for s in switches.SWITCHES if s.mixed}
PIPELINE, REPLICAS = rules.MIXED_FORMS  # the two kinds of mix (its keys, in that order)
# a covered mix's label where its pools' families reach different fillings (`_within_reach`)
EACH_POOLS_REACH = "memory within each pool's reach"


@dataclass
class Found:
    """The best plan of one subset of pools."""

    pools: tuple[str, ...]
    kind: str  # "one pool", "pipeline across pools", "replicas across pools"
    plan: object  # a Plan (one pool) or a MixedPlan
    iteration_time_s: float
    global_batch: int
    devices: dict[str, int]
    memory_bytes: dict[str, float] = field(default_factory=dict)  # fullest device per pool
    solution: object | None = None  # the one-pool search's Solution
    status: str = "optimal"
    subset: tuple[str, ...] = ()  # the pools it was searched over (default: `pools`)
    time_band: dict | None = None  # where the measured time likely lies (`planner.bands`)
    # a mix beyond its pools' memory reach: the covered mix weighed beside it (`_within_reach`)
    support: dict | None = None

    def __post_init__(self):
        self.subset = self.subset or self.pools

    @property
    def seconds_per_sample(self) -> float:
        return self.iteration_time_s / self.global_batch


@dataclass
class ClusterSolution:
    status: str
    best: Found
    subsets: list[Found]  # the best of each subset that has a plan
    missing: dict[str, str]  # subset -> why it has no plan
    mixed_note: str | None  # why mixed plans were not searched, if they were not
    models_solved: int
    shapes_priced: int
    solve_time_s: float
    seq_len: int
    prices: dict[str, float | None]
    # what limits the best plan and what would change it (`_limits`); empty when nothing to say
    limits: dict = field(default_factory=dict)

    def of(self, pools: tuple[str, ...]) -> Found | None:
        """The best plan searched over exactly these pools."""
        return next((f for f in self.subsets if f.subset == pools), None)


def _unsupported(m: Transformer, q: Search) -> str | None:
    """Why the mixed shapes cannot express this request (None: they can)."""
    for s in switches.SWITCHES:
        value = getattr(q, s.name)
        if s.name == "optimizer" and value in (None, "adam"):
            continue  # the transformer default
        if s.name not in MIXED_SWITCHES and value != s.default:
            return f"{s.flag} is not priced across pools"
    pins = {"ep": 1, "interleave": 1, "schedule": "1f1b"}
    for key, ok in pins.items():
        value = getattr(q, key)
        if value is not None and value != ok:
            return f"{key} = {value} is not priced across pools (only {key} {ok})"
    for key in ("etp", "dp", "recompute_layers", "devices", "nodes"):
        if getattr(q, key) is not None:
            return f"a pinned {key} is not priced across pools"
    if q.zero == 3:
        return "ZeRO-3 is not priced across pools"
    if m.experts > 1:
        return "mixture-of-experts layers are not priced across pools (expert parallelism)"
    return None


def _priced_switches(q: Search) -> tuple[tuple[str, object], ...]:
    """The switches of `MIXED_SWITCHES` (but overlap, a `Shape` field) that the request sets
    off their defaults, as `Shape.switches` carries them to every stage's prices."""
    return tuple(sorted((s.name, getattr(q, s.name)) for s in switches.SWITCHES
                        if s.name in MIXED_SWITCHES and s.name != "overlap"
                        and getattr(q, s.name) != s.default))


class ClusterSolver:
    def __init__(self, m: Transformer, cluster: Cluster, precision: Precision, q: Search,
                 prefer: float | None = None):
        objective = q.objective if isinstance(q.objective, Objective) else Objective(q.objective)
        if objective is not Objective.throughput:
            raise SpecError(f"objective: over several pools solve ranks plans by throughput "
                            f"(the cost per token is reported per plan); got {objective.value}")
        if q.devices_max is not None or q.nodes_max is not None:
            raise SpecError("nodes_max: over a cluster of several pools the pools' node counts "
                            "are the budget (lower `nodes` or `availability` in the cluster "
                            "YAML); --nodes-max / --devices-max are not read")
        if q.training is not None or q.pareto or q.top or q.fewest_nodes_within is not None:
            raise SpecError("a cluster of several pools: --top, --within, --pareto and the "
                            "time to train are not searched across pools yet")
        for pool in cluster.pools:
            pool.system.device.peak_flops(precision)
        if prefer is not None and not 0 <= prefer <= 1:
            raise SpecError(f"prefer_supported: must be a fraction in [0, 1], got {prefer!r}")
        self.m, self.cluster, self.precision, self.q = m, cluster, precision, q
        # how much slower a covered plan may be and be taken (None: its band's spread)
        self.prefer = prefer
        lo, hi = q.global_batch_range or (q.global_batch, q.global_batch)
        if lo is None:
            raise SpecError("global_batch: give --global-batch or --global-batch-range")
        self.batches = candidate_batches(lo, hi)
        self.note = _unsupported(m, q)
        self.switches = _priced_switches(q)
        self.models = 0
        self.priced = 0
        self.hws = [Hardware.of(p.system, precision) for p in cluster.pools]
        self.caps = [usable_bytes(hw.memory_bytes, q.memory_headroom) for hw in self.hws]
        # each pool's fullest calibration run, a share of its usable memory (None: unbounded)
        self.reach = [bands.covered(p.system.device.name, "full") for p in cluster.pools]

    # --- every subset ----------------------------------------------------------------------

    def solve(self) -> ClusterSolution:
        t0 = time.perf_counter()
        names = [p.name for p in self.cluster.pools]
        found: dict[tuple[int, ...], Found | None] = {}
        missing, status = {}, "optimal"
        for size in range(1, len(names) + 1):
            for subset in itertools.combinations(range(len(names)), size):
                within = [found[s] for s in found if set(s) < set(subset) and found[s]]
                best = min(within, key=lambda f: f.seconds_per_sample, default=None)
                libraries = {self.cluster.pools[k].system.device.collective_library
                             for k in subset}
                if size == 1:
                    here, why = self._one_pool(subset[0])
                elif len(libraries) > 1:
                    here, why = None, (f"no job spans pools of different collective libraries "
                                       f"({', '.join(sorted(libraries))}): they do not "
                                       f"interoperate")
                elif self.note is None:
                    here, why = self._mixed(subset, best)
                else:
                    here, why = None, self.note
                if here is not None and here.status != "optimal":
                    status = "feasible"
                found[subset] = here
                if here is None:
                    missing[" + ".join(names[k] for k in subset)] = why
        plans = [f for f in found.values() if f is not None]
        if not plans:
            raise InfeasibleError("infeasible: no plan fits on any pool or mix of pools: "
                                  + "; ".join(f"{k}: {v}" for k, v in missing.items()),
                                  ("memory",))
        best = min(plans, key=lambda f: f.seconds_per_sample)
        singles = [f for f in plans if len(f.subset) == 1]
        return ClusterSolution(
            status=status, best=best, subsets=plans, missing=missing, mixed_note=self.note,
            models_solved=self.models, shapes_priced=self.priced,
            solve_time_s=time.perf_counter() - t0, seq_len=self.m.seq_len,
            prices={p.name: p.price_per_device_hour for p in self.cluster.pools},
            limits=self._limits(best, min(singles, key=lambda f: f.seconds_per_sample,
                                          default=None)))

    def _limits(self, best: Found, single: Found | None) -> dict:
        """The bottleneck of a mixed best plan, the bandwidth between pools it needs to beat
        the best pool alone, and (replicas) the balanced micro-batches per pool; for a
        one-pool best over links between pools slower than the pools' own, the best mix at
        the pools' own speed (`planner.analysis.pools`)."""
        from planner.analysis import pools as limits

        m, cluster, prec = self.m, self.cluster, self.precision
        if best.kind == "one pool":
            if single is None or self.note is not None or not self._slow_between():
                return {}
            fast = ClusterSolver(m, cluster.at_between(math.inf), prec, self.q,
                                 self.prefer).solve()
            mixed = [f for f in fast.subsets if f.kind != "one pool" and f.pools == f.subset]
            if not mixed:
                return {}
            top = min(mixed, key=lambda f: f.seconds_per_sample)
            gain = single.seconds_per_sample / top.seconds_per_sample - 1
            need = limits.break_even_between_Bps(m, cluster.at_between(math.inf), prec,
                                                 top.plan, single.seconds_per_sample)
            return {"at_own_fabric": {"pools": list(top.pools), "kind": top.kind,
                                      "gain_over_best_single_pool": gain,
                                      "break_even_between_node_Bps": need}}
        out = {"bottleneck": limits.bottleneck(m, cluster, prec, best.plan)}
        if single is not None:
            used = sorted({s.pool for g in best.plan.groups for s in g.stages})
            out["between_node_Bps"] = min(cluster.between_node_Bps(
                cluster.pools[a], cluster.pools[b]) for a in used for b in used if a < b)
            out["against"] = single.pools[0]
            out["break_even_between_node_Bps"] = limits.break_even_between_Bps(
                m, cluster, prec, best.plan, single.seconds_per_sample)
        if len(best.plan.groups) > 1:
            plan = best.plan
            slots = [max(x) for x in limits.stage_slots(m, cluster, prec, plan)]
            even = limits.balanced_micro_batches(
                slots, [g.replicas for g in plan.groups], plan.pp,
                sum(g.replicas * g.micro_batches for g in plan.groups))
            out["balanced_micro_batches"] = {
                cluster.pools[g.stages[0].pool].name: x for g, x in zip(plan.groups, even,
                                                                       strict=True)}
        return out

    def _slow_between(self) -> bool:
        """Whether a link between pools is slower than the pools' own NICs."""
        pools = self.cluster.pools
        full = self.cluster.at_between(math.inf)
        return any(self.cluster.between_node_Bps(a, b) < full.between_node_Bps(a, b)
                   for a, b in itertools.combinations(pools, 2))

    def _one_pool(self, k: int) -> tuple[Found | None, str]:
        pool = self.cluster.pools[k]
        q = replace(self.q, nodes_max=min(self.q.nodes_max or pool.nodes, pool.nodes))
        try:
            sol = supported_solve(self.m, pool.system, self.precision, q, self.prefer)[1]
        except InfeasibleError as exc:
            return None, str(exc)
        plan, pred = sol.plan, sol.prediction
        return Found((pool.name,), "one pool", plan, pred.iteration_time_s, plan.global_batch,
                     {pool.name: plan.devices}, {pool.name: pred.memory_bytes_per_device},
                     solution=sol, status=sol.status, time_band=pred.time_band), ""

    def _mixed(self, subset, incumbent: Found | None) -> tuple[Found | None, str]:
        bound = incumbent.seconds_per_sample if incumbent else math.inf
        best, capped = self._fastest_mix(subset, bound)
        names = [p.name for p in self.cluster.pools]
        if best is None:  # no mix beats the best of the smaller subsets: that is this one's
            if incumbent is None:
                return None, (f"no mixed plan found within {MAX_MODELS} CP-SAT models" if capped
                              else "no mixed plan fits")
            return replace(incumbent, subset=tuple(names[k] for k in subset),
                           status="feasible" if capped else incumbent.status), ""
        return self._within_reach(subset, incumbent, self._found(subset, *best, capped)), ""

    def _fastest_mix(self, subset, bound: float, usable: list | None = None
                     ) -> tuple[tuple | None, bool]:
        """((plan, its prices, its kind) of the fastest mix over `subset` within the pools'
        usable bytes per device `usable` (the request's, `self.caps`, where None) and faster a
        sample than `bound`, or None; whether the model budget stopped the search before its
        proof). Every method the mix's search runs takes `usable` the same way."""
        usable = self.caps if usable is None else usable
        best, capped = None, False
        # both kinds' rows in one best-first order of their lower bounds: a cheap replica
        # plan found early rules out pipelines whose models would take long to refute
        forms = [form(subset, bound, usable) for kind, form in ((PIPELINE, self._pipeline_rows),
                                                        (REPLICAS, self._replica_rows))
                 if not self.q.framework or self.q.framework in rules.MIXED_FORMS[kind]]
        self.priced += sum(len(rows["lb"]) for rows in forms)
        none = [np.empty(0, dtype=int)]  # no form priced (a framework's launcher writes none)
        lbs = np.concatenate([rows["lb"] for rows in forms] + none)
        which = np.concatenate([np.full(len(rows["lb"]), j) for j, rows in enumerate(forms)]
                               + none)
        index = np.concatenate([np.arange(len(rows["lb"])) for rows in forms] + none)
        for o in np.argsort(lbs, kind="stable"):
            if lbs[o] >= bound * (1 - 1e-9):
                break
            if self.models >= MAX_MODELS:  # rows left unproven: the best found, not proven
                capped = True
                break
            self.models += 1
            rows = forms[which[o]]
            plan = rows["solve"](index[o], bound)
            if plan is None:
                continue
            priced = cost.price(self.m, self.cluster, self.precision, plan, usable)
            value = priced.iteration_time_s / plan.global_batch
            if priced.fits and value < bound:
                bound, best = value, (plan, priced, rows["kind"])
        return best, capped

    def _found(self, subset, plan, priced, kind, capped: bool) -> Found:
        from planner.analysis.pools import time_band

        names = [p.name for p in self.cluster.pools]
        memory = {}
        for g, mem in zip(plan.groups, priced.memory_bytes, strict=True):
            for s, x in zip(g.stages, mem, strict=True):
                memory[names[s.pool]] = max(memory.get(names[s.pool], 0.0), x)
        return Found(tuple(names[k] for k in subset), kind, plan, priced.iteration_time_s,
                     plan.global_batch, {names[k]: plan.devices_on(k) for k in subset},
                     memory, status="feasible" if capped else "optimal",
                     time_band=time_band(self.m, self.cluster, self.precision, plan))

    def _within_reach(self, subset, incumbent: Found | None, fastest: Found) -> Found:
        """`fastest`, or where it fills a pool's devices beyond the fullest calibration run of
        their family (its band "not covered") the fastest plan within those fillings: a mix
        searched again with each pool kept to its family's reach, or where none beats the
        smaller subsets' best, that plan (`incumbent`). It is taken as `supported_solve` takes
        a covered plan on one pool: where it lies within its own band's spread of the fastest
        (as fast, without a band; within `prefer` where given). The choice is recorded in
        `support`."""
        pools, names = self.cluster.pools, [p.name for p in self.cluster.pools]
        beyond = [k for k in subset if self.reach[k] is not None and filled(
            fastest.memory_bytes.get(names[k], 0.0), pools[k].system.device) > self.reach[k]]
        if "low_s" in (fastest.time_band or {}) or not beyond:
            return fastest  # covered, or not covered for another reason than its memory
        # each bounded pool's memory as one pool's covered search keeps it: a headroom of
        # 1 - its reach where that keeps more free than the request's (`covered_pins`)
        usable = [usable_bytes(hw.memory_bytes, max(self.q.memory_headroom, 1 - most))
                  if k in subset and most is not None else cap
                  for k, (hw, cap, most) in enumerate(zip(self.hws, self.caps, self.reach,
                                                          strict=True))]
        bound = incumbent.seconds_per_sample if incumbent else math.inf
        best, cut = self._fastest_mix(subset, bound, usable)
        if best is not None:
            alt = self._found(subset, *best, cut)
        elif incumbent is not None and not cut:  # no mix within the reach beats it
            alt = replace(incumbent, subset=fastest.subset)
        else:  # none fits, or the model budget ran out first
            alt = None
        tolerance = self.prefer if self.prefer is not None else (
            None if alt is None else band_tolerance_of(alt.time_band) or 0.0)
        taken = (alt is not None
                 and alt.seconds_per_sample <= (1 + tolerance) * fastest.seconds_per_sample)
        # each bounded pool's reach; one share says it for all of them, else "each pool's"
        reach = {names[k]: most for k, most in enumerate(self.reach)
                 if k in subset and most is not None}
        shares = {f"{most:.1%}" for most in reach.values()}
        record = {"note": fastest.time_band["note"], "taken": taken,
                  "covered_by": (f"{FULL_AT_MOST}{shares.pop()}" if len(shares) == 1
                                 else EACH_POOLS_REACH),
                  "reach": reach, "rule": "band" if self.prefer is None else "fraction",
                  "tolerance": tolerance, "cut_off": cut,
                  "fastest_iteration_time_s": fastest.iteration_time_s,
                  "fastest_seconds_per_sample": fastest.seconds_per_sample,
                  "alternative": None if alt is None else {
                      "kind": alt.kind, "pools": list(alt.pools),
                      "iteration_time_s": alt.iteration_time_s,
                      "seconds_per_sample": alt.seconds_per_sample,
                      "time_band": alt.time_band}}
        chosen = alt if taken else fastest
        # (a search cut off by the model budget proves no choice)
        return replace(chosen, support=record,
                       status="feasible" if cut else chosen.status)

    # --- the shapes, priced in numpy with their lower bounds ---------------------------------

    def _grid(self, subset):
        """(t, mb, recompute) combinations and the per-layer parts of each pool on them
        (cp as the request pins it, else 1)."""
        q, m = self.q, self.m
        g_min = min(self.cluster.pools[k].system.devices_per_node for k in subset)
        cp = q.cp or 1
        ts = [t for t in (1, 2, 4, 8, 16, 32, 64) if math.gcd(m.heads, m.kv_heads) % t == 0
              and t * cp <= g_min and q.tp in (None, t)]
        mbs = [b for b in MICRO_BATCHES if q.micro_batch in (None, b)]
        if q.micro_batch is not None and q.micro_batch not in mbs:
            mbs = [q.micro_batch]
        recs = [q.recompute] if q.recompute else list(RECOMPUTE)
        combos = [(t, b, r) for t in ts for b in mbs for r in recs]
        sp = True if q.sequence_parallel is None else q.sequence_parallel
        zero = 1 if q.zero is None else q.zero  # what the calibration runs hold (bands)
        given = self.switches
        shapes = [Shape(t, b, r, bool(sp and t > 1), zero, q.overlap, given, cp)
                  for t, b, r in combos]
        values = {}
        for k in subset:
            hw = self.hws[k]
            t, b, r = (np.array(x) for x in zip(*combos, strict=True)) if combos else ([],) * 3
            cfg = {"t": t, "cp": cp, "p": 2, "d": 1, "mb": b, "acc": 1, "v": 1,
                   "recompute": np.array([RECOMPUTE.index(x) for x in r]),
                   "sp": np.array([int(s.sequence_parallel) for s in shapes]), "zero": zero,
                   "gpipe": 0, "overlap": q.overlap, **dict(given)}
            names = ("layer_time", "logit_time", "send_bytes", "regather", "layer_params",
                     "layer_backward", "optimizer_per_param", "grad_bytes", "weight_bytes",
                     "state_bytes", "layer_activations", "transient_activations",
                     "weight_copy_bytes")
            values[k] = iteration(m, hw, cfg, names) if combos else {}
        return shapes, values

    def _capacity(self, k: int) -> int:
        return self.cluster.pools[k].devices

    def _pipeline_rows(self, subset, incumbent: float = math.inf, usable: list | None = None
                       ) -> dict:
        """Pipelines across the pools of `subset`, each pool holding at least one stage. The
        bound: the slowest stage at least the least slot that holds the integer layers
        (`_slot_bound`; computed for the rows whose continuous bound, the layers spread at
        the speed of p stages, is below `incumbent`), and the sync and step of the stage
        holding the most layers (at least ceil(L / p)): no less than either piece of the
        exposed sync at its least over [ceil(L / p), L] (the slowed compute's share grows
        with the layers; the sync beyond the backward is affine in them)."""
        shapes, values = self._grid(subset)
        L, K = self.m.layers, len(subset)
        rows = []
        for si, shape in enumerate(shapes):
            for B in self.batches:
                for d in _divisors(B // shape.micro_batch):
                    caps = [self._capacity(k) // (d * shape.width) for k in subset]
                    if min(caps) < 1:
                        continue
                    rows += [(si, B, d, p) for p in range(K, min(L, sum(caps)) + 1)
                             if self.q.pp in (None, p)]
        rows = np.array(rows, dtype=np.int64).reshape(-1, 4)
        si, B, d, p = rows.T
        mb = np.array([s.micro_batch for s in shapes])[si]
        tp = np.array([s.tp for s in shapes])[si]
        width = tp * shapes[0].cp
        mcount = B // (mb * d)
        at = {k: {name: np.asarray(v)[si] for name, v in values[k].items()} for k in subset}
        lt = np.stack([at[k]["layer_time"] for k in subset])  # (K, rows)
        caps = np.stack([self._capacity(k) // (d * width) for k in subset])
        # whole nodes: a pool holds a multiple of g / gcd(g, d t) stages, at least that many
        least = np.stack([self.hws[k].g // np.gcd(self.hws[k].g, d * width) for k in subset])
        speed, left = (least / lt).sum(axis=0), p - least.sum(axis=0)
        for rank in range(K):  # the fastest pools take the stages left, as room allows
            pick = np.argsort(lt, axis=0)[rank]
            cols = np.arange(len(rows))
            take = np.clip(np.minimum(left, caps[pick, cols] - least[pick, cols]), 0, None)
            speed, left = speed + take / lt[pick, cols], left - take
        hop = np.min([2 * (self.hws[k].intra_lat + at[k]["send_bytes"] / self.hws[k].intra_bw
                           + at[k]["regather"]) for k in subset], axis=0)
        tail = np.full(len(rows), np.inf)
        n0 = -(-L // p)
        for k in subset:
            tail = np.minimum(tail, self._tail_bound(shapes, si, at[k], k, d, p, n0, mcount))
        room = self._room(shapes, si, at, subset, d, p, mcount, usable)
        logit = np.stack([at[k]["logit_time"] for k in subset])
        lb = ((mcount + p - 1) * (L / speed + hop) + tail) / B
        lb[room["total"] < L] = np.inf  # cannot fit
        lb[(left > 0) | (least > caps).any(axis=0)] = np.inf  # no room for p stages
        # the integer bound, where the continuous one does not already rule the row out
        sharp = np.flatnonzero(lb < incumbent)
        most = room["per_stage"]
        slot = _slot_bound(L, lt[:, sharp], logit[:, sharp], hop[sharp], least[:, sharp],
                           caps[:, sharp], p[sharp], most[:, sharp])
        lb[sharp] = np.maximum(lb[sharp], ((mcount + p - 1)[sharp] * slot + tail[sharp])
                               / B[sharp])
        # the sync bound: a plan below `incumbent` has a slot short enough to cap the
        # layers of every stage, so its busiest stage's sync is at least the least that
        # such stages reach
        near = lb[sharp] < incumbent
        sharp, slot = sharp[near], slot[near]
        if len(sharp):
            longest = (incumbent * B[sharp] - tail[sharp]) / (mcount + p - 1)[sharp]
            hold = np.clip(np.floor((longest - hop[sharp]) / lt[:, sharp]), 0,
                           most[:, sharp])
            sync = self._sync_bound(shapes[0], {k: {n: v[sharp] for n, v in at[k].items()}
                                                for k in subset}, subset, tp[sharp],
                                    d[sharp], p[sharp], mcount[sharp], hold,
                                    least[:, sharp], caps[:, sharp])
            lb[sharp] = np.maximum(lb[sharp], ((mcount + p - 1)[sharp] * slot + sync)
                                   / B[sharp])
        return self._rows(rows, lb, shapes, subset, PIPELINE, self._solve_pipeline, usable)

    def _sync_bound(self, shape, at, subset, tp, d, p, mcount, hold, least, caps):
        """The least sync and step of the busiest stage, per row: the least tau at which the
        stages, each on pool k at most min(hold_k, the most layers whose sync and step is
        within tau) layers, still hold the model (`_stages_hold`); lower end of a
        bisection. The sync of n layers is the stage's own table (no embedding or output
        layer: those only add)."""
        L = self.m.layers
        n = np.arange(L + 1)[:, None]
        tables = []
        for k in subset:
            part = cost.Parts(at[k], self.hws[k])
            agg = cost.layer_aggregates(at[k], n)
            per_node = np.minimum(np.maximum(self.hws[k].scale_up // (tp * p), 1),
                                  d * shape.cp)
            tail = cost.sync_and_memory(shape, agg, part, cost.pool_links(part), d,
                                        per_node, mcount, p)[0]
            tables.append(np.broadcast_to(tail, (L + 1, len(p))))
        tables = np.stack(tables)  # (K, L + 1, rows)
        n = n[None]

        def holds(tau):
            within = np.where((tables <= tau) & (n >= 1), n, 0).max(axis=1)
            return _stages_hold(np.minimum(hold, within), least, caps, p) >= L

        lo = np.nextafter(tables[:, 1].max(axis=0), 0)  # every pool holds a layer
        hi = tables.max(axis=(0, 1))
        for _ in range(30):
            mid = (lo + hi) / 2
            yes = holds(mid)
            hi, lo = np.where(yes, mid, hi), np.where(yes, lo, mid)
        return np.where(holds(hi), np.maximum(lo, 0), np.inf)

    def _room(self, shapes, si, at, subset, d, p, mcount, usable: list | None = None) -> dict:
        """Upper bounds of the layers in memory: `total`, of p stages (stage j holds the
        activations of min(p - j, m) micro-batches; each position on the pool that fits the
        most there), and `per_stage`, of one stage on each pool (one micro-batch in flight),
        both without the embedding or output layer."""
        per = {}
        for k in subset:
            part = cost.Parts(at[k], self.hws[k])
            links = cost.pool_links(part)

            def memory(n, part=part, links=links, k=k):
                agg = cost.layer_aggregates(at[k], n, at[k]["transient_activations"])
                return cost.sync_and_memory(shapes[0], agg, part, links, d, 1, mcount, p)[1]

            one, two = memory(1.0), memory(2.0)
            per[k] = (two - one, 2 * one - two, at[k]["layer_activations"])

        usable = self.caps if usable is None else usable

        def fits(k, flight):
            slope, base, act = per[k]
            return np.maximum(np.floor((usable[k] - base) / (slope + act * flight)), 0)

        total = np.zeros(len(si))
        for i in range(1, int(p.max()) + 1):
            most = np.max([fits(k, np.minimum(i, mcount)) for k in subset], axis=0)
            total += np.where(i <= p, most, 0)
        return {"total": total, "per_stage": np.stack([fits(k, 1) for k in subset])}

    def _tail_bound(self, shapes, si, at, k, d, p, n0, mcount) -> np.ndarray:
        """A lower bound of the sync and step of a middle stage of n >= n0 layers on pool k."""
        L, hw, zero, overlap = self.m.layers, self.hws[k], shapes[0].zero, shapes[0].overlap
        part = cost.Parts(at, hw)
        links = cost.pool_links(part)
        per_node = np.minimum(np.maximum(hw.scale_up // (np.array(
            [s.tp for s in shapes])[si] * p), 1), d * shapes[0].cp)
        plain = replace(shapes[0], overlap=False)

        def pieces(n):
            agg = cost.layer_aggregates(at, n)
            step = agg["Psi"] * at["optimizer_per_param"] / (d * plain.cp if zero else 1)
            sync = cost.sync_and_memory(plain, agg, part, links, d, per_node, mcount, p)[0]
            return sync - step, agg["H"], step

        sync0, h0, step0 = pieces(n0)
        if not overlap:
            return sync0 + step0
        sigma = hw.overlap_slowdown / (1 + hw.overlap_slowdown)
        syncL, hL, stepL = pieces(np.full_like(n0, L))
        beyond = np.minimum(sync0 - h0 + step0, syncL - hL + stepL)
        return np.maximum(sigma * sync0 + step0, beyond)

    def _replica_rows(self, subset, _incumbent: float = math.inf, usable: list | None = None
                      ) -> dict:
        """The same pipeline on every pool of `subset`, replicas and micro-batches per pool.
        The bound: each pool's slot s_k exact (its even split, output layer and sends); with
        T the pipeline's time, a pool's replicas run m_k <= T / s_k - p + 1 micro-batches, at
        least one, so T >= p s_k on every pool, and B / mb = sum d_k m_k is at most
        sum dmax_k (T / s_k - p + 1) (each term grows with d_k there): T >= (B / mb +
        (p - 1) sum dmax) / sum (dmax / s). A pool whose smallest stage does not fit at the
        most sharding (every replica of the subset) and one micro-batch in flight rules the
        row out, as does a pool with no whole node of replicas."""
        shapes, values = self._grid(subset)
        L = self.m.layers
        p = np.arange(1, L + 1) if self.q.pp is None else np.array([self.q.pp])
        split = [stage_layers(L, int(x)) for x in p]
        most = np.array([max(s[:-1], default=0) for s in split])
        final = np.array([s[-1] for s in split])
        rows, bounds = [], []
        for si, shape in enumerate(shapes):
            dmax, slot = [], []
            for k in subset:
                hw, at = self.hws[k], {n: v[si] for n, v in values[k].items()}
                per = self._capacity(k) // (shape.width * p)
                whole = hw.g // np.gcd(hw.g, shape.width * p)
                dmax.append(per // whole * whole)
                inside = shape.width * p <= hw.scale_up
                hop = np.where(inside, hw.intra_lat + at["send_bytes"] / hw.intra_bw,
                               hw.inter_lat + at["send_bytes"] * hw.g / hw.nic_bw)
                slot.append(np.maximum(most * at["layer_time"], final * at["layer_time"]
                                       + at["logit_time"]) + np.where(
                                           p > 1, 2 * (hop + at["regather"]), 0.0))
            dmax, slot = np.array(dmax), np.array(slot)
            ok = (dmax >= 1).all(axis=0)
            ok &= self._replica_memory(shape, si, values, subset, p, dmax.sum(axis=0), usable)
            for B in self.batches:
                if B % shape.micro_batch:
                    continue
                T = np.maximum(p * slot.max(axis=0), (B / shape.micro_batch + (
                    p - 1) * dmax.sum(axis=0)) / np.maximum((dmax / slot).sum(axis=0), 1e-300))
                rows += [(si, B, 0, int(x)) for x in p]
                bounds.append(np.where(ok, T / B, np.inf))
        rows = np.array(rows, dtype=np.int64).reshape(-1, 4)
        lb = np.concatenate(bounds) if bounds else np.zeros(0)
        return self._rows(rows, lb, shapes, subset, REPLICAS, self._solve_replicas, usable)

    def _replica_memory(self, shape, si, values, subset, p, ranks, usable: list | None = None
                        ) -> np.ndarray:
        """Per pipeline depth: whether every pool's smallest stage (floor(L / p) layers, no
        embedding or output layer, one micro-batch in flight) fits, sharded over `ranks`."""
        ok = np.ones(len(p), dtype=bool)
        n = self.m.layers // p
        for k in subset:
            part = cost.Parts({name: v[si] for name, v in values[k].items()}, self.hws[k])
            agg = cost.layer_aggregates(
                part, n, n * part.layer_activations + part.transient_activations)
            _, mem = cost.sync_and_memory(shape, agg, part, cost.pool_links(part),
                                          np.maximum(ranks, 1), 1, 1, p)
            ok &= np.asarray(mem) <= (self.caps if usable is None else usable)[k]
        return ok

    def _rows(self, rows, lb, shapes, subset, kind, solver, usable: list | None = None) -> dict:
        def solve(i, bound):
            si, B, d, p = (int(x) for x in rows[i])
            return solver(shapes[si], subset, B, d, p, bound, usable)

        return {"lb": lb, "solve": solve, "kind": kind, "rows": rows}

    # --- the CP-SAT models ------------------------------------------------------------------

    def _minimise(self, model: cp_model.CpModel, objective, bound_s: float):
        """Solve `model` for the least `objective` (seconds x SCALE) no worse than `bound_s`;
        the solver, or None when nothing beats the bound."""
        if math.isfinite(bound_s):
            model.Add(objective <= _int(bound_s) + 1)
        model.Minimize(objective)
        s = cp_model.CpSolver()
        s.parameters.num_workers = self.q.workers
        s.parameters.max_time_in_seconds = self.q.time_limit_s
        return s if s.Solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None

    def _solve_pipeline(self, shape: Shape, subset, B: int, d: int, p: int, bound: float,
                        usable: list | None = None):
        """The best pipeline of p stages over the pools of `subset` (each holding one at
        least) for d replicas of B / d samples: layers and pool per stage, within the pools'
        usable bytes `usable` (the request's where None)."""
        m, L, pools = self.m, self.m.layers, self.cluster.pools
        usable = self.caps if usable is None else usable
        mcount = B // (shape.micro_batch * d)
        part = {k: cost.parts(m, pools[k], self.precision, shape) for k in subset}
        # per pool and stage class (first, middle, last): the sync + optimizer step as a
        # table over the stage's layers, and memory without the activations in flight (both
        # read the class only through the embedding / output layer the stage holds)
        layers = np.arange(L + 1)
        tables, static = {}, {}
        for k in subset:
            pk = part[k]
            per_node = int(cost.replicas_per_node(pk, shape, p, d))
            for c, j in (("first", 0), ("middle", 1), ("last", p - 1)):
                agg = cost.stage_aggregates(pk, layers, j, p, 0)
                tail, mem = cost.sync_and_memory(shape, agg, pk, cost.pool_links(pk), d,
                                                 per_node, mcount, p)
                tables[k, c] = [_int(v) for v in np.broadcast_to(tail, layers.shape)]
                mem = np.broadcast_to(mem, layers.shape)
                static[k, c] = (mem[2] - mem[1], mem[1] - (mem[2] - mem[1]))
        classes = ["first"] + ["middle"] * (p - 2) + ["last"]
        model = cp_model.CpModel()
        x = {(j, k): model.NewBoolVar(f"x{j}_{k}") for j in range(p) for k in subset}
        n = [model.NewIntVar(1, L, f"n{j}") for j in range(p)]
        nk = {(j, k): model.NewIntVar(0, L, f"n{j}_{k}") for j in range(p) for k in subset}
        model.Add(sum(n) == L)
        for j in range(p):
            model.AddExactlyOne(x[j, k] for k in subset)
            model.Add(sum(nk[j, k] for k in subset) == n[j])
            for k in subset:
                model.Add(nk[j, k] <= L * x[j, k])
        # each pool's stages are one contiguous run of the pipeline (at most K - 1 changes of
        # pool along it): interleaving pools only adds crossings
        change = [model.NewBoolVar(f"c{j}") for j in range(p - 1)]
        for j in range(p - 1):
            for k in subset:
                model.Add(change[j] >= x[j, k] - x[j + 1, k])
        model.Add(sum(change) <= len(subset) - 1)
        cross = {(k, o): cost.hop(part[k], cost.between_links(self.cluster, sorted({k, o}),
                                                                part), part[k].send_bytes,
                                  False) for k in subset for o in subset if o != k}
        fits = {}
        for k in subset:
            pool, hw = pools[k], self.hws[k]
            s_k = sum(x[j, k] for j in range(p))
            model.Add(s_k >= 1)
            model.Add(s_k * d * shape.width <= pool.devices)
            nodes = model.NewIntVar(0, pool.nodes, f"N{k}")
            model.Add(s_k * d * shape.width == hw.g * nodes)
            fits[k] = model.NewBoolVar(f"fit{k}")
            model.Add(s_k * shape.width <= hw.scale_up).OnlyEnforceIf(fits[k])
        slot = model.NewIntVar(0, 1 << 50, "slot")
        tails = []
        for j in range(p):
            last = j == p - 1
            c = classes[j]
            tau = sum(_int(part[k].layer_time) * nk[j, k]
                      + (_int(part[k].logit_time) * x[j, k] if last else 0) for k in subset)
            sends = model.NewIntVar(0, 1 << 50, f"send{j}")
            a, b = (j, j + 1) if j + 1 < p else (j - 1, j)
            for k in subset:
                pk, own = part[k], cost.pool_links(part[k])
                inside = cost.hop(pk, own, pk.send_bytes, True)
                nic = cost.hop(pk, own, pk.send_bytes, False)
                model.Add(sends >= _int(2 * (inside + pk.regather))).OnlyEnforceIf(x[j, k])
                model.Add(sends >= _int(2 * (nic + pk.regather))).OnlyEnforceIf(
                    [x[j, k], fits[k].Not()])
                for o in subset:
                    if o != k:
                        hop = 2 * (max(cross[k, o], inside) + pk.regather)
                        other = b if j == a else a
                        model.Add(sends >= _int(hop)).OnlyEnforceIf([x[j, k], x[other, o]])
                # memory: linear in the layers, the activations of min(p - j, m) in flight
                slope, base = static[k, c]
                slope += pk.layer_activations * min(p - j, mcount)
                model.Add(math.ceil(slope) * n[j] + math.ceil(base)
                          <= int(usable[k])).OnlyEnforceIf(x[j, k])
            model.Add(slot >= tau + sends)
            table = [v for k in subset for v in tables[k, c]]
            index = model.NewIntVar(0, len(table) - 1, f"i{j}")
            model.Add(index == n[j] + sum(i * (L + 1) * x[j, k] for i, k in enumerate(subset)))
            tail = model.NewIntVar(0, max(table), f"tail{j}")
            model.AddElement(index, table, tail)
            tails.append(tail)
        worst = model.NewIntVar(0, 1 << 50, "tail")
        model.AddMaxEquality(worst, tails)
        objective = (mcount + p - 1) * slot + worst
        s = self._minimise(model, objective, bound * B)
        if s is None:
            return None
        stages = []
        for j in range(p):
            k = next(k for k in subset if s.Value(x[j, k]))
            stages.append(Stage(k, int(s.Value(n[j]))))
        return MixedPlan(shape, (Group(tuple(stages), d, mcount),))

    def _solve_replicas(self, shape: Shape, subset, B: int, _d: int, p: int, bound: float,
                        usable: list | None = None):
        """The best split of B samples over replicas of one p-stage pipeline on every pool of
        `subset`: replicas and micro-batches per replica on each pool, within the pools'
        usable bytes `usable` (the request's where None)."""
        m, pools = self.m, self.cluster.pools
        usable = self.caps if usable is None else usable
        per = B // shape.micro_batch
        split = stage_layers(m.layers, p)
        part = {k: cost.parts(m, pools[k], self.precision, shape) for k in subset}
        model = cp_model.CpModel()
        dmax = {k: pools[k].devices // (shape.width * p) for k in subset}
        total = sum(dmax.values())
        if min(dmax.values()) < 1:
            return None  # a pool without room for one replica
        d = {k: model.NewIntVar(1, dmax[k], f"d{k}") for k in subset}
        mc = {k: model.NewIntVar(1, per, f"m{k}") for k in subset}
        y = {k: model.NewIntVar(1, per, f"y{k}") for k in subset}
        pipe = model.NewIntVar(0, 1 << 55, "pipe")
        D = model.NewIntVar(len(subset), total, "D")
        model.Add(sum(d.values()) == D)
        for k in subset:
            hw = self.hws[k]
            model.AddMultiplicationEquality(y[k], [d[k], mc[k]])
            nodes = model.NewIntVar(0, pools[k].nodes, f"N{k}")
            model.Add(d[k] * shape.width * p == hw.g * nodes)
            group = Group(tuple(Stage(k, n) for n in split), 1, 1)
            slot = max(cost.group_slots(self.cluster, part, group, shape.width))
            model.Add(pipe >= _int(slot) * (mc[k] + p - 1))
        model.Add(sum(y.values()) == per)
        # sync + step over D replicas across the pools; memory of the first and last stage
        ranks = np.arange(len(subset), total + 1)
        links = cost.between_links(self.cluster, list(subset), part)
        tail = np.zeros(ranks.shape)
        for k in subset:
            pk = part[k]
            per_node = cost.replicas_per_node(pk, shape, p, ranks)
            for o in subset:
                per_node = np.minimum(per_node, cost.replicas_per_node(part[o], shape, p, ranks))
            for j in sorted({0, p - 1}):
                in_flight = min(p - j, per)
                agg = cost.stage_aggregates(pk, split[j], j, p, in_flight)
                sync, _ = cost.sync_and_memory(shape, agg, pk, links, ranks, per_node, per, p)
                tail = np.maximum(tail, sync)
                # memory: the static part over D, the activations in flight over m_k
                still = {**agg, "A_act": agg["A_act"] - split[j] * pk.layer_activations
                         * in_flight}
                _, static = cost.sync_and_memory(shape, still, pk, links, ranks, per_node,
                                                 per, p)
                static_var = model.NewIntVar(0, 1 << 60, f"mem{k}_{j}")
                model.AddElement(D - len(subset), [int(math.ceil(v)) for v in
                                                   np.broadcast_to(static, ranks.shape)],
                                 static_var)
                flight = model.NewIntVar(1, p - j, f"f{k}_{j}")
                model.AddMinEquality(flight, [mc[k], model.NewConstant(p - j)])
                act = int(math.ceil(split[j] * pk.layer_activations))
                model.Add(static_var + act * flight <= int(usable[k]))
        sync = model.NewIntVar(0, 1 << 50, "sync")
        model.AddElement(D - len(subset), [_int(v) for v in tail], sync)
        objective = pipe + sync
        s = self._minimise(model, objective, bound * B)
        if s is None:
            return None
        groups = tuple(Group(tuple(Stage(k, n) for n in split), int(s.Value(d[k])),
                             int(s.Value(mc[k]))) for k in subset)
        return MixedPlan(shape, groups)


def _stages_hold(most, least, caps, p) -> np.ndarray:
    """The most layers p stages hold when a stage on pool k holds at most `most[k]`: every
    pool `least[k]` stages, those beyond on the pools that hold the most (as `caps` allow).
    Arrays (K, rows) but `p`; a pool that holds no layer holds no stage (0)."""
    cols = np.arange(most.shape[1])
    total, left = (least * most).sum(axis=0), p - least.sum(axis=0)
    for pick in np.argsort(-most, axis=0):
        take = np.clip(np.minimum(left, caps[pick, cols] - least[pick, cols]), 0, None)
        total, left = total + take * most[pick, cols], left - take
    return np.where((most >= 1).all(axis=0), total, 0)


def _slot_bound(L, lt, logit, hop, least, caps, p, room) -> np.ndarray:
    """A lower bound of the slowest stage's time of p stages over the pools (arrays (K, rows)
    but `hop` and `p`, per row): the least T at which the stages can hold L layers, a stage
    on pool k at most min(floor((T - hop) / lt_k), room_k) of them (`_stages_hold`), and the
    last stage also its output layer. The layers held grow with T, so bisection finds it;
    the lower end (where they do not fit) is returned; inf: no T fits."""

    def holds(T):
        return _stages_hold(np.clip(np.floor((T - hop) / lt), 0, room), least, caps, p) >= L

    # every pool's stages hold a layer; the last stage also the output layer
    lo = np.maximum((hop + lt).max(axis=0), (hop + lt + logit).min(axis=0))
    hi = hop + L * lt.max(axis=0) + logit.max(axis=0)
    lo = np.where(holds(lo), lo, np.nextafter(lo, 0))  # lo: where the layers do not fit
    for _ in range(50):
        mid = (lo + hi) / 2
        yes = holds(mid)
        hi, lo = np.where(yes, mid, hi), np.where(yes, lo, mid)
    return np.where(holds(hi), lo, np.inf)


def _int(seconds: float) -> int:
    return int(round(float(seconds) * SCALE))


def _divisors(x: int) -> list[int]:
    return [k for k in range(1, x + 1) if x % k == 0]
