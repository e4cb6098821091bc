"""One plan type and one prediction type for every model family: the plan checks itself and
spells out the arithmetic; a pin no plan of the model can meet is bad input (exit 2), a request
the hardware cannot satisfy is infeasible (exit 1); the objectives are one enum."""

import pytest

from planner.errors import SpecError
from planner.plan import Plan
from planner.prediction import Config
from planner.search.objective import Objective, objective_for


def test_plan_errors_spell_out_the_arithmetic():
    with pytest.raises(SpecError, match=r"^devices: tp\(8\) x pp\(3\) x dp\(5\) = 120 != 128 "
                                        r"devices \(16 nodes x 8\)$"):
        Plan(16, 8, tp=8, pp=3, dp=5, micro_batch=1, global_batch=120)
    with pytest.raises(SpecError, match=r"^global_batch: global batch 1000 is not divisible by "
                                        r"dp\(16\) x micro-batch\(4\) = 64$"):
        Plan(2, 8, tp=1, pp=1, dp=16, micro_batch=4, global_batch=1000)
    with pytest.raises(SpecError, match=r"tp\(2\) x pp\(3\) x dp\(2\) = 12 is more than one node "
                                        r"and not a multiple of 8"):
        Plan.split(2, 3, 2, 1, 64, node_size=8)
    with pytest.raises(SpecError, match=r"interleave: 2 virtual stages need pp > 1"):
        Plan.split(1, 1, 8, 1, 64, node_size=8, interleave=2)
    with pytest.raises(SpecError, match=r"multiple of pp\(4\)"):
        Plan.split(1, 4, 2, 1, 12, node_size=8, interleave=2)  # 6 micro-batches, pp 4
    with pytest.raises(SpecError, match=r"zero: must be 0, 1, 2 or 3, got 4"):
        Plan.split(1, 1, 8, 1, 64, node_size=8, zero=4)
    with pytest.raises(SpecError, match=r"recompute: unknown value 'some'"):
        Plan.split(1, 1, 8, 1, 64, node_size=8, recompute="some")
    with pytest.raises(SpecError, match=r"micro_batch: must be a positive integer, got 0"):
        Plan(1, 8, tp=1, pp=1, dp=8, micro_batch=0, global_batch=64)
    with pytest.raises(SpecError, match=r"global_batch: 100 is not divisible by 8 devices"):
        Config(1, 8, 100, "ring")


def test_a_data_parallel_plan_is_the_same_type_with_tp_pp_1():
    cnn = Config(2, 4, 256, "ring", True)
    assert isinstance(cnn, Plan)
    assert (cnn.tp, cnn.pp, cnn.dp, cnn.micro_batch, cnn.accumulation) == (1, 1, 8, 32, 1)
    assert cnn.devices == 8 and cnn.local_batch == 32
    hybrid = Plan.split(2, 2, 4, 2, 64, node_size=8)
    assert (hybrid.nodes, hybrid.devices_per_node, hybrid.accumulation) == (2, 8, 8)
    assert set(cnn.to_json()) == set(hybrid.to_json()) | {"collective"}
    small = Plan.split(1, 1, 4, 1, 8, node_size=8)  # part of one node
    assert (small.nodes, small.devices_per_node) == (1, 4)


def test_prediction_and_config_keys_are_the_same_for_every_family(run_json):
    cnn = run_json("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "2",
                   "--global-batch", "256")
    tr = run_json("evaluate", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "8", "--tp",
                  "2", "--global-batch", "64")
    common = {"iteration_time_s", "samples_per_s", "throughput_samples_per_s", "compute_time_s",
              "exposed_communication_time_s", "optimizer_time_s", "time_breakdown",
              "memory_bytes_per_device", "memory_breakdown", "memory_capacity_bytes",
              "fits_memory", "fits_in_memory"}
    for doc in (cnn, tr):
        pred = doc["prediction"]
        assert common <= set(pred)
        assert pred["throughput_samples_per_s"] == pred["samples_per_s"]
        assert pred["fits_in_memory"] == pred["fits_memory"]
        assert set(pred["memory_breakdown"]) == {"weights", "gradients", "optimizer",
                                                 "activations"}
        assert {"compute", "optimizer"} <= set(pred["time_breakdown"])
        # the parts add up to the iteration time
        assert sum(pred["time_breakdown"].values()) == pytest.approx(pred["iteration_time_s"],
                                                                     rel=1e-9)
    assert set(cnn["config"]) - {"collective"} == set(tr["config"])
    assert {"speedup", "efficiency"} <= set(cnn["prediction"])
    assert {"tokens_per_s", "mfu", "hfu"} <= set(tr["prediction"])


@pytest.mark.parametrize(("args", "match"), [
    (("--tp", "5"), "tp: 5 does not divide heads 12"),             # gpt2: 12 heads
    (("--pp", "13"), "pp: 13 stages for 12 layers"),
    (("--interleave", "7"), "interleave: 7 virtual stages"),
    (("--pp", "4", "--interleave", "4"), "at most ceil(layers / pp) = 3"),
])
def test_a_pin_no_plan_of_the_model_can_meet_is_bad_input(run, args, match):
    for command in ("solve", "evaluate"):
        code, _, err = run(command, "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "16",
                           "--global-batch", "64", *args)
        assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args", [
    ("-m", "gpt3-175b", "--devices-max", "8", "--global-batch", "1536"),  # memory
    ("-m", "gpt2", "--devices", "8", "--dp", "16", "--global-batch", "64"),  # 16 replicas on 8
    ("-m", "gpt2", "--devices", "16", "--tp", "4", "--micro-batch", "3", "--global-batch", "64"),
])
def test_a_request_the_hardware_or_the_batch_cannot_meet_is_infeasible(run, args):
    code, _, err = run("solve", "-H", "dgx-a100-80gb", *args)
    assert code == 1 and err.startswith("planner: infeasible") and len(err.strip().splitlines()) == 1


def test_objectives_are_one_enum_each_family_says_what_it_supports(run):
    assert objective_for("cost", "cnn") is Objective.cost
    assert objective_for("token-budget", "transformer") is Objective.token_budget
    code, out, _ = run("solve", "--help")
    assert code == 0 and all(o.value in out for o in Objective)
    for model, objective in (("gpt2", "efficiency"), ("alexnet", "token-budget")):
        code, _, err = run("solve", "-m", model, "-H", "dgx-a100-80gb", "--global-batch", "64",
                           "--objective", objective)
        assert code == 2 and objective in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SpecError, match="efficiency applies to CNN models only"):
        objective_for("efficiency", "transformer")


def test_the_plan_vocabulary_imports_no_sympy():
    """`planner.plan` (and the `Collective` it uses, `planner.vocabulary`) is a leaf: building
    or reading a plan loads neither SymPy nor OR-Tools (issue: one request path, fast CLI)."""
    import subprocess
    import sys

    code = ("import sys, planner.plan, planner.vocabulary; "
            "print(sorted(m for m in ('sympy', 'ortools', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
