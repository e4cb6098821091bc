"""Theoretical limits of data-parallel scaling, derived from the cost expressions.

Strong scaling (global batch B fixed, every node full, b = B / (g n)) turns the iteration time
into a function of the node count n alone:

    T(n) = t_0 + c B / (g n) + C(n)                       (no overlap)
    T(n) = t_0 + c B / (g n) + max(0, C(n) - h_0 - h_1 B / (g n))   (overlap)

where (t_0, c) and (h_0, h_1) are the affine piece of the roofline sum that holds at b, and
C(n) the collective's alpha-beta cost (seed paper, sec. 3; Thakur et al. 2005). Each limit is
obtained by differentiating / solving that expression with SymPy, piece by piece, and checking
the candidates against the full expression: nothing here is a hard-coded formula.

`Limits` holds the strong-scaling limits; the time to train at a critical batch is its part
in `planner.analysis.time_to_train`, the roots and `Formula` are `planner.analysis.roots`, and
the text of `planner limits` is `planner.report.limits`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import sympy as sp

from planner.analysis.roots import Formula, rational, real_root_in, relax, solve_for_n
from planner.analysis.time_to_train import TimeToTrain
from planner.errors import SpecError
from planner.expr import collectives as coll
from planner.expr import symbols as S
from planner.expr.cnn import DataParallelModel
from planner.expr.collectives import Collective
from planner.expr.piecewise import piece_at
from planner.search.data_parallel import DEFAULT_NODES_MAX

DEFAULT_LOCAL_EFFICIENCY = 0.9  # a device counts as efficient at >= 90% of its large-batch rate
DEFAULT_TARGET_EFFICIENCY = 0.8


def comm_expr(dp: DataParallelModel, collective: Collective) -> sp.Expr:
    """The collective's cost across n > 1 nodes in the aggregate symbols."""
    n, g, M, k, a, bw = S.n, S.g, S.M, S.k, S.alpha, S.beta
    if collective is Collective.hierarchical:
        return coll.hierarchical_allreduce(g, n, M, S.alpha_i, S.beta_i, a, bw / g, k)
    if collective is Collective.ring:
        return coll.ring_allreduce(g * n, M, a, bw, k)
    if collective is Collective.halving_doubling:
        return coll.halving_doubling_allreduce(g * n, M, a, bw, k)
    if collective is Collective.tree:
        return coll.tree_allreduce(g * n, M, a, bw, k)
    return coll.parameter_server(g * n, M, a, bw, S.s, k)


@dataclass
class Limits(TimeToTrain):
    """The limits of data-parallel strong scaling of `dp` at `global_batch` over full nodes;
    with `critical_batch`, also the time-to-train optimum (`TimeToTrain`)."""

    dp: DataParallelModel
    collective: Collective
    overlap: bool
    global_batch: int
    local_efficiency: float = DEFAULT_LOCAL_EFFICIENCY
    target_efficiency: float = DEFAULT_TARGET_EFFICIENCY
    at_nodes: float | None = None
    critical_batch: float | None = None  # B_noise (McCandlish et al. 2018): time-to-train limits
    nodes_max: int = DEFAULT_NODES_MAX  # the joint time-to-train optimum's node range (the
    # solver's default space)
    _cache: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.global_batch < 1:
            raise SpecError(f"global_batch: must be a positive integer, got {self.global_batch}")
        if self.nodes_max < 1:
            raise SpecError(f"nodes_max: must be a positive integer, got {self.nodes_max}")
        for key in ("local_efficiency", "target_efficiency"):
            v = getattr(self, key)
            if not 0 < v < 1:
                raise SpecError(f"{key}: must be in (0, 1), got {v}")
        dp = self.dp
        self.g = dp.system.devices_per_node
        self.n_max = self.global_batch / self.g  # continuous: at least one sample per device
        if self.n_max < 1:
            raise SpecError(f"global_batch: {self.global_batch} is smaller than one node's "
                            f"{self.g} devices")
        self.compute_pieces = dp.compute_sum.pieces()
        self.hide_pieces = dp.roofline["T_hide"].pieces() if self.overlap else None
        link = dp.hier_inter if self.collective is Collective.hierarchical else dp.flat_inter
        self.base_values = {
            S.B: self.global_batch, S.g: self.g, S.M: dp.grad_bytes, S.k: dp.calls,
            S.alpha: link.alpha, S.beta: link.beta, S.s: dp.options.servers,
            S.alpha_i: dp.intra.alpha, S.beta_i: dp.intra.beta,
            S.T1: self.single_device_time,
        }
        self.comm = comm_expr(dp, self.collective)

    # --- the expression of T(n) --------------------------------------------------------------

    @property
    def plan(self) -> dict:
        """What the limits (and `derive`'s formulas) assume: data parallel over nodes of g
        devices, the collective, whether the backward hides it."""
        return {"devices_per_node": self.g, "collective": self.collective.value,
                "overlap": self.overlap, "global_batch": self.global_batch}

    @property
    def single_device_time(self) -> float:
        return float(self.dp.numeric("compute")(1, 1, self.global_batch)) + float(self.dp.t_opt)

    def piece_values(self, b: float) -> dict:
        """Values of t_0, c (and h_0, h_1) in the roofline piece that holds at local batch b."""
        p = piece_at(self.compute_pieces, b)
        vals = {**self.base_values, S.t0: p.t0 + float(self.dp.t_opt), S.c: p.c}
        if self.overlap:
            hp = piece_at(self.hide_pieces, b)
            vals.update({S.h0: hp.t0, S.h1: hp.c})
        return vals

    def compute_expr(self) -> sp.Expr:
        return S.t0 + S.c * S.B / (S.g * S.n)

    def exposed_expr(self) -> sp.Expr:
        if not self.overlap:
            return self.comm
        return sp.Max(0, self.comm - (S.h0 + S.h1 * S.B / (S.g * S.n)))

    def iteration_expr(self) -> sp.Expr:
        return self.compute_expr() + self.exposed_expr()

    def iteration_time(self, n: float) -> float:
        """T(n) from the full model (the ground truth the closed forms are checked against)."""
        b = self.global_batch / (self.g * n)
        return float(self.dp.numeric("iteration", self.collective, self.overlap)(n, self.g, b))

    # --- breakpoints in n --------------------------------------------------------------------

    def _n_intervals(self) -> list[tuple[float, float]]:
        """Intervals of n (within [1, n_max]) on which one roofline piece holds."""
        cuts = {1.0, self.n_max}
        pieces = self.compute_pieces + (self.hide_pieces or [])
        for p in pieces:
            for bb in (p.b_lo, p.b_hi):
                if 0 < bb < math.inf:
                    x = self.global_batch / (self.g * bb)
                    if 1 < x < self.n_max:
                        cuts.add(x)
        cuts |= self._step_points
        edges = sorted(cuts)
        return list(zip(edges, edges[1:], strict=False)) or [(1.0, 1.0)]

    def piece_batches(self, n: float, values: dict | None = None) -> tuple[float, float]:
        """The local batches b (at least one sample a device) of the roofline pieces (compute,
        and the backward that hides the sync) that hold at n nodes: where the closed forms'
        t_0, c, h_0, h_1 stay those of n (b_hi inf: every larger b). At a corner between two
        pieces, the pieces whose t_0, c, h_0, h_1 are `values` (the side the formula's
        values were read on)."""
        b = self.global_batch / (self.g * n)

        def pick(pieces, t0, c, offset):
            here = [p for p in pieces if p.b_lo * (1 - 1e-9) <= b <= p.b_hi * (1 + 1e-9)]
            same = [p for p in here if values is not None and t0 in values
                    and math.isclose(p.t0 + offset, values[t0], rel_tol=1e-9, abs_tol=1e-15)
                    and math.isclose(p.c, values[c], rel_tol=1e-9, abs_tol=1e-15)]
            return (same or here or [piece_at(pieces, b)])[0]

        chosen = [pick(self.compute_pieces, S.t0, S.c, float(self.dp.t_opt))]
        if self.overlap:
            chosen.append(pick(self.hide_pieces, S.h0, S.h1, 0.0))
        return max(1.0, *(p.b_lo for p in chosen)), min(p.b_hi for p in chosen)

    @functools.cached_property
    def _step_points(self) -> frozenset[float]:
        """Node counts where a ceiling in C(n) steps (tree allreduce: g n a power of two)."""
        points = set()
        level = sp.Dummy("level", positive=True)
        for atom in self.comm.atoms(sp.ceiling):
            arg = atom.args[0].subs(self.base_values)
            lo = math.floor(float(arg.subs(S.n, 1)))
            hi = math.ceil(float(arg.subs(S.n, self.n_max)))
            roots = sp.solve(sp.Eq(arg, level), S.n)  # once, then one substitution per step
            for k in range(lo, hi + 1):
                for r in roots:
                    x = complex(r.subs(level, k))
                    if abs(x.imag) < 1e-12 and 1 < x.real < self.n_max:
                        points.add(float(x.real))
        return frozenset(points)

    # --- optimal nodes -----------------------------------------------------------------------

    @functools.cached_property
    def _stationary_exprs(self) -> list[tuple[str, sp.Expr]]:
        """Closed forms of dT/dn = 0 for each smooth branch of T(n)."""
        branches = [("no overlap", self.compute_expr() + relax(self.comm))]
        if self.overlap:
            exposed = self.compute_expr() + relax(self.comm) - S.h0 - S.h1 * S.B / (S.g * S.n)
            branches = [("communication exposed", exposed)]
        out = []
        for label, t in branches:
            try:
                roots = solve_for_n(sp.diff(t, S.n))
            except Exception:  # noqa: BLE001 - no closed form: the interval ends still count
                roots = []
            out.extend((label, r) for r in roots)
        return out

    @functools.cached_property
    def _crossover_exprs(self) -> list[sp.Expr] | None:
        """Closed forms of C(n) = h_0 + h_1 B / (g n): where overlap stops hiding the
        communication. None when SymPy finds no closed form (then roots are found numerically)."""
        if not self.overlap:
            return []
        eq = relax(self.comm) - S.h0 - S.h1 * S.B / (S.g * S.n)
        try:
            return solve_for_n(eq)
        except Exception:  # noqa: BLE001 - SymPy's solvers fail in many ways; fall back
            return None

    def _crossovers(self, lo: float, hi: float, vals: dict) -> list[tuple[float, Formula]]:
        out = []
        if self._crossover_exprs is None:
            grid = np.geomspace(lo, hi, 64)
            gaps = [self._gap(x) for x in grid]
            for i in range(1, len(grid)):
                if (gaps[i - 1] < 0) != (gaps[i] < 0):
                    a, z = grid[i - 1], grid[i]
                    for _ in range(100):
                        mid = (a + z) / 2
                        a, z = (mid, z) if (self._gap(mid) < 0) == (gaps[i - 1] < 0) else (a, mid)
                    out.append((a, Formula("optimal_nodes", sp.Float(a), vals,
                                           "communication just hidden (numeric root)")))
            return out
        for root in self._crossover_exprs:
            x = real_root_in(root, vals, lo, hi)
            if x is not None:
                out.append((x, Formula("optimal_nodes", root, vals,
                                       "communication just hidden by the backward pass")))
        return out

    @functools.cached_property
    def optimum(self) -> tuple[float, Formula]:
        """(n*, the formula that gives it). Candidates: each branch's stationary points inside
        each piece's interval, and the interval ends; the best under the full model wins."""
        best: tuple[float, float, Formula] | None = None
        for lo, hi in self._n_intervals():
            mid = math.sqrt(lo * hi)
            vals = self.piece_values(self.global_batch / (self.g * mid))
            cands: list[tuple[float, Formula]] = []
            for label, root in self._stationary_exprs:
                x = real_root_in(root, vals, lo, hi)
                if x is not None:
                    cands.append((x, Formula("optimal_nodes", root, vals,
                                             f"stationary point of T(n), {label}")))
            cands.extend(self._crossovers(lo, hi, vals))
            for end in (lo, hi):
                cands.append((end, self._boundary_formula(end, vals)))
            for x, f in cands:
                t = self.iteration_time(x)
                if best is None or t < best[1] - 1e-15 * t:
                    best = (x, t, f)
        assert best is not None
        return best[0], best[2]

    def _boundary_formula(self, x: float, vals: dict) -> Formula:
        if x == 1.0:
            return Formula("optimal_nodes", sp.Integer(1), vals, "a single node is best")
        if abs(x - self.n_max) <= 1e-9 * self.n_max:
            return Formula("optimal_nodes", S.B / S.g, vals,
                           "batch limit: one sample per device")
        if any(abs(x - p) <= 1e-9 * x for p in self._step_points):
            return Formula("optimal_nodes", sp.Integer(round(x * self.g)) / S.g, vals,
                           "a step of the collective's ceiling(log2 p) latency")
        b_edge = sp.Float(self.global_batch / (self.g * x))
        return Formula("optimal_nodes", S.B / (S.g * b_edge), vals,
                       f"roofline corner at local batch {float(b_edge):.4g}")

    @property
    def optimal_nodes(self) -> float:
        return self.optimum[0]

    @property
    def max_speedup(self) -> float:
        return self.single_device_time / self.iteration_time(self.optimal_nodes)

    # --- where communication overtakes compute -----------------------------------------------

    def _gap(self, n: float) -> float:
        """comm - compute (no overlap) or comm - hideable backward (overlap), at n nodes."""
        b = self.global_batch / (self.g * n)
        dp = self.dp
        comm = float(dp.numeric("comm", self.collective)(max(n, 1 + 1e-9), self.g, b))
        other = dp.numeric("hide" if self.overlap else "compute")(n, self.g, b)
        return comm - float(other)

    @functools.cached_property
    def comm_bound_from_nodes(self) -> float | None:
        """Smallest n >= 1 with communication >= compute (or >= what overlap can hide)."""
        grid = np.geomspace(1, max(self.n_max, 1 + 1e-9), 400)
        gaps = [self._gap(x) for x in grid]
        if gaps[0] >= 0:
            return 1.0
        for i in range(1, len(grid)):
            if gaps[i] >= 0:
                lo, hi = grid[i - 1], grid[i]
                for _ in range(100):  # bisection on the expressions
                    mid = (lo + hi) / 2
                    lo, hi = (mid, hi) if self._gap(mid) < 0 else (lo, mid)
                return float(hi)
        return None

    # --- batch-size limit --------------------------------------------------------------------

    @functools.cached_property
    def local_batch_min(self) -> float:
        """Smallest local batch at which a device reaches `local_efficiency` of its large-batch
        rate: solve c_inf b / (t_0 + c b) = theta on the roofline pieces."""
        c_inf = self.compute_pieces[-1].c
        theta = self.local_efficiency
        bsym = sp.Symbol("b", positive=True)
        for p in self.compute_pieces:
            if p.t0 == 0:
                return max(p.b_lo, 1e-9)
            sol = sp.solve(sp.Eq(c_inf * bsym / (p.t0 + p.c * bsym), theta), bsym)
            for r in sol:
                r = float(r)
                if p.b_lo <= r <= p.b_hi:
                    return r
        return self.compute_pieces[-1].b_lo

    @property
    def max_useful_nodes(self) -> int:
        """Global-batch limit over the smallest efficient local batch (seed paper, sec. 4)."""
        return max(1, math.floor(self.global_batch / (self.g * math.ceil(self.local_batch_min))))

    # --- efficiency and bandwidth ------------------------------------------------------------

    @property
    def nodes_for_targets(self) -> float:
        return float(self.at_nodes) if self.at_nodes is not None else float(self.max_useful_nodes)

    def efficiency_at(self, n: float) -> float:
        return self.single_device_time / (self.g * n * self.iteration_time(n))

    def required_bandwidth(self) -> Formula | None:
        """beta at which efficiency at `nodes_for_targets` reaches the target, or None when
        compute and latency alone already miss it."""
        n_at = self.nodes_for_targets
        vals = dict(self.piece_values(self.global_batch / (self.g * n_at)))
        vals[S.n] = n_at
        target_time = S.T1 / (S.g * S.n * rational(self.target_efficiency))
        t = self.compute_expr() + self.comm
        if self.overlap:
            t = t - S.h0 - S.h1 * S.B / (S.g * S.n)
        sols = sp.solve(sp.Eq(t, target_time), S.beta)
        for r in sols:
            v = complex(r.subs(vals))
            if abs(v.imag) < 1e-9 * abs(v) and v.real > 0:
                del vals[S.beta]
                return Formula("required_bandwidth", r, vals,
                               f"beta for {self.target_efficiency:.0%} efficiency at "
                               f"{n_at:g} nodes")
        return None

    def summary(self) -> dict:
        """The `limits` document: every limit with the values it holds at (and the time to
        train with a critical batch)."""
        n_opt, f_opt = self.optimum
        bw = self.required_bandwidth()
        n_at = self.nodes_for_targets
        return {
            "optimal_nodes": n_opt,
            "optimal_nodes_reason": f_opt.note,
            "max_speedup": self.max_speedup,
            "comm_bound_from_nodes": self.comm_bound_from_nodes,
            "local_batch_min": self.local_batch_min,
            "max_useful_nodes": self.max_useful_nodes,
            "efficiency_at_nodes": {"nodes": n_at, "efficiency": self.efficiency_at(n_at)},
            "required_bandwidth_GBps": bw.value / 1e9 if bw else None,
            "available_bandwidth_GBps": self.base_values[S.beta] / 1e9,
            "target_efficiency": self.target_efficiency,
            "local_efficiency": self.local_efficiency,
            "single_device_time_s": self.single_device_time,
            "iteration_time_at_optimum_s": self.iteration_time(n_opt),
            "global_batch": self.global_batch,
            "devices_per_node": self.g,
            "collective": self.collective.value,
            "overlap": self.overlap,
            **self._ttt_summary(),
            **({"spatial": x} if (x := self._spatial()) else {}),
        }

    def _spatial(self) -> list[dict]:
        from planner.analysis.spatial import crossovers

        return crossovers(self.dp, self.collective)
