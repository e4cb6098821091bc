"""The bad-input corpus (tests/bad_inputs/cases.yaml): documented exit code, one line naming
the file / key / value, never a traceback."""

from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).parent / "bad_inputs"
CASES = yaml.safe_load((HERE / "cases.yaml").read_text())


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 40
    assert len({c["id"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input(run, case):
    args = [a.replace("{d}", str(HERE)) for a in case["args"]]
    code, out, err = run(*args)
    assert code == case["exit"], (code, out, err)
    assert "Traceback" not in out + err
    if case["stream"] == "stdout":
        lines = [ln for ln in out.splitlines() if '"error"' in ln]
        assert len(lines) == 1, out
        message = lines[0]
    else:
        # one line per mistake of the spec (up to 10), the first as the one-error message
        assert 1 <= len(err.strip().splitlines()) <= 10, err
        message = err
        assert message.startswith("planner: ")
    for text in case["match"]:
        assert text.lower() in message.lower(), (text, message)
