"""The compiled transformer programs, kept: in this process (a small LRU) and on disk, so a
second run of the same model shape on the same system builds nothing (a build loads no SymPy
either: `planner.expr.graph`).

A program is keyed by everything it is built from: the model spec, the hardware rates, the
choices, the outputs asked for, planner's version and a digest of the source of the modules
that write the expressions (so an edited cost model never reads an old program). Entries live
under the user cache directory (`$XDG_CACHE_HOME/planner/programs`, else
`~/.cache/planner/programs`; `PLANNER_CACHE_DIR` overrides it, `PLANNER_CACHE_DIR=off` turns the
disk cache off), one JSON file per key written to a temporary file and renamed into place, so
two processes writing the same entry at once each leave a whole file. An entry that does not
read back as a program (truncated, edited, another format) is rebuilt and overwritten, never
trusted.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

from planner.compiled import Compiled
from planner.expr.choices import OUTPUTS, Choices

# the modules whose source writes the expressions a program computes
_SOURCES = ("expr/transformer.py", "expr/layer.py", "expr/domain.py", "expr/choices.py",
            "expr/collectives.py", "expr/graph.py", "expr/vocab.py",
            "expr/roofline.py", "expr/symbols.py", "expr/rewrite.py", "expr/unordered.py",
            "expr/memory.py", "numeric.py", "compiled.py", "switches.py",
            "spec/hardware.py", "spec/transformer.py")


@functools.cache
def _code_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    try:
        h.update(metadata.version("planner").encode())
    except metadata.PackageNotFoundError:
        h.update(b"unversioned")
    for rel in _SOURCES:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()


def cache_dir() -> Path | None:
    """Where programs are kept on disk (None: not kept)."""
    chosen = os.environ.get("PLANNER_CACHE_DIR")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "planner" / "programs"


def key(model, hw, choices: tuple[Choices, ...], outputs: tuple[str, ...]) -> str:
    """The entry's name: a digest of the inputs (frozen dataclasses, whose reprs list every
    field) and of the code."""
    text = repr((model, hw, choices, outputs))
    return hashlib.sha256(f"{_code_digest()}\n{text}".encode()).hexdigest()


def _load(path: Path) -> Compiled | None:
    try:
        with open(path, encoding="utf-8") as f:
            return Compiled.from_data(json.load(f))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError):  # unreadable or not a program: rebuild
        return None


def _store(path: Path, prog: Compiled) -> None:
    """Write the entry whole or not at all (a temporary file renamed into place); a cache
    that cannot be written is skipped, never an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(prog.to_data(), f, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return


@functools.lru_cache(maxsize=128)
def program(model, hw, choices: tuple[Choices, ...], outputs: tuple[str, ...] = OUTPUTS
            ) -> Compiled:
    """The program computing `outputs` of every choice in `choices` ("j/output" for choice
    j), from this process's LRU, the disk cache, or built (`planner.expr.transformer.
    build_program`) and kept."""
    folder = cache_dir()
    path = folder / f"{key(model, hw, choices, outputs)}.json" if folder else None
    if path is not None and (prog := _load(path)) is not None:
        return prog
    from planner.expr.transformer import build_program  # the expressions: only when building

    prog = build_program(model, hw, choices, outputs)
    if path is not None:
        _store(path, prog)
    return prog
