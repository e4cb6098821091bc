"""Transformer benchmarks: SC21 Table 1 accuracy (pinned solves), hybrid solve time by GPU
budget (gpt3-175b, global batch 1536, dgx-a100-80gb) and the time-to-train solve over a batch
range.

    python benchmarks/transformer_runs.py
"""

from __future__ import annotations

import time

from planner import api
from planner.errors import InfeasibleError
from planner.published import bert_rows, fit_matmul_efficiency, sc21_rows


def sc21_table():
    rows = sc21_rows()
    print("SC21 Table 1 (Narayanan et al. 2021), devices / batch / tp / pp / full recompute pinned")
    print(f"{'model':<11} {'gpus':>5} {'tp':>3} {'pp':>3} {'mb':>3} {'v':>3} {'measured_s':>10} "
          f"{'predicted_s':>11} {'TF/s meas':>9} {'TF/s pred':>9} {'error':>7}")
    for r in rows:
        print(f"{r['model']:<11} {r['gpus']:>5} {r['tp']:>3} {r['pp']:>3} {r['micro_batch']:>3} "
              f"{r['interleave']:>3} {r['measured_s']:>10.2f} {r['predicted_s']:>11.2f} "
              f"{r['measured_tflops']:>9.0f} {r['predicted_tflops']:>9.1f} {r['error']:>+7.1%}")
    mape = sum(abs(r["error"]) for r in rows) / len(rows)
    print(f"MAPE {mape:.1%} over {len(rows)} rows")
    print(f"matmul efficiency refitted to these rows alone: {fit_matmul_efficiency():.3f} "
          "(the spec's is fitted with vTrain too: python -m planner.fit_transformer)\n")


def bert_table():
    rows = bert_rows()
    print("BERT-Large phase 1 on DGX A100 80GB (NVIDIA DeepLearningExamples), held out")
    print(f"{'gpus':>5} {'batch':>6} {'mb':>4} {'measured seq/s':>14} {'predicted':>10} {'error':>7}")
    for r in rows:
        print(f"{r['gpus']:>5} {r['global_batch']:>6} {r['micro_batch']:>4} "
              f"{r['measured_seq_s']:>14,.0f} {r['predicted_seq_s']:>10,.0f} {r['error']:>+7.1%}")
    mape = sum(abs(r["error"]) for r in rows) / len(rows)
    print(f"MAPE {mape:.1%} over {len(rows)} rows\n")


def solve_times():
    print("hybrid solve (gpt3-175b, global batch 1536, dgx-a100-80gb), all choices free")
    print(f"{'devices_max':>11} {'rows':>9} {'build_s':>8} {'cp-sat_s':>8} {'total_s':>8}  "
          f"status   plan")
    for budget in (8, 64, 512, 4096, 16384, 65536):
        t = time.perf_counter()
        try:
            sol = api.solve_transformer("gpt3-175b", "dgx-a100-80gb", global_batch=1536,
                                        devices_max=budget)
        except InfeasibleError as exc:
            print(f"{budget:>11} {'-':>9} {'-':>8} {'-':>8} {time.perf_counter() - t:>8.2f}  "
                  f"{str(exc)[:70]}")
            continue
        p = sol.plan
        print(f"{budget:>11} {sol.rows:>9,} {sol.build_time_s:>8.2f} {sol.solve_time_s:>8.3f} "
              f"{time.perf_counter() - t:>8.2f}  {sol.status:<8} {p.devices} = {p.tp}x{p.pp}"
              f"(v{p.interleave})x{p.dp}, mb {p.micro_batch}, {p.recompute}, ZeRO {p.zero}, "
              f"MFU {sol.prediction['mfu']:.1%}")


def time_to_train():
    print("\ntime-to-train solve over --global-batch-range 256:8192 (candidates 2^k, 3x2^k), "
          "B_noise 4096 sequences, 300B tokens, dgx-a100-80gb")
    print(f"{'model':>10} {'devices_max':>11} {'rows':>10} {'total_s':>8}  plan")
    for model, budget in (("llama2-7b", 512), ("gpt3-175b", 1024), ("gpt3-175b", 4096)):
        t = time.perf_counter()
        sol = api.solve_transformer(model, "dgx-a100-80gb", global_batch_range=(256, 8192),
                                    devices_max=budget, objective="time-to-train",
                                    critical_batch=4096, target_tokens=3e11)
        p, tr = sol.plan, sol.training
        print(f"{model:>10} {budget:>11} {sol.rows:>10,} {time.perf_counter() - t:>8.2f}  "
              f"{p.devices} = {p.tp}x{p.pp}(v{p.interleave})x{p.dp}, batch {p.global_batch}, "
              f"{tr['steps']:,.0f} steps, {tr['time_to_train_s'] / 86400:.1f} days")


if __name__ == "__main__":
    sc21_table()
    bert_table()
    solve_times()
    time_to_train()
