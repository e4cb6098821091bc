"""`planner derive` rendered for papers and programs: the paper form keeps every value, the LaTeX
compiles and reads like the papers (symbols on the left, upright multi-letter subscripts, no
double negatives), the Python module runs as printed, and text, JSON and `limits` agree."""

import json
import math
import re
import shutil
import subprocess
import sys

import pytest
import sympy as sp

from planner import api
from planner.expr import symbols as S
from planner.expr.collectives import Collective
from planner.formulas import (
    FORMULAS,
    Derived,
    as_json,
    derive,
    latex_block,
    latex_equation,
    python_module,
    text_block,
)
from planner.latex import LHS, lhs, symbol_latex
from planner.tidy import evaluate, tidy

RESNET = ("-m", "resnet50", "-H", "dgx1-v100", "--global-batch", "4096")
CASES = [(c.value, True) for c in Collective] + [("ring", False)]
TRANSFORMER = ("gpt3-175b", None)
RING_OPTIMUM = {  # issue 13: n* = (1/g) sqrt((B (c - h_1) - 2 M / beta) / (2 k alpha))
    True: r"\frac{1}{g} \sqrt{\frac{B \left(c - h_{1}\right) - \frac{2 M}{\beta_{\mathrm{inter}}}}"
          r"{2 \alpha_{\mathrm{inter}} k}}",
    False: r"\frac{1}{g} \sqrt{\frac{B c - \frac{2 M}{\beta_{\mathrm{inter}}}}"
           r"{2 \alpha_{\mathrm{inter}} k}}",
}
# a sum or a fraction that opens negative, or a minus before a negative group
DOUBLE_NEGATIVE = re.compile(r"--|\+-|\{-|\(-|\\left\(-|-\\frac\{-|-\\left\(-")


@pytest.fixture(scope="module")
def derived():
    """Every formula for each collective (overlap on; ring also off), with time to train, and
    a transformer's (the renderers know no family)."""
    out = {case: derive(api.limits("alexnet", "k80-fdr", global_batch=1024, collective=case[0],
                                   overlap=case[1], critical_batch=2048.0, at_nodes=8))
           for case in CASES}
    out[TRANSFORMER] = api.derive("gpt3-175b", "dgx-a100-80gb", global_batch=1536,
                                  critical_batch=500.0)
    return out


def _all(derived):
    return [(case, d) for case, ds in derived.items() for d in ds]


# 1e-10: the data-parallel roots are a quadratic's, (b + sqrt(b^2 + c)) / 4 alpha with alpha
# ~6e-7 s against b ~0.2 s, and lose about four digits to cancellation in any written order
def _close(x: complex, value: float, rel: float = 1e-10) -> bool:
    return abs(x.imag) <= rel * abs(value) and math.isclose(x.real, value, rel_tol=rel)


def test_every_formula_of_every_case_is_derived(derived):
    names = {d.name for d in derived[TRANSFORMER]}
    assert {"iteration_time", "bubble_fraction", "mfu", "optimal_devices"} <= names
    assert names <= set(LHS)
    for case in CASES:
        names = {d.name for d in derived[case]}
        assert {"iteration_time", "optimal_nodes", "max_speedup", "time_to_train_batch"} <= names
        assert names <= set(FORMULAS), case


def test_paper_form_has_the_value_of_the_formula(derived):
    """The tidied expression and the display form (with its `where` parts) evaluate to
    `Derived.value` to 1e-12 relative, for every formula of every case."""
    for case, d in _all(derived):
        assert _close(evaluate(tidy(d.expression), d.values), d.value), (case, d.name)
        rhs, where = d.shown()
        env = dict(d.values)
        for sym, e in where:
            env[sym] = evaluate(e, env).real
        assert _close(evaluate(rhs, env), d.value), (case, d.name)


def test_ring_optimum_reads_like_the_paper(derived):
    for overlap in (True, False):
        (d,) = [d for d in derived[("ring", overlap)] if d.name == "optimal_nodes"]
        assert "stationary point" in d.note
        assert latex_equation(d) == ("\\begin{equation}\n  n^* = " + RING_OPTIMUM[overlap]
                                     + " \\label{eq:optimal_nodes}\n\\end{equation}")


def test_pipeline_bubble_reads_p_minus_one_over_m_v():
    """Any family's formula renders: the bubble (p - 1) / (m v) of Narayanan et al. SC21,
    given expanded, prints as one fraction; its Python runs."""
    vals = {S.p: 8, S.m: 32, S.v: 2}
    d = Derived("bubble_fraction", "pipeline bubble over compute", "dimensionless",
                sp.expand((S.p - 1) / (S.m * S.v)), vals)
    assert latex_equation(d) == ("\\begin{equation}\n  f_{\\mathrm{bubble}} = \\frac{p - 1}{m v}"
                                 " \\label{eq:bubble_fraction}\n\\end{equation}")
    out = _run_python(python_module([d]))
    assert math.isclose(out["bubble_fraction"], 7 / 64, rel_tol=1e-15)


def test_symbol_names_are_upright_words_and_greek():
    assert symbol_latex("alpha_inter") == r"\alpha_{\mathrm{inter}}"
    assert symbol_latex("beta_intra") == r"\beta_{\mathrm{intra}}"
    assert symbol_latex("B_noise") == r"B_{\mathrm{noise}}"
    assert symbol_latex("T_iter") == r"T_{\mathrm{iter}}"
    assert symbol_latex("t_0") == "t_{0}"
    assert symbol_latex("n_star") == "n^*"
    assert symbol_latex("eta") == r"\eta"
    assert symbol_latex("flops") == r"\mathrm{flops}"


def test_every_formula_name_has_a_left_hand_side():
    assert set(FORMULAS) <= set(LHS)
    assert lhs("iteration_time") == r"T_{\mathrm{iter}}"
    assert lhs("required_bandwidth") == r"\beta_{\mathrm{req}}"
    for name in ("optimal_devices", "optimal_pp", "memory_floor", "comm_bound_from",
                 "tp_comm_bound_from", "max_useful_devices", "mfu", "bubble_fraction",
                 "activation_memory"):
        assert name in LHS
    assert lhs("some_new_formula") == r"\mathrm{some\_new\_formula}"


def test_latex_has_upright_subscripts_and_no_double_negatives(derived):
    for case, ds in derived.items():
        block = latex_block(ds)
        body = block[block.index(r"\begin{align}"):]
        assert r"\beta_{\mathrm{inter}}" in body or case == TRANSFORMER, case
        if any(S.B_noise in d.values for d in ds):
            assert r"B_{\mathrm{noise}}" in body, case
        assert not re.search(r"_\{[A-Za-z]{2,}", body), case  # multi-letter and not upright
        assert not re.search(r"\\mathrm\{[a-z]+\}_", body), case
        flat = re.sub(r"\s+", "", body)
        assert not DOUBLE_NEGATIVE.search(flat), (case, DOUBLE_NEGATIVE.search(flat))
        if case == ("hierarchical", True):
            assert r"\alpha_{\mathrm{intra}}" in body, case
        if case == TRANSFORMER:
            assert r"f_{\mathrm{bubble}} &= \frac{p - 1}{m v}" in body


def test_text_and_python_have_no_double_negatives(derived):
    for case, ds in derived.items():
        for out in [text_block(d) for d in ds] + [python_module(ds)]:
            code = "\n".join(line for line in out.splitlines()
                             if not line.lstrip().startswith(("#", "where", '"""')))
            assert not re.search(r"- -|\+ -|-\(-|\(-", code), (case, code)


def test_json_carries_a_complete_equation(derived):
    for case, d in _all(derived):
        j = as_json(d)
        env = j["latex_equation"]
        assert env.startswith(("\\begin{equation}", "\\begin{align}")), (case, d.name)
        assert j["latex_lhs"] == lhs(d.name)
        assert all(v["unit"] not in ("", "1") for v in j["symbols"].values()), (case, d.name)
        assert all(v["latex"] for v in j["symbols"].values())


def test_glossary_units_are_not_one():
    for sym, meaning in S.GLOSSARY.items():
        assert meaning.unit and meaning.unit != "1", sym
    assert S.GLOSSARY[S.n].unit == "nodes" and S.GLOSSARY[S.k].unit == "calls"


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed")
def test_latex_compiles_with_pdflatex(derived, tmp_path):
    """Every case's `--format latex` block (`latex_block`) and each formula's own environment
    (JSON `latex_equation`), in one minimal document; pdflatex stops at the first error."""
    parts = []
    for ds in derived.values():
        parts.append(latex_block(ds))
        parts += [latex_equation(d) for d in ds]
    doc = ("\\documentclass{article}\n\\usepackage{amsmath}\n\\begin{document}\n"
           + "\n\n".join(parts) + "\n\\end{document}\n")
    (tmp_path / "derive.tex").write_text(doc)
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error",
                           "derive.tex"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "derive.pdf").stat().st_size > 0


def _run_python(module: str) -> dict[str, float]:
    """Run a printed module with `python` (our own output) and read `name = value` lines."""
    proc = subprocess.run([sys.executable, "-"], input=module, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        name, _, value = line.partition(" = ")
        out[name] = float(value)
    return out


def test_python_module_of_every_case_runs_and_gives_the_values(derived):
    for case, ds in derived.items():
        printed = _run_python(python_module(ds))
        assert list(printed) == [d.name for d in ds], case
        for d in ds:
            assert math.isclose(printed[d.name], d.value, rel_tol=1e-10), (case, d.name)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("--collective", "tree", "--critical-batch", "4096",
                                         "--substitute", "all")])
def test_python_output_runs_and_prints_the_values(run, run_json, extra):
    code, module, err = run("derive", *RESNET, *extra, "--format", "python")
    assert code == 0, err
    assert module.splitlines()[0].startswith('"""') and "import math" in module
    printed = _run_python(module)
    doc = run_json("derive", *RESNET, *extra)
    values = {f["name"]: f["value"] for f in doc["formulas"]}
    assert set(printed) == set(values)
    for name, value in values.items():
        assert math.isclose(printed[name], value, rel_tol=1e-10), name


def test_text_value_equals_json_value_equals_limits(run, run_json):
    code, out, err = run("derive", *RESNET, "--formula", "optimal_nodes")
    assert code == 0, err
    text_value = float(re.search(r"value = (\S+) nodes", out).group(1))
    head, body = out.split("\n\n", 1)  # the plan the formulas are read at, then them
    assert head.startswith("read at the plan") and "--collective ring --overlap" in head
    assert body.startswith("optimal_nodes = sqrt(") and "c - h_1" in body
    (f,) = run_json("derive", *RESNET, "--formula", "optimal_nodes")["formulas"]
    limits = run_json("limits", *RESNET)
    assert math.isclose(f["value"], limits["optimal_nodes"], rel_tol=1e-12)
    assert math.isclose(text_value, f["value"], rel_tol=5e-6)
    expr = sp.sympify(f["expression"])  # test-only: our own output, never user input
    got = float(expr.subs({sp.Symbol(k): v["value"] for k, v in f["symbols"].items()}))
    assert math.isclose(got, f["value"], rel_tol=1e-12)
    assert json.dumps(f["latex_equation"]).count("begin{equation}") == 1


def test_every_glossary_symbol_reads_back_as_itself():
    """derive's text and JSON forms are SymPy-readable: no symbol name may parse as one of
    SymPy's functions or constants (gamma, beta, E, I, ...)."""
    for sym in S.GLOSSARY:
        assert sp.sympify(sym.name) == sp.Symbol(sym.name), sym.name


def test_a_formula_with_no_solution_is_infeasible_not_bad_input(run):
    """A well-formed problem whose bound is never reached (no bandwidth gives 80 % here):
    exit 1, as `limits` calls it unreachable, not exit 2."""
    code, _, err = run("derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024",
                       "--no-overlap", "--formula", "required_bandwidth")
    assert code == 1 and "has no solution for this problem" in err, err


def test_substitute_all_gives_numbers_not_products_of_roots(run_json):
    """With every symbol substituted, a formula with no symbol left is one number (the
    optimum had read 38.2130636338908*sqrt(10)), equal to its value."""
    doc = run_json("derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024",
                   "--substitute", "all")
    for f in doc["formulas"]:
        expr = sp.sympify(f["expression"])  # test-only: our own output, never user input
        if not expr.free_symbols:
            assert expr.is_Number, (f["name"], f["expression"])
            assert math.isclose(float(expr), f["value"], rel_tol=1e-12), f["name"]
    assert {f["name"] for f in doc["formulas"]} >= {"optimal_nodes", "iteration_time"}
