"""Shared pieces of spec validation: a strict frozen base model and one-line error messages."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from planner.errors import SpecError
from planner.spec.numbers import (  # noqa: F401 - re-exported: specs parse numbers through these
    MAX_NUMBER_CHARS,
    decimal_float,
    decimal_int,
    loads_json,
    short,
)

M = TypeVar("M", bound="Spec")


class Spec(BaseModel):
    """Frozen, strict, no unknown keys, no NaN/inf: every spec and spec fragment derives from this."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


_TAGS = {"constrained-int", "constrained-float", "constrained-str", "int", "float", "str", "bool"}


def _is_tag(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in _TAGS)


def validate(cls: type[M], data: Any, where: str, prefix: str = "") -> M:
    """Build `cls` from `data`; turn the first pydantic error into a one-line SpecError."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: {prefix or 'document'} must be a mapping, got {short(data)}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        # pydantic adds union-member tags ('constrained-int', 'list[int]') to the location
        key = ".".join(str(p) for p in err["loc"] if not _is_tag(p))
        key = f"{prefix}.{key}" if prefix and key else (prefix or key)
        msg = err["msg"].replace("\n", " ")
        if err["type"] == "missing":
            raise SpecError(f"{where}: missing key '{key}'") from None
        if err["type"] == "extra_forbidden":
            raise SpecError(f"{where}: unknown key '{key}'") from None
        if not key:  # a whole-document check (a model validator): its message names the keys
            raise SpecError(f"{where}: {msg.removeprefix('Value error, ')}") from None
        raise SpecError(f"{where}: key '{key}': {msg} (got {short(err.get('input'))})") from None
