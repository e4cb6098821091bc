"""Shared pieces of spec validation: a strict frozen base model and error messages of one line
per mistake (every mistake of a spec at once, with "did you mean" for unknown keys)."""

from __future__ import annotations

import difflib
from typing import Any, TypeVar, get_args

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


MAX_ERRORS = 10  # lines of one spec's error message


def _spec_classes(annotation: Any, seen: set) -> None:
    """Every Spec class inside a type annotation (lists, unions, Annotated), recursively."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation in seen:
            return
        seen.add(annotation)
        for field in annotation.model_fields.values():
            _spec_classes(field.annotation, seen)
        return
    for arg in get_args(annotation):
        _spec_classes(arg, seen)


def known_keys(cls: type[BaseModel]) -> list[str]:
    """The keys of `cls` and of every spec nested in it (what "did you mean" chooses from)."""
    seen: set = set()
    _spec_classes(cls, seen)
    return sorted({name for c in seen for name in c.model_fields})


# keys a spec once took, by the name that replaced them (a user's old YAML is told the new one)
RENAMED = {"graph_floor_us": "kernel_gpu_us"}  # stop 31: t_0 is paid beside the work, no floor


def did_you_mean(word: Any, choices) -> str:
    """' (did you mean 'x'?)' for the closest of `choices` to `word`, or ''."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _line(err: dict, where: str, prefix: str, cls: type[BaseModel]) -> tuple[str, str]:
    """(key, one line) for one pydantic error."""
    # pydantic adds union-member tags ('constrained-int', 'list[int]') to the location
    key = ".".join(str(p) for p in err["loc"] if not _is_tag(p))
    key = f"{prefix}.{key}" if prefix and key else (prefix or key)
    msg = err["msg"].replace("\n", " ")
    if err["type"] == "missing":
        return key, f"{where}: missing key '{key}'"
    if err["type"] == "extra_forbidden":
        last = next((p for p in reversed(err["loc"]) if isinstance(p, str)), None)
        hint = (f" (renamed '{RENAMED[last]}')" if last in RENAMED
                else did_you_mean(last, known_keys(cls)))
        return key, f"{where}: unknown key '{key}'{hint}"
    if not key:  # a whole-document check (a model validator): its message names the keys
        return key, f"{where}: {msg.removeprefix('Value error, ')}"
    return key, f"{where}: key '{key}': {msg} (got {short(err.get('input'))})"


def validate(cls: type[M], data: Any, where: str, prefix: str = "") -> M:
    """Build `cls` from `data`; every pydantic error becomes one line of a SpecError (one line
    per key, at most MAX_ERRORS, the first line alone being the message one error gives), so
    a spec with several mistakes is fixed in one run."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: {prefix or 'document'} must be a mapping, got {short(data)}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        lines: dict[str, str] = {}
        for err in exc.errors():
            key, line = _line(err, where, prefix, cls)
            lines.setdefault(key, line)  # a union reports one value once per member
        shown = list(lines.values())
        if len(shown) > MAX_ERRORS:
            rest = len(shown) - (MAX_ERRORS - 1)
            shown = [*shown[:MAX_ERRORS - 1], f"{where}: ... and {rest} more errors"]
        raise SpecError("\n".join(shown)) from None
