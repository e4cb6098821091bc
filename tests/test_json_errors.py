"""With --format json, a failure (exit 1, 2 or 3) prints an error document on stdout that
validates against the command's schema; stderr keeps its one line."""

import json

import jsonschema
import pytest

from planner.schema import schemas

CASES = [  # (args, exit code, kind, constraints, file, key, value)
    (("solve", "-m", "vgg16", "-H", "k80-fdr", "--global-batch", "4096", "--nodes-max", "2"),
     1, "infeasible", ["memory", "nodes_max"], None, None, None),
    (("show", "model", "nope"), 2, "bad_input", [], None, "model", "nope"),
    (("evaluate", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "3", "--global-batch",
      "8"), 2, "bad_input", [], None, "global_batch", None),
    (("evaluate", "-m", "gpt2", "-H", "dgx-a100-80gb", "--tp", "x"), 2, "bad_input", [], None,
     "tp", "x"),
    (("solve", "--bogus"), 2, "bad_input", [], None, None, None),
    (("evaluate", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "24", "--tp", "8",
      "--pp", "3", "--global-batch", "48", "--memory-headroom", "1.5"), 2, "bad_input", [],
     None, "memory_headroom", "1.5"),
    # the value given, where the message starts with it (a flag's range, a pin's rule)
    (("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--global-batch",
      "-4"), 2, "bad_input", [], None, "global_batch", "-4"),
    (("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--global-batch",
      "64", "--tp", "3"), 2, "bad_input", [], None, "tp", "3"),
]


@pytest.mark.parametrize(("args", "code", "kind", "constraints", "file", "key", "value"), CASES)
def test_error_document_on_stdout(run, args, code, kind, constraints, file, key, value):
    for fmt in (["--format", "json"], ["--format=json"]):
        got, out, err = run(*args, *fmt)
        assert got == code
        assert len(err.strip().splitlines()) == 1 and err.startswith("planner: ")
        doc = json.loads(out)
        assert doc["schema_version"] == 1 and doc["command"] == args[0]
        e = doc["error"]
        assert e["kind"] == kind and e["message"] == err.strip().removeprefix("planner: ")
        assert e["constraints"] == constraints
        assert (e["file"], e["key"], e["value"]) == (file, key, value)
        jsonschema.validate(doc, schemas()[args[0]])


def _spec_error(run, tmp_path, extra: str) -> tuple[str, dict]:
    """(the spec's path, the JSON error of evaluating a small model spec with `extra` lines)."""
    spec = tmp_path / "bad.yaml"
    spec.write_text("kind: transformer\nname: x\nhidden: 64\nheads: 4\nseq_len: 8\n"
                    "vocab: 10\n" + extra)
    code, out, _ = run("evaluate", "-m", str(spec), "-H", "dgx-a100-80gb", "--devices", "8",
                       "--global-batch", "8", "--format", "json")
    assert code == 2
    return str(spec), json.loads(out)["error"]


def test_spec_error_names_file_key_and_value(run, tmp_path):
    spec, e = _spec_error(run, tmp_path, "layers: 0\n")
    assert e["kind"] == "bad_input" and (e["file"], e["key"], e["value"]) == (spec, "layers", "0")


def test_an_unknown_key_is_the_key_named(run, tmp_path):
    """"unknown key 'x'" names the key x (no value): in a spec file and in a batch line."""
    spec, e = _spec_error(run, tmp_path, "layers: 2\nbogus_key: 1\n")
    assert (e["file"], e["key"], e["value"]) == (spec, "bogus_key", None)
    lines = tmp_path / "b.jsonl"
    lines.write_text(json.dumps({"model": "llama3-8b", "hardware": "dgx-h100", "devices": 8,
                                 "global_batch": 64, "bogus_key": 1}) + "\n")
    code, out, _ = run("evaluate", "--batch", str(lines))
    e = json.loads(out)["error"]
    assert code == 2 and (e["key"], e["value"]) == ("bogus_key", None)


def test_internal_error_is_json_too(run, monkeypatch):
    import planner.api

    def boom(*a, **k):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(planner.api, "evaluate", boom)
    code, out, err = run("evaluate", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "8",
                         "--global-batch", "8", "--format", "json")
    assert code == 3 and "internal error" in err
    assert json.loads(out)["error"]["kind"] == "internal"


def test_no_error_document_without_json(run):
    code, out, err = run("show", "model", "nope")
    assert code == 2 and out == "" and err.count("\n") == 1


def test_launcher_format_on_a_plan_that_does_not_fit_is_not_json(run):
    code, out, err = run("evaluate", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "24",
                         "--tp", "8", "--pp", "3", "--global-batch", "48", "--format",
                         "megatron")
    assert code == 1 and out == "" and "does not fit" in err
