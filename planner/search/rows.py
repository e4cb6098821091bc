"""The CP-SAT model both searches share: one variable, the index of a row in a table sorted
by the objective, so minimising the index minimises the objective exactly (no objective value
is rounded into an integer; the index is far inside int64).

Each user-facing constraint family restricts the index to the rows it allows and is enforced
by a named literal ("gate"): an infeasible model can be solved again with the gates as
assumptions, and the names CP-SAT blames explain the conflict.
"""

from __future__ import annotations

import itertools

import numpy as np
from ortools.sat.python import cp_model


class RowModel:
    def __init__(self, rows: int):
        self.model = cp_model.CpModel()
        self.point = self.model.NewIntVar(0, rows - 1, "row")
        self.gates: dict[str, tuple[cp_model.IntVar, str]] = {}  # name -> (literal, why)
        self.allowed = np.ones(rows, dtype=bool)  # rows every gate allows
        self.masks: dict[str, np.ndarray] = {}  # gate name -> rows it allows
        self.model.Minimize(self.point)

    def restrict(self, allowed: np.ndarray) -> None:
        """An unconditional restriction of the index (not a user constraint)."""
        self.model.AddLinearExpressionInDomain(
            self.point, cp_model.Domain.FromValues(np.flatnonzero(allowed).tolist()))

    def gate(self, name: str, why: str, allowed: np.ndarray) -> None:
        lit = self.model.NewBoolVar(name)
        self.gates[name] = (lit, why)
        self.masks[name] = allowed
        self.allowed &= allowed
        self.model.AddLinearExpressionInDomain(
            self.point, cp_model.Domain.FromValues(np.flatnonzero(allowed).tolist())
        ).OnlyEnforceIf(lit)

    def conflict(self) -> tuple[str, ...]:
        """The smallest set of gates that no row satisfies together (exact: each gate is a
        mask over the rows, so a set conflicts when the AND of its masks is empty)."""
        names = list(self.masks)
        for size in range(1, len(names) + 1):
            for combo in itertools.combinations(names, size):
                if not np.logical_and.reduce([self.masks[k] for k in combo]).any():
                    return combo
        return ()

    def enforce_gates(self) -> None:
        for lit, _ in self.gates.values():
            self.model.Add(lit == 1)


def cp_solver(time_limit_s: float, workers: int = 1) -> cp_model.CpSolver:
    """A deterministic solver: fixed seed, `workers` threads (one by default)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    return solver
