"""Numbers and values a user wrote, parsed and shown safely (no heavy imports: the CLI uses
these before it loads anything else).

Every integer and float parsed from text a user wrote goes through these: ASCII decimal digits
only (`str.isdigit` accepts '²', `int` and `float` accept '٣' and '1_000'), a bounded length
(Python refuses to convert integers longer than 4,300 digits), finite values only.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from planner.errors import SpecError

MAX_INT_DIGITS = 18  # below 2**63: every count planner takes is far smaller
MAX_NUMBER_CHARS = 64
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def decimal_int(text: str, max_digits: int = MAX_INT_DIGITS) -> int | None:
    """`text` as an integer when it is one in plain decimal digits (sign allowed, surrounding
    blanks ignored) of at most `max_digits` digits; otherwise None."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not _INT.fullmatch(text) or len(text.lstrip("+-")) > max_digits:
        return None
    return int(text)


def decimal_float(text: str) -> float | None:
    """`text` as a finite float when it is a plain decimal number ('12', '-0.5', '1e-9'), at
    most 64 characters; otherwise None (no 'nan', 'inf', '1_000' or non-ASCII digits)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or not _FLOAT.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise SpecError(f"integer with {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _json_float(text: str) -> float:
    value = decimal_float(text)
    if value is None:
        raise SpecError(f"number {short(text, 30)} is not a finite number of at most "
                        f"{MAX_NUMBER_CHARS} characters")
    return value


def _json_constant(text: str):
    raise SpecError(f"{text} is not a number planner accepts (finite numbers only)")


def loads_json(text: str) -> Any:
    """json.loads with every number guarded (digit limit, finite floats, no NaN / Infinity).
    Raises SpecError for a bad number and json.JSONDecodeError for malformed JSON."""
    return json.loads(text, parse_int=_json_int, parse_float=_json_float,
                      parse_constant=_json_constant)


def short(value: Any, limit: int = 60) -> str:
    """A bounded repr for error messages (a user's value may be huge)."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        text = f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
