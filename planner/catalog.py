"""Where specs come from: built-in names under `planner/models` and `planner/hardware`, or paths.

Every spec a command asks for goes through `load_model` / `load_system`, so built-in names and
file paths are interchangeable everywhere. YAML is read with a safe loader, bounded in size,
alias count and depth; anything odd becomes a one-line `SpecError`.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

from planner.errors import SpecError
from planner.spec.base import short, validate
from planner.spec.hardware import Device, Link, System, SystemSpec

DATA = Path(__file__).parent
MODELS = DATA / "models"
HARDWARE = DATA / "hardware"
HARDWARE_KINDS = ("systems", "devices", "links")

MAX_BYTES = 4 * 2**20
MAX_ALIASES = 100


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses alias bombs (a few anchors expanded exponentially)."""

    aliases = 0

    def compose_node(self, parent, index):  # noqa: D401 - PyYAML hook
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise SpecError(f"more than {MAX_ALIASES} YAML aliases")
        return super().compose_node(parent, index)


# YAML 1.1 (PyYAML) reads `1e-9` as a string; people write floats that way, so resolve it as
# YAML 1.2 does (digits, optional fraction, exponent).
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_yaml(path: Path) -> Any:
    where = str(path)
    if path.is_dir():
        raise SpecError(f"{where}: is a directory, expected a YAML file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{where}: cannot read ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise SpecError(f"{where}: {len(raw)} bytes, larger than the {MAX_BYTES}-byte limit")
    if b"\0" in raw:
        raise SpecError(f"{where}: binary file, expected YAML text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{where}: not UTF-8 (byte {exc.start})") from None
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{where}: malformed YAML{at}: {problem}") from None
    except RecursionError:
        raise SpecError(f"{where}: YAML nested too deeply") from None
    if data is None:
        raise SpecError(f"{where}: empty document")
    if not isinstance(data, dict):
        raise SpecError(f"{where}: document must be a mapping, got {short(data)}")
    return data


def _is_path(ref: str) -> bool:
    return "/" in ref or ref.endswith((".yaml", ".yml")) or Path(ref).exists()


def _builtin_names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _resolve(ref: str, folders: list[Path], what: str) -> tuple[dict, str]:
    """Return (data, where) for a built-in name or a path."""
    if not isinstance(ref, str) or not ref:
        raise SpecError(f"{what}: expected a name or a path, got {short(ref)}")
    if _is_path(ref):
        path = Path(ref)
        if not path.exists():
            raise SpecError(f"{ref}: no such file")
        return read_yaml(path), ref
    for folder in folders:
        candidate = folder / f"{ref}.yaml"
        if candidate.exists():
            return read_yaml(candidate), f"{what} '{ref}'"
    known = ", ".join(n for f in folders for n in _builtin_names(f))
    raise SpecError(f"unknown {what} '{ref}' (built-in: {known})")


def _expect_kind(data: dict, where: str, kinds: tuple[str, ...]) -> str:
    kind = data.get("kind")
    if kind not in kinds:
        raise SpecError(f"{where}: key 'kind': expected {' or '.join(kinds)}, got {short(kind)}")
    return kind


def load_model(ref: str):
    """A CNN or a transformer from a built-in name or a YAML path."""
    data, where = _resolve(ref, [MODELS], "model")
    kind = _expect_kind(data, where, ("cnn", "transformer"))
    if kind == "transformer":
        from planner.spec.transformer import build_transformer

        return build_transformer(data, where)
    from planner.spec.cnn import build_cnn

    return build_cnn(data, where)


def load_device(ref: str) -> Device:
    data, where = _resolve(ref, [HARDWARE / "devices"], "device")
    _expect_kind(data, where, ("device",))
    return validate(Device, data, where)


def load_link(ref: str) -> Link:
    data, where = _resolve(ref, [HARDWARE / "links"], "link")
    _expect_kind(data, where, ("link",))
    return validate(Link, data, where)


def load_system(ref: str) -> System:
    """A system from a built-in name or a path; its device and links may be names or paths."""
    data, where = _resolve(ref, [HARDWARE / "systems"], "hardware")
    _expect_kind(data, where, ("system",))
    spec = validate(SystemSpec, data, where)

    def part(key: str, loader, name: str):
        """Resolve a referenced spec; its errors name this system's file and key too."""
        try:
            return loader(name)
        except SpecError as exc:
            raise SpecError(f"{where}: key '{key}': {exc}") from None

    return System(
        name=spec.name,
        description=spec.description,
        device=part("device", load_device, spec.device),
        devices_per_node=spec.devices_per_node,
        intra_node=part("intra_node", load_link, spec.intra_node),
        inter_node=part("inter_node.link", load_link, spec.inter_node.link),
        nics_per_node=spec.inter_node.count,
    )


@functools.cache
def list_models() -> list[str]:
    return _builtin_names(MODELS)


def list_hardware() -> dict[str, list[str]]:
    return {kind: _builtin_names(HARDWARE / kind) for kind in HARDWARE_KINDS}


def load_hardware_any(ref: str) -> Device | Link | System:
    """For `show hardware`: a system, device or link, whichever the name or file is."""
    if _is_path(ref):
        data, where = _resolve(ref, [], "hardware")
        kind = _expect_kind(data, where, ("system", "device", "link"))
        return {"system": load_system, "device": load_device, "link": load_link}[kind](ref)
    for kind, loader in (("systems", load_system), ("devices", load_device),
                         ("links", load_link)):
        if (HARDWARE / kind / f"{ref}.yaml").exists():
            return loader(ref)
    known = ", ".join(n for names in list_hardware().values() for n in names)
    raise SpecError(f"unknown hardware '{ref}' (built-in: {known})")
