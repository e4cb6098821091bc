"""The compiled-program cache (planner.cost.programs): a second process of the same model shape
reads the programs from disk and loads no SymPy; a corrupt entry is rebuilt, not trusted; the
cache lives under XDG_CACHE_HOME unless PLANNER_CACHE_DIR says otherwise; two processes
writing the same entry at once leave a whole file; the data form refuses what is not a
program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.catalog import load_model, load_system
from planner.compiled import Compiled
from planner.cost import programs
from planner.cost.transformer import Hardware
from planner.expr.choices import Choices
from planner.spec.hardware import Precision

M = load_model("gpt2")
HW = Hardware.of(load_system("dgx-a100-80gb"), Precision.bf16)
CHOICES = (Choices(recompute="selective", sequence_parallel=True, zero=1),)
ARGS = [np.array([1.0, 2.0]), 2.0, 4.0, 1.0, 8.0, 1.0, 1.0, 1.0, np.array([1.0, 2.0]), 1.0, 1.0]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    programs.program.cache_clear()
    yield tmp_path
    programs.program.cache_clear()


def _values(prog):
    return {k: np.asarray(v, dtype=float) for k, v in prog(*ARGS).items()}


def test_a_second_process_reads_the_program_and_builds_nothing(cache, monkeypatch):
    first = _values(programs.program(M, HW, CHOICES))
    (entry,) = cache.glob("*.json")
    programs.program.cache_clear()  # as a new process: nothing in memory

    def refuse(*args, **kw):
        raise AssertionError("built again")

    import planner.expr.transformer as ex
    monkeypatch.setattr(ex, "build_program", refuse)
    again = _values(programs.program(M, HW, CHOICES))
    assert again.keys() == first.keys() and all(
        np.array_equal(again[k], first[k]) for k in first)
    # another choice, another entry
    programs.program.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(cache))
    programs.program(M, HW, (Choices(zero=3),))
    assert len(list(cache.glob("*.json"))) == 2 and entry.exists()


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"format": 1}',
                                    b'{"format": 99, "n_args": 1, "ops": [], "constants": [],'
                                    b' "outputs": {}}', b"\xff\xfe"])
def test_a_corrupt_entry_is_rebuilt_not_trusted(cache, damage):
    want = _values(programs.program(M, HW, CHOICES))
    (entry,) = cache.glob("*.json")
    entry.write_bytes(damage)
    programs.program.cache_clear()
    got = _values(programs.program(M, HW, CHOICES))
    assert all(np.array_equal(got[k], want[k]) for k in want)
    Compiled.from_data(json.loads(entry.read_text()))  # rewritten whole


def test_the_cache_lives_under_xdg_cache_home_and_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.delenv("PLANNER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert programs.cache_dir() == tmp_path / "xdg" / "planner" / "programs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert programs.cache_dir() == tmp_path / "home" / ".cache" / "planner" / "programs"
    monkeypatch.setenv("PLANNER_CACHE_DIR", "off")
    assert programs.cache_dir() is None
    programs.program.cache_clear()
    programs.program(M, HW, CHOICES)  # built, kept nowhere
    assert not (tmp_path / "home" / ".cache").exists()


def test_the_key_changes_with_every_input():
    base = programs.key(M, HW, CHOICES, ("time",))
    import dataclasses
    others = [programs.key(dataclasses.replace(M, layers=M.layers + 1), HW, CHOICES, ("time",)),
              programs.key(M, dataclasses.replace(HW, mem_bw=HW.mem_bw * 2), CHOICES,
                           ("time",)),
              programs.key(M, HW, (Choices(zero=2),), ("time",)),
              programs.key(M, HW, CHOICES, ("memory",))]
    assert len({base, *others}) == 5


@pytest.mark.parametrize("data, message", [
    ({"format": 1, "n_args": 1, "ops": [["add", [0, 1]]], "constants": [], "outputs": {}},
     "operation 0"),
    ({"format": 1, "n_args": 1, "ops": [["exec", [0]]], "constants": [], "outputs": {}},
     "operation 0"),
    ({"format": 1, "n_args": 1, "ops": [["const", []]], "constants": [], "outputs": {}},
     "constant 0 has no value"),
    ({"format": 1, "n_args": 1, "ops": [], "constants": [], "outputs": {"x": 5}},
     "names no slot"),
    ({"format": 1, "n_args": 1}, "not program data"),
])
def test_the_data_form_refuses_what_is_not_a_program(data, message):
    with pytest.raises(ValueError, match=message):
        Compiled.from_data(data)


BLOCK_SYMPY = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "sympy" or name.startswith("sympy."):
            raise ImportError("sympy imported on a cache hit")
sys.meta_path.insert(0, Block())
from planner.cli import main
main()
"""
SOLVE = ["solve", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--global-batch",
         "64", "--format", "json"]


def _cli(env, *args, code=None):
    return subprocess.run([sys.executable, "-c", code or "from planner.cli import main; main()",
                           *args], capture_output=True, text=True, env=env)


def test_a_cache_hit_loads_no_sympy_and_answers_the_same(tmp_path):
    env = {**os.environ, "PLANNER_CACHE_DIR": str(tmp_path)}
    cold = _cli(env, *SOLVE)
    assert cold.returncode == 0, cold.stderr
    assert list(tmp_path.glob("*.json"))
    warm = _cli(env, *SOLVE, code=BLOCK_SYMPY)
    assert warm.returncode == 0, warm.stderr

    def steady(out):  # without the wall-clock keys
        doc = json.loads(out)
        for where in (doc, doc.get("search", {})):
            for k in ("build_time_s", "solve_time_s"):
                where.pop(k, None)
        return doc
    assert steady(warm.stdout) == steady(cold.stdout)


def test_two_processes_writing_the_same_entries_leave_whole_files(tmp_path):
    env = {**os.environ, "PLANNER_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", "from planner.cli import main; main()",
                               *SOLVE], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=env) for _ in range(2)]
    assert all(p.wait() == 0 for p in procs)
    entries = list(Path(tmp_path).glob("*.json"))
    assert entries and not list(Path(tmp_path).glob(".tmp-*"))
    for entry in entries:
        Compiled.from_data(json.loads(entry.read_text()))
