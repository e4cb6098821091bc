"""The `planner` command. One function per command; the docstring is the help.

Exit codes: 0 success; 1 a well-formed problem with no feasible answer; 2 bad input (unknown
name, malformed or invalid spec, bad flag); 3 an internal error (a bug: please report it);
4 batch / sweep: the Dask cluster was lost (finished lines kept; docs/batch.md).
"""

from __future__ import annotations

import contextlib
import re
import sys

import click

from planner.cli.batch_cmd import batch
from planner.cli.calibrate_cmd import calibrate
from planner.cli.catalog_cmds import list_cmd, schema, show
from planner.cli.evaluate_cmd import evaluate
from planner.cli.limits_cmds import derive, limits
from planner.cli.solve_cmd import solve
from planner.cli.sweep_cmd import sweep
from planner.errors import CheckFailed, InfeasibleError, PlannerError
from planner.report import render

COMMANDS = [list_cmd, show, evaluate, solve, limits, derive, sweep, batch, calibrate, schema]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             commands=COMMANDS)
@click.version_option(package_name="planner")
def cli():
    """Plan distributed deep-learning training before it runs: how many nodes, which batch and
    split, how fast, and where scaling stops.

    Exit codes: 0 ok, 1 infeasible (the message names the conflicting constraints),
    2 bad input, 3 internal error, 4 batch / sweep lost their cluster (finished lines kept).
    """


def _json_request(argv: list[str]) -> str | None:
    """The command of `argv` when it asks for --format json (None otherwise): read from the
    arguments themselves, so a request click refused to parse still gets its JSON error."""
    args = [a for a in argv if isinstance(a, str)]
    wants = "--format=json" in args or any(
        a == "--format" and b == "json" for a, b in zip(args, args[1:], strict=False))
    if not wants:
        return None
    return next((a for a in args if a in cli.commands), "planner")


_GOT = re.compile(r"[(,] ?got (.{1,200}?)\)?$")
_KEY = re.compile(r"key '([^']{1,200})'")
_NAMED = re.compile(r"(?:unknown (\w{1,40})|Invalid value for '--([\w-]{1,60})':) '([^']{0,200})'")
_LEAD = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]{0,99}): ")
# the value a flag or key was given, where the message starts with it: click's range errors
# ("Invalid value for '--tp': 0 is not in the range ...") and planner's ("tp: 3 does not ...")
_FLAG_NUMBER = re.compile(r"^Invalid value for '--([\w-]{1,60})': (-?[\d.eE+]{1,40}) ")
_LEAD_NUMBER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,99}: (-?\d[\d.eE+]{0,39}) ")


def error_doc(command: str, kind: str, message: str, exc: BaseException) -> dict:
    """The JSON error document: kind, the one-line message, the conflicting constraints (exit
    1), and the file, key and value it names where it names them (else null)."""
    file = key = value = None
    message_all, message = message, message.split("\n", 1)[0]  # a spec's later errors: more lines
    lead, _, rest = message.partition(": ")
    if rest and ("/" in lead or lead.endswith((".yaml", ".yml", ".json", ".jsonl", ".csv"))
                 or lead == "-"):
        file = lead
    elif (m := _LEAD.match(message)) and kind == "bad_input":
        key = m.group(1)
    if (m := _KEY.search(message)) is not None:
        key = m.group(1)
    if (m := _GOT.search(message)) is not None:
        value = m.group(1)
    if (m := _NAMED.search(message)) is not None:  # unknown model 'x', Invalid value for '--k': 'x'
        # "unknown key 'x'" names the key itself (no value)
        key, value = ((m.group(3), None) if m.group(1) == "key"
                      else (m.group(1) or m.group(2), m.group(3)))
    elif (m := _FLAG_NUMBER.match(message)) is not None:
        key, value = m.group(1), m.group(2)
    elif value is None and key is not None and (m := _LEAD_NUMBER.match(message)) is not None:
        value = m.group(1)
    param = getattr(exc, "param", None)
    if param is not None and getattr(param, "name", None):
        key = param.name
    return render.document(command, {"error": {
        "kind": kind, "message": message_all,
        "constraints": list(getattr(exc, "conflicts", ()) or ()),
        "file": file, "key": key, "value": value}})


def _fail(argv: list[str], code: int, kind: str, message: str, exc: BaseException) -> None:
    """One line on stderr; with --format json also the error document on stdout; exit."""
    click.echo(f"planner: {message}", err=True)
    command = _json_request(argv)
    if command is not None and not isinstance(exc, CheckFailed):
        # (calibrate --check has printed its document already; its exit 1 adds none)
        with contextlib.suppress(Exception):
            click.echo(render.to_json(error_doc(command, kind, message, exc)))
    sys.exit(code)


def main(argv=None) -> None:
    """Run the CLI; every failure becomes one line on stderr and a documented exit code (with
    --format json, also a JSON error document on stdout)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort as exc:
        _fail(args, 2, "bad_input", "aborted", exc)
    except click.ClickException as exc:
        _fail(args, 2, "bad_input", exc.format_message(), exc)
    except InfeasibleError as exc:
        _fail(args, 1, "infeasible", str(exc), exc)
    except PlannerError as exc:
        kind = "infeasible" if exc.exit_code == 1 else "bad_input"
        _fail(args, exc.exit_code, kind, str(exc), exc)
    except BrokenPipeError:
        sys.exit(0)
    except RecursionError as exc:
        _fail(args, 2, "bad_input", "input nested too deeply", exc)
    except Exception as exc:  # a bug: still one line, never a traceback
        _fail(args, 3, "internal", f"internal error: {type(exc).__name__}: {exc}", exc)
