"""The CP-SAT model of a priced table: one variable, the index of a row in a table sorted by
the objective, so minimising the index minimises the objective exactly (no objective value
is rounded into an integer; the index is far inside int64).

Each user-facing constraint family restricts the index to the rows it allows and is enforced
by a named literal ("gate"); `table.py` names the smallest set of gates no row passes when the
model is infeasible.
"""

from __future__ import annotations

import numpy as np
from ortools.sat.python import cp_model


class RowModel:
    def __init__(self, rows: int):
        self.model = cp_model.CpModel()
        self.point = self.model.new_int_var(0, rows - 1, "row")
        self.gates: dict[str, tuple[cp_model.IntVar, str]] = {}  # name -> (literal, why)
        self.allowed = np.ones(rows, dtype=bool)  # rows every gate allows
        self.masks: dict[str, np.ndarray] = {}  # gate name -> rows it allows
        self.model.minimize(self.point)

    def restrict(self, allowed: np.ndarray) -> None:
        """An unconditional restriction of the index (not a user constraint)."""
        self.model.add_linear_expression_in_domain(
            self.point, cp_model.Domain.from_values(np.flatnonzero(allowed).tolist()))

    def exclude(self, rows: np.ndarray) -> None:
        """Forbid these row indices (runners-up: the plans already returned)."""
        self.model.add_linear_expression_in_domain(
            self.point, cp_model.Domain.from_values(np.asarray(rows).tolist()).complement())

    def gate(self, name: str, why: str, allowed: np.ndarray) -> None:
        lit = self.model.new_bool_var(name)
        self.gates[name] = (lit, why)
        self.masks[name] = allowed
        self.allowed &= allowed
        self.model.add_linear_expression_in_domain(
            self.point, cp_model.Domain.from_values(np.flatnonzero(allowed).tolist())
        ).only_enforce_if(lit)

    def enforce_gates(self) -> None:
        for lit, _ in self.gates.values():
            self.model.add(lit == 1)


def cp_solver(time_limit_s: float, workers: int = 1) -> cp_model.CpSolver:
    """A deterministic solver: fixed seed, `workers` threads (one by default)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    return solver
