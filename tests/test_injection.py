"""Nothing a user writes is executed: code-injection strings in every string and number field of
model and hardware specs, in flags and in --batch lines. Each run must end with a documented exit
code and no traceback, and the payload's side effect (creating a marker file) must never happen."""

import json
import re
from pathlib import Path

import pytest
import yaml

import planner

PAYLOADS = [
    "__import__('os').system('touch {marker}')",
    "exec(\"open('{marker}', 'w')\")",
    "eval(\"__import__('os').system('touch {marker}')\")",
    "$(touch {marker})",
    "`touch {marker}`",
    "; touch {marker}",
    "{{{{ open('{marker}', 'w') }}}}",
    "lambda: open('{marker}', 'w')",
    "Symbol('x').__class__.__init__.__globals__",
]

MINI_CNN = {
    "kind": "cnn", "name": "mini", "description": "injection target", "input": [3, 32, 32],
    "blocks": {"unit": {"params": ["w"], "layers": [
        {"type": "conv", "out": "$w", "kernel": 3, "padding": 1}, {"type": "relu"}]}},
    "layers": [{"block": "unit", "name": "u1", "repeat": 2, "args": {"w": 8}},
               {"type": "maxpool", "kernel": 2, "stride": 2},
               {"type": "fc", "name": "fc1", "out": 10}],
}


def _leaves(node, path=()):
    """Paths to every scalar (string or number) in a YAML document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, (*path, i))
    elif isinstance(node, str | int | float) and not isinstance(node, bool):
        yield path


def _replaced(doc, path, value):
    doc = json.loads(json.dumps(doc))  # deep copy
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


def _builtin(kind: str, name: str) -> dict:
    root = Path(planner.__file__).parent / "hardware" / kind
    return yaml.safe_load((root / f"{name}.yaml").read_text())


def _check(run, marker: Path, *args):
    code, out, err = run(*args)
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in out + err
    assert not marker.exists(), f"payload executed: {args}"
    if code:
        assert len(err.strip().splitlines()) <= 1 or '"error"' in out


SPECS = [
    ("model", MINI_CNN),
    ("device", _builtin("devices", "k80")),
    ("link", _builtin("links", "fdr-ib")),
    ("system", {**_builtin("systems", "k80-fdr")}),
]


@pytest.mark.parametrize("kind,doc", SPECS, ids=[k for k, _ in SPECS])
def test_payload_in_every_field_is_never_executed(run, tmp_path, kind, doc):
    marker = tmp_path / "pwned"
    paths = list(_leaves(doc))
    assert len(paths) >= 5
    for i, path in enumerate(paths):
        for j, payload in enumerate(PAYLOADS if i % 3 == 0 else PAYLOADS[:3]):
            bad = _replaced(doc, path, payload.format(marker=marker))
            spec = tmp_path / f"{kind}-{i}-{j}.yaml"
            spec.write_text(yaml.safe_dump(bad))
            if kind == "model":
                _check(run, marker, "evaluate", "-m", str(spec), "-H", "k80-fdr", "--nodes", "1",
                       "--global-batch", "8")
            elif kind == "system":
                _check(run, marker, "evaluate", "-m", "alexnet", "-H", str(spec), "--nodes", "1",
                       "--global-batch", "8")
            else:
                _check(run, marker, "show", "hardware", str(spec))


@pytest.mark.parametrize("tag", [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/name:os.system",
    "!!python/object/new:subprocess.Popen [['touch', '{marker}']]",
])
def test_python_yaml_tags_are_refused(run, tmp_path, tag):
    marker = tmp_path / "pwned"
    spec = tmp_path / "tagged.yaml"
    spec.write_text(f"kind: cnn\nname: t\ninput: [3, 8, 8]\nlayers:\n"
                    f"  - {{type: fc, out: {tag.format(marker=marker)}}}\n")
    code, _, err = run("show", "model", str(spec))
    assert code == 2 and "tagged.yaml" in err and "Traceback" not in err
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("payload", PAYLOADS)
def test_payload_in_flags_and_batch_lines(run, tmp_path, payload):
    marker = tmp_path / "pwned"
    text = payload.format(marker=marker)
    _check(run, marker, "evaluate", "-m", text, "-H", "k80-fdr", "--nodes", "1", "--global-batch", "8")
    _check(run, marker, "evaluate", "-m", "alexnet", "-H", text, "--nodes", "1", "--global-batch", "8")
    _check(run, marker, "solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch-range", text)
    _check(run, marker, "sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64",
           "--nodes", text)
    _check(run, marker, "derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "64",
           "--substitute", text)
    batch = tmp_path / "b.jsonl"
    lines = [{"model": "alexnet", "hardware": "k80-fdr", "nodes": 1, "global_batch": 8, key: text}
             for key in ("collective", "precision", "optimizer")]
    lines.append({"model": text, "hardware": "k80-fdr", "nodes": 1, "global_batch": 8})
    lines.append({"model": "alexnet", "hardware": "k80-fdr", "nodes": text, "global_batch": 8})
    batch.write_text("\n".join(json.dumps(x) for x in lines))
    _check(run, marker, "evaluate", "--batch", str(batch))


def test_the_package_never_evaluates_text():
    """No eval/exec/sympify/parse_expr/lambdify call anywhere in the package source."""
    root = Path(planner.__file__).parent
    pattern = re.compile(r"\b(eval|exec|sympify|parse_expr|lambdify|nsimplify)\s*\(")
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
