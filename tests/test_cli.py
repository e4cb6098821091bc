"""CLI contracts: exit codes, one-line errors without tracebacks, JSON keys."""

import json

import pytest


def test_solve_json_contract(run_json):
    doc = run_json("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256")
    assert doc["schema_version"] == 1 and doc["status"] == "optimal"
    for key in ("nodes", "devices_per_node", "devices", "global_batch", "local_batch",
                "collective"):
        assert key in doc["config"]
    for key in ("iteration_time_s", "throughput_samples_per_s", "compute_time_s",
                "communication_time_s", "exposed_communication_time_s",
                "memory_bytes_per_device", "speedup", "efficiency"):
        assert key in doc["prediction"]
    assert "solve_time_s" in doc and "alternatives" in doc


def test_limits_and_show_json_keys(run_json):
    doc = run_json("limits", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024")
    for key in ("optimal_nodes", "max_speedup", "comm_bound_from_nodes", "max_useful_nodes",
                "required_bandwidth_GBps", "efficiency_at_nodes"):
        assert key in doc
    show = run_json("show", "model", "alexnet")
    assert show["params"] == 60_965_224
    assert {"name", "type", "output_shape", "params", "forward_flops_per_sample",
            "activation_elements_per_sample"} <= set(show["layers"][0])


def test_infeasible_exits_1_with_one_line(run):
    code, out, err = run("solve", "-m", "vgg16", "-H", "k80-fdr", "--global-batch", "4096",
                         "--nodes-max", "2")
    assert code == 1 and "memory" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_bad_input_exits_2_without_traceback(run, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    for args in [("show", "model", "nope"), ("show", "model", str(bad)),
                 ("solve", "-m", "alexnet", "-H", "k80-fdr"),
                 ("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "3",
                  "--global-batch", "1000"),
                 ("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch-range", "9:x"),
                 ("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "0")]:
        code, _, err = run(*args)
        assert code == 2, args
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_evaluate_batch_jsonl(run, tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"model": "alexnet", "hardware": "k80-fdr", "nodes": 4,
                             "global_batch": 1024}) + "\n"
                 + json.dumps({"model": "alexnet", "hardware": "k80-fdr", "nodes": 3,
                               "global_batch": 1000}) + "\n")
    code, out, _ = run("evaluate", "--batch", str(f))
    lines = [json.loads(x) for x in out.splitlines()]
    assert code == 2 and len(lines) == 2
    assert lines[0]["config"]["nodes"] == 4 and "error" in lines[1]
    single = json.loads(run("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "4",
                            "--global-batch", "1024", "--format", "json")[1])
    assert single["prediction"] == lines[0]["prediction"]


def test_derive_json_and_sweep(run_json):
    doc = run_json("derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024",
                   "--formula", "optimal_nodes")
    f = doc["formulas"][0]
    assert {"expression", "latex", "symbols", "value"} <= set(f)
    sw = run_json("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024",
                  "--nodes", "1:64:x2")
    assert [p["nodes"] for p in sw["points"]] == [1, 2, 4, 8, 16, 32, 64]


def test_cli_choice_lists_mirror_the_enums():
    """The CLI keeps its choice lists as strings (importing the enums would slow `--help`):
    they must name exactly the enums' values."""
    from planner.cli import params
    from planner.expr.collectives import Collective
    from planner.plan import Kernels, Recompute, Schedule

    assert [x.value for x in Recompute] == params.RECOMPUTE
    assert [x.value for x in Schedule] == params.SCHEDULES
    assert [x.value for x in Kernels] == params.KERNELS
    assert [x.value for x in Collective] == params.COLLECTIVES


def test_the_text_names_the_sequence_length_and_explains_superlinear_scaling(run):
    """The throughput line names the sequence length priced (tokens / samples); a sweep whose
    scaling passes 100 % says why (memory holds the smallest count to a slower plan); a band
    lying wholly on one side of the point says so."""
    code, out, err = run("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16",
                         "--global-batch", "64", "--seq-len", "4096")
    assert code == 0, err
    assert "samples/s of 4,096 tokens" in out
    code, out, err = run("sweep", "-m", "llama3-70b", "-H", "dgx-h100", "--global-batch",
                         "1024", "--nodes", "2,4")
    assert code == 0, err
    assert "scaling above 100 %: at 16 devices memory holds the plan to recompute full" in out
    code, out, err = run("solve", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices-max",
                         "4096", "--global-batch", "1536")
    assert code == 0, err
    likely = next(line for line in out.splitlines() if line.startswith("likely"))
    assert likely.endswith("such runs measured slower than predicted)")


def test_a_transformer_takes_its_whole_node_as_devices_per_node(run):
    """`solve`'s JSON config carries devices_per_node; fed back to `evaluate` (or `solve`) for
    a transformer, the whole node is accepted, any other count is one line, exit 2."""
    base = ("-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--global-batch", "64")
    code, out, err = run("evaluate", *base, "--tp", "2", "--devices-per-node", "8")
    assert code == 0 and "2 nodes x 8 devices" in out, err
    assert run("solve", *base, "--devices-per-node", "8")[0] == 0
    code, _, err = run("evaluate", *base, "--devices-per-node", "4")
    assert code == 2 and "whole nodes of 8 devices" in err and len(err.strip().splitlines()) == 1


def test_a_batch_line_takes_a_transformers_whole_node_too(run, tmp_path):
    lines = tmp_path / "b.jsonl"
    line = {"model": "llama3-8b", "hardware": "dgx-h100", "devices": 16, "global_batch": 64}
    lines.write_text(json.dumps({**line, "devices_per_node": 8}) + "\n"
                     + json.dumps({**line, "devices_per_node": 4}) + "\n")
    code, out, _ = run("evaluate", "--batch", str(lines))
    first, second = (json.loads(x) for x in out.splitlines())
    assert code == 2 and first["config"]["devices_per_node"] == 8
    assert "whole nodes of 8 devices" in second["error"]["message"]


@pytest.mark.parametrize("pins, named", [
    (("--tp", "4", "--cp", "4", "--pp", "8"), ["tp", "cp", "pp"]),  # 128 ranks > 64 devices
    (("--tp", "8", "--cp", "8", "--pp", "2"), ["tp", "cp", "pp"]),
])
def test_infeasible_pins_name_the_smallest_set_that_conflicts_together(run, pins, named):
    """No split of 64 devices holds tp x cp x pp = 128: the error names the three pins
    together (the smallest set no plan meets), not one that alone would be feasible."""
    base = ("solve", "-m", "llama3-8b", "-H", "dgx-h100", "--devices-max", "64",
            "--global-batch", "64", "--format", "json")
    code, out, _ = run(*base, *pins)
    error = json.loads(out)["error"]
    assert code == 1 and error["kind"] == "infeasible" and error["constraints"] == named
    for one in named:  # each alone is feasible
        i = pins.index(f"--{one}")
        assert run(*base, *pins[i:i + 2])[0] == 0


def test_a_sweep_grid_over_the_cap_is_refused_at_once(run):
    """Each list is capped alone; their product too: two long ranges are one line, exit 2,
    not hours of pricing."""
    code, out, err = run("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch",
                         "1:99999", "--nodes", "1:99999")
    assert code == 2 and "at most 100,000" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("nodes, says", [
    ("1:2000000", "1 <= A <= B <= 1,000,000"),
    ("1:64:x4", "no other step"),
    ("1:200000", "at most 100,000 values"),
    ("abc", "with positive integers"),
])
def test_a_bad_node_range_says_what_is_wrong(run, nodes, says):
    code, _, err = run("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
                       "--nodes", nodes)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
