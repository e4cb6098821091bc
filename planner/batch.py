"""`planner batch`: many solves from a scenario file, streamed, resumable (`docs/batch.md`).

A scenario is a mapping whose keys are `planner solve`'s options, underscored
(`{model: llama3-8b, hardware: dgx-h100, global_batch: 512, devices_max: 64}`); each one runs
as `planner solve ... --format json` would and gives that command's JSON document (or its
JSON error document) as one line, with a `scenario` key naming it: its index (from 1), the
input line (JSONL and YAML files) and its options as given. Values are type-checked against
the option they name and handed to the same click parser as the command line
(`--key=value`): never to eval, exec or sympify.

`batch` is the Python API: it runs the scenarios as `planner.parallel.Run` does (here, in local
processes or on a Dask cluster) and yields one `Result` per scenario as each finishes (in input
order by default, holding back only what is not yet in order). A scenario whose worker died
for good, or that a lost cluster left unrun, is an error line of its own kind (`worker_lost`,
`cluster_lost`, exit code 4); `resume` skips the scenarios a partial output already answered.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import SpecError
from planner.parallel import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_STALL_TIMEOUT_S,
    EXIT_CLUSTER,
    ClusterError,
    Progress,
    Run,
    cores,
    parallel_map,
)
from planner.spec.numbers import loads_json, short

__all__ = ["EXIT_CLUSTER", "BatchRun", "ClusterError", "Progress", "Result", "Scenario", "batch",
           "cores", "line_schema", "parallel_map", "read_scenarios", "run_scenario", "scenarios",
           "without_wall_clock"]

MAX_SCENARIO_BYTES = 64 * 2**20
MAX_SCENARIOS = 100_000
# Keys of a solve document that measure this run's wall clock, not the plan: they differ
# between two runs of the same scenario (what "identical results" leaves out).
WALL_CLOCK_KEYS = ("solve_time_s", "build_time_s")
# error kinds of a line and the exit code each stands for; the last two are batch's own: the
# cluster, not the scenario, failed, and `--resume` runs them again
EXIT_OF_KIND = {"infeasible": 1, "bad_input": 2, "internal": 3, "worker_lost": EXIT_CLUSTER,
                "cluster_lost": EXIT_CLUSTER}
UNANSWERED = ("worker_lost", "cluster_lost")


# --- scenarios ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One checked scenario: its 1-based index, where it is, `planner solve`'s argv, the
    line it starts on (None where unknown: a .json list) and its options as given."""

    index: int
    where: str  # 'FILE: scenario K' (JSONL: '... (line L)')
    argv: tuple[str, ...]
    line: int | None = None
    given: Any = None

    def name(self) -> dict:
        """The `scenario` key of its output line."""
        return {"index": self.index, "line": self.line, "input": self.given}


def read_scenarios(path: str) -> list[tuple[str, Any, int | None]]:
    """The raw scenarios of a file, each with where it is and its line: a YAML list (or a
    mapping with a `scenarios` list) for .yaml / .yml, a JSON list for .json, one JSON object
    per line for anything else (.jsonl); '-' reads JSON lines from stdin. A file with no
    scenario (empty, blank, an empty list) is bad input, whatever its format."""
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
        if not text.strip():
            raise SpecError(f"{shown}: no scenarios (the file is empty)")
        data = _load_document(text, shown, yaml_text=suffix != ".json")
        nested = isinstance(data, dict) and set(data) == {"scenarios"}
        if nested:
            data = data["scenarios"]
        if data is None:  # only comments, or a lone 'scenarios:'
            raise SpecError(f"{shown}: no scenarios (the file is empty)")
        if not isinstance(data, list):
            raise SpecError(f"{shown}: expected a list of scenarios (or a mapping with the one "
                            f"key 'scenarios'), got {short(data)}")
        lines = _yaml_lines(text, nested, len(data)) if suffix != ".json" else [None] * len(data)
        found = [(f"{shown}: scenario {k}", s, line)
                 for k, (s, line) in enumerate(zip(data, lines, strict=True), 1)]
    else:
        found = []
        for line_no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{shown}: scenario {len(found) + 1} (line {line_no})"
            try:
                found.append((where, loads_json(line), line_no))
            except json.JSONDecodeError as exc:
                raise SpecError(f"{where}: not JSON ({exc.msg})") from None
            except SpecError as exc:
                raise SpecError(f"{where}: {exc}") from None
            except RecursionError:
                raise SpecError(f"{where}: JSON nested too deeply") from None
    if not found:
        raise SpecError(f"{shown}: no scenarios (the file is empty)")
    if len(found) > MAX_SCENARIOS:
        raise SpecError(f"{shown}: {len(found)} scenarios, more than the {MAX_SCENARIOS} allowed")
    return found


def _yaml_lines(text: str, nested: bool, count: int) -> list[int | None]:
    """The line each item of a YAML list starts on (the text parsed already: this composes
    the same text again for the nodes' marks)."""
    import yaml

    from planner.catalog import _BoundedLoader

    try:
        node = yaml.compose(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
        if nested:
            node = node.value[0][1]
        lines = [item.start_mark.line + 1 for item in node.value]
    except Exception:  # the data came from the same text: this is only for the line numbers
        return [None] * count
    return lines if len(lines) == count else [None] * count


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


def scenarios(path: str, command=None) -> list[Scenario]:
    """Every scenario of the file, checked before any runs (`command`: the click `solve`)."""
    if command is None:
        from planner.cli.solve_cmd import solve as command
    return [Scenario(k, where, check_scenario(where, raw, command), line, _as_json(raw))
            for k, (where, raw, line) in enumerate(read_scenarios(path), 1)]


def from_mappings(items: Sequence[Mapping], command=None) -> list[Scenario]:
    """Scenarios given as Python mappings (`batch`'s list input), checked as a file's are."""
    if command is None:
        from planner.cli.solve_cmd import solve as command
    return [Scenario(k, f"scenario {k}", check_scenario(f"scenario {k}", dict(raw)
                                                         if isinstance(raw, Mapping) else raw,
                                                         command), None,
                     _as_json(dict(raw) if isinstance(raw, Mapping) else raw))
            for k, raw in enumerate(items, 1)]


def _as_json(raw: Any) -> Any:
    """The options as JSON gives them back (what a line's `input` is compared with)."""
    return json.loads(json.dumps(raw))




# --- lines --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One scenario's outcome: its exit code (0 ok, 1 infeasible, 2 bad input, 3 internal, 4
    its worker or the cluster was lost), its output line as a document and as text, and the
    stderr lines the solve printed. `resumed`: taken from the `resume` file, not run."""

    scenario: Scenario
    code: int
    doc: dict
    text: str
    stderr: tuple[str, ...] = ()
    resumed: bool = False

    @property
    def kind(self) -> str | None:
        """The error kind (None: a plan)."""
        error = self.doc.get("error")
        return error.get("kind") if isinstance(error, dict) else None


def _named(scenario: Scenario, doc: dict) -> dict:
    """The document with its `scenario` key, after schema_version and command."""
    head = {k: doc[k] for k in ("schema_version", "command") if k in doc}
    return {**head, "scenario": scenario.name(),
            **{k: v for k, v in doc.items() if k not in head}}


def _result(scenario: Scenario, code: int, doc: dict, stderr: Sequence[str] = ()) -> Result:
    from planner.report import render

    doc = _named(scenario, doc)
    return Result(scenario, code, doc, render.to_jsonl(doc), tuple(stderr))


def _error_result(scenario: Scenario, kind: str, message: str) -> Result:
    from planner.report import render

    doc = render.document("solve", {"error": {
        "kind": kind, "message": message, "constraints": [], "file": None, "key": None,
        "value": None}})
    return _result(scenario, EXIT_OF_KIND[kind], doc)


def code_of(doc: dict) -> int:
    """The exit code an output line stands for."""
    error = doc.get("error")
    if not isinstance(error, dict):
        return 0
    return EXIT_OF_KIND.get(error.get("kind"), 3)


def line_schema() -> dict:
    """The JSON Schema of one output line: `planner schema solve`'s document (a plan or an
    error) with the `scenario` key, and batch's own error kinds (`worker_lost`,
    `cluster_lost`)."""
    import copy

    from planner.schema import schemas

    doc = copy.deepcopy(schemas()["solve"])
    scenario = {"type": "object", "additionalProperties": False,
                "required": ["index", "line", "input"],
                "properties": {"index": {"type": "integer", "minimum": 1},
                               "line": {"type": ["integer", "null"], "minimum": 1},
                               "input": {"type": "object"}}}
    for variant in doc["oneOf"]:
        variant["properties"]["scenario"] = scenario
        variant["required"] = [*variant["required"], "scenario"]
        error = variant["properties"].get("error")
        if error is not None:
            kinds = error["properties"]["kind"]["enum"]
            error["properties"]["kind"]["enum"] = [*kinds, *UNANSWERED]
    doc["title"] = "planner batch: one output line"
    return doc


# --- resume -------------------------------------------------------------------------------------


def answered(path: str, todo: Sequence[Scenario]) -> dict[int, Result]:
    """The lines of a partial output that answer a scenario of `todo` (a plan or the
    scenario's own error; not `worker_lost` / `cluster_lost`), by index. A missing file answers
    nothing; a line that is not one of batch's, or answers a scenario with other options than
    `todo`'s, is bad input. A last line cut short (a run killed while writing) is ignored."""
    from planner.catalog import shown as shown_path

    shown = shown_path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(64 * MAX_SCENARIO_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SpecError(f"{shown}: cannot read ({exc.strerror})") from None
    if len(raw) > 64 * MAX_SCENARIO_BYTES:
        raise SpecError(f"{shown}: larger than {64 * MAX_SCENARIO_BYTES} bytes")
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    by_index = {s.index: s for s in todo}
    found: dict[int, Result] = {}
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = line_no == len(lines)  # no newline after it: possibly cut short
        try:
            doc = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            if last:
                continue
            raise SpecError(f"{shown}: line {line_no}: not JSON (resume takes a batch "
                            f"output)") from None
        name = doc.get("scenario") if isinstance(doc, dict) else None
        index = name.get("index") if isinstance(name, dict) else None
        if not isinstance(index, int) or isinstance(index, bool):
            if last:
                continue
            raise SpecError(f"{shown}: line {line_no}: names no scenario (resume takes the "
                            f"output of planner batch)")
        scenario = by_index.get(index)
        if scenario is None:
            raise SpecError(f"{shown}: line {line_no}: scenario {index}, but the input has "
                            f"{len(todo)} scenarios")
        if name.get("input") != scenario.given:
            raise SpecError(f"{shown}: line {line_no}: scenario {index} was run with other "
                            f"options than {scenario.where}'s")
        code = code_of(doc)
        error = doc.get("error")
        if isinstance(error, dict) and error.get("kind") in UNANSWERED:
            continue
        found.setdefault(index, Result(scenario, code, doc, line.strip(), (), True))
    return found


# --- the run ------------------------------------------------------------------------------------


class BatchRun:
    """The scenarios run as `batch` describes; iterate for the `Result`s. After the iteration
    `lost` is None or why the cluster was lost, `exit_code` the worst scenario's code."""

    def __init__(self, todo: Sequence[Scenario], *, jobs: int, scheduler: Any, ordered: bool,
                 done: Mapping[int, Result], stall_timeout_s: float, connect_timeout_s: float,
                 on_progress: Callable[[Progress], None] | None):
        self.scenarios = list(todo)
        self.resumed = dict(done)
        self.ordered = ordered
        self.lost: str | None = None
        self.exit_code = 0
        self.unanswered = 0  # worker_lost and cluster_lost lines
        pending = [s for s in self.scenarios if s.index not in self.resumed]
        self._pending = pending
        self._run = Run(run_scenario, [s.argv for s in pending], jobs=jobs, scheduler=scheduler,
                        stall_timeout_s=stall_timeout_s, connect_timeout_s=connect_timeout_s,
                        on_progress=on_progress)

    def __iter__(self) -> Iterator[Result]:
        # `yield from`: an exception thrown in (an interrupt) reaches the ordering below, which
        # gives up what it holds before the run ends
        try:
            yield from self._in_order(self._results())
        finally:
            self.lost = self._run.lost

    def _counted(self, r: Result) -> Result:
        self.exit_code = max(self.exit_code, r.code)
        self.unanswered += r.kind in UNANSWERED
        return r

    def _results(self) -> Iterator[Result]:
        yield from (self.resumed[k] for k in sorted(self.resumed))
        if not self._pending:
            return
        for done in self._run:
            scenario = self._pending[done.index]
            if done.lost:
                kind = done.lost
                why = ("its worker died and was not replaced in time, or Dask gave up on it"
                       if kind == "worker_lost" else "not run: the cluster was lost")
                yield _error_result(scenario, kind, f"{why} ({done.message})")
            elif done.error is not None:
                yield _error_result(scenario, "internal", f"internal error: "
                                    f"{type(done.error).__name__}: {done.error}")
            else:
                code, doc, err = done.value
                yield _result(scenario, code, doc, err)

    def _in_order(self, results: Iterator[Result]) -> Iterator[Result]:
        if not self.ordered:
            for r in results:
                yield self._counted(r)
            return
        held: dict[int, Result] = {}
        order = [s.index for s in self.scenarios]
        at, closing = 0, False
        try:
            for r in results:
                held[r.scenario.index] = r
                while at < len(order) and order[at] in held:
                    yield self._counted(held.pop(order[at]))
                    at += 1
        except GeneratorExit:  # the caller stopped reading
            closing = True
            raise
        finally:  # an interrupt ends the run: what finished is not held back
            if not closing:
                for k in order[at:]:
                    if k in held:
                        yield self._counted(held.pop(k))


def batch(source: str | Path | Sequence[Mapping], *, jobs: int = 1, scheduler: Any = None,
          ordered: bool = True, resume: str | Path | None = None,
          stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
          connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
          on_progress: Callable[[Progress], None] | None = None) -> BatchRun:
    """Many solves: `planner batch` from Python.

    `source` is a scenario file (YAML / JSON list, JSONL) or a list of mappings of solve's
    options, every one checked before any runs (SpecError naming the scenario and key).
    `jobs` / `scheduler` say where they run: 1 here, N local processes (0: every core), or a
    Dask cluster (an address 'tcp://HOST:PORT' or a `distributed.Client`, which is left
    open). Iterate the returned `BatchRun` for one `Result` per scenario, as each finishes: in
    input order when `ordered` (only what is not yet in order is held back), else as they
    finish. `resume`: a partial output of an earlier run; its answered scenarios are yielded
    from it (`Result.resumed`) and not run again. A lost cluster (`stall_timeout_s` without
    workers or progress counts) ends the iteration with a `cluster_lost` result for each
    scenario not finished and `BatchRun.lost` set; nothing is raised for it.

    >>> for r in batch("scenarios.yaml", scheduler="tcp://10.0.0.5:8786"):  # doctest: +SKIP
    ...     print(r.scenario.index, r.code, r.doc.get("config"))
    """
    todo = (scenarios(str(source)) if isinstance(source, str | Path)
            else from_mappings(source))
    done = answered(str(resume), todo) if resume is not None else {}
    return BatchRun(todo, jobs=jobs, scheduler=scheduler, ordered=ordered, done=done,
                    stall_timeout_s=stall_timeout_s, connect_timeout_s=connect_timeout_s,
                    on_progress=on_progress)


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
            # Ctrl-C / SIGTERM during the solve: click made it an Abort, `main` an exit 2;
            # it is the batch's interrupt, not this scenario's answer
            cause = getattr(exc.__context__, "__cause__", None)
            if isinstance(cause, KeyboardInterrupt):
                raise cause from None
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
