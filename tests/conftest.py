import json

import pytest
from click.testing import CliRunner

from planner.cli import cli, main


@pytest.fixture
def run(capsys):
    """Run the real entry point (with its error handling); return (exit code, stdout, stderr)."""

    def _run(*args):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return _run


@pytest.fixture
def run_json(run):
    def _run(*args):
        code, out, err = run(*args, "--format", "json")
        assert code == 0, err
        return json.loads(out)

    return _run


@pytest.fixture
def runner():
    return CliRunner(), cli
