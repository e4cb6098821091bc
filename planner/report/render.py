"""Output for people (aligned text tables) and programs (JSON, YAML). Nothing here computes."""

from __future__ import annotations

import json
import math
from typing import Any

import yaml

SCHEMA_VERSION = 1


def _clean(value: Any) -> Any:
    """JSON-safe: enums to values, numpy scalars to Python, non-finite floats to None."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, int | float | str):
        return value.value
    if hasattr(value, "item") and not isinstance(value, int | float | str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def document(command: str, body: dict) -> dict:
    return {"schema_version": SCHEMA_VERSION, "command": command, **_clean(body)}


def to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=False)


def to_jsonl(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"))


def to_yaml(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def si(value: float, unit: str = "") -> str:
    """3 significant digits with an SI prefix: 1.23 ms, 45.6 GB."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return f"0 {unit}".strip()
    prefixes = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""),
                (1e-3, "m"), (1e-6, "u"), (1e-9, "n")]
    for factor, p in prefixes:
        if abs(value) >= factor:
            return f"{value / factor:.3g} {p}{unit}".strip()
    return f"{value:.3g} {unit}".strip()


def duration(seconds: float) -> str:
    """A wall-clock span in the unit people plan in: 42.1 s, 17.8 min, 5.2 h, 7.86 days,
    1,234 days (never an SI prefix on seconds: no "11.5 Ms")."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    for limit, factor, unit in ((120, 1, "s"), (7200, 60, "min"), (172800, 3600, "h")):
        if abs(seconds) < limit:
            return f"{seconds / factor:.3g} {unit}"
    days = seconds / 86400
    return f"{days:.3g} days" if abs(days) < 1000 else f"{days:,.0f} days"


def count(n: float, word: str, spec: str = "g") -> str:
    """`n word`, the word plural unless n is one: "1 node", "8 nodes", "1.5 nodes"."""
    return f"{n:{spec}} {word}{'' if n == 1 else 's'}"


def span(seconds: float) -> str:
    """A time as people read it: SI below two minutes (6.84 s, 393 ms, 932 us), minutes,
    hours or days above (`duration`)."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if abs(seconds) < 1e-15:  # under a femtosecond: the float residue of a difference of 0
        return "0 s"
    return si(seconds, "s") if abs(seconds) < 120 else duration(seconds)


def usd(amount: float) -> str:
    """Dollars with the precision a figure of that size carries: $12.29 below $1,000, whole
    dollars up to a million ($123,456), then millions ($40.2 M): no cents on $40 M."""
    if amount is None or not math.isfinite(amount):
        return "n/a"
    if abs(amount) < 1000:
        return f"${amount:,.2f}"
    if abs(amount) < 1e6:
        return f"${amount:,.0f}"
    return f"${amount / 1e6:,.3g} M" if abs(amount) < 1e9 else f"${amount / 1e6:,.0f} M"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for k, r in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if k and _numeric(c) else c.ljust(w)
                               for c, w in zip(r, widths, strict=True)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or (text[0] in "-." and text[1:2] not in ("", "-")
                                                 and (text[1].isdigit() or text[1] == ".")))


def key_values(pairs: list[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in pairs)
