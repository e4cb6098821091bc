"""The Python API takes the command line's option names (`tokens`, `deadline`, `budget`,
`within`, ...) as well as its own, a wrong name is a one-line SpecError with "did you mean",
and every field of a solution reads as attributes while the JSON documents stay the same."""

import copy
import dataclasses
import json
import pickle

import click
import pytest

import planner
from planner import api
from planner.errors import SpecError
from planner.inputs import CLI_NAMES, CLI_ONLY
from planner.search.solution import (
    Alternative,
    FrontPoint,
    Knee,
    ObjectiveValue,
    Record,
    SearchInfo,
    Solution,
    TrainingReport,
)

WALL_CLOCK = {"solve_time_s", "build_time_s", "time_s"}


def _steady(doc):
    """A document without the keys that measure this run's wall clock."""
    if isinstance(doc, dict):
        return {k: _steady(v) for k, v in doc.items() if k not in WALL_CLOCK}
    if isinstance(doc, list):
        return [_steady(v) for v in doc]
    return doc


def _doc(sol) -> dict:
    from planner.report import render, solution_doc

    return _steady(json.loads(render.to_json(render.document("solve", solution_doc(sol)))))


# --- the command line's names -------------------------------------------------------------


TTT = dict(global_batch_range=(64, 4096), nodes_max=16, critical_batch=1024, target_steps=2000,
           objective="time-to-train")


@pytest.mark.parametrize(("model", "common", "cli", "old"), [
    ("gpt2", dict(devices_max=16, global_batch=64), dict(tokens=1e10),
     dict(token_budget=1e10)),
    ("alexnet", TTT, dict(deadline=1e6), dict(deadline_s=1e6)),
    ("alexnet", TTT, dict(budget=1e4), dict(budget_usd=1e4)),
    ("alexnet", TTT, dict(deadline=1e6, budget=1e4, price_per_device_hour=2.5),
     dict(deadline_s=1e6, budget_usd=1e4, price_per_device_hour=2.5)),
    ("alexnet", dict(global_batch=1024, nodes_max=32), dict(within=0.05),
     dict(fewest_nodes_within=0.05)),
    ("alexnet", dict(global_batch=256), dict(time_limit=5), dict(time_limit_s=5)),
    ("alexnet", dict(nodes_max=8), dict(global_batch_max=512),
     dict(global_batch_range=(1, 512))),
    ("gpt2", dict(devices_max=16), dict(global_batch_max=128),
     dict(global_batch_range=(1, 128))),
])
def test_solve_takes_the_command_lines_names(model, common, cli, old):
    new = planner.solve(model, "dgx-a100-80gb" if model == "gpt2" else "k80-fdr",
                        **common, **cli)
    was = planner.solve(model, "dgx-a100-80gb" if model == "gpt2" else "k80-fdr",
                        **common, **old)
    assert new.plan == was.plan
    assert _doc(new) == _doc(was)


def test_tokens_rank_by_the_token_budget_as_on_the_command_line():
    sol = planner.solve("gpt2", "dgx-a100-80gb", devices_max=16, global_batch=64, tokens=1e10)
    assert sol.objective.name == "token-budget" and sol.objective.unit == "s"
    assert planner.solve("gpt2", "dgx-a100-80gb", devices_max=16,
                         global_batch=64).objective.name == "throughput"


def test_a_deadline_binds_under_either_name():
    with pytest.raises(Exception) as cli:
        planner.solve("alexnet", "k80-fdr", deadline=1.0, **TTT)
    with pytest.raises(Exception) as old:
        planner.solve("alexnet", "k80-fdr", deadline_s=1.0, **TTT)
    assert type(cli.value) is type(old.value) and str(cli.value) == str(old.value)


def test_sweep_takes_bandwidth_and_the_cluster_timeouts(monkeypatch):
    common = dict(global_batch=1024, nodes=[1, 2, 4])
    one = planner.sweep("alexnet", "k80-fdr", bandwidth=25, **common)
    assert one == planner.sweep("alexnet", "k80-fdr", bandwidths_GBps=[25], **common)
    two = planner.sweep("alexnet", "k80-fdr", bandwidth=[6.25, 25], **common)
    assert two == planner.sweep("alexnet", "k80-fdr", bandwidths_GBps=[6.25, 25], **common)
    assert {p.bandwidth_GBps for p in two.points} == {6.25, 25}
    assert planner.sweep("alexnet", "k80-fdr", time_limit=5, **common) == \
        planner.sweep("alexnet", "k80-fdr", **common)
    # serial: the cluster's settings are unused, as on the command line
    assert planner.sweep("alexnet", "k80-fdr", stall_timeout=5, connect_timeout=3,
                         **common) == planner.sweep("alexnet", "k80-fdr", **common)
    seen = {}

    def in_parallel(specs, **kwargs):
        seen.update(kwargs, model=specs.model_ref)
        return "swept"

    monkeypatch.setattr("planner.sweeping.sweep_in_parallel", in_parallel)
    assert planner.sweep("alexnet", "k80-fdr", jobs=2, stall_timeout=5, connect_timeout=3,
                         **common) == "swept"
    assert seen["stall_timeout_s"] == 5 and seen["connect_timeout_s"] == 3
    assert "stall_timeout" not in seen and seen["model"] == "alexnet"


def test_derive_takes_formula_and_substitute():
    case = dict(global_batch=1024)
    one = planner.derive("alexnet", "k80-fdr", formula="optimal_nodes", **case)
    assert [f.name for f in one] == ["optimal_nodes"]
    assert one == planner.derive("alexnet", "k80-fdr", names=("optimal_nodes",), **case)
    two = planner.derive("alexnet", "k80-fdr", formula=["memory", "speedup"], **case)
    assert two == planner.derive("alexnet", "k80-fdr", names=("memory", "speedup"), **case)
    subbed = planner.derive("alexnet", "k80-fdr", formula="optimal_nodes", substitute="all",
                            **case)
    assert subbed == [f.substituted(None) for f in one]
    with pytest.raises(SpecError, match="substitute: unknown symbol 'nope'"):
        planner.derive("alexnet", "k80-fdr", substitute="nope", **case)


def _long_name(param: click.Parameter) -> str:
    longs = [o for o in param.opts if o.startswith("--")]
    return longs[0][2:].replace("-", "_")


@pytest.mark.parametrize("verb", ["evaluate", "solve", "sweep", "limits", "derive"])
def test_every_command_line_option_is_a_python_argument(verb):
    """Each option of the command (underscored) is an argument of the verb, or one that
    shapes the command line's output only (`CLI_ONLY`, which says what to do instead)."""
    from planner.cli.app import cli

    command = cli.commands[verb]
    accepted = api._accepted(verb)
    for param in command.params:
        if not isinstance(param, click.Option) or param.name in ("model", "hardware"):
            continue
        name = _long_name(param)
        if name in CLI_ONLY:
            continue
        assert name in accepted or CLI_NAMES.get(name) in accepted, (verb, name)


@pytest.mark.parametrize("verb", ["evaluate", "solve", "sweep", "limits", "derive"])
def test_the_old_names_stay(verb):
    """The names scripts already use are all still taken."""
    old = {"evaluate": {"nodes", "global_batch", "memory_headroom", "tp"},
           "solve": {"token_budget", "deadline_s", "budget_usd", "fewest_nodes_within",
                     "time_limit_s", "global_batch_range", "top", "pareto"},
           "sweep": {"bandwidths_GBps", "stall_timeout_s", "connect_timeout_s", "jobs"},
           "limits": {"global_batch", "at_nodes", "tp"},
           "derive": {"names", "global_batch"}}[verb]
    assert old <= api._accepted(verb)


# --- wrong names ----------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda: planner.solve("gpt2", "dgx-a100-80gb", global_batch=64, toknes=1e10),
     "solve: unknown argument 'toknes' (did you mean 'tokens'?)"),
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch=256, withn=0.05),
     "solve: unknown argument 'withn' (did you mean 'within'?)"),
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch=256, deadlin=5),
     "solve: unknown argument 'deadlin' (did you mean 'deadline'?)"),
    (lambda: planner.evaluate("alexnet", "k80-fdr", nodes=2, global_bach=256),
     "evaluate: unknown argument 'global_bach' (did you mean 'global_batch'?)"),
    (lambda: planner.evaluate("gpt2", "dgx-a100-80gb", devices=8, global_batch=64,
                              micro_bach=2),
     "evaluate: unknown argument 'micro_bach' (did you mean 'micro_batch'?)"),
    (lambda: planner.limits("alexnet", "k80-fdr", global_batch=1024, at_node=4),
     "limits: unknown argument 'at_node' (did you mean 'at_nodes'?)"),
    (lambda: planner.limits("gpt2", "dgx-a100-80gb", global_batch=64, tpp=2),
     "limits: unknown argument 'tpp' (did you mean 'tp'?)"),
    (lambda: planner.derive("alexnet", "k80-fdr", global_batch=1024, formulas="memory"),
     "derive: unknown argument 'formulas' (did you mean 'formula'?)"),
    (lambda: planner.sweep("alexnet", "k80-fdr", nodes=[1, 2], global_batch=1024,
                           bandwith=25),
     "sweep: unknown argument 'bandwith' (did you mean 'bandwidth'?)"),
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch=256, zzzzzz=1),
     "solve: unknown argument 'zzzzzz'"),
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch=256, format="json"),
     "solve: 'format' is a command-line option; the Python API returns objects"),
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch=256, plot="p.png"),
     "solve: 'plot' is a command-line option; draw with planner.plot.plan_plot"),
    (lambda: planner.solve("gpt2", "dgx-a100-80gb", global_batch=64, tokens=1e9,
                           token_budget=1e9),
     "solve: give 'tokens' or 'token_budget', not both"),
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch_max=512,
                           global_batch_range=(1, 512)),
     "solve: give 'global_batch_max' or 'global_batch_range', not both"),
    (lambda: planner.limits("alexnet", "k80-fdr"), "limits: missing argument 'global_batch'"),
    (lambda: planner.evaluate("alexnet", "k80-fdr", nodes=2, global_batch=256, tokens=1e9),
     "evaluate: unknown argument 'tokens'"),
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch=256, training=None),
     "solve: unknown argument 'training'"),
])
def test_a_wrong_name_is_one_line_with_did_you_mean(call, message):
    with pytest.raises(SpecError) as err:
        call()
    text = str(err.value)
    assert text.startswith(message) and "\n" not in text


def test_the_family_checks_still_name_the_family():
    with pytest.raises(SpecError, match="tp: --tp applies to transformer models only"):
        planner.solve("alexnet", "k80-fdr", global_batch=256, tp=2)
    with pytest.raises(SpecError, match="token_budget: --tokens applies to transformer"):
        planner.solve("alexnet", "k80-fdr", global_batch=256, tokens=1e9)


# --- attribute objects ----------------------------------------------------------------------


def _attributes(value, path="sol"):
    """Every key of every record under `value` reads as the same attribute."""
    if isinstance(value, Record):
        for key, item in value.items():
            assert getattr(value, key) is item, f"{path}.{key}"
            _attributes(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for k, item in enumerate(value):
            _attributes(item, f"{path}[{k}]")
    else:
        assert not isinstance(value, dict), f"{path} is a plain dict"


@pytest.fixture(scope="module")
def solutions():
    cnn = planner.solve("resnet50", "dgx-a100-80gb", nodes_max=8,
                        global_batch_range=(256, 4096), critical_batch=4096,
                        target_samples=1.2e8, objective="time-to-train", pareto=True, top=2)
    gpt = planner.solve("gpt2", "dgx-a100-80gb", devices_max=16,
                        global_batch_range=(32, 256), critical_batch=128, target_tokens=1e9,
                        objective="cost", pareto=True, top=1)
    split = planner.solve("alexnet", "k80-fdr", global_batch=256, nodes_max=8,
                          strategy="hybrid")
    return cnn, gpt, split


def test_every_solution_field_reads_as_attributes(solutions):
    for sol in solutions[:2]:
        assert isinstance(sol, Solution)
        for f in dataclasses.fields(sol):
            value = getattr(sol, f.name)
            _attributes(value, f"sol.{f.name}")
            # every optional field is exercised here (support: by the test below; the
            # token budget: tests/test_user_terms.py)
            assert value is not None or f.name in ("support", "token_budget"), f.name
        assert isinstance(sol.objective, ObjectiveValue)
        assert sol.objective.value == sol.objective["value"] > 0
        assert sol.objective.name in ("time-to-train", "cost")
        assert isinstance(sol.training, TrainingReport)
        assert sol.training.time_to_train_s == sol.training["time_to_train_s"] > 0
        assert sol.training.cost_usd > 0 and sol.training.steps > 0
        assert isinstance(sol.knee, Knee) and sol.knee.devices >= 1
        assert sol.knee.best_devices == sol.knee["best_devices"]
        assert sol.pareto and all(isinstance(p, FrontPoint) for p in sol.pareto)
        assert sol.pareto[0].config.nodes == sol.pareto[0]["config"]["nodes"] >= 1
        assert sol.pareto[0].time_to_train_s <= sol.pareto[-1].time_to_train_s
        assert sol.alternatives and all(isinstance(a, Alternative) for a in sol.alternatives)
        alt = sol.alternatives[0]
        plan, pred = alt  # still a pair
        assert alt.plan is plan and alt.prediction is pred
        assert isinstance(sol.search, SearchInfo)
        assert sol.search.rows == sol.rows and sol.search.points == sol.points
        # the old dict-style reads keep working
        assert sol.prediction["iteration_time_s"] == sol.prediction.iteration_time_s
        assert {**sol.training}["steps"] == sol.training.steps
        assert dict(sol.objective) == {"name": sol.objective.name, "value": sol.objective.value,
                                       "solver_value": sol.objective.solver_value,
                                       "unit": sol.objective.unit}
    assert solutions[1].training.tokens > 0
    assert solutions[0].support is None  # a CNN's plan: nothing to support


def test_a_split_solution_reads_as_attributes(solutions):
    split = solutions[2]
    for f in dataclasses.fields(split):
        _attributes(getattr(split, f.name), f"split.{f.name}")
    assert split.objective.value == split.objective["value"]
    assert split.config.devices == split.config["devices"]
    assert split.search.candidates >= 1
    assert split.data_parallel.config.nodes >= 1
    assert all(isinstance(layer, Record) for layer in split.plan.layers)


def test_records_are_read_only_and_survive_copies(solutions):
    sol = solutions[0]
    with pytest.raises(TypeError, match="read-only"):
        sol.objective["value"] = 0
    with pytest.raises(AttributeError, match="read-only"):
        sol.objective.value = 0
    with pytest.raises(TypeError):
        sol.training.update(steps=1)
    with pytest.raises(AttributeError, match="no field 'nope'"):
        sol.knee.nope  # noqa: B018
    assert getattr(sol.knee, "nope", None) is None
    changed = dict(sol.objective)
    changed["value"] = 0
    assert sol.objective.value > 0
    for twin in (pickle.loads(pickle.dumps(sol)), copy.deepcopy(sol), dataclasses.replace(sol)):
        assert twin == sol
        assert type(twin.knee) is Knee and type(twin.pareto[0].config) is Record
        assert type(twin.alternatives[0]) is Alternative
    assert "time_to_train_s" in dir(sol.training)


def _plain(sol):
    """`sol` with its records as the plain dicts the searches built."""
    plain = copy.copy(sol)
    for name in ("objective", "training", "pareto", "knee"):
        object.__setattr__(plain, name, json.loads(json.dumps(getattr(sol, name))))
    object.__setattr__(plain, "alternatives", [tuple(a) for a in sol.alternatives])
    return plain


def test_the_json_and_yaml_documents_are_byte_identical(solutions):
    from planner.report import render, solution_doc

    for sol in solutions[:2]:
        plain = _plain(sol)
        assert type(plain.objective) is dict and type(plain.pareto[0]["config"]) is dict
        new = render.document("solve", solution_doc(sol))
        old = render.document("solve", solution_doc(plain))
        assert render.to_json(new) == render.to_json(old)
        assert render.to_yaml(new) == render.to_yaml(old)
        assert render.to_jsonl(new) == render.to_jsonl(old)
        assert all(type(v) is dict for v in (new["objective"], new["knee"], new["pareto"][0]))


def test_the_command_lines_json_keeps_its_schema(run_json):
    import jsonschema

    from planner.schema import schemas

    doc = run_json("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "16",
                   "--global-batch", "64", "--tokens", "1e10", "--format", "json")
    jsonschema.validate(doc, schemas()["solve"])
    sol = planner.solve("gpt2", "dgx-a100-80gb", devices_max=16, global_batch=64, tokens=1e10)
    assert _steady(doc["objective"]) == _steady(dict(sol.objective))
    assert doc["config"] == sol.plan.to_json()
    assert set(_doc(sol)) <= set(doc)


def test_a_pick_no_run_covers_carries_the_covered_plan_and_can_prefer_it():
    """A ZeRO-3 transformer pick has no calibration run behind it: the solution names the
    fastest ZeRO 1 plan beside it (`support`), and prefer_supported F takes that plan when it
    is within 1 + F of the fastest (by default within its error band), in the Python API as on
    the command line (tp overlap
    pinned off: with it free this job's pick keeps the weights whole)."""
    fast = planner.solve("llama3-70b", "dgx-h100", devices=128, global_batch=256,
                         tp_overlap=False, prefer_supported=0.0)
    assert fast.plan.zero == 3 and fast.support.taken is False
    assert fast.support.note.startswith("not covered")
    alt = fast.support.alternative
    assert alt.config.zero == 1 and alt.iteration_time_s > fast.prediction.iteration_time_s
    assert "low_s" in alt.time_band  # the covered plan has a band
    took = planner.solve("llama3-70b", "dgx-h100", devices=128, global_batch=256, tp_overlap=False,
                         prefer_supported=1.0)
    assert took.plan.zero == 1 and took.support.taken
    assert took.prediction.iteration_time_s == alt.iteration_time_s
    assert took.support.fastest_iteration_time_s == fast.prediction.iteration_time_s
    # by default it is taken where it lies within the fastest plan's error band
    band = planner.solve("llama3-70b", "dgx-h100", devices=128, global_batch=256,
                         tp_overlap=False)
    spread = alt.time_band["high_ratio"] / alt.time_band["low_ratio"]
    assert band.support.rule == "band" and band.support.tolerance == pytest.approx(spread - 1)
    assert band.support.taken is (alt.iteration_time_s <= spread * fast.prediction.iteration_time_s)
    assert band.plan.zero == (1 if band.support.taken else 3)
    pinned = planner.solve("llama3-70b", "dgx-h100", devices=128, global_batch=256, zero=3,
                           tp_overlap=False)
    assert pinned.support is None  # a pinned stage is the user's
    with pytest.raises(SpecError, match="prefer_supported: must be a fraction in"):
        planner.solve("llama3-70b", "dgx-h100", devices=128, global_batch=256,
                      prefer_supported=2.0)


@pytest.mark.parametrize("call, says", [
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch="lots"),
     "global_batch: expected an integer, got 'lots'"),
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch=256.5),
     "global_batch: expected an integer, got 256.5"),
    (lambda: planner.solve("llama3-8b", "dgx-h100", devices=8, global_batch_range="256:1024"),
     "global_batch_range: expected 2 numbers (low, high), got '256:1024'"),
    (lambda: planner.evaluate("llama3-8b", "dgx-h100", devices=8, global_batch=64, tp="2"),
     "tp: expected an integer, got '2'"),
    (lambda: planner.limits("alexnet", "k80-fdr", global_batch="x"),
     "global_batch: expected an integer, got 'x'"),
    (lambda: planner.sweep("alexnet", "k80-fdr", global_batch=64, nodes=["1"]),
     "nodes: expected an integer, got '1'"),
    (lambda: planner.solve("alexnet", "k80-fdr", global_batch=256, critical_batch="big"),
     "critical_batch: expected a number, got 'big'"),
])
def test_a_value_of_the_wrong_type_is_one_line(call, says):
    """A Python caller's wrong type is the same one-line SpecError as the command line's,
    never a TypeError from deep inside the search."""
    with pytest.raises(SpecError) as err:
        call()
    assert str(err.value) == says
