"""The project's own fuzzing (issue 17): CLI calls, mutated spec files and --batch lines drawn from
`grammar.py`, each held to the rules there (exit code 0/1/2, one-line errors, no traceback, no
NaN hole, no negative time) and to determinism (the same call twice gives the same output).

CI runs the suite's fixed, derandomized profile (a few dozen calls per test, about a minute in
all); `python -m pytest tests/fuzz --hypothesis-profile long` runs a thousand random calls per
test and adds limits, derive and calibrate (see the README, "Fuzzing").
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import grammar as g


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@g.examples(ci=60)
@given(call=g.cli_calls(slow=g.long_profile()))
def test_cli_calls_keep_the_rules(tmp, call):
    args = g.resolve(call, tmp)
    code, out, err = g.invoke(args)
    g.check(args, code, out, err)


@g.examples(ci=15)
@given(call=g.cli_calls(slow=g.long_profile(), wall_clock=False))
def test_the_same_call_twice_gives_the_same_output(tmp, call):
    args = g.resolve(call, tmp)
    first, second = g.invoke(args), g.invoke(args)
    g.check(args, *first)
    assert first[0] == second[0] and first[2] == second[2], args
    assert g.strip_timing(first[1]) == g.strip_timing(second[1]), args


@pytest.mark.parametrize("kind", ["cnn", "transformer", "device", "link", "system"])
@g.examples(ci=10)
@given(data=st.data())
def test_mutated_specs_keep_the_rules(tmp, kind, data):
    text = data.draw(g.mutated_spec(kind), label="spec")
    path = tmp / f"mutated-{kind}.yaml"
    path.write_text(text, encoding="utf-8")
    for args in g.spec_calls(kind, str(path)):
        code, out, err = g.invoke(args)
        g.check(args, code, out, err)


@g.examples(ci=20)
@given(lines=st.lists(g.batch_line(), min_size=1, max_size=4))
def test_batch_lines_keep_the_rules(tmp, lines):
    path = tmp / "batch.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["evaluate", "--batch", str(path)]
    code, out, err = g.invoke(args)
    g.check(args, code, out, err, batch=True)
    assert code in (0, 2)
    outputs = [json.loads(line) for line in out.splitlines()]
    # one output line per non-blank input line, in order; an error line makes the exit code 2
    assert [d["line"] for d in outputs] == [k for k, line in enumerate(lines, 1) if line.strip()]
    assert (code == 2) == any("error" in d for d in outputs)
    again = g.invoke(args)
    assert again == (code, out, err)
