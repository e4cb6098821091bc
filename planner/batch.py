"""`planner batch`: many solves from a scenario file, and the parallel map `sweep` shares.

A scenario is a mapping whose keys are `planner solve`'s options, underscored
(`{model: llama3-8b, hardware: dgx-h100, global_batch: 512, devices_max: 64}`); each one runs
as `planner solve ... --format json` would and gives that command's JSON document (or its
JSON error document) as one line. Values are type-checked against the option they name and
handed to the same click parser as the command line (`--key=value`): never to eval, exec or
sympify.

`parallel_map` runs a picklable function over a list: in this process (jobs = 1), in a pool
of local processes (jobs > 1; 0 = every core), or on a Dask cluster (`scheduler`, the
optional `dask` extra). Results come back in input order whatever order they finish in.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import SpecError
from planner.spec.numbers import loads_json, short

MAX_SCENARIO_BYTES = 64 * 2**20
MAX_SCENARIOS = 100_000
# Keys of a solve document that measure this run's wall clock, not the plan: they differ
# between two runs of the same scenario (what "identical results" leaves out).
WALL_CLOCK_KEYS = ("solve_time_s", "build_time_s")


# --- the parallel map ---------------------------------------------------------------------------


def cores() -> int:
    """The cores this process may run on (what `--jobs 0` uses)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def parallel_map(fn: Callable, items: Sequence, *, jobs: int = 1, scheduler: str | None = None,
                 on_done: Callable[[], None] | None = None) -> list:
    """[fn(x) for x in items], in input order. `fn` and the items must pickle (a module-level
    function) unless it runs here. jobs = 1 without a scheduler runs here, one after the other;
    jobs > 1 (0: every core) in that many local processes; `scheduler` ('tcp://host:port') on
    that Dask cluster. `on_done` is called once per finished item. An exception raised by `fn`
    is raised here: the one of the earliest item, after every item has finished."""
    items = list(items)
    if jobs < 0:
        raise SpecError(f"jobs: must be 0 (every core) or a positive number, got {jobs}")
    if scheduler is not None:
        return _on_dask(fn, items, scheduler, on_done)
    workers = min(cores() if jobs == 0 else jobs, len(items))
    if workers <= 1:
        out = []
        for x in items:
            out.append(fn(x))
            if on_done is not None:
                on_done()
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fn, x): k for k, x in enumerate(items)}
        for _ in as_completed(futures):
            if on_done is not None:
                on_done()
        return _in_order([(futures[f], f) for f in futures], lambda f: f.result())


def _in_order(indexed: list, result: Callable) -> list:
    """The results by input index; the earliest item's exception, if any, raised."""
    out = [None] * len(indexed)
    failed = None
    for k, future in indexed:
        try:
            out[k] = result(future)
        except Exception as exc:
            if failed is None or k < failed[0]:
                failed = (k, exc)
    if failed is not None:
        raise failed[1]
    return out


def _on_dask(fn: Callable, items: list, scheduler: str, on_done) -> list:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise SpecError("scheduler: --scheduler needs Dask; pip install 'planner[dask]'") from None
    if not scheduler.startswith(("tcp://", "tls://", "inproc://", "ucx://")):
        raise SpecError(f"scheduler: expected an address like tcp://HOST:PORT, got "
                        f"{short(scheduler)}")
    try:
        client = Client(scheduler, timeout="10s", set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise SpecError(f"scheduler: cannot connect to {short(scheduler)} ({exc})") from None
    with client:
        if not items:
            return []
        futures = client.map(fn, items, pure=False)
        for _ in as_completed(futures, loop=client.loop):
            if on_done is not None:
                on_done()
        return _in_order(list(enumerate(futures)), lambda f: f.result())


# --- scenarios ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One checked scenario: its 1-based index, where it is, and `planner solve`'s argv."""

    index: int
    where: str  # 'FILE: scenario K' (JSONL: '... (line L)')
    argv: tuple[str, ...]


def read_scenarios(path: str) -> list[tuple[str, Any]]:
    """The raw scenarios of a file, each with where it is: a YAML list (or a mapping with a
    `scenarios` list) for .yaml / .yml, a JSON list for .json, one JSON object per line for
    anything else (.jsonl); '-' reads JSON lines from stdin."""
    import sys

    from planner.catalog import read_file
    from planner.catalog import shown as shown_path

    shown = "-" if path == "-" else shown_path(path)
    if path == "-":
        text = sys.stdin.read(MAX_SCENARIO_BYTES + 1)
        if len(text) > MAX_SCENARIO_BYTES:
            raise SpecError(f"-: more than {MAX_SCENARIO_BYTES} characters on stdin")
    else:
        raw = read_file(path, MAX_SCENARIO_BYTES, "scenario file")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError(f"{shown}: not UTF-8 (byte {exc.start})") from None
    suffix = "" if path == "-" else Path(path).suffix.lower()
    if suffix in (".yaml", ".yml", ".json"):
        data = _load_document(text, shown, yaml_text=suffix != ".json")
        if isinstance(data, dict) and set(data) == {"scenarios"}:
            data = data["scenarios"]
        if not isinstance(data, list):
            raise SpecError(f"{shown}: expected a list of scenarios (or a mapping with the one "
                            f"key 'scenarios'), got {short(data)}")
        found = [(f"{shown}: scenario {k}", s) for k, s in enumerate(data, 1)]
    else:
        found = []
        for line_no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{shown}: scenario {len(found) + 1} (line {line_no})"
            try:
                found.append((where, loads_json(line)))
            except json.JSONDecodeError as exc:
                raise SpecError(f"{where}: not JSON ({exc.msg})") from None
            except SpecError as exc:
                raise SpecError(f"{where}: {exc}") from None
            except RecursionError:
                raise SpecError(f"{where}: JSON nested too deeply") from None
    if len(found) > MAX_SCENARIOS:
        raise SpecError(f"{shown}: {len(found)} scenarios, more than the {MAX_SCENARIOS} allowed")
    return found


def _load_document(text: str, shown: str, yaml_text: bool) -> Any:
    if not yaml_text:
        try:
            return loads_json(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{shown}: not JSON ({exc.msg} at line {exc.lineno})") from None
        except SpecError as exc:
            raise SpecError(f"{shown}: {exc}") from None
        except RecursionError:
            raise SpecError(f"{shown}: JSON nested too deeply") from None
    from planner.catalog import parse_yaml

    return parse_yaml(text, shown)


def solve_keys(command) -> dict[str, Any]:
    """Scenario key -> click option of the `solve` command: each long flag underscored
    ('devices_max', 'deadline', 'time_limit'), and the parameter's own name where it differs
    ('deadline_s', 'time_limit_s'). --format (always json here) and --plot are not keys."""
    keys = {}
    for param in command.params:
        if param.name in ("fmt", "plot_path") or not getattr(param, "opts", None):
            continue
        keys[param.name] = param
        for opt in param.opts:
            if opt.startswith("--"):
                keys[opt[2:].replace("-", "_")] = param
    return keys


def check_scenario(where: str, raw: Any, command) -> tuple[str, ...]:
    """`planner solve`'s argv for a raw scenario, or a SpecError naming where and the key. An
    integer option takes a JSON / YAML integer, a float option a number, a choice or text a
    string, a switch true or false; null means not given. Each value is checked by the
    option's own type and range, then passed as '--flag=value' text."""
    import click

    if not isinstance(raw, dict):
        raise SpecError(f"{where}: expected a mapping of solve options, got {short(raw)}")
    keys = solve_keys(command)
    argv, seen = ["solve"], {}
    for key, value in raw.items():
        if not isinstance(key, str) or key not in keys:
            hint = difflib.get_close_matches(str(key).replace("-", "_"), list(keys), n=1)
            near = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise SpecError(f"{where}: unknown key {short(key, 60)}{near}")
        param = keys[key]
        if param.name in seen:
            raise SpecError(f"{where}: key '{key}' repeats '{seen[param.name]}'")
        seen[param.name] = key
        if value is None:
            continue
        argv.extend(_option_text(where, key, value, param, click))
    for key in ("model", "hardware"):
        if key not in seen or raw.get(seen[key]) is None:
            raise SpecError(f"{where}: key '{key}' is required")
    return (*argv, "--format", "json")


def check_option_value(where: str, key: str, value: Any, param, click) -> None:
    """A value from a file for the click option `param`, held to the option's type and range
    as its flag would be: a switch takes true or false, an integer option a JSON integer, a
    float option a number, any other a string (shared by `planner batch` and `--batch`)."""
    kind = param.type
    if getattr(param, "is_flag", False) or isinstance(kind, click.types.BoolParamType):
        if not isinstance(value, bool):
            raise SpecError(f"{where}: key '{key}' must be true or false, got {short(value)}")
        return
    if isinstance(kind, click.types.IntParamType):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(kind, click.types.FloatParamType):
        ok, want = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    else:
        ok, want = isinstance(value, str), "a string"
    if not ok:
        raise SpecError(f"{where}: key '{key}' must be {want}, got {short(value)}")
    try:
        kind.convert(value, param, None)
    except click.BadParameter as exc:
        raise SpecError(f"{where}: key '{key}': {exc.message}") from None


def _option_text(where: str, key: str, value: Any, param, click) -> list[str]:
    check_option_value(where, key, value, param, click)
    flag = next(o for o in param.opts if o.startswith("--"))
    if getattr(param, "is_flag", False) or isinstance(param.type, click.types.BoolParamType):
        if value:
            return [flag]
        return [param.secondary_opts[0]] if param.secondary_opts else []
    text = repr(float(value)) if isinstance(value, float) else str(value)
    return [f"{flag}={text}"]  # '--k=v': a value starting with '-' is still a value


def scenarios(path: str, command) -> list[Scenario]:
    """Every scenario of the file, checked before any runs."""
    return [Scenario(k, where, check_scenario(where, raw, command))
            for k, (where, raw) in enumerate(read_scenarios(path), 1)]


# --- one scenario -------------------------------------------------------------------------------

_CAPTURE = threading.Lock()  # sys.stdout is one per process: one scenario at a time per process


def run_scenario(argv: Sequence[str]) -> tuple[int, dict, list[str]]:
    """Run `planner <argv>` (a solve with --format json) here: its exit code, the JSON document
    it printed and its stderr lines."""
    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _CAPTURE, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    text = out.getvalue()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:  # a bug: solve --format json always prints one document
        doc = {"schema_version": 1, "command": "solve", "error": {
            "kind": "internal", "message": f"no JSON document on stdout: {short(text, 200)}",
            "constraints": [], "file": None, "key": None, "value": None}}
        code = max(code, 3)
    return code, doc, err.getvalue().splitlines()


def without_wall_clock(doc: Any) -> Any:
    """`doc` without the keys that time this run (`WALL_CLOCK_KEYS`, at any depth)."""
    if isinstance(doc, dict):
        return {k: without_wall_clock(v) for k, v in doc.items() if k not in WALL_CLOCK_KEYS}
    if isinstance(doc, list):
        return [without_wall_clock(v) for v in doc]
    return doc
