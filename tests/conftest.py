import atexit
import json
import os
import shutil
import tempfile

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, settings

from planner.cli import cli, main

# One fixed profile everywhere: derandomized (the same examples on every run and machine), no
# per-example deadline (a first build compiles a model), function-scoped fixtures allowed.
settings.register_profile("fixed", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                 HealthCheck.too_slow])
settings.load_profile("fixed")

# the compiled-program cache of this test run: empty at its start, never the user's own (the
# CLI subprocesses the tests start inherit it)
os.environ["PLANNER_CACHE_DIR"] = tempfile.mkdtemp(prefix="planner-test-cache-")
atexit.register(shutil.rmtree, os.environ["PLANNER_CACHE_DIR"], ignore_errors=True)


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


@pytest.fixture
def no_memory_reach(monkeypatch):
    """The shipped residuals with no run's memory recorded: no family bounds how full a
    covered plan may be (`planner.bands.REACH["full"]`), so a test of another support rule
    (ZeRO, cp, ep, a LoRA pipeline) sees that rule alone."""
    from planner import bands

    rows = tuple({**r, "full": ""} for r in bands.residuals())
    monkeypatch.setattr(bands, "residuals", lambda path=bands.CSV: rows)
    bands.cache_clear()
    yield
    monkeypatch.undo()
    bands.cache_clear()
