"""The grammar the fuzz tests draw from (issue 17): CLI calls built from flag sets with good and
bad values, spec files as mutations of valid specs, and `evaluate --batch` lines; plus the rules
every answer must keep and an in-process runner.

Rules (`check`): exit code 0, 1 or 2 (never 3, an internal error); no traceback; an error is one
line on stderr starting "planner: " (a --batch line's error is a JSON line on stdout); a success
prints at most one note line on stderr; JSON has no NaN hole (a time, size or cost that is null)
and no negative time.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import yaml
from hypothesis import settings
from hypothesis import strategies as st

from planner.cli import main

HERE = Path(__file__).parent
MODELS = Path(__file__).parents[2] / "planner" / "models"
HARDWARE = Path(__file__).parents[2] / "planner" / "hardware"


def long_profile() -> bool:
    """True under `--hypothesis-profile long` (or PLANNER_FUZZ_EXAMPLES): the slow commands
    (limits, derive, calibrate) join the grammar."""
    return "PLANNER_FUZZ_EXAMPLES" in os.environ or settings.default.max_examples >= 1000


def examples(ci: int) -> settings:
    """`ci` examples in CI (the suite's fixed profile); the long profile's count by hand."""
    if "PLANNER_FUZZ_EXAMPLES" in os.environ:
        return settings(max_examples=int(os.environ["PLANNER_FUZZ_EXAMPLES"]))
    return settings(max_examples=settings.default.max_examples if long_profile() else ci)


# --- running and the rules ---------------------------------------------------------------------

TIMING_KEYS = {"time_s", "solve_time_s", "build_time_s"}
# Keys whose value is a time, size, rate or cost: a number >= 0 when present (null is a NaN hole).
NON_NEGATIVE_SUFFIXES = ("_s", "_bytes", "_usd", "_per_s", "_GBps", "_bytes_per_device")


def _special(arg: str) -> bool:
    return arg.startswith("/dev/") or arg.endswith("/fifo")


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


def invoke(args: list[str]) -> tuple[int, str, str]:
    """Run the real entry point in-process; (exit code, stdout, stderr). A call naming a
    special file runs in a child with 2 GiB of memory and a minute: a regression that reads
    /dev/zero or waits on a FIFO then fails the test instead of taking the machine down."""
    if any(_special(a) for a in args):
        try:
            res = subprocess.run([sys.executable, "-m", "planner.cli", *args], text=True,
                                 capture_output=True, timeout=60, preexec_fn=_cap_memory)
        except subprocess.TimeoutExpired:
            return 124, "", "planner: timed out (a special file was read or waited on)\n"
        return res.returncode, res.stdout, res.stderr
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def _walk(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, value


def _nullable_keys() -> set[str]:
    """Keys the JSON schema documents as possibly null (`planner schema`): null there is an
    answer ("never communication bound"), not a NaN hole."""
    from planner.schema import schemas

    found = set()

    def walk(node):
        if isinstance(node, dict):
            for key, sub in (node.get("properties") or {}).items():
                kinds = sub.get("type") if isinstance(sub, dict) else None
                options = sub.get("oneOf", []) if isinstance(sub, dict) else []
                if (isinstance(kinds, list) and "null" in kinds) or any(
                        isinstance(o, dict) and o.get("type") == "null" for o in options):
                    found.add(key)
            for sub in node.values():
                walk(sub)
        elif isinstance(node, list):
            for sub in node:
                walk(sub)

    walk(schemas())
    return found


NULLABLE = _nullable_keys()


def check_json(doc) -> None:
    for path, value in _walk(doc):
        key = path.rsplit(".", 1)[-1].split("[")[0]
        if isinstance(value, float):
            assert value == value and abs(value) != float("inf"), (path, value)
        if key.endswith(NON_NEGATIVE_SUFFIXES) and key not in NULLABLE:
            assert value is not None, f"{path} is null (a NaN hole)"
            if isinstance(value, int | float) and not isinstance(value, bool):
                assert value >= 0, f"{path} = {value} is negative"


def check(args: list[str], code: int, out: str, err: str, batch: bool = False) -> None:
    """The rules every call keeps (see the module docstring)."""
    where = " ".join(a if len(a) < 60 else a[:57] + "..." for a in args)
    assert code in (0, 1, 2), (where, code, err)
    assert "Traceback" not in out + err, where
    assert "internal error" not in err, (where, err)
    lines = err.strip().splitlines()
    if code == 0:  # a note and a low-efficiency warning at most
        assert len(lines) <= 2, (where, err)
    elif not (batch and code == 2 and not lines):
        # one line, or one per mistake of a spec (up to 10), each naming the file
        assert 1 <= len(lines) <= 10 and err.startswith("planner: "), (where, err)
    if code == 0 and "--format" in args and args[args.index("--format") + 1] == "json":
        check_json(json.loads(out))
    if batch and out:
        for line in out.splitlines():
            check_json(json.loads(line))


def strip_timing(text: str) -> str:
    """JSON output without its wall-clock keys, for determinism checks."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMING_KEYS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    try:
        return json.dumps(strip(json.loads(text)))
    except json.JSONDecodeError:
        return text


# --- values ------------------------------------------------------------------------------------

# Text no number parser may take: Unicode digits, underscores, NaN, infinities, 5,000 digits,
# injection payloads (nothing a user writes is evaluated).
BAD_TEXT = ["nan", "NaN", "inf", "-inf", "Infinity", "²", "٣", "1_0", "1e999", "9" * 5000,
            "0x10", "", " ", "-", "1,", ",", ":", "1:", "abc", "__import__('os').system('true')",
            "$(true)", "`true`", "1;true", "{{7*7}}", "\x00", "é" * 300]
BAD = st.sampled_from(BAD_TEXT)


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy = BAD, odds: int = 4):
    """A good value, and one time in `odds` a bad one."""
    return st.sampled_from([True] * (odds - 1) + [False]).flatmap(
        lambda ok: good if ok else bad)


INTS = mostly(st.one_of(st.integers(1, 64).map(str), st.sampled_from(["0", "-1", "1024"])))
SMALL_INTS = mostly(st.one_of(st.integers(1, 8).map(str), st.sampled_from(["0", "-3", "1e3"])))
BATCHES = mostly(st.sampled_from(["8", "32", "64", "256", "1024", "4096", "7", "0"]))
FLOATS = mostly(st.one_of(st.floats(1e-3, 1e6).map(lambda x: f"{x:.6g}"),
                          st.sampled_from(["0", "-1", "0.05", "0.9", "1e-9", "1e15"])))
RANGES = mostly(st.one_of(st.tuples(st.integers(1, 512), st.integers(1, 4096)).map(
    lambda t: f"{min(t)}:{max(t)}"), st.sampled_from(["0:8", "8:4", "²:64", "1:2:3", ":"])))
LISTS = mostly(st.sampled_from(["1,2,4", "1:4", "1:8:x2", "2", "4:1", "64,128", "1:1000000"]))

CNNS = ["alexnet", "{toy}"]
TRANSFORMERS = ["gpt2"]
SYSTEMS = ["k80-fdr", "dgx1-v100", "dgx-a100-80gb"]
BAD_NAMES = st.sampled_from(["nosuchnet", "a" * 300, "x/" + "a" * 300, "/dev/zero", "{fifo}",
                             "{dir}", "../..", "-", "{missing}", "k80-fdr"])
BAD_HW = st.sampled_from(["nosuchhw", "b" * 300, "/dev/urandom", "{fifo}", "{dir}", "k80",
                          "fdr-ib", "{missing}", "alexnet"])
NAMES = mostly(st.sampled_from(CNNS + TRANSFORMERS), BAD_NAMES, odds=2)
HW = mostly(st.sampled_from(SYSTEMS), BAD_HW, odds=2)


def _flags(options: dict) -> st.SearchStrategy[list[str]]:
    """A subset of the options (each flag with a value drawn from its strategy, or alone)."""
    names = sorted(options)

    @st.composite
    def draw(data):
        chosen = data(st.lists(st.sampled_from(names), unique=True, max_size=4))
        out = []
        for name in chosen:
            value = options[name]
            out += [name] if value is None else [name, data(value)]
        return out

    return draw()


TRAINING = {"--critical-batch": FLOATS, "--target-steps": FLOATS, "--target-samples": FLOATS}
COMMON = {"--precision": st.sampled_from(["fp32", "fp16", "bf16", "fp64", "fp8", "fp7"]),
          "--optimizer": st.sampled_from(["sgd", "momentum", "adam", "lion"]),
          "--servers": SMALL_INTS, "--no-overlap": None,
          "--collective": st.sampled_from(["ring", "tree", "hierarchical", "parameter-server",
                                           "halving-doubling", "pigeon"])}
HYBRID = {"--tp": SMALL_INTS, "--pp": SMALL_INTS, "--dp": SMALL_INTS, "--micro-batch": SMALL_INTS,
          "--recompute": st.sampled_from(["none", "selective", "full", "half"]),
          "--zero": st.sampled_from(["0", "1", "3", "4"]), "--seq-len": INTS,
          "--interleave": SMALL_INTS, "--sequence-parallel": None}
EVALUATE = {**COMMON, **HYBRID, "--nodes": SMALL_INTS, "--devices": SMALL_INTS,
            "--devices-per-node": SMALL_INTS, "--global-batch": BATCHES,
            "--local-batch": BATCHES}
SOLVE = {**COMMON, **TRAINING, "--global-batch": BATCHES, "--global-batch-range": RANGES,
         "--global-batch-max": BATCHES, "--devices-max": SMALL_INTS, "--nodes": SMALL_INTS,
         "--objective": st.sampled_from(["throughput", "iteration-time", "efficiency",
                                         "time-to-train", "cost", "token-budget", "speed"]),
         "--deadline": FLOATS, "--budget": FLOATS, "--price-per-device-hour": FLOATS,
         "--strategy": st.sampled_from(["data", "hybrid", "pipeline", "auto", "sideways"]),
         "--stages": SMALL_INTS, "--top": st.sampled_from(["0", "2", "-1", "200"]),
         "--within": FLOATS, "--local-batch-min": SMALL_INTS, "--pareto": None,
         "--tp": SMALL_INTS, "--recompute": HYBRID["--recompute"]}
SWEEP = {**COMMON, **TRAINING, "--nodes": LISTS, "--global-batch": LISTS,
         "--bandwidth": st.one_of(st.sampled_from(["6.25,12.5", "100", "0"]), st.sampled_from(BAD_TEXT)),
         "--price-per-device-hour": FLOATS}
LIMITS = {**COMMON, "--global-batch": BATCHES, "--at-nodes": FLOATS, "--critical-batch": FLOATS,
          "--local-efficiency": FLOATS, "--target-efficiency": FLOATS, "--nodes-max": SMALL_INTS}


@st.composite
def cli_calls(draw, slow: bool = False, wall_clock: bool = True) -> list[str]:
    """One CLI call: a command, a model and hardware (mostly good), and a flag set. `slow` adds
    limits, derive and calibrate; `wall_clock` lets --time-limit in (never for determinism)."""
    commands = ["evaluate", "evaluate", "solve", "solve", "sweep", "show", "list"]
    if slow:
        commands += ["limits", "derive", "calibrate"]
    cmd = draw(st.sampled_from(commands))
    if cmd == "list":
        return ["list", draw(st.sampled_from(["models", "hardware", "things"])), "--format", "json"]
    if cmd == "show":
        what = draw(st.sampled_from(["model", "hardware"]))
        return ["show", what, draw(NAMES if what == "model" else HW), "--format", "json"]
    if cmd == "calibrate":
        return ["calibrate", "--csv", draw(st.sampled_from(["{fifo}", "{dir}", "/dev/zero",
                                                            "c" * 300, "{missing}", "{bad_csv}"])),
                "--format", "json"]
    model = draw(mostly(st.sampled_from(CNNS + TRANSFORMERS), BAD_NAMES, odds=8))
    hw = draw(mostly(st.sampled_from(SYSTEMS), BAD_HW, odds=8))
    options = {"evaluate": EVALUATE, "solve": SOLVE, "sweep": SWEEP, "limits": LIMITS,
               "derive": LIMITS}[cmd]
    if cmd == "solve" and wall_clock:
        options = {**options, "--time-limit": FLOATS}
    flags = draw(_flags(options))
    # A call that would run as it stands (the drawn flags come after, so they may override or
    # contradict it), kept small: few nodes, a small sweep.
    cnn = model in CNNS
    base = {"evaluate": [("--nodes", "2") if cnn else ("--devices", "8"),
                         ("--global-batch", "64")],
            "solve": [("--nodes-max", "4") if cnn else ("--devices-max", "16"),
                      ("--global-batch", "64")],
            "sweep": [("--nodes", "1,2"), ("--global-batch", "64")],
            "limits": [("--global-batch", "1024")], "derive": [("--global-batch", "1024")]}[cmd]
    given = set(flags)
    if {"--devices", "--nodes"} & given:
        given |= {"--devices", "--nodes", "--nodes-max", "--devices-max"}
    if {"--global-batch-range", "--global-batch-max", "--local-batch"} & given:
        given.add("--global-batch")
    keep = [x for flag, value in base if flag not in given for x in (flag, value)]
    return [cmd, "-m", model, "-H", hw, *keep, *flags, "--format", "json"]


def resolve(args: list[str], tmp: Path) -> list[str]:
    """Fill the placeholders: the toy CNN, a FIFO, a directory, a missing file, a bad CSV."""
    toy = tmp / "toy.yaml"
    if not toy.exists():
        toy.write_text(yaml.safe_dump(TOY_CNN))
        os.mkfifo(tmp / "fifo")
        (tmp / "bad.csv").write_text("citation,model\n" + "²," * 3 + "\n")
    subs = {"{toy}": str(toy), "{fifo}": str(tmp / "fifo"), "{dir}": str(tmp),
            "{missing}": str(tmp / "missing.yaml"), "{bad_csv}": str(tmp / "bad.csv")}
    return [subs.get(a, a) for a in args]


# --- spec files --------------------------------------------------------------------------------

TOY_CNN = {"kind": "cnn", "name": "toy", "input": [3, 16, 16], "layers": [
    {"type": "conv", "out": 8, "kernel": 3, "padding": 1, "stride": 1}, {"type": "relu"},
    {"type": "maxpool", "kernel": 2},
    {"type": "residual", "branch": [{"type": "conv", "out": 8, "kernel": 3, "padding": 1},
                                    {"type": "batchnorm"}]},
    {"type": "concat", "name": "mix", "branches": [[{"type": "conv", "out": 4, "kernel": 1}],
                                                   [{"type": "avgpool", "kernel": 3,
                                                     "stride": 1, "padding": 1}]]},
    {"block": "head", "args": {"width": 16}, "repeat": 2},
    {"type": "fc", "out": 10}, {"type": "softmax"}],
    "blocks": {"head": {"params": ["width"], "layers": [{"type": "fc", "out": "$width"},
                                                        {"type": "dropout", "rate": 0.5}]}}}


def _spec(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def base_specs() -> dict[str, dict]:
    """Valid specs to mutate, by kind: model (CNN, transformer), device, link, system."""
    return {"cnn": TOY_CNN, "transformer": _spec(MODELS / "gpt2.yaml"),
            "device": _spec(HARDWARE / "devices" / "v100-sxm2-16gb.yaml"),
            "link": _spec(HARDWARE / "links" / "fdr-ib.yaml"),
            "system": _spec(HARDWARE / "systems" / "k80-fdr.yaml")}


# Values a mutation puts in a spec (YAML can say all of these).
SPEC_VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2, 3, 7, 2**31, 2**70, 0.5, -0.0, 1e308,
                     float("nan"), float("inf"), float("-inf"), "", "x", "conv", "relu", "fc",
                     "concat", "residual", "$width", "$nope", [], {}, [0], [1, 2], [3, 0],
                     {"type": "relu"}, ["conv"], "a" * 300, "fp16", "ring"]),
    st.integers(-10, 10**6), st.text(max_size=8))


def _paths(value, path=()):
    """Every place in a nested spec: (path, value)."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _set(doc, path, fn):
    if not path:
        return fn(doc)
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        out = dict(doc)
        if rest or fn is not None:
            out[head] = _set(doc[head], rest, fn) if rest else fn(doc[head])
        if fn is None and not rest:
            del out[head]
        return out
    out = list(doc)
    if fn is None and not rest:
        del out[head]
    else:
        out[head] = _set(doc[head], rest, fn) if rest else fn(doc[head])
    return out


@st.composite
def mutated_spec(draw, kind: str) -> str:
    """A valid spec of `kind` with one to three mutations, as YAML text (sometimes with a
    textual mutation on top: a 5,000-digit number, an alias, a truncation, a tab)."""
    doc = base_specs()[kind]
    for _ in range(draw(st.integers(1, 3))):
        places = [p for p, _ in _paths(doc) if p]
        if not places:
            break
        path = draw(st.sampled_from(places))
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "wrap", "string"]))
        try:
            if op == "replace":
                value = draw(SPEC_VALUES)
                doc = _set(doc, path, lambda _v, value=value: value)
            elif op == "delete":
                doc = _set(doc, path, None)
            elif op == "add":
                key, value = draw(st.sampled_from(["extra", "name", "type", "stride", "kernel",
                                                   "groups", "repeat", "args"])), draw(SPEC_VALUES)
                doc = _set(doc, path[:-1], lambda v, k=key, x=value:
                           {**v, k: x} if isinstance(v, dict) else [*v, {k: x}])
            elif op == "wrap":
                doc = _set(doc, path, lambda v: [v])
            else:
                doc = _set(doc, path, lambda v: str(v))
        except (KeyError, IndexError, TypeError):
            pass
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    textual = draw(st.sampled_from(["none", "none", "none", "huge", "alias", "cut", "tab", "nul"]))
    if textual == "huge":
        text = text.replace(": 1\n", ": " + "1" * 5000 + "\n", 1).replace(
            ": 3\n", ": " + "3" * 5000 + "\n", 1)
    elif textual == "alias":
        text = "x: &a [1, 2]\n" + text.replace("\n", "\ny: *a\n", 1)
    elif textual == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif textual == "tab":
        text = text.replace("  ", "\t", 1)
    elif textual == "nul":
        text = text + "\x00"
    return text


def spec_calls(kind: str, path: str) -> list[list[str]]:
    """The calls that read a spec of `kind` at `path`."""
    if kind in ("cnn", "transformer"):
        run = (["evaluate", "-m", path, "-H", "k80-fdr", "--nodes", "1", "--global-batch", "8"]
               if kind == "cnn" else
               ["evaluate", "-m", path, "-H", "dgx-a100-80gb", "--devices", "8",
                "--global-batch", "64"])
        return [["show", "model", path, "--format", "json"], [*run, "--format", "json"]]
    if kind == "system":
        return [["show", "hardware", path, "--format", "json"],
                ["evaluate", "-m", "alexnet", "-H", path, "--nodes", "2", "--global-batch", "64",
                 "--format", "json"]]
    return [["show", "hardware", path, "--format", "json"]]


# --- --batch lines -----------------------------------------------------------------------------

BATCH_KEYS = ["model", "hardware", "nodes", "devices", "devices_per_node", "global_batch",
              "local_batch", "collective", "overlap", "precision", "optimizer", "servers", "tp",
              "pp", "dp", "micro_batch", "interleave", "recompute", "sequence_parallel", "zero",
              "schedule", "flash_attention", "seq_len", "colour"]
JSON_VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2, 8, 64, 2**31, 2**70, 1.5, 1e308, "",
                     "alexnet", "gpt2", "k80-fdr", "dgx-a100-80gb", "ring", "hierarchical",
                     "fp16", "adam", "selective", [], {}, [1], "a" * 300]),
    st.integers(-5, 5000), st.text(max_size=6))
RAW_NUMBERS = ["NaN", "Infinity", "-Infinity", "1" * 5000, "1e400", "-0", "1E5"]


@st.composite
def batch_line(draw) -> str:
    base = draw(st.sampled_from([
        {"model": "alexnet", "hardware": "k80-fdr", "nodes": 2, "global_batch": 64},
        {"model": "gpt2", "hardware": "dgx-a100-80gb", "devices": 8, "global_batch": 64},
    ]))
    kind = draw(st.sampled_from(["good", "mutate", "mutate", "mutate", "raw", "garbage"]))
    if kind == "good":
        return json.dumps(base)
    if kind == "garbage":
        return draw(st.sampled_from(["[1, 2]", "42", '"text"', "{", "not json", "null",
                                     '{"model": ' * 200, "{}"]))
    line = dict(base)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(BATCH_KEYS))
        if draw(st.booleans()) and key in line:
            del line[key]
        else:
            line[key] = draw(JSON_VALUES)
    text = json.dumps(line)
    if kind == "raw":  # a number JSON allows in text but no parser should take
        key = draw(st.sampled_from(["nodes", "global_batch", "servers", "tp"]))
        text = text[:-1] + f', "{key}": {draw(st.sampled_from(RAW_NUMBERS))}}}'
    return text
