"""The project's own exceptions; `planner.cli` turns them into one-line messages and exit codes."""


class PlannerError(Exception):
    """Base class. `exit_code` is what the CLI exits with."""

    exit_code = 2


class SpecError(PlannerError):
    """A spec or flag is malformed or invalid (exit code 2). The message names file, key, value."""

    exit_code = 2


class InfeasibleError(PlannerError):
    """A well-formed problem has no feasible answer (exit code 1); the message names the conflict."""

    exit_code = 1

    def __init__(self, message: str, conflicts: tuple[str, ...] = ()):
        super().__init__(message)
        self.conflicts = conflicts


class CheckFailed(PlannerError):
    """A `--check` found the specs out of date with what they claim (exit code 1)."""

    exit_code = 1
