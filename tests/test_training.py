"""Time-to-train and cost (McCandlish et al. 2018): formulas, the batch the objective picks,
the Pareto front, and the flags' errors."""

import math

import pytest

from planner import api

RESNET = dict(model="resnet50", hardware="dgx-a100-80gb", nodes_max=64,
              global_batch_range=(256, 65536))


def test_time_to_train_picks_a_smaller_batch_than_throughput():
    fast = api.solve(**RESNET)
    ttt = api.solve(**RESNET, objective="time-to-train", critical_batch=4096,
                    target_samples=1.2e8)
    assert ttt.status == "optimal"
    assert ttt.config.global_batch < fast.config.global_batch
    # steps = S_min (1 + B_noise / B) with S_min = E_min / B_noise (McCandlish eq. 2.11)
    b = ttt.config.global_batch
    steps = 1.2e8 / 4096 * (1 + 4096 / b)
    assert math.isclose(ttt.training["steps"], steps, rel_tol=1e-12)
    assert math.isclose(ttt.training["time_to_train_s"],
                        steps * ttt.prediction.iteration_time_s, rel_tol=1e-9)
    assert math.isclose(ttt.objective["value"], ttt.training["time_to_train_s"], rel_tol=1e-9)
    # samples E(B) = E_min (1 + B / B_noise)
    assert math.isclose(ttt.training["samples"], 1.2e8 * (1 + b / 4096), rel_tol=1e-12)


def test_time_to_train_optimum_beats_every_batch_by_brute_force():
    kw = dict(model="resnet50", hardware="dgx-a100-80gb", nodes=4, critical_batch=2048,
              target_steps=1000.0)
    sol = api.solve(**kw, global_batch_range=(32, 4096), objective="time-to-train")
    best = math.inf
    for b in range(32, 4097, 32):  # 32 devices: the global batch is a multiple of 32
        ev = api.evaluate("resnet50", "dgx-a100-80gb", nodes=4, global_batch=b)
        if ev.prediction.fits_memory:
            best = min(best, 1000 * (1 + 2048 / b) * ev.prediction.iteration_time_s)
    assert math.isclose(sol.training["time_to_train_s"], best, rel_tol=1e-9)


def test_pareto_front_cost_rises_as_time_falls():
    sol = api.solve(**RESNET, objective="time-to-train", critical_batch=4096,
                    target_samples=1.2e8, pareto=True)
    front = sol.pareto
    assert len(front) >= 3
    times = [p["time_to_train_s"] for p in front]
    costs = [p["cost_usd"] for p in front]
    assert times == sorted(times)
    assert all(a > b for a, b in zip(costs, costs[1:], strict=False))  # faster costs more
    price = 5.12  # a100-sxm4-80gb spec
    for p in front[:3]:
        cfg = p["config"]
        ev = api.evaluate("resnet50", "dgx-a100-80gb", nodes=cfg["nodes"],
                          devices_per_node=cfg["devices_per_node"],
                          global_batch=cfg["global_batch"], collective=cfg["collective"])
        t = p["steps"] * ev.prediction.iteration_time_s
        assert math.isclose(p["time_to_train_s"], t, rel_tol=1e-9)
        assert math.isclose(p["cost_usd"], t / 3600 * cfg["devices"] * price, rel_tol=1e-9)
    # the time-to-train optimum is the front's fastest point
    assert math.isclose(front[0]["time_to_train_s"], sol.training["time_to_train_s"],
                        rel_tol=1e-9)


@pytest.mark.parametrize(("args", "match"), [
    (("--objective", "time-to-train"), "critical-batch"),
    (("--objective", "time-to-train", "--critical-batch", "4096"), "exactly one"),
    (("--critical-batch", "4096", "--target-steps", "10", "--target-samples", "10"),
     "exactly one"),
    (("--target-steps", "10"), "critical-batch"),
])
def test_training_flag_errors(run, args, match):
    code, _, err = run("solve", "-m", "resnet50", "-H", "dgx-a100-80gb", "--global-batch",
                       "1024", *args)
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1


def test_cost_needs_a_price_and_takes_the_flag(run, run_json):
    args = ("solve", "-m", "alexnet", "-H", "titanx-fdr", "--global-batch", "256",
            "--objective", "cost", "--critical-batch", "512", "--target-steps", "100")
    code, _, err = run(*args)  # titan-x-maxwell has no price in its spec
    assert code == 2 and "price" in err and len(err.strip().splitlines()) == 1
    doc = run_json(*args, "--price-per-device-hour", "0.5")
    pred = doc["prediction"]
    assert math.isclose(pred["cost_usd"], pred["time_to_train_s"] / 3600
                        * doc["config"]["devices"] * 0.5, rel_tol=1e-12)
    assert math.isclose(doc["objective"]["value"], pred["cost_usd"], rel_tol=1e-9)


@pytest.mark.slow
def test_deadline_and_budget_constraints_agree_with_the_front(tmp_path):
    kw = dict(**RESNET, critical_batch=4096, target_samples=1.2e8)
    front = api.solve(**kw, objective="time-to-train", pareto=True).pareto
    deadline = front[len(front) // 3]["time_to_train_s"] * 1.0001
    cheapest = api.solve(**kw, objective="cost", deadline_s=deadline)
    assert cheapest.training["time_to_train_s"] <= deadline
    # the cheapest plan within the deadline is the cheapest front point within it
    best = min(p["cost_usd"] for p in front if p["time_to_train_s"] <= deadline)
    assert math.isclose(cheapest.training["cost_usd"], best, rel_tol=1e-9)
    budget = front[len(front) // 2]["cost_usd"] * 1.0001
    fastest = api.solve(**kw, objective="time-to-train", budget_usd=budget)
    assert fastest.training["cost_usd"] <= budget
    best = min(p["time_to_train_s"] for p in front if p["cost_usd"] <= budget)
    assert math.isclose(fastest.training["time_to_train_s"], best, rel_tol=1e-9)


def test_an_impossible_deadline_is_infeasible_and_named(run):
    code, _, err = run("solve", "-m", "resnet50", "-H", "dgx-a100-80gb", "--nodes-max", "8",
                       "--global-batch-range", "256:4096", "--critical-batch", "4096",
                       "--target-samples", "1.2e8", "--deadline", "1")
    assert code == 1 and "time to train <= 1 s" in err


def test_pareto_plot_is_written(tmp_path, run):
    out = tmp_path / "front.png"
    code, _, err = run("solve", "-m", "resnet50", "-H", "dgx-a100-80gb", "--nodes-max", "4",
                       "--global-batch-range", "256:2048", "--critical-batch", "4096",
                       "--target-samples", "1.2e8", "--pareto", "--plot", str(out))
    assert code == 0, err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_over_batch_and_bandwidth(run_json):
    doc = run_json("sweep", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "2,8",
                   "--global-batch", "256,1024", "--bandwidth", "1,6.25,25",
                   "--critical-batch", "512", "--target-steps", "1000")
    pts = doc["points"]
    assert len(pts) == 2 * 2 * 3
    for p in pts:
        assert math.isclose(p["steps"], 1000 * (1 + 512 / p["global_batch"]), rel_tol=1e-12)
        assert math.isclose(p["time_to_train_s"], p["steps"] * p["iteration_time_s"],
                            rel_tol=1e-12)
    # more bandwidth never predicts slower, at every (nodes, batch)
    for n in (2, 8):
        for b in (256, 1024):
            times = [p["iteration_time_s"] for p in sorted(
                (p for p in pts if p["nodes"] == n and p["global_batch"] == b),
                key=lambda p: p["bandwidth_GBps"])]
            assert times == sorted(times, reverse=True)
    # 1 GB/s on 8 nodes is communication bound: slower than the spec's FDR
    slow = next(p for p in pts if p["nodes"] == 8 and p["global_batch"] == 1024
                and p["bandwidth_GBps"] == 1)
    fast = next(p for p in pts if p["nodes"] == 8 and p["global_batch"] == 1024
                and p["bandwidth_GBps"] == 6.25)
    assert slow["iteration_time_s"] > 1.5 * fast["iteration_time_s"]


def test_plot_without_matplotlib_is_a_clear_error(tmp_path, run, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code, _, err = run("sweep", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
                       "--nodes", "1,2", "--plot", str(tmp_path / "s.png"))
    assert code == 2 and "pip install 'planner[plot]'" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("model", "hw", "kw"), [
    ("resnet50", "dgx-a100-80gb", dict(global_batch=4096, at_nodes=8)),
    ("alexnet", "k80-fdr", dict(global_batch=1024, overlap=False)),
    ("alexnet", "k80-fdr", dict(global_batch=1024, collective="tree", at_nodes=16)),
    ("vgg16", "dgx-a100-80gb", dict(global_batch=2048, at_nodes=4)),
])
def test_time_to_train_batch_closed_form_beats_a_dense_numeric_search(model, hw, kw):
    import numpy as np

    lim = api.limits(model, hw, critical_batch=3000.0, **kw)
    B, n = lim.time_to_train_batch
    best = lim.time_per_min_step(n, B)
    gn = lim.g * n
    grid = np.geomspace(gn, gn * lim._b_max(), 4000)
    numeric = min(lim.time_per_min_step(n, x) for x in grid)
    assert best <= numeric * (1 + 1e-9)          # nothing on the grid is better
    assert best >= numeric * (1 - 2e-3)          # and the grid gets close to it
    doc = lim.summary()["time_to_train"]
    assert doc["global_batch"] == B and doc["nodes"] == n


@pytest.mark.parametrize(("model", "hw", "kw"), [
    ("resnet50", "dgx-a100-80gb", dict(global_batch=4096)),
    ("alexnet", "k80-fdr", dict(global_batch=1024, overlap=False)),
    ("alexnet", "k80-fdr", dict(global_batch=1024, collective="tree")),
    ("googlenet", "k80-fdr", dict(global_batch=1024, collective="hierarchical")),
])
def test_joint_time_to_train_optimum_beats_a_dense_numeric_search(model, hw, kw):
    """(nodes, batch) from the closed forms against every node count up to the cap, each on a
    dense geometric grid of batches within memory."""
    import numpy as np

    lim = api.limits(model, hw, critical_batch=3000.0, nodes_max=128, **kw)
    B, n = lim.time_to_train_batch
    best = float(lim.time_per_min_step(n, B))
    ns = np.arange(1, 129, dtype=float)[:, None]
    grid = lim.g * ns * np.geomspace(1, lim._b_max(), 1500)[None, :]
    numeric = float(np.min(lim.time_per_min_step(ns, grid)))
    assert best <= numeric * (1 + 1e-9)
    assert best >= numeric * (1 - 2e-3)
    assert n == int(n) and 1 <= n <= 128
    doc = lim.summary()["time_to_train"]
    assert doc["nodes_chosen"] and doc["nodes"] == n and doc["global_batch"] == B


def test_joint_time_to_train_optimum_bounds_the_solver():
    """The continuous-batch optimum of `limits` is a lower bound on the solver's integer plans
    and close to it (two independent routes: closed forms vs CP-SAT over rows)."""
    lim = api.limits("resnet50", "dgx-a100-80gb", global_batch=4096, critical_batch=4096.0,
                     nodes_max=32)
    B, n = lim.time_to_train_batch
    bound = float(lim.time_per_min_step(n, B))
    sol = api.solve("resnet50", "dgx-a100-80gb", nodes_max=32, devices_per_node=8,
                    collective="ring", global_batch_range=(8, 2**17),
                    objective="time-to-train", critical_batch=4096.0, target_steps=1.0)
    per_min_step = sol.training["time_to_train_s"]  # S_min = 1
    assert bound <= per_min_step * (1 + 1e-9)
    assert per_min_step <= bound * 1.01
    assert abs(sol.config.nodes - n) <= 0.25 * n


def test_derive_gives_the_time_to_train_batch_formula(run_json):
    # a V100 (no issue floor fitted): the optimum is the stationary point, where B_noise enters
    doc = run_json("derive", "-m", "resnet50", "-H", "dgx1-v100", "--global-batch", "4096",
                   "--critical-batch", "4096", "--formula", "time_to_train_batch")
    (f,) = doc["formulas"]
    lim = api.limits("resnet50", "dgx1-v100", global_batch=4096, critical_batch=4096.0)
    assert math.isclose(f["value"], lim.time_to_train_batch[0], rel_tol=1e-9)
    assert "B_noise" in f["symbols"] and "n" in f["symbols"]


# --- transformers: the hybrid search over a batch range --------------------------------------

GPT2 = ("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "64",
        "--global-batch-range", "64:4096")
GPT2_TRAIN = ("--critical-batch", "512", "--target-tokens", "1e10")


def test_transformer_time_to_train_picks_a_smaller_batch_than_throughput(run_json):
    fast = run_json(*GPT2)
    ttt = run_json(*GPT2, *GPT2_TRAIN, "--objective", "time-to-train")
    assert fast["config"]["global_batch"] == 4096  # throughput: the largest batch offered
    b = ttt["config"]["global_batch"]
    assert b < fast["config"]["global_batch"]
    # --target-tokens sets E_min in tokens: S_min = tokens / seq_len / B_noise (gpt2: 1024)
    pred = ttt["prediction"]
    steps = 1e10 / 1024 / 512 * (1 + 512 / b)
    assert math.isclose(pred["steps"], steps, rel_tol=1e-12)
    assert math.isclose(pred["tokens"], pred["samples"] * 1024, rel_tol=1e-12)
    assert math.isclose(pred["time_to_train_s"], steps * pred["iteration_time_s"], rel_tol=1e-12)
    assert math.isclose(ttt["objective"]["value"], pred["time_to_train_s"], rel_tol=1e-12)
    # the plan is what `evaluate` predicts for it
    c = ttt["config"]
    ev = api.evaluate_transformer("gpt2", "dgx-a100-80gb", global_batch=b, devices=c["devices"],
                                  tp=c["tp"], pp=c["pp"], micro_batch=c["micro_batch"],
                                  interleave=c["interleave"], recompute=c["recompute"],
                                  sequence_parallel=c["sequence_parallel"], zero=c["zero"])
    assert ev.prediction.iteration_time_s == pred["iteration_time_s"]


def test_transformer_pareto_front_and_launcher_agree(run, run_json):
    doc = run_json(*GPT2, *GPT2_TRAIN, "--objective", "cost", "--pareto")
    front = doc["pareto"]
    assert len(front) >= 2
    costs = [p["cost_usd"] for p in front]
    assert all(a > b for a, b in zip(costs, costs[1:], strict=False))  # faster costs more
    assert math.isclose(doc["objective"]["value"], min(costs), rel_tol=1e-12)
    code, out, _ = run(*GPT2, *GPT2_TRAIN, "--objective", "cost", "--format", "megatron")
    assert code == 0
    assert f"--global-batch-size {doc['config']['global_batch']}" in out


@pytest.mark.parametrize(("args", "match", "exit_code"), [
    (("--objective", "time-to-train"), "critical-batch", 2),
    (("--critical-batch", "512", "--target-tokens", "1e9", "--target-samples", "10"),
     "target_tokens", 2),
    (("--objective", "cost", "--critical-batch", "512", "--target-steps", "10",
      "--price-per-device-hour", "1", "--budget", "1e-9"), "cost to train <= 1e-09 USD", 1),
    (("--critical-batch", "512", "--target-steps", "10", "--deadline", "1e-6"),
     "time to train <= 1e-06 s", 1),
])
def test_transformer_training_errors(run, args, match, exit_code):
    code, _, err = run(*GPT2, *args)
    assert code == exit_code and match in err and len(err.strip().splitlines()) == 1


def test_target_tokens_is_for_transformers(run):
    code, _, err = run("solve", "-m", "resnet50", "-H", "dgx-a100-80gb", "--global-batch",
                       "1024", "--critical-batch", "4096", "--target-tokens", "1e9")
    assert code == 2 and "target_tokens" in err


def test_transformer_sweep_points_are_the_pinned_solves(run, run_json, tmp_path):
    args = ("sweep", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--global-batch", "1536",
            "--nodes", "4,16,64", "--critical-batch", "4096", "--target-tokens", "3e11")
    doc = run_json(*args)
    (skip,) = doc["skipped"]
    assert skip["nodes"] == 4 and "memory" in skip["reason"]  # 32 A100s cannot hold 175B
    assert [p["nodes"] for p in doc["points"]] == [16, 64]
    assert doc["points"][0]["scaling_efficiency"] == 1.0
    for p in doc["points"]:
        sol = api.solve_transformer("gpt3-175b", "dgx-a100-80gb", global_batch=1536,
                                    devices=p["nodes"] * 8)
        assert p["config"]["devices"] == p["nodes"] * 8
        assert p["prediction"]["iteration_time_s"] == sol.prediction.iteration_time_s
        steps = 3e11 / 2048 / 4096 * (1 + 4096 / 1536)
        assert math.isclose(p["prediction"]["steps"], steps, rel_tol=1e-12)
    a, b = doc["points"]
    ratio = (b["prediction"]["tokens_per_s"] / 512) / (a["prediction"]["tokens_per_s"] / 128)
    assert math.isclose(b["scaling_efficiency"], ratio, rel_tol=1e-12)
    # pins hold at every point; the plot is written
    out = tmp_path / "s.svg"
    code, _, err = run("sweep", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--global-batch",
                       "1536", "--nodes", "16,64", "--tp", "8", "--plot", str(out))
    assert code == 0, err
    assert out.read_text().lstrip().startswith("<?xml")
    pinned = run_json("sweep", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--global-batch",
                      "1536", "--nodes", "16,64", "--tp", "8")
    assert all(p["config"]["tp"] == 8 for p in pinned["points"])


@pytest.mark.parametrize(("args", "match"), [
    (("-m", "gpt2", "--local-batch", "8"), "local_batch"),
    (("-m", "gpt2"), "global_batch"),
    (("-m", "alexnet", "--global-batch", "256", "--tp", "2"), "tp"),
    (("-m", "alexnet", "--global-batch", "256", "--critical-batch", "10", "--target-tokens",
      "1e6"), "target_tokens"),
])
def test_sweep_flag_errors(run, args, match):
    code, _, err = run("sweep", "-H", "dgx-a100-80gb", *args)
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1


def test_sweep_cost_is_time_x_devices_x_price(run_json):
    base = ("sweep", "-m", "resnet50", "-H", "dgx-a100-80gb", "--global-batch", "4096",
            "--nodes", "1,4", "--critical-batch", "4096", "--target-samples", "1.2e8")
    for extra, price in (((), 5.12), (("--price-per-device-hour", "2"), 2.0)):
        for p in run_json(*base, *extra)["points"]:
            assert math.isclose(p["cost_usd"], p["time_to_train_s"] / 3600 * p["devices"] * price,
                                rel_tol=1e-12)
    doc = run_json("sweep", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--global-batch", "1536",
                   "--nodes", "16", "--critical-batch", "4096", "--target-tokens", "3e11",
                   "--price-per-device-hour", "1.5")
    (p,) = doc["points"]
    pred = p["prediction"]
    assert math.isclose(pred["cost_usd"], pred["time_to_train_s"] / 3600 * 128 * 1.5,
                        rel_tol=1e-12)


def test_time_to_train_formula_needs_the_critical_batch(run):
    code, _, err = run("derive", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024",
                       "--formula", "time_to_train_batch")
    assert code == 2 and "needs --critical-batch" in err


def test_sweep_scaling_is_per_bandwidth_and_batch_whatever_their_order(run_json):
    """Each swept bandwidth and global batch is its own series: its fewest-devices point is
    100 %, no point is measured against another network or batch, and the order the lists are
    given in changes nothing (a CNN sweep too, and a weak-scaling one over bandwidth)."""
    def eff(*args):
        doc = run_json("sweep", *args)
        return {(p["bandwidth_GBps"], p["global_batch"], p["nodes"]): p["scaling_efficiency"]
                for p in doc["points"]}

    a = eff("-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256,1024", "--nodes", "2,8",
            "--bandwidth", "2,20")
    b = eff("-m", "alexnet", "-H", "k80-fdr", "--global-batch", "1024,256", "--nodes", "8,2",
            "--bandwidth", "20,2")
    assert a == b and len(a) == 8
    assert all(v == 1.0 for (bw, batch, n), v in a.items() if n == 2)
    weak = eff("-m", "alexnet", "-H", "k80-fdr", "--local-batch", "64", "--nodes", "2,8",
               "--bandwidth", "2,20")
    assert all(v == 1.0 for (bw, batch, n), v in weak.items() if n == 2)
    assert all(v <= 1.0 for (bw, batch, n), v in weak.items() if n == 8)
    assert weak[2, 1024, 8] < 1.0  # the slow network's exposed sync
