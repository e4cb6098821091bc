"""Time to train of data-parallel strong scaling (McCandlish et al. 2018): the part of
`planner.analysis.cnn_limits.Limits` that takes the critical batch B_noise.

Time to train over S_min is F(n, B) = (1 + B_noise / B) T(n, B). On one roofline piece T is
affine in B at a fixed n, so dF/dB = 0 has closed forms B*(n) (one per smooth branch of the
overlap max), and the kink where overlap stops hiding the communication is one more closed
form. The batch at a node count is the best of those and the piece ends; the joint optimum is
the best node count, every integer up to `nodes_max`, each at its best batch.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import sympy as sp

from planner.analysis.roots import Formula, affine, affine_root, relax
from planner.expr import symbols as S
from planner.numeric import compile_expr
from planner.search.training import token_budget  # noqa: F401 (its home before)


def stationary_batch(t: sp.Expr) -> list[sp.Expr]:
    """Roots in B of d/dB [(1 + B_noise / B) t(B)] = 0. Where t = a + k B on a smooth branch
    (it is: compute c B / (g n) and the hidden backward h_1 B / (g n) are linear in B, the
    collective does not depend on it), d/dB = k - B_noise a / B^2 = 0 gives
    B* = sqrt(B_noise a / k), with a = t(0) kept as written so `derive` can print it
    (the time-to-train model is McCandlish et al. 2018's); otherwise SymPy solves."""
    ak = affine(t, S.B)
    if ak is None:
        return sp.solve(sp.diff((1 + S.B_noise / S.B) * t, S.B), S.B)
    a, k = ak
    return [sp.sqrt(S.B_noise * a / k)]


class TimeToTrain:
    """The time-to-train limits, mixed into `Limits`: they read its model `dp`, `g`,
    `collective`, `overlap`, `critical_batch`, `at_nodes`, `nodes_max`, the roofline pieces
    and `piece_values`, `comm` and `compute_expr`."""

    def time_per_min_step(self, n, B):
        """F(n, B) from the full model (arrays broadcast)."""
        b = np.asarray(B, dtype=float) / (self.g * np.asarray(n, dtype=float))
        t = self.dp.numeric("iteration", self.collective, self.overlap)(n, self.g, b)
        return (1 + self.critical_batch / np.asarray(B, dtype=float)) * t

    @functools.cached_property
    def ttt_batch_exprs(self) -> list[tuple[str, sp.Expr]]:
        """Closed forms of B in the aggregate symbols and B_noise: the stationary points of F
        in B on each smooth branch, and the overlap kink (communication just hidden)."""
        comm = relax(self.comm)
        hidden = S.h0 + S.h1 * S.B / (S.g * S.n)
        branches = [("no overlap", self.compute_expr() + comm)]
        if self.overlap:
            branches = [("communication exposed", self.compute_expr() + comm - hidden),
                        ("communication hidden", self.compute_expr())]
        out = []
        for label, t in branches:
            out += [(f"stationary point of the time to train, {label}", r)
                    for r in stationary_batch(t)]
        if self.overlap:
            out += [("communication just hidden by the backward pass", r)
                    for r in affine_root(comm - hidden, S.B)]
        return out

    @functools.cached_property
    def _ttt_batch_fns(self) -> tuple[list[sp.Symbol], list]:
        """(argument symbols, one vectorised function per closed form of `ttt_batch_exprs`)."""
        args = sorted(set().union(*(e.free_symbols for _, e in self.ttt_batch_exprs)) | {S.n},
                      key=lambda x: x.name)
        return args, [compile_expr(e, args) for _, e in self.ttt_batch_exprs]

    def _b_max(self) -> float:
        """The largest local batch that fits in device memory (doubling, then bisection)."""
        mem = self.dp.numeric("memory")
        cap = self.dp.system.device.usable_memory_bytes
        if float(mem(1, 1, 1.0)) > cap:
            return 1.0
        lo, hi = 1.0, 2.0
        while float(mem(1, 1, hi)) <= cap and hi < 2**40:
            lo, hi = hi, hi * 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if float(mem(1, 1, mid)) <= cap else (lo, mid)
        return lo

    def _pieces_in_b(self) -> list[tuple[float, float]]:
        """Local-batch intervals within [1, memory limit] on which one roofline piece holds."""
        b_hi = self._b_max()
        edges = {1.0, b_hi}
        for p in self.compute_pieces + (self.hide_pieces or []):
            edges |= {x for x in (p.b_lo, p.b_hi) if 1 < x < b_hi}
        edges = sorted(edges)
        return list(zip(edges, edges[1:], strict=False)) or [(edges[0], edges[0])]

    def best_batches(self, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(B*, F(n, B*), (piece, closed form) of B*) for each node count in `ns`: the closed
        forms of `ttt_batch_exprs` evaluated on every piece where they land inside it, and the
        piece ends (closed form -1), at least one sample per device and within memory."""
        ns = np.asarray(ns, dtype=float)
        gn = self.g * ns
        args, fns = self._ttt_batch_fns
        cands, labels = [], []
        for k, (lo, hi) in enumerate(self._pieces_in_b()):
            cands += [lo * gn, hi * gn]
            labels += [(k, -1), (k, -1)]
            vals = {**self.piece_values(math.sqrt(lo * hi)), S.B_noise: self.critical_batch}
            for i, fn in enumerate(fns):
                x = fn(*(ns if a == S.n else vals[a] for a in args))
                cands.append(np.where(np.isfinite(x) & (x >= lo * gn) & (x <= hi * gn), x,
                                      np.nan))
                labels.append((k, i))
        C = np.column_stack(cands)
        F = self.time_per_min_step(ns[:, None], np.where(np.isnan(C), gn[:, None], C))
        F = np.where(np.isnan(C), np.inf, F)
        j = np.argmin(F, axis=1)
        rows = np.arange(len(ns))
        return C[rows, j], F[rows, j], np.asarray(labels)[j]

    @functools.cached_property
    def _ttt_choice(self) -> tuple[float, float, tuple[int, int]]:
        """(B*, n, (piece, closed form)) at `at_nodes`, or the joint optimum over every node
        count up to `nodes_max`."""
        ns = (np.array([float(self.at_nodes)]) if self.at_nodes is not None else
              np.arange(1, self.nodes_max + 1, dtype=float))
        B, F, which = self.best_batches(ns)
        i = int(np.argmin(F))
        return float(B[i]), float(ns[i]), (int(which[i][0]), int(which[i][1]))

    @property
    def time_to_train_batch(self) -> tuple[float, float]:
        """(B*, n): the global batch minimising time to train on n = `at_nodes` nodes or, by
        default, at the joint optimum over every node count up to `nodes_max`."""
        return self._ttt_choice[:2]

    def time_to_train_formula(self) -> Formula:
        """The closed form that gives the time-to-train batch, with its values on its piece."""
        B, n, (piece, form) = self._ttt_choice
        lo, hi = self._pieces_in_b()[piece]
        vals = {**self.piece_values(math.sqrt(lo * hi)), S.n: n,
                S.B_noise: self.critical_batch}
        if form < 0:
            return Formula("time_to_train_batch", sp.Float(B), vals,
                           "a piece end: one sample per device, device memory or a roofline "
                           "corner")
        note, expr = self.ttt_batch_exprs[form]
        return Formula("time_to_train_batch", expr, vals, note)

    def _ttt_summary(self) -> dict:
        if self.critical_batch is None:
            return {}
        B, n = self.time_to_train_batch
        return {"time_to_train": {
            "critical_batch": self.critical_batch, "nodes": n, "global_batch": B,
            "local_batch": B / (self.g * n),
            "time_per_min_step_s": float(self.time_per_min_step(n, B)),
            "nodes_chosen": self.at_nodes is None,
            "nodes_max": self.nodes_max, "reason": self.time_to_train_formula().note}}
