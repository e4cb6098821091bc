"""Transformer benchmarks: SC21 Table 1 accuracy (pinned solves) and hybrid solve time by GPU
budget (gpt3-175b, global batch 1536, dgx-a100-80gb).

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
    print(f"matmul efficiency refitted to these rows: {fit_matmul_efficiency():.3f} "
          "(a100-sxm4-80gb spec: 0.66)\n")


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


if __name__ == "__main__":
    sc21_table()
    bert_table()
    solve_times()
