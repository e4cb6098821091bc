"""The cost model's own algebra (`planner.expr.graph`): the transformer's expressions built
without SymPy, compiled straight to numpy, and read by `limits` / `derive` as SymPy."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware
from planner.expr import graph as G
from planner.expr import symbols, vocab
from planner.expr.collectives import ring_allreduce
from planner.expr.transformer import PLAN_SYMBOLS, Choices, TransformerExpressions
from planner.numeric import Program
from planner.spec.hardware import Precision


def test_constants_fold_exactly_and_equal_graphs_are_one_node():
    third = G.Rational(1, 3)
    assert (third * 3).args[0] == 1 and isinstance((third * 3).args[0], int)
    assert G.Integer(7) / 2 == Fraction(7, 2)
    assert (vocab.t + 1) is (vocab.t + 1)
    assert vocab.t * 0 == 0 and vocab.t * 1 is vocab.t and vocab.t + 0 is vocab.t
    assert G.Piecewise((vocab.t, True), (vocab.p, True)) is vocab.t
    assert G.Piecewise((vocab.t, False), (vocab.p, vocab.p > 1)).op == "piecewise"
    assert float(G.Max(1, 2.5, Fraction(1, 2))) == 2.5
    with pytest.raises(TypeError):
        bool(vocab.t > 1)


def test_a_pickled_graph_reads_back_as_the_same_nodes():
    import pickle

    e = G.Max(vocab.t * G.Rational(3, 2), vocab.b + 0.5) / (vocab.p - 1)
    assert pickle.loads(pickle.dumps(e)) is e


def test_substitution_takes_either_algebras_symbols_or_names():
    e = (vocab.t - 1) * vocab.b / vocab.t
    assert float(e.subs({vocab.t: 4, "b": 2})) == 1.5
    assert float(e.subs({symbols.t: 4, symbols.b: 2})) == 1.5
    assert e.subs(vocab.t, 1) == 0  # exactly, as the ring over one rank


def test_vocab_is_the_symbols_of_the_same_name():
    """Each graph symbol the transformer is written in is `planner.expr.symbols`' symbol of
    the same identifier and name, so `to_sympy` gives back the glossary's symbols."""
    nodes = {k: v for k, v in vars(vocab).items() if isinstance(v, G.Node)}
    assert len(nodes) >= 30
    for ident, node in nodes.items():
        assert getattr(symbols, ident).name == node.name, ident
        assert G.to_sympy(node) is getattr(symbols, ident)


def test_a_formula_built_in_either_algebra_is_the_same_sympy_expression():
    """The ring allreduce written once (`planner.expr.collectives`) on graph symbols and on
    SymPy symbols: the graph read as SymPy is SymPy's own expression."""
    built = ring_allreduce(vocab.t, vocab.M, vocab.alpha_i, vocab.beta_i)
    direct = ring_allreduce(symbols.t, symbols.M, symbols.alpha_i, symbols.beta_i)
    assert G.to_sympy(built) == direct


CASES = [("llama3-70b", "dgx-h100", "bf16", Choices(recompute="selective", sequence_parallel=True,
                                                     zero=1, flash_attention=True)),
         ("deepseek-v3", "gb200-nvl72", "fp8", Choices(recompute="full", zero=3,
                                                       flash_attention=True, tp_overlap=True,
                                                       ep_overlap=True)),
         ("gpt3-175b", "dgx-a100-80gb", "bf16", Choices(recompute="full", partial=True,
                                                        sequence_parallel=True, zero=2))]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_graph_program_equals_the_sympy_program_of_the_same_expressions(case):
    """Two compilers must agree: `compile_graphs` on the graphs and `planner.numeric.Program`
    on their SymPy form (which SymPy has re-ordered, merged and folded its own way), at random
    plans: to 1e-10 relative, or a picosecond / byte where a difference of near-equal terms
    leaves SymPy's form a rounding residue (3.6e-15 s of DeepSeek-V3's tp_comm at tp 1)."""
    name, system, precision, choices = case
    ex = TransformerExpressions(load_model(name), Hardware.of(load_system(system),
                                                              Precision(precision)), choices)
    keys = ("time", "memory", "dp_comm_exposed", "tp_comm", "activations")
    graphs = {k: ex.terms[k] for k in keys}
    ours = G.compile_graphs(graphs, PLAN_SYMBOLS)
    theirs = Program(G.many_to_sympy(graphs), [G.to_sympy(s) for s in PLAN_SYMBOLS])
    rng = np.random.default_rng(7)
    n = 64
    plan = [rng.choice([1, 2, 4, 8], n), rng.choice([1, 2, 4, 8], n), rng.choice([1, 8, 64], n),
            rng.choice([1, 2], n), rng.choice([1, 4, 16], n), rng.choice([1, 2], n),
            rng.choice([1, 2], n), rng.choice([1, 8], n), rng.choice([1, 2], n),
            rng.choice([1, 2], n), rng.choice([1, 2], n)]
    a, b = ours(*plan), theirs(*plan)
    for k in keys:
        np.testing.assert_allclose(np.broadcast_to(a[k], (n,)), np.broadcast_to(b[k], (n,)),
                                   rtol=1e-10, atol=1e-12, err_msg=k)


def test_a_cold_search_loads_no_sympy(tmp_path):
    """The transformer search with an empty program cache builds its programs without SymPy
    (the cold-start goal: SymPy's import and its expression building were most of it)."""
    code = ("import sys, json, planner; "
            "s = planner.solve('llama3-70b', 'dgx-h100', devices_max=64, global_batch=256); "
            "print(json.dumps([s.plan.tp, 'sympy' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PLANNER_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin",
                              "HOME": str(tmp_path)}, check=True)
    tp, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert tp >= 1 and loaded is False
    assert any(tmp_path.iterdir())  # it built and kept programs
