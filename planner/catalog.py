"""Where specs come from: built-in names under `planner/models` and `planner/hardware`, or paths.

Every spec a command asks for goes through `load_model` / `load_system`, so built-in names and
file paths are interchangeable everywhere. Files are read by `read_file`: regular files only
(devices, FIFOs and directories are refused before anything is read), size checked before
reading. YAML is read with a safe loader, bounded in size, alias count, depth and number length;
anything odd becomes a one-line `SpecError`.
"""

from __future__ import annotations

import copy
import errno
import functools
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from planner.errors import SpecError
from planner.spec.base import MAX_ERRORS, MAX_NUMBER_CHARS, did_you_mean, short, validate
from planner.spec.cluster import Cluster, ClusterSpec, Pool
from planner.spec.hardware import Device, Link, System, SystemSpec

DATA = Path(__file__).parent
MODELS = DATA / "models"
HARDWARE = DATA / "hardware"
HARDWARE_KINDS = ("systems", "devices", "links", "clusters")

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


def _bounded_number(construct):
    """A number constructor that refuses scalars longer than MAX_NUMBER_CHARS (Python will not
    convert an integer of more than 4,300 digits, and no spec value needs more than a few)."""

    def build(loader, node):
        if len(node.value) > MAX_NUMBER_CHARS:
            raise SpecError(f"line {node.start_mark.line + 1}: a number of {len(node.value)} "
                            f"characters (at most {MAX_NUMBER_CHARS})")
        return construct(loader, node)

    return build


_BoundedLoader.add_constructor("tag:yaml.org,2002:int",
                               _bounded_number(yaml.SafeLoader.construct_yaml_int))
_BoundedLoader.add_constructor("tag:yaml.org,2002:float",
                               _bounded_number(yaml.SafeLoader.construct_yaml_float))

# OS errors that mean "this path names nothing readable": reported as "no such file".
_NO_SUCH_FILE = {errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL}


def shown(path: Any) -> str:
    """A path as error messages show it: bounded (a name may be thousands of bytes)."""
    text = str(path)
    return text if len(text) <= 120 else text[:100] + "..." + text[-17:]


def path_exists(path: Any) -> bool:
    """Path.exists that never raises: a name too long, a loop or a NUL byte is just absent."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def read_file(path: Any, limit: int = MAX_BYTES, what: str = "file") -> bytes:
    """The bytes of a regular file of at most `limit` bytes. Special files (devices, FIFOs,
    sockets) and directories are refused before anything is read, the size is checked before
    reading, and no OS error escapes: each becomes a one-line SpecError."""
    where = shown(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except ValueError:  # a NUL byte in the name
        raise SpecError(f"{where}: no such file") from None
    except OSError as exc:
        if exc.errno in _NO_SUCH_FILE:
            raise SpecError(f"{where}: no such file") from None
        if exc.errno == errno.EISDIR:
            raise SpecError(f"{where}: is a directory, expected a {what}") from None
        raise SpecError(f"{where}: cannot read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SpecError(f"{where}: is a directory, expected a {what}")
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(f"{where}: not a regular file, expected a {what}")
        if info.st_size > limit:
            raise SpecError(f"{where}: {info.st_size} bytes, larger than the {limit}-byte limit")
        chunks, size = [], 0
        while size <= limit:  # a file growing while read is still cut at the limit
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise SpecError(f"{where}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise SpecError(f"{where}: larger than the {limit}-byte limit")
    return b"".join(chunks)


def parse_yaml(text: str, where: str):
    """YAML text as data, with the spec files' safe, bounded loader; every failure one line
    naming `where` (also `planner batch`'s scenario files)."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{where}: malformed YAML{at}: {problem}") from None
    except RecursionError:
        raise SpecError(f"{where}: YAML nested too deeply") from None


@functools.lru_cache(maxsize=512)
def _parsed(text: str, where: str):
    """`parse_yaml`, once per text: a search reads the same model and hardware files on every
    call (a sweep or a batch calls it hundreds of times)."""
    return parse_yaml(text, where)


def read_yaml(path: Path) -> Any:
    where = shown(path)
    raw = read_file(path, MAX_BYTES, "YAML file")
    if b"\0" in raw:
        raise SpecError(f"{where}: binary file, expected YAML text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{where}: not UTF-8 (byte {exc.start})") from None
    data = copy.deepcopy(_parsed(text, where))  # callers may change what they get
    if data is None:
        raise SpecError(f"{where}: empty document")
    if not isinstance(data, dict):
        raise SpecError(f"{where}: document must be a mapping, got {short(data)}")
    return data


def _is_path(ref: str, base: Path | None = None) -> bool:
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        return True
    return path_exists(base / ref) if base is not None else path_exists(ref)


def _builtin_names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _at(ref: str, base: Path | None) -> Path:
    """A path named inside a YAML file is relative to that file's folder (`base`)."""
    path = Path(ref)
    return path if base is None or path.is_absolute() else base / path


def _resolve(ref: str, folders: list[Path], what: str,
             base: Path | None = None) -> tuple[dict, str, Path | None]:
    """Return (data, where, the file's path or None for a built-in) for a built-in name or a
    path; `base` is the folder of the YAML file that names `ref` (None: the current folder)."""
    if not isinstance(ref, str) or not ref:
        raise SpecError(f"{what}: expected a name or a path, got {short(ref)}")
    if _is_path(ref, base):
        path = _at(ref, base)
        return read_yaml(path), shown(path), path
    for folder in folders:
        candidate = folder / f"{ref}.yaml"
        if path_exists(candidate):
            return read_yaml(candidate), f"{what} '{ref}'", None
    names = [n for f in folders for n in _builtin_names(f)]
    if what == "hardware":
        _not_a_system(ref)
    raise SpecError(f"unknown {what} {short(ref)}{did_you_mean(ref, names)} "
                    f"(built-in: {', '.join(names)})")


def systems_using(kind: str, name: str) -> list[str]:
    """Built-in systems whose `kind` (device, or a link key) is the built-in `name`."""
    out = []
    for path in sorted((HARDWARE / "systems").glob("*.yaml")):
        data = read_yaml(path)
        if kind == "device":
            refs = [data.get("device")]
        else:
            inter, host = data.get("inter_node"), data.get("host_offload")
            refs = [data.get("intra_node"), data.get("scale_up"),
                    inter.get("link") if isinstance(inter, dict) else None,
                    host.get("link") if isinstance(host, dict) else None]
        if name in refs:
            out.append(path.stem)
    return out


def _not_a_system(ref: str) -> None:
    """A device or link name given where a system is expected: say what it is and which
    built-in systems use it."""
    for kind in ("device", "link"):
        if path_exists(HARDWARE / f"{kind}s" / f"{ref}.yaml"):
            users = systems_using(kind, ref)
            raise SpecError(
                f"hardware: '{ref}' is a {kind}, not a system; --hardware takes a system"
                + (f" (built-in systems with this {kind}: {', '.join(users)})" if users else
                   f" (no built-in system uses it; write a system YAML naming "
                   f"{kind}: {ref})"))


def _expect_kind(data: dict, where: str, kinds: tuple[str, ...]) -> str:
    if "kind" not in data:
        raise SpecError(f"{where}: missing key 'kind' (expected kind: {' or '.join(kinds)})")
    kind = data.get("kind")
    if kind not in kinds:
        raise SpecError(f"{where}: key 'kind': expected {' or '.join(kinds)}, got {short(kind)}"
                        + did_you_mean(str(kind), list(kinds)))
    return kind


def _without_envelope(data: dict, where: str) -> dict:
    """A spec as `planner show hardware --format yaml|json` prints it, without the document's
    envelope (`schema_version: 1`, `command: show`), so what `show` prints loads back."""
    if not isinstance(data, dict) or ("schema_version" not in data and "command" not in data):
        return data
    if data.get("command", "show") != "show":
        raise SpecError(f"{where}: key 'command': a spec document is `planner show`'s output "
                        f"(command: show), got {short(data.get('command'))}")
    if data.get("schema_version", 1) != 1:
        raise SpecError(f"{where}: key 'schema_version': expected 1, got "
                        f"{short(data.get('schema_version'))}")
    return {k: v for k, v in data.items() if k not in ("schema_version", "command")}


INLINE = "<inline>"  # the name a part written inline takes while its system is validated


def _inline_parts(data: dict, where: str) -> tuple[dict, dict]:
    """(the system's data with every part written inline replaced by a name, {key: that
    part's mapping}): a system may name its device and links or write them out, as `show`
    prints them (`inter_node` a link with `nics_per_node` beside it, or {link, count})."""
    data, inline = dict(data), {}
    for key in ("device", "intra_node", "scale_up"):
        if isinstance(data.get(key), dict):
            inline[key], data[key] = data[key], INLINE
    nics = data.pop("nics_per_node", None)
    inter = data.get("inter_node")
    if isinstance(inter, dict) and "link" not in inter and "count" not in inter:
        # the link itself, as `show` prints it; the NIC count is `nics_per_node`
        if nics is None:
            raise SpecError(f"{where}: missing key 'nics_per_node' (the NICs per node, with "
                            "inter_node written out as a link)")
        inline["inter_node.link"], data["inter_node"] = inter, {"link": INLINE, "count": nics}
    elif isinstance(inter, dict):
        inter = dict(inter)
        if isinstance(inter.get("link"), dict):
            inline["inter_node.link"], inter["link"] = inter["link"], INLINE
        if nics is not None:
            if "count" not in inter:
                inter["count"] = nics
            elif inter["count"] != nics:
                raise SpecError(f"{where}: key 'nics_per_node': {short(nics)} differs from "
                                f"inter_node.count {short(inter['count'])}")
        data["inter_node"] = inter
    elif nics is not None:
        data["nics_per_node"] = nics  # no inter_node: validation says what is missing
    host = data.get("host_offload")
    if isinstance(host, dict) and isinstance(host.get("link"), dict):
        host = dict(host)
        inline["host_offload.link"], host["link"] = host["link"], INLINE
        data["host_offload"] = host
    return data, inline


def load_model(ref: str):
    """A CNN, a transformer or a recommendation model from a built-in name, a YAML path, or a
    Hugging Face config.json (the file or a folder holding one)."""
    if isinstance(ref, str) and ref:
        from planner.spec.huggingface import config_path, load_config

        hf = config_path(ref)
        if hf is not None:
            return load_config(hf)
    data, where, _ = _resolve(ref, [MODELS], "model")
    kind = _expect_kind(data, where, ("cnn", "transformer", "recommendation"))
    if kind == "recommendation":
        from planner.spec.recommendation import build_recommendation

        return build_recommendation(data, where)
    if kind == "transformer":
        from planner.spec.transformer import build_transformer

        return build_transformer(data, where)
    from planner.spec.cnn import build_cnn

    return build_cnn(data, where)


def load_device(ref: str, base: Path | None = None) -> Device:
    """A device from a built-in name or a path (relative to `base`, the folder of the system
    YAML naming it, when given)."""
    data, where, _ = _resolve(ref, [HARDWARE / "devices"], "device", base)
    data = _without_envelope(data, where)
    _expect_kind(data, where, ("device",))
    return validate(Device, data, where)


def load_link(ref: str, base: Path | None = None) -> Link:
    """A link from a built-in name or a path (relative to `base` when given)."""
    data, where, _ = _resolve(ref, [HARDWARE / "links"], "link", base)
    data = _without_envelope(data, where)
    _expect_kind(data, where, ("link",))
    return validate(Link, data, where)


HARDWARE_FOLDERS = [HARDWARE / "systems", HARDWARE / "clusters"]


def load_target(ref: str) -> System | Cluster:
    """What `--hardware` names: a system, or a cluster of pools (`planner.spec.cluster`)."""
    data, where, path = _resolve(ref, HARDWARE_FOLDERS, "hardware")
    data = _without_envelope(data, where)  # `planner show hardware --format yaml` output
    if isinstance(data, dict) and data.get("kind") == "cluster":
        return _cluster(data, where, path)
    if isinstance(data, dict) and data.get("kind") not in (None, "system"):
        _expect_kind(data, where, ("system", "cluster"))
    return load_system(ref)


def _cluster(data: dict, where: str, path: Path | None) -> Cluster:
    base = path.parent if path is not None else None
    try:
        spec = validate(ClusterSpec, data, where)
    except SpecError as exc:  # the names too, so one run names every mistake
        names = _name_errors(data, where, base)
        raise SpecError("\n".join([str(exc), *names][:MAX_ERRORS])) from None
    # every pool's system and the link between them are resolved before any error is raised,
    # so a file with several wrong names names them all in one run
    pools, errors = [], []
    for i, p in enumerate(spec.pools):
        try:
            system = _pool_system(p.system, base)
        except SpecError as exc:
            errors.append(f"{where}: key 'pools.{i}.system': {exc}")
            continue
        nodes = int(p.nodes * p.availability)
        if nodes < 1:
            errors.append(f"{where}: key 'pools.{i}.availability': {p.availability:g} of "
                          f"{p.nodes} nodes leaves none")
            continue
        price = p.price_per_device_hour_usd or system.device.price_per_hour_usd
        pools.append(Pool(p.name or system.name, system, nodes, price, p.partition))
    between = None
    if spec.between_pools is not None:
        try:
            between = load_link(spec.between_pools.link, base)
        except SpecError as exc:
            errors.append(f"{where}: key 'between_pools.link': {exc}")
    if errors:
        raise SpecError("\n".join(errors[:MAX_ERRORS]))
    return Cluster(spec.name, spec.description, tuple(pools), between,
                   spec.between_pools.count if spec.between_pools else 0,
                   sources=dict(spec.sources))


def _pool_system(name: str, base: Path | None) -> System:
    """A pool's system, by name or path (relative to the cluster file's folder)."""
    if _is_path(name, base):
        ref = str(_at(name, base))
        cluster = _kind_of(ref) == "cluster"
    else:  # a built-in (an unknown name: the systems' names suggested, not the clusters')
        ref = name
        cluster = path_exists(HARDWARE / "clusters" / f"{name}.yaml")
        if not cluster and not path_exists(HARDWARE / "systems" / f"{name}.yaml"):
            _resolve(name, [HARDWARE / "systems"], "hardware")  # raises
    if cluster:
        raise SpecError(f"{short(name)} is a cluster; a pool is one system (list that "
                        "cluster's pools here instead)")
    return load_system(ref)


def _name_errors(data, where: str, base: Path | None) -> list[str]:
    """The unknown systems and link a cluster file names, read from the file as written
    (beside its other mistakes, which validation reports)."""
    if not isinstance(data, dict):
        return []
    pools, between = data.get("pools"), data.get("between_pools")
    named = [(f"pools.{i}.system", p.get("system"), _pool_system)
             for i, p in enumerate(pools if isinstance(pools, list) else [])
             if isinstance(p, dict)]
    if isinstance(between, dict):
        named.append(("between_pools.link", between.get("link"), load_link))
    out = []
    for key, name, load in named:
        if isinstance(name, str) and name:
            try:
                load(name, base)
            except SpecError as exc:
                out.append(f"{where}: key '{key}': {exc}")
    return out


def _kind_of(ref: str) -> str | None:
    """The `kind` a hardware name or file declares (None where it cannot be read: the
    loader's own error says why)."""
    try:
        data, where, _ = _resolve(ref, HARDWARE_FOLDERS, "hardware")
    except SpecError:
        return None
    data = _without_envelope(data, where)
    return data.get("kind") if isinstance(data, dict) else None


def load_system(ref: str) -> System:
    """A system from a built-in name or a path; its device and links may be names or paths,
    a path relative to the system file's folder. A cluster of one pool is that pool's system
    (its node count bounds a search: `pool_nodes`); one of several pools is refused here:
    only `solve` plans over several kinds of node."""
    data, where, path = _resolve(ref, HARDWARE_FOLDERS, "hardware")
    data = _without_envelope(data, where)
    if isinstance(data, dict) and data.get("kind") == "cluster":
        return one_system(_cluster(data, where, path))
    _expect_kind(data, where, ("system",))
    data, inline = _inline_parts(data, where)
    base = path.parent if path is not None else None

    def written(key: str):
        """A part written inline, validated; its errors name this system's file and key."""
        cls = Device if key == "device" else Link
        _expect_kind(inline[key], f"{where}: key '{key}'", (cls.__name__.lower(),))
        return validate(cls, inline[key], where, prefix=key)

    # the system's own keys and every part written inline are checked together, so a file
    # with mistakes in several places names them all in one run
    errors, parts = [], {}
    for check, key in ((lambda: validate(SystemSpec, data, where), None),
                       *((lambda k=k: written(k), k) for k in inline)):
        try:
            value = check()
        except SpecError as exc:
            errors += str(exc).splitlines()
            continue
        if key is None:
            spec = value
        else:
            parts[key] = value
    if errors:
        shown = errors if len(errors) <= MAX_ERRORS else [
            *errors[:MAX_ERRORS - 1], f"{where}: ... and {len(errors) - MAX_ERRORS + 1} more "
                                      "errors"]
        raise SpecError("\n".join(shown))

    def part(key: str, loader, name: str):
        """A referenced spec resolved, or the one written inline; its errors name this
        system's file and key too."""
        if key in parts:
            return parts[key]
        try:
            return loader(name, base)
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
        devices_per_scale_up_domain=spec.devices_per_scale_up_domain,
        scale_up=part("scale_up", load_link, spec.scale_up) if spec.scale_up else None,
        host_link=(part("host_offload.link", load_link, spec.host_offload.link)
                   if spec.host_offload else None),
        devices_per_host_link=spec.host_offload.devices_per_link if spec.host_offload else 1,
    )


@functools.cache
def list_models() -> list[str]:
    return _builtin_names(MODELS)


def list_hardware() -> dict[str, list[str]]:
    return {kind: _builtin_names(HARDWARE / kind) for kind in HARDWARE_KINDS}


def pool_nodes(ref: str) -> int | None:
    """The nodes of a one-pool cluster `ref` names (None for a system): a search's node
    budget there."""
    return one_pool_nodes(load_target(ref))


def several_pools(target: System | Cluster) -> bool:
    """Whether `target` is a cluster of several pools (only `solve` and `limits` plan over
    it)."""
    return isinstance(target, Cluster) and len(target.pools) > 1


def one_pool_nodes(target: System | Cluster) -> int | None:
    """The nodes of a one-pool cluster (None for a system or several pools)."""
    if isinstance(target, Cluster) and len(target.pools) == 1:
        return target.pools[0].nodes
    return None


def one_system(target: System | Cluster) -> System:
    """The system of `target`: itself, or a one-pool cluster's; several pools refused."""
    if not isinstance(target, Cluster):
        return target
    if several_pools(target):
        raise SpecError(f"hardware: '{target.name}' is a cluster of {len(target.pools)} pools; "
                        f"only `planner solve` plans over several kinds of node (give one "
                        f"pool's system here, e.g. -H {target.pools[0].system.name})")
    return target.pools[0].system


def load_hardware_any(ref: str) -> Device | Link | System | Cluster:
    """For `show hardware`: a system, device, link or cluster, whichever the name or file
    is."""
    if _is_path(ref):
        data, where, _ = _resolve(ref, [], "hardware")
        kind = _expect_kind(data, where, ("system", "device", "link", "cluster"))
        return {"system": load_system, "device": load_device, "link": load_link,
                "cluster": load_target}[kind](ref)
    for kind, loader in (("systems", load_system), ("devices", load_device),
                         ("links", load_link), ("clusters", load_target)):
        if path_exists(HARDWARE / kind / f"{ref}.yaml"):
            return loader(ref)
    names = [n for kind_names in list_hardware().values() for n in kind_names]
    raise SpecError(f"unknown hardware {short(ref)}{did_you_mean(ref, names)} (built-in "
                    f"systems: {', '.join(list_hardware()['systems'])}; devices and links: "
                    "planner list hardware)")
