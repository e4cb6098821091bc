"""The click parameter types every flag of planner uses, the choices of its options, and the
parsers of list and range flags ('1,2,4', 'A:B', 'A:B:x2', '6.25,12.5').

The choices spell out the values of the enums they stand for (`planner.expr.collectives.
Collective`, `planner.spec.hardware.Precision`, `planner.expr.memory.Optimizer`,
`planner.plan.Recompute` and `Schedule`): importing those would load SymPy and pydantic for
`planner --help`; `planner.api` turns the strings into the enums and rejects any other.
"""

from __future__ import annotations

import math

import click

from planner.errors import SpecError
from planner.spec.numbers import decimal_float, decimal_int, short

FORMATS = ["table", "json", "yaml"]
LAUNCH_FORMATS = ["env", "slurm", "torchrun", "megatron", "deepspeed", "torchtitan"]
PLAN_FORMATS = FORMATS + LAUNCH_FORMATS
COLLECTIVES = ["ring", "halving-doubling", "tree", "parameter-server", "hierarchical"]
PRECISIONS = ["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4", "fp4"]
OPTIMIZERS = ["sgd", "momentum", "adam", "adafactor", "muon"]  # the last two: transformers
RECOMPUTE = ["none", "selective", "full"]
SCHEDULES = ["1f1b", "gpipe"]
KERNELS = ["fused", "eager"]


class FiniteFloat(click.FloatRange):
    """A float flag: plain decimal text ('0.05', '1e-9'), finite, within the range. click's
    FloatRange lets 'nan' through (it compares false both ways) and float() takes 'inf',
    '1_000' and non-ASCII digits; every float flag of planner uses this type instead."""

    name = "float"

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            number = decimal_float(value)
            if number is None:
                self.fail(f"{short(value, 40)} is not a finite decimal number", param, ctx)
            value = number
        elif isinstance(value, float) and not math.isfinite(value):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(value, param, ctx)


class DecimalInt(click.IntRange):
    """An integer flag: plain ASCII decimal digits of bounded length, within the range. int()
    takes '٣', '1_000' and ' 7 ', and refuses more than 4,300 digits with a message quoting them
    all; every integer flag of planner uses this type instead."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            number = decimal_int(value)
            if number is None:
                self.fail(f"{short(value, 40)} is not a whole number in decimal digits", param,
                          ctx)
            value = number
        return super().convert(value, param, ctx)


MAX_LIST_TEXT = 10_000  # characters of a list flag ('1,2,4', '6.25,12.5')
MAX_LIST_ITEMS = 100_000


def plot_path_checked(ctx, param, value: str | None) -> str | None:  # noqa: ARG001 (click callback)
    """--plot's file name, checked before any work (`planner.plot.check_path`); None: no plot."""
    if value is None:
        return None
    from planner.plot import check_path

    return check_path(value)


def batch_range(value: str | None) -> tuple[int, int] | None:
    """'A:B': two positive decimal integers (sizes are checked by the solver)."""
    if value is None:
        return None
    parts = value.split(":") if len(value) <= 100 else []
    ints = [decimal_int(p) for p in parts]
    if len(ints) != 2 or any(x is None or x < 1 for x in ints):
        raise SpecError(f"global_batch_range: expected A:B with positive integers, got "
                        f"{short(value)}")
    return ints[0], ints[1]


def float_list(value: str | None, key: str) -> list[float] | None:
    """'6.25,12.5,25': positive finite decimal numbers."""
    if value is None:
        return None
    out = [decimal_float(x) for x in value.split(",")] if len(value) <= MAX_LIST_TEXT else []
    if not out or not all(x is not None and x > 0 for x in out):
        raise SpecError(f"{key}: expected positive numbers like '6.25,12.5,25', got "
                        f"{short(value)}")
    return out


def int_list(value: str | None, key: str) -> list[int] | None:
    """'1,2,4' or 'A:B' (every integer) or 'A:B:x2' (doubling): positive decimal integers
    (a range within 1..1,000,000 and of at most 100,000 values; listed values up to 2^40)."""
    if value is None:
        return None
    bad = SpecError(f"{key}: expected '1,2,4', 'A:B' or 'A:B:x2' with positive integers, "
                    f"got {short(value)}")
    if len(value) > MAX_LIST_TEXT:
        raise bad
    if ":" in value:
        parts = value.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "x2"):
            raise SpecError(f"{key}: a range is 'A:B' (every integer) or 'A:B:x2' (doubling; "
                            f"no other step), got {short(value)}")
        lo, hi = decimal_int(parts[0]), decimal_int(parts[1])
        if lo is None or hi is None:
            raise bad
        if not 1 <= lo <= hi <= 1_000_000:
            raise SpecError(f"{key}: a range 'A:B' needs 1 <= A <= B <= 1,000,000, got "
                            f"{short(value)}")
        if len(parts) == 3:
            out, x = [], lo
            while x <= hi:
                out.append(x)
                x *= 2
            return out
        if hi - lo >= MAX_LIST_ITEMS:
            raise SpecError(f"{key}: a range 'A:B' of every integer holds at most "
                            f"{MAX_LIST_ITEMS:,} values, got {hi - lo + 1:,} ({short(value)}); "
                            "'A:B:x2' doubles")
        return list(range(lo, hi + 1))
    out = [decimal_int(x) for x in value.split(",")]
    if not all(x is not None and 1 <= x <= 2**40 for x in out):
        raise bad
    return out
