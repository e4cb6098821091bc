"""Real JSON outputs validate against `planner schema`; a wrong document does not."""

import json

import jsonschema
import pytest

CASES = [
    ("evaluate", ("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "4",
                  "--global-batch", "1024")),
    ("evaluate", ("evaluate", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices", "1024",
                  "--tp", "8", "--pp", "8", "--global-batch", "1536", "--recompute", "full")),
    ("solve", ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--top", "2")),
    # a ZeRO-3 pick: the covered ZeRO 2 plan beside it (support)
    ("solve", ("solve", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "64",
               "--global-batch", "256")),
    ("solve", ("solve", "-m", "resnet50", "-H", "dgx-a100-80gb", "--nodes-max", "8",
               "--global-batch-range", "256:4096", "--critical-batch", "4096",
               "--target-samples", "1.2e8", "--objective", "time-to-train", "--pareto")),
    ("solve", ("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "16",
               "--global-batch", "64")),
    ("solve", ("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "16",
               "--global-batch", "64", "--framework", "torchtitan")),
    ("evaluate", ("evaluate", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "16",
                  "--global-batch", "64", "--tp", "2", "--framework", "deepspeed")),
    ("solve", ("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "16",
               "--global-batch-range", "32:256", "--critical-batch", "128", "--target-tokens",
               "1e9", "--objective", "cost", "--pareto")),
    ("limits", ("limits", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024")),
    ("sweep", ("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024", "--nodes",
               "1:8:x2", "--critical-batch", "4096", "--target-steps", "1000")),
    ("sweep", ("sweep", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--global-batch", "1536",
               "--nodes", "4,16", "--critical-batch", "4096", "--target-tokens", "3e11")),
    ("derive", ("derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024")),
    ("show", ("show", "model", "resnet50")),
    ("list", ("list", "models")),
    ("list", ("list", "hardware")),
    ("list", ("list", "systems")),
    ("list", ("list", "clusters")),
    ("list", ("list", "switches")),
    ("calibrate", ("calibrate",)),
    ("show", ("show", "model", "llama3-8b")),
    ("show", ("show", "hardware", "dgx-a100-80gb")),
    ("show", ("show", "hardware", "a100-sxm4-80gb")),
    ("show", ("show", "hardware", "fdr-ib")),
    ("solve", ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
               "--nodes-max", "8", "--strategy", "auto")),
]


@pytest.fixture(scope="module")
def schemas():
    from planner.schema import schemas

    out = schemas()
    for sch in out.values():
        jsonschema.Draft202012Validator.check_schema(sch)
    return out


@pytest.mark.parametrize(("command", "args"), CASES)
def test_outputs_validate(run_json, schemas, command, args):
    jsonschema.validate(run_json(*args), schemas[command])


def test_list_of_one_kind_is_that_part_of_the_hardware_list(run, run_json):
    """`planner list systems` (as the help's "hardware (systems, ...)" invites) lists the
    systems of `planner list hardware`, a name a line."""
    hw = run_json("list", "hardware")["hardware"]
    for kind in ("systems", "devices", "links", "clusters"):
        code, out, err = run("list", kind)
        assert code == 0, err
        assert out.split() == hw[kind]
        assert run_json("list", kind)["hardware"] == {kind: hw[kind]}


def test_schema_command_prints_every_schema(run, schemas):
    code, out, _ = run("schema")
    assert code == 0 and json.loads(out) == schemas


def test_an_unknown_key_or_a_wrong_type_is_rejected(run_json, schemas):
    doc = run_json("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256")
    bad = {**doc, "config": {**doc["config"], "nodes": "four"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schemas["solve"])
    extra = {**doc, "prediction": {**doc["prediction"], "surprise": 1}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(extra, schemas["solve"])


def test_sweep_progress_bar_only_on_a_terminal(run, monkeypatch):
    import io
    import sys

    args = ("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024", "--nodes",
            "1:64:x2", "--format", "json")
    code, out, err = run(*args)
    assert code == 0 and err == "" and json.loads(out)["points"]

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    code, out, _ = run(*args)
    assert code == 0 and json.loads(out)["points"]
    assert "sweep" in term.getvalue() and "100%" in term.getvalue()
