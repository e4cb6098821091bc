"""Transformers: exact counts against the published formulas, memory against Korthikanti et al.,
the hybrid solver against brute force, evaluate == solve, and the CLI contract."""

import dataclasses
import functools
import itertools
import math

import numpy as np
import pytest

from planner import api
from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, activation_bytes_per_layer, hardware_flops_per_sequence
from planner.errors import SpecError
from planner.search.hybrid import HybridSolver, Plan, Search, candidate_batches, predict
from planner.search.training import Training
from planner.spec.hardware import Precision
from planner.spec.transformer import build_transformer

SC21 = ["gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b", "gpt-39.1b", "gpt-76.1b",
        "gpt-145.6b", "gpt-310.1b", "gpt-529.6b", "gpt-1t"]


@pytest.mark.parametrize(("name", "params"), [
    ("gpt2", 124_337_664),            # bias-free GPT-2 small, tied embeddings (issue 3)
    ("bert-large", 335_141_888),      # Devlin et al.: with token types and pooler
    ("llama2-7b", 6_738_415_616),     # Meta's released checkpoint
    ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248),
    ("llama3-70b", 70_553_706_496),
    ("llama3-405b", 405_853_388_800),
])
def test_exact_parameter_totals(name, params):
    assert load_model(name).params() == params


def test_gpt2_with_biases_is_the_hugging_face_count():
    data = {"kind": "transformer", "name": "g", "layers": 12, "hidden": 768, "heads": 12,
            "seq_len": 1024, "vocab": 50257}
    assert build_transformer(data, "t").params() == 124_439_808


@pytest.mark.parametrize("name", SC21)
def test_params_follow_the_sc21_closed_form(name):
    m = load_model(name)
    l, h, V, s = m.layers, m.hidden, m.vocab, m.seq_len
    # Narayanan et al. SC21 sec. 5.1: 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h)),
    # which leaves out the final layer norm (2 h)
    assert m.params() == 12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h


@pytest.mark.parametrize("name", SC21 + ["gpt3-175b"])
def test_flops_itemised_equal_sc21_eq3(name):
    m = load_model(name)
    l, h, V, s = m.layers, m.hidden, m.vocab, m.seq_len
    eq3 = 96 * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))  # per sequence, B = 1
    assert math.isclose(hardware_flops_per_sequence(m, "full", count_masked=True), eq3,
                        rel_tol=1e-12)
    no_recompute = 72 * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert math.isclose(m.model_flops(count_masked=True), no_recompute, rel_tol=1e-12)
    # a causal mask skips half of QK^T and scores x V (4 s^2 h a layer): s / 12h, not s / 6h
    causal = 72 * s * l * h * h * (1 + s / (12 * h) + V / (12 * l * h))
    assert math.isclose(m.model_flops(), causal, rel_tol=1e-12)
    recomputed = 96 * s * l * h * h * (1 + s / (12 * h) + V / (16 * l * h))
    assert math.isclose(hardware_flops_per_sequence(m, "full"), recomputed, rel_tol=1e-12)


def test_palm_mfu_formula_agrees_for_dense_models():
    # PaLM appendix B: 6 N + 12 L H Q T FLOPs per token, N the non-embedding parameters
    m = load_model("llama2-7b")
    per_token = m.model_flops(count_masked=True) / m.seq_len
    n_matmul = m.layers * (m.attention_params() + m.ffn_params())
    palm = 6 * n_matmul + 12 * m.layers * m.hidden * m.seq_len + 6 * m.hidden * m.vocab
    assert math.isclose(per_token, palm, rel_tol=1e-12)
    # the MFU numerator leaves out the causal mask's half of the attention term
    causal = palm - 6 * m.layers * m.hidden * m.seq_len
    assert math.isclose(m.model_flops() / m.seq_len, causal, rel_tol=1e-12)


def test_activation_memory_matches_korthikanti_table2():
    m = load_model("gpt3-175b")
    hw = Hardware.of(load_system("dgx-a100-80gb"), Precision.fp16)
    s, h, a, b = m.seq_len, m.hidden, m.heads, 1
    for t in (1, 2, 8):
        none = activation_bytes_per_layer(m, hw, t, b, "none", False, flash=False)
        assert math.isclose(none, s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
        sp_sel = activation_bytes_per_layer(m, hw, t, b, "selective", True, flash=False)
        assert math.isclose(sp_sel, 34 * s * b * h / t)
        full = activation_bytes_per_layer(m, hw, t, b, "full", False, flash=False)
        assert math.isclose(full, 2 * s * b * h)


def _tiny():
    return "gpt2", "dgx-a100-80gb"


def _every_plan(m, system, B: int, budget: int):
    """Every structurally valid plan that fits in memory, with its prediction (all recompute,
    sp, ZeRO and schedule choices, so the solver's dominance pruning is checked too)."""
    for t, p, d in itertools.product([1, 2, 3, 4, 6, 12], range(1, 13), [1, 2, 4, 8, 16, 32]):
        n = t * p * d
        if n > budget or (n > 8 and n % 8) or B % d:
            continue
        for mb in [x for x in range(1, B // d + 1) if (B // d) % x == 0]:
            for v, rec, sp, zero, sched in itertools.product(
                    [1, 2, 3, 4, 6, 12], ["none", "selective", "full"], [False, True],
                    [0, 1, 2, 3], ["1f1b", "gpipe"]):
                try:
                    plan = Plan.split(t, p, d, mb, B, node_size=8, interleave=v, recompute=rec,
                                      sequence_parallel=sp and t > 1, zero=zero, schedule=sched)
                    pred = predict(m, system, Precision.bf16, plan)
                except SpecError:
                    continue
                if pred.fits_memory:
                    yield plan, pred


@functools.cache
def _plans(B: int, budget: int) -> list:
    name, hwname = _tiny()
    return list(_every_plan(load_model(name), load_system(hwname), B, budget))


@pytest.mark.slow
def test_solver_equals_brute_force_over_every_plan():
    name, hwname = _tiny()
    m, system = load_model(name), load_system(hwname)
    B, budget = 32, 16
    best = min(pred.iteration_time_s for _, pred in _plans(B, budget))
    sol = HybridSolver(m, system, Precision.bf16, Search(global_batch=B, devices_max=budget)).solve()
    assert sol.status == "optimal"
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


@pytest.mark.slow
def test_time_to_train_over_a_batch_range_equals_brute_force():
    """The batch range, the time-to-train and cost objectives, the deadline and the Pareto
    front against every plan at every candidate batch (McCandlish S(B) = S_min (1 + Bn / B))."""
    name, hwname = _tiny()
    m, system = load_model(name), load_system(hwname)
    budget, price = 16, 2.0
    tr = Training(critical_batch=40, target_steps=1000, price_per_device_hour=price)
    assert candidate_batches(16, 48) == [16, 24, 32, 48]
    every = [(plan, pred.iteration_time_s * tr.steps(plan.global_batch))
             for B in (16, 24, 32, 48) for plan, pred in _plans(B, budget)]
    cost = [(plan, ttt * plan.devices * price / 3600) for plan, ttt in every]
    for objective, table in (("time-to-train", every), ("cost", cost)):
        q = Search(global_batch_range=(16, 48), devices_max=budget, objective=objective,
                   training=tr, pareto=True)
        sol = HybridSolver(m, system, Precision.bf16, q).solve()
        assert math.isclose(sol.objective["value"], min(v for _, v in table), rel_tol=1e-12)
        assert sol.training["time_to_train_s"] == pytest.approx(
            sol.prediction.iteration_time_s * tr.steps(sol.plan.global_batch), rel=1e-12)
    # the front: no plan is both faster and cheaper than a front point, and along it cost
    # rises as time falls
    front = sol.pareto
    pts = [(ttt, ttt * plan.devices * price / 3600) for plan, ttt in every]
    for f in front:
        assert not any(t < f["time_to_train_s"] * (1 - 1e-9) and c < f["cost_usd"] * (1 - 1e-9)
                       for t, c in pts)
    assert [f["time_to_train_s"] for f in front] == sorted(f["time_to_train_s"] for f in front)
    assert len(front) > 1
    assert all(b["cost_usd"] < a["cost_usd"] for a, b in itertools.pairwise(front))
    # a deadline between the fastest and the cheapest plan: the cheapest plan meeting it
    deadline = (front[0]["time_to_train_s"] + front[-1]["time_to_train_s"]) / 2
    q = Search(global_batch_range=(16, 48), devices_max=budget, objective="cost",
               training=dataclasses.replace(tr, deadline_s=deadline))
    sol = HybridSolver(m, system, Precision.bf16, q).solve()
    assert math.isclose(sol.objective["value"], min(c for (t, c) in pts if t <= deadline),
                        rel_tol=1e-12)


@pytest.mark.slow  # prices every plan of the space one by one (about 40 s)
def test_runners_up_and_fewest_nodes_equal_brute_force():
    """--top: the next best splits (tp, pp, dp), each with its best micro-batch and choices,
    never one split twice; --within: the fewest nodes whose plan is within the tolerance of the
    best, and the best plan on that many nodes (against every plan)."""
    m, system = load_model("gpt2"), load_system("dgx-a100-80gb")
    every = _plans(32, 16)
    per_split: dict = {}
    for plan, pred in every:
        key = (plan.tp, plan.pp, plan.dp)
        per_split[key] = min(per_split.get(key, math.inf), pred.iteration_time_s)
    ranked = sorted(per_split.values())
    q = Search(global_batch=32, devices_max=16, top=4)
    sol = HybridSolver(m, system, Precision.bf16, q).solve()
    got = [sol.prediction.iteration_time_s] + [p.iteration_time_s for _, p in sol.alternatives]
    assert len(got) == 5
    assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(got, ranked, strict=False))
    splits = [(p.tp, p.pp, p.dp) for p in [sol.plan, *(p for p, _ in sol.alternatives)]]
    assert len(set(splits)) == 5
    fastest = ranked[0]
    for tol in (0.0, 0.3, 3.0):
        q = Search(global_batch=32, devices_max=16, fewest_nodes_within=tol)
        few = HybridSolver(m, system, Precision.bf16, q).solve()
        ok = [(plan.nodes, pred.iteration_time_s) for plan, pred in every
              if pred.iteration_time_s <= fastest * (1 + tol) * (1 + 1e-12)]
        nodes = min(n for n, _ in ok)
        assert few.plan.nodes == nodes
        assert math.isclose(few.prediction.iteration_time_s,
                            min(t for n, t in ok if n == nodes), rel_tol=1e-12)


def test_top_and_within_on_the_command_line(run_json):
    doc = run_json("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "16",
                   "--global-batch", "64", "--top", "3", "--within", "1.5")
    assert len(doc["alternatives"]) == 3
    splits = {(c["tp"], c["pp"], c["dp"]) for c in
              [doc["config"], *(a["config"] for a in doc["alternatives"])]}
    assert len(splits) == 4
    assert doc["config"]["nodes"] == 1  # one node takes 2x the best (two nodes): within 150 %


def test_cost_objective_picks_a_plan_on_its_own_front(run_json):
    """Issue 16: `--objective cost` chose 1 GPU for 17 h over 32 GPUs for 32 min at the same
    cost, a plan off its own Pareto front. The cheapest plan is at most as costly as every
    plan in the space (one GPU at batch 64 among them), it is on the (time, cost) front, and
    no plan on the front is cheaper and at least as fast (ties go to the faster plan)."""
    args = ("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--critical-batch", "512",
            "--target-tokens", "1e10", "--objective", "cost")
    doc = run_json(*args, "--devices-max", "64", "--global-batch-range", "64:4096", "--pareto")
    one = run_json(*args, "--devices", "1", "--global-batch", "64")
    pred, alone = doc["prediction"], one["prediction"]
    assert pred["cost_usd"] <= alone["cost_usd"] * (1 + 1e-12)
    assert doc["config"] in [p["config"] for p in doc["pareto"]]
    for p in doc["pareto"]:
        assert not (p["cost_usd"] < pred["cost_usd"] * (1 - 1e-12)
                    and p["time_to_train_s"] <= pred["time_to_train_s"]), p
        if math.isclose(p["cost_usd"], pred["cost_usd"], rel_tol=1e-12):
            assert p["time_to_train_s"] >= pred["time_to_train_s"] * (1 - 1e-12), p


def test_evaluate_equals_solve_at_the_optimum_and_pins_hold():
    sol = api.solve_transformer("gpt3-175b", "dgx-a100-80gb", global_batch=1536,
                                devices_max=4096)
    p = sol.plan
    ev = api.evaluate_transformer("gpt3-175b", "dgx-a100-80gb", global_batch=1536,
                                  devices=p.devices, tp=p.tp, pp=p.pp, micro_batch=p.micro_batch,
                                  interleave=p.interleave, recompute=p.recompute,
                                  sequence_parallel=p.sequence_parallel, zero=p.zero,
                                  schedule=p.schedule, tp_overlap=p.tp_overlap)
    assert ev.prediction.iteration_time_s == sol.prediction.iteration_time_s
    assert sol.objective["value"] == sol.prediction.iteration_time_s / 1536  # s/sample
    assert sol.prediction.fits_memory and p.devices <= 4096
    pinned = api.solve_transformer("gpt3-175b", "dgx-a100-80gb", global_batch=1536,
                                   devices_max=4096, tp=4, recompute="full")
    assert pinned.plan.tp == 4 and pinned.plan.recompute == "full"
    assert pinned.prediction.iteration_time_s >= sol.prediction.iteration_time_s


def test_sc21_table1_within_10_percent():
    from planner.published import sc21_rows

    rows = sc21_rows()
    assert len(rows) == 10
    mape = np.mean([abs(r["error"]) for r in rows])
    assert mape < 0.10, rows


def test_unequal_stages_and_output_layer_set_the_pace():
    """80 layers on 12 stages: 8 stages of 7 layers and 4 of 6, the last also holding the output
    layer; the slowest stage sets the pace: max(7 L, 6 L + out)."""
    m, system = load_model("llama2-70b"), load_system("dgx-a100-80gb")

    def stage(pp):
        plan = Plan.split(8, pp, 1, 1, 80, node_size=8, recompute="full")
        return predict(m, system, Precision.bf16, plan).time_breakdown["compute"] / 80

    layer = stage(40) - stage(80)  # 2 L + out  -  (L + out)
    out = stage(80) - layer
    assert layer > 0 and out > 0
    assert math.isclose(stage(12), max(7 * layer, 6 * layer + out), rel_tol=1e-9)
    assert math.isclose(stage(10), 8 * layer + out, rel_tol=1e-9)


def test_cli_contract(run, run_json):
    doc = run_json("solve", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices-max", "16",
                   "--global-batch", "64")
    assert doc["status"] == "optimal"
    for key in ("tp", "pp", "dp", "micro_batch", "interleave", "recompute",
                "sequence_parallel", "zero", "gradient_accumulation", "devices"):
        assert key in doc["config"]
    pred = doc["prediction"]
    for key in ("tokens_per_s", "model_flops_per_iteration", "tflops_per_device_model",
                "tflops_per_device_hardware", "mfu", "hfu", "memory_bytes_per_device"):
        assert key in pred
    assert set(pred["memory_breakdown"]) == {"weights", "gradients", "optimizer", "activations"}
    assert set(pred["time_breakdown"]) == {"compute", "tp_comm", "cp_comm", "ep_comm",
                                           "offload", "pp_bubble", "pp_comm",
                                           "dp_comm_exposed", "optimizer", "host_sync"}
    bad = [
        ("evaluate", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "8", "--tp", "5",
         "--global-batch", "64"),                                   # tp does not divide heads
        ("evaluate", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "8", "--tp", "2",
         "--pp", "2", "--dp", "3", "--global-batch", "60"),          # tp x pp x dp != devices
        ("evaluate", "-m", "gpt2", "-H", "dgx-a100-80gb", "--devices", "8", "--micro-batch",
         "3", "--global-batch", "64"),                               # batch not divisible
        ("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "2", "--global-batch", "256",
         "--tp", "2"),                                                # tp on a CNN
    ]
    for args in bad:
        code, _, err = run(*args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, _, err = run("solve", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices-max", "8",
                       "--global-batch", "1536")
    assert code == 1 and "memory" in err and len(err.strip().splitlines()) == 1


def test_bert_rows_held_out_within_6_percent():
    from planner.published import bert_rows

    rows = bert_rows()
    assert len(rows) == 6
    assert np.mean([abs(r["error"]) for r in rows]) < 0.06, rows


def test_seq_len_override_keeps_the_position_table(run):
    m = load_model("bert-large")
    from planner.spec.transformer import with_seq_len

    short = with_seq_len(m, 128)
    assert short.params() == m.params() and short.seq_len == 128
    assert short.model_flops() < m.model_flops()
    code, _, err = run("evaluate", "-m", "bert-large", "-H", "dgx-a100-80gb", "--devices", "8",
                       "--global-batch", "64", "--seq-len", "1024")
    assert code == 2 and "512 learned positions" in err


def test_first_stage_activations_follow_korthikanti_in_flight_counts():
    """1F1B: p micro-batches of L / p layers in flight = L layers' worth; interleaved with v
    chunks: x (1 + (p - 1) / (p v)) (Korthikanti et al. 2022, sec. 4.2.3) when m > p, but
    every one of the m v chunk forwards at once (no more) when m = p, as Megatron-LM's
    interleaved schedule runs them all first; GPipe: all m (and the last stage their logits)."""
    from planner.cost.transformer import iteration

    m = load_model("gpt3-175b")
    hw = Hardware.of(load_system("dgx-a100-80gb"), Precision.fp16)
    layer = activation_bytes_per_layer(m, hw, 8, 1, "selective", True, flash=False)

    def acts(v, gpipe=0, acc=16):
        cfg = dict(t=8, p=8, d=1, mb=1, acc=acc, v=v, recompute=1, sp=1, zero=0, gpipe=gpipe,
                   flash_attention=False)
        return float(iteration(m, hw, cfg)["activations"])

    assert math.isclose(acts(1), 96 * layer, rel_tol=1e-12)
    assert math.isclose(acts(2), 96 * layer * (1 + 7 / 16), rel_tol=1e-12)
    # m = p = 8, v = 2: 16 chunks of 6 layers, not the warm-up's 2 x 7 + 8 + 1 = 23
    assert math.isclose(acts(2, acc=8), 16 * 6 * layer, rel_tol=1e-12)
    # m = 4 < p: 1F1B holds all 4 (interleaving needs a multiple of p micro-batches)
    assert math.isclose(acts(1, acc=4), 4 * 12 * layer, rel_tol=1e-12)
    # GPipe: all 16 micro-batches on every stage, the last also their 16 fp32 logits
    logits = 4 * m.seq_len * m.vocab / 8
    assert math.isclose(acts(1, gpipe=1), 16 * 12 * layer + 16 * logits, rel_tol=1e-12)


def test_bf16_gradients_are_accumulated_and_reduced_in_fp32():
    """Megatron-LM with bf16 (it forces --accumulate-allreduce-grads-in-fp32) and FSDP2
    (reduce_dtype float32) keep and reduce gradients in fp32: 4 bytes a parameter against the
    weights' 2, so twice the gradient memory and allreduce bytes of fp16 (which Megatron keeps
    at 16 bits); fp8 training keeps bf16 weights and so fp32 gradients too. ZeRO gathers the
    weights at their own width."""
    from planner.cost.transformer import iteration

    m, system = load_model("llama3-8b"), load_system("dgx-a100-80gb")
    cfg = dict(t=1, p=1, d=64, mb=1, acc=1, v=1, recompute=0, sp=0, zero=0, gpipe=0,
               overlap=False)
    out = {p: iteration(m, Hardware.of(system, p), cfg)
           for p in (Precision.fp16, Precision.bf16)}
    assert float(out[Precision.bf16]["weights"]) == float(out[Precision.fp16]["weights"])
    assert float(out[Precision.bf16]["gradients"]) == 2 * float(out[Precision.fp16]["gradients"])
    ratio = float(out[Precision.bf16]["dp_comm_exposed"] / out[Precision.fp16]["dp_comm_exposed"])
    assert 1.99 < ratio <= 2.0
    # ZeRO: the fp32 gradients reduce-scattered, the bf16 weights all-gathered: (4 + 2) / 2
    # bytes a parameter each way instead of the allreduce's 4, so 3/4 of its time
    bf16 = Hardware.of(system, Precision.bf16)
    zero1 = iteration(m, bf16, {**cfg, "zero": 1})["dp_comm_exposed"]
    ratio = float(zero1 / out[Precision.bf16]["dp_comm_exposed"])
    assert 0.75 < ratio < 0.7505  # the latencies, equal in both, lift it a little
    assert Hardware.of(load_system("dgx-h100"), Precision.fp8).grad_bytes == 4
    assert Hardware.of(system, Precision.fp32).grad_bytes == 4
