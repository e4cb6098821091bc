"""Theoretical limits of hybrid-parallel transformer training, from the cost expressions.

The iteration time is `planner.expr.transformer.time_form`, written in aggregates (tau, tau_p2p,
M, r, H, T_opt, T_sync) that each have an expression in the plan (t, p, d, b, m, v). Along the
data-parallel degree d at a fixed t x p, with m = B / (d b), only the collective and the
pipeline slots move:

    T(d) = (B / (d b) + (p - 1) / v)(tau + tau_p2p) + max(0, C(d) - H) + T_opt / d + T_sync
                                                                                 (ZeRO >= 1)

so its optimum, the point where communication stops being hidden and the bandwidth a target
efficiency needs are SymPy closed forms in those symbols (the seed paper's sec. 3 results, for
a hybrid plan). Along p and t the cost on one smooth branch is a_inv / x + a_0 + a_1 x (+ a_2
x^2), whose stationary point or root is solved the same way. Every closed form is evaluated on
the branch that holds at its value and checked against the full model; the whole plans a user
can run (integers that divide the batch, whole nodes) are found on the full model beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import sympy as sp

from planner.analysis import branches as br
from planner.analysis.branches import Closed, divisors
from planner.analysis.transformer_lines import optimal_pp, tp_comm_bound_from
from planner.cost.programs import program
from planner.cost.transformer import Hardware
from planner.errors import InfeasibleError, SpecError
from planner.expr import graph, vocab
from planner.expr import symbols as S
from planner.expr import transformer as model_forms
from planner.expr.rewrite import substitute
from planner.expr.transformer import PLAN_SYMBOLS, RECOMPUTE, Choices, TransformerExpressions
from planner.numeric import Program


def time_form(c: Choices) -> sp.Expr:
    """`planner.expr.transformer.time_form` as SymPy (closed forms are solved in it)."""
    return graph.to_sympy(model_forms.time_form(c))


def allreduce_form() -> sp.Expr:
    return graph.to_sympy(model_forms.allreduce_form())


def _of(symbol: sp.Symbol) -> graph.Node:
    """The cost model's symbol (`planner.expr.vocab`) of a SymPy symbol."""
    return graph.symbol(symbol.name)

DEFAULT_LOCAL_EFFICIENCY = 0.9
DEFAULT_TARGET_EFFICIENCY = 0.8
# What `limits` assumes where nothing is pinned: Megatron-LM's usual settings for large runs
# (selective recompute, sequence parallel, the distributed optimizer = ZeRO 1, 1F1B, flash)
DEFAULT_CHOICES = Choices(recompute="selective", sequence_parallel=True, zero=1)


class TransformerLimits:
    def __init__(self, model, system, precision, global_batch: int, *, tp: int | None = None,
                 pp: int | None = None, dp: int | None = None, micro_batch: int = 1,
                 interleave: int = 1, choices: Choices = DEFAULT_CHOICES,
                 local_efficiency: float = DEFAULT_LOCAL_EFFICIENCY,
                 target_efficiency: float = DEFAULT_TARGET_EFFICIENCY,
                 critical_batch: float | None = None):
        self.model, self.system, self.precision = model, system, precision
        self.hw = Hardware.of(system, precision)
        self.g, self.B, self.b, self.v = self.hw.g, global_batch, micro_batch, interleave
        self.choices = choices
        self.local_efficiency, self.target_efficiency = local_efficiency, target_efficiency
        self.critical_batch = critical_batch
        self._check(tp, pp, dp)
        self.tp, self.pp, self.pinned_dp = tp, pp, dp
        if tp is None or pp is None or dp is None:
            # unpinned: the memory floor with the tensor-parallel group inside a node
            floor = self.memory_floor_for(choices, tp, pp, dp, inside_node=tp is None,
                                          fewest_devices=True)
            if floor is None:
                raise InfeasibleError(
                    f"infeasible: memory: no tp x pp x dp split of '{model.name}' fits "
                    f"{system.device.name} at global batch {global_batch} with ZeRO "
                    f"{choices.zero} and {choices.recompute} recompute", ("memory",))
            tp, pp, dp = floor["tp"], floor["pp"], floor["dp"]
        self.tp, self.pp, self.dp = tp, pp, dp

    def _check(self, tp, pp, dp) -> None:
        md = self.model
        if self.B < 1:
            raise SpecError(f"global_batch: must be a positive integer, got {self.B}")
        if self.B % self.b:
            raise SpecError(f"micro_batch: {self.b} does not divide global batch {self.B}")
        for key, v in (("local_efficiency", self.local_efficiency),
                       ("target_efficiency", self.target_efficiency)):
            if not 0 < v < 1:
                raise SpecError(f"{key}: must be in (0, 1), got {v}")
        if tp is not None and (md.heads % tp or md.kv_heads % tp):
            raise SpecError(f"tp: {tp} does not divide heads {md.heads} and kv_heads "
                            f"{md.kv_heads} of '{md.name}'")
        if pp is not None and pp > md.layers:
            raise SpecError(f"pp: {pp} stages for {md.layers} layers")
        if self.v > 1 and (pp in (None, 1) or md.layers % (pp * self.v)):
            raise SpecError(f"interleave: {self.v} chunks need a pinned pp > 1 with pp x "
                            f"interleave dividing {md.layers} layers")
        if dp is not None and (self.B // self.b) % dp:
            raise SpecError(f"dp: {dp} does not divide the {self.B // self.b} micro-batches of "
                            f"{self.b} in global batch {self.B}")

    # --- the full model ------------------------------------------------------------------------

    def run(self, choices: Choices | None = None, **plan) -> dict[str, np.ndarray]:
        """Every output of the full model at a plan (arrays broadcast); d defaults to give
        m = B / (d b)."""
        t, p = plan.get("t", self.tp), plan.get("p", self.pp)
        d = np.asarray(plan.get("d", 1), dtype=float)
        b = plan.get("b", self.b)
        m = plan.get("m", self.B / (d * b))
        out = program(self.model, self.hw, (choices or self.choices,))(
            t, p, d, b, m, plan.get("v", self.v), 1, 1, t, 1, 1)  # cp = ep = 1, etp = tp
        return {k.split("/", 1)[1]: v for k, v in out.items()}

    def whole_node(self, devices: np.ndarray) -> np.ndarray:
        return (devices <= self.g) | (devices % self.g == 0)

    def valid_dps(self, t: int, p: int) -> np.ndarray:
        """Data-parallel degrees of whole plans: d b divides B, whole nodes beyond one."""
        ds = np.array(divisors(self.B // self.b), dtype=float)
        return ds[self.whole_node(t * p * ds)]

    # --- memory floor ------------------------------------------------------------------------

    def memory_floor_for(self, choices: Choices, tp=None, pp=None, dp=None,
                         inside_node: bool = False, fewest_devices: bool = False) -> dict | None:
        """The smallest tp x pp that fits in device memory at micro-batch b, then the fewest
        devices, then the larger tp (Megatron's advice: tensor parallel first, inside the
        node), searched on the memory expression; `inside_node` keeps tp <= devices per node,
        `fewest_devices` ranks by devices before tp x pp."""
        md = self.model
        ts = [x for x in divisors(math.gcd(md.heads, md.kv_heads)) if tp in (None, x)
              and (x <= self.g or not inside_node)]
        ps = [x for x in range(1, md.layers + 1) if pp in (None, x)]
        ds = [x for x in divisors(self.B // self.b) if dp in (None, x)]
        t, p, d = (a.ravel().astype(float) for a in np.meshgrid(ts, ps, ds, indexing="ij"))
        mem = np.broadcast_to(self.run(choices, t=t, p=p, d=d, v=self.v)["memory"], t.shape)
        ok = (mem <= self.hw.memory_bytes) & self.whole_node(t * p * d)
        if not ok.any():
            return None
        keys = (-t[ok], t[ok] * p[ok] * d[ok], t[ok] * p[ok])
        i = np.flatnonzero(ok)[np.lexsort(keys[:1] + keys[2:0:-1] if fewest_devices else keys)[0]]
        return {"zero": choices.zero, "recompute": choices.recompute, "tp": int(t[i]),
                "pp": int(p[i]), "dp": int(d[i]), "devices": int(t[i] * p[i] * d[i]),
                "memory_bytes_per_device": float(mem[i])}

    def memory_floor(self) -> list[dict]:
        """The floor for every ZeRO stage and recompute choice (None where nothing fits)."""
        out = []
        for zero in range(4):
            for rec in RECOMPUTE:
                c = dataclasses.replace(self.choices, recompute=rec, zero=zero)
                out.append(self.memory_floor_for(c) or {"zero": zero, "recompute": rec,
                                                        "tp": None, "pp": None})
        return out

    # --- along d: the aggregates and the form ------------------------------------------------

    @functools.cached_property
    def expressions(self) -> TransformerExpressions:
        """The expressions of this model, hardware and choices (built once)."""
        return TransformerExpressions(self.model, self.hw, self.choices, cp=1, ep=1,
                                      etp=vocab.t)

    @functools.cached_property
    def aggregates(self) -> dict:
        """The aggregates' values at this t x p (r at d >= its node share)."""
        ex = self.expressions
        keys = [S.tau, S.tau_p2p, S.M, S.H, S.T_opt, S.T_sync, S.beta, S.alpha, S.beta_i, S.alpha_i,
                S.Psi, S.Psi_t, S.delta, S.W_q, S.ell]
        prog = graph.compile_graphs({k: ex.aggregates[_of(k)] for k in keys}, PLAN_SYMBOLS)
        out = {k: float(np.asarray(v)) for k, v in prog(self.tp, self.pp, 1e9, self.b, 1.0,
                                                         self.v, 1, 1, 1, 1, 1).items()}
        out[S.r] = float(max(self.hw.scale_up // (self.tp * self.pp), 1))
        out[S.sigma] = self.hw.overlap_slowdown
        return {**out, S.B: self.B, S.b: self.b, S.p: self.pp, S.v: self.v, S.t: self.tp}

    def one_replica_per_node(self, form: sp.Expr) -> sp.Expr:
        """With r = 1 (the model-parallel group fills a node) the intra-node ring vanishes:
        say so in the formula rather than carry (r - 1) factors."""
        return substitute(form, {S.r: sp.Integer(1)}) if self.aggregates[S.r] == 1 else form

    @functools.cached_property
    def d_form(self) -> sp.Expr:
        """T(d): the iteration time at this t x p with m = B / (d b)."""
        return self.one_replica_per_node(
            substitute(time_form(self.choices), {S.m: S.B / (S.d * S.b)}))

    @property
    def d_range(self) -> tuple[float, float]:
        hi = self.B / self.b
        return min(self.aggregates[S.r], hi), hi

    def d_time(self, d) -> np.ndarray:
        """T(d) from the full model (continuous d allowed)."""
        return np.asarray(self.run(d=d)["time"], dtype=float)

    def _branch_candidates(self, form: sp.Expr, var: sp.Symbol, lo: float, hi: float,
                           point: dict, kinks: list[sp.Expr]) -> list[tuple[float, Closed]]:
        """Stationary points of every smooth branch of `form` (met on a grid of `var`) that
        lie where their branch holds, the kinks' roots, and the interval ends."""
        out, seen = [], set()
        for x in np.geomspace(lo, hi, 24) if hi > lo else [lo]:
            branch = br.branch_at(form, {**point, var: float(x)})
            if branch in seen:
                continue
            seen.add(branch)
            for root in br.solve_for(sp.diff(branch, var), var):
                z = br.real_in(root, point, lo, hi)
                if z is not None and br.branch_at(form, {**point, var: z}) == branch:
                    out.append((z, Closed("", root, point, "stationary point of T on its "
                                                              "branch")))
        for kink in kinks:
            for root in br.solve_for(br.branch_at(kink, {**point, var: hi}), var):
                z = br.real_in(root, point, lo, hi)
                if z is not None:
                    out.append((z, Closed("", root, point, "communication just hidden by "
                                                           "the backward pass")))
        ends = {lo: (sp.Integer(1) if lo == 1 else S.r, "the smallest data-parallel degree"),
                hi: (S.B / S.b, "batch limit: one micro-batch per replica")}
        out += [(x, Closed("", e, point, note)) for x, (e, note) in ends.items()]
        return out

    @functools.cached_property
    def optimal_dp(self) -> Closed:
        """d* minimising T(d) at this t x p (continuous), with its closed form."""
        lo, hi = self.d_range
        point = dict(self.aggregates)
        # overlapped, the sync is hidden until it outlasts the backward it slows down
        kink = self.one_replica_per_node(allreduce_form() - (1 + S.sigma) * S.H)
        cands = self._branch_candidates(self.d_form, S.d, lo, hi, point,
                                        [kink] if self.choices.overlap else [])
        times = [self.relaxed_d_time(x) for x, _ in cands]
        x, best = cands[int(np.argmin(times))]
        return Closed("optimal_dp", best.expression, point, best.note)

    def best_whole_dp(self) -> tuple[int, float]:
        """(d, T) of the fastest whole plan at this t x p, on the full model."""
        ds = self.valid_dps(self.tp, self.pp)
        times = self.d_time(ds)
        i = int(np.argmin(times))
        return int(ds[i]), float(times[i])

    def comm_bound_from(self) -> Closed | None:
        """The d where data-parallel communication stops being hidden (overlap) or exceeds
        the pipeline's compute (no overlap): the root of the relaxed condition."""
        lo, hi = self.d_range
        point = dict(self.aggregates)
        hidden = ((1 + S.sigma) * S.H if self.choices.overlap
                  else (S.B / (S.d * S.b) + (S.p - 1) / S.v) * S.tau)
        gap = self.one_replica_per_node(allreduce_form() - hidden)
        for root in br.solve_for(br.branch_at(gap, {**point, S.d: hi}), S.d):
            z = br.real_in(root, point, 1.0, hi)
            if z is not None:
                return Closed("comm_bound_from", root, point,
                              "data-parallel communication equals what hides it")
        return None

    def first_exposed_dp(self) -> int | None:
        """The smallest whole-plan d whose data-parallel communication is exposed (full model):
        overlapped, beyond the share of it the slowed compute beside it always pays."""
        ds = self.valid_dps(self.tp, self.pp)
        r = self.run(d=ds)
        floor = 0.0
        if self.choices.overlap:
            sigma = self.hw.overlap_slowdown
            alone = self.run(dataclasses.replace(self.choices, overlap=False), d=ds)
            floor = sigma / (1 + sigma) * np.asarray(alone["dp_comm_exposed"])
        exposed = np.asarray(r["dp_comm_exposed"]) > floor + 1e-12 * np.asarray(r["time"])
        return int(ds[np.argmax(exposed)]) if exposed.any() else None

    # --- batch limit -------------------------------------------------------------------------

    @functools.cached_property
    def smallest_efficient_micro_batch(self) -> int:
        """Smallest micro-batch at which the stage runs at `local_efficiency` of its
        large-batch rate per sequence (the roofline's weight traffic stops dominating)."""
        tau = self.expressions.aggregates[vocab.tau]
        f = graph.compile_graphs({"tau": tau}, PLAN_SYMBOLS)
        big = 2.0**30
        t_big, t_2big = (float(np.asarray(f(self.tp, self.pp, 1, x, 1, self.v, 1, 1, 1,
                                            1, 1)["tau"])) for x in (big, 2 * big))
        rate = (t_2big - t_big) / big  # seconds per sequence at large micro-batches
        bs = np.arange(1, self.B + 1, dtype=float)
        taus = np.asarray(f(self.tp, self.pp, 1, bs, 1, self.v, 1, 1, 1, 1, 1)["tau"], dtype=float)
        ok = rate * bs / taus >= self.local_efficiency
        return int(bs[np.argmax(ok)]) if ok.any() else self.B

    def max_useful_devices(self) -> Closed:
        b_min = self.smallest_efficient_micro_batch
        point = {S.t: self.tp, S.p: self.pp, S.B: self.B, S.b: b_min}
        return Closed("max_useful_devices", S.t * S.p * sp.floor(S.B / S.b), point,
                      f"global batch over the smallest efficient micro-batch ({b_min})")

    # --- bandwidth and time to train ---------------------------------------------------------

    def required_bandwidth(self, d: float) -> Closed | None:
        """The inter-node bandwidth per device the data-parallel allreduce needs for
        `target_efficiency` at d replicas: T(d) = T_d1 / (d eta) solved for beta, on the
        branch holding at the system's bandwidth (pipeline sends keep the system's)."""
        point = {**self.aggregates, S.d: float(d), S.T_d1: float(self.d_time(1.0))}
        eta = sp.Rational(round(self.target_efficiency * 10**6), 10**6)
        # the branch where the allreduce is exposed: the requirement lies on it whenever the
        # target is reachable at all (below the kink the exposure only grows)
        starved = {**point, S.beta: point[S.beta] * 1e-9}
        branch = br.relax(br.branch_at(self.d_form, starved))
        for root in sp.solve(sp.Eq(branch, S.T_d1 / (S.d * eta)), S.beta):
            values = {k: v for k, v in point.items() if k != S.beta}
            z = br.real_in(root, values, 0.0, math.inf)
            if z is not None and z > 0 and br.relax(
                    br.branch_at(self.d_form, {**point, S.beta: z})) == branch:
                return Closed("required_bandwidth", root, values,
                              f"beta for {self.target_efficiency:.0%} data-parallel "
                              f"efficiency at {d:g} replicas")
        return None

    def time_to_train_batch(self, d: int) -> Closed | None:
        """B* minimising (1 + B_noise / B) T(B) at this t x p and d replicas (McCandlish et
        al. 2018, eq. 2.11): the stationary point on the branch holding at the given batch."""
        if self.critical_batch is None:
            return None
        point = {**self.aggregates, S.d: float(d), S.B_noise: self.critical_batch}
        del point[S.B]
        form = (1 + S.B_noise / S.B) * br.relax(self.one_replica_per_node(substitute(
            time_form(self.choices), {S.m: S.B / (S.d * S.b)})))
        branch = br.branch_at(form, {**point, S.B: float(self.B)})
        for root in br.solve_for(sp.diff(branch, S.B), S.B):
            z = br.real_in(root, point, d * self.b, math.inf)
            if z is not None:
                return Closed("time_to_train_batch", root, point,
                              f"stationary point of the time to train at {d} replicas")
        # F falls until its stationary point: below the smallest batch, that batch is best
        return Closed("time_to_train_batch", S.d * S.b, point,
                      f"the smallest batch at {d} replicas: one micro-batch each")

    # --- at the plan, and everything together ------------------------------------------------

    @functools.cached_property
    def plan_point(self) -> dict:
        """The plan symbols and the aggregates' values at (tp, pp, dp)."""
        prog = graph.compile_graphs({graph.to_sympy(k): x for k, x in
                                     self.expressions.aggregates.items()}, PLAN_SYMBOLS)
        m = self.B / (self.dp * self.b)
        values = {k: float(np.asarray(x)) for k, x in
                  prog(self.tp, self.pp, self.dp, self.b, m, self.v, 1, 1, 1, 1, 1).items()}
        return {**values, S.t: self.tp, S.p: self.pp, S.d: self.dp, S.b: self.b, S.m: m,
                S.v: self.v, S.B: self.B}

    def optimum(self) -> dict:
        d_star = self.optimal_dp
        d_whole, t_whole = self.best_whole_dp()
        t_one = float(self.d_time(1.0))
        return {"dp": d_star.value, "devices": self.tp * self.pp * d_star.value,
                "reason": d_star.note,
                "max_speedup": t_one / float(self.relaxed_d_time(d_star.value)),
                "whole_plan": {"dp": d_whole, "devices": self.tp * self.pp * d_whole,
                               "iteration_time_s": t_whole, "speedup": t_one / t_whole}}

    @functools.cached_property
    def _relaxed_d(self) -> Program:
        return Program({"t": br.relax(self.d_form)}, [S.d, *self.aggregates])

    def relaxed_d_time(self, d: float) -> float:
        """T(d) on the relaxed form (ceilings as their argument): what the closed forms
        optimise."""
        return float(self._relaxed_d(d, *self.aggregates.values())["t"])

    @property
    def plan(self) -> dict:
        """The plan the limits (and `derive`'s formulas) are read at, as `limits` reports it."""
        c = self.choices
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp,
                "devices": self.tp * self.pp * self.dp, "micro_batch": self.b,
                "interleave": self.v, "recompute": c.recompute,
                "sequence_parallel": c.sequence_parallel and self.tp > 1, "zero": c.zero,
                "schedule": c.schedule, "overlap": c.overlap,
                "flash_attention": c.flash_attention}

    def summary(self) -> dict:
        at = self.pinned_dp or self.dp
        plan = self.plan
        run = self.run(d=float(self.dp))
        comm = self.comm_bound_from()
        useful = self.max_useful_devices()
        p_int, p_star = optimal_pp(self, at)
        t_int, t_star = tp_comm_bound_from(self, at)
        d_whole = self.best_whole_dp()[0]
        bw = self.required_bandwidth(d_whole)
        ttt = self.time_to_train_batch(d_whole)
        return {
            "global_batch": self.B, "devices_per_node": self.g, "plan": plan,
            "iteration_time_s": float(np.asarray(run["time"])),
            "memory_bytes_per_device": float(np.asarray(run["memory"])),
            "memory_capacity_bytes": self.hw.memory_bytes,
            "memory_floor": self.memory_floor(),
            "optimal_devices": self.optimum(),
            "comm_bound_from": None if comm is None else {
                "dp": comm.value, "devices": self.tp * self.pp * comm.value,
                "first_whole_dp_exposed": self.first_exposed_dp(), "reason": comm.note},
            "max_useful_devices": {
                "devices": useful.value,
                "smallest_efficient_micro_batch": self.smallest_efficient_micro_batch,
                "local_efficiency": self.local_efficiency},
            "optimal_pp": {"pp": p_int, "continuous": None if p_star is None else p_star.value,
                           "at_dp": at},
            "tp_comm_bound_from": None if t_int is None else {
                "tp": t_int, "continuous": None if t_star is None else t_star.value,
                "reason": None if t_star is None else t_star.note, "at_dp": at},
            "required_bandwidth_GBps": None if bw is None else bw.value / 1e9,
            "available_bandwidth_GBps": self.aggregates[S.beta] / 1e9,
            "bandwidth_at_dp": d_whole, "target_efficiency": self.target_efficiency,
            **({} if ttt is None else {"time_to_train": {
                "critical_batch": self.critical_batch, "dp": d_whole,
                "global_batch": ttt.value, "reason": ttt.note}}),
        }
