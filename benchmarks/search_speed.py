"""Transformer search speed: GPT-3 175B on up to 4,096 and 65,536 GPUs of dgx-a100-80gb at
global batch 1,536, every choice free (search build + CP-SAT solve), several runs each because
this machine is noisy (goal 0.3 s and 1 s); then the searches with expert and context
parallelism (goal 2 s each): DeepSeek-V3 on up to 2,048 H100 and on 256 GB200 (NVL72),
Llama 3.1 405B on up to 16,384 H100 at sequence 131,072 (cp up to 16).

    python benchmarks/search_speed.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from planner import api

BUDGETS = (4096, 65536)
MOE_AND_CP = (  # (label, model, system, devices_max, global batch, sequence length)
    ("deepseek-v3, <= 2048 x H100", "deepseek-v3", "dgx-h100", 2048, 4096, None),
    ("deepseek-v3, <= 256 x GB200", "deepseek-v3", "gb200-nvl72", 256, 1024, None),
    ("llama3.1-405b, <= 16384 x H100, s 131072", "llama3.1-405b", "dgx-h100", 16384, 128,
     131072),
)


def measure(runs: int) -> dict[int, list[float]]:
    api.solve_transformer("gpt3-175b", "dgx-a100-80gb", global_batch=1536, devices_max=64)
    out = {}
    for budget in BUDGETS:
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            api.solve_transformer("gpt3-175b", "dgx-a100-80gb", global_batch=1536,
                                  devices_max=budget)
            times.append(time.perf_counter() - t)
        out[budget] = times
    return out


def moe_and_cp(runs: int) -> None:
    print(f"\nsearches with ep / cp ({runs} runs each)")
    print(f"{'case':<42} {'rows':>9} {'min_s':>7} {'max_s':>7}  plan")
    for label, model, system, budget, batch, seq in MOE_AND_CP:
        times, sol = [], None
        for _ in range(runs):
            t = time.perf_counter()
            sol = api.solve_transformer(model, system, global_batch=batch, devices_max=budget,
                                        seq_len=seq)
            times.append(time.perf_counter() - t)
        p = sol.plan
        print(f"{label:<42} {sol.rows:>9,} {min(times):>7.2f} {max(times):>7.2f}  "
              f"{p.devices} = tp {p.tp} cp {p.cp} ep {p.ep} pp {p.pp} dp {p.dp}, mb "
              f"{p.micro_batch}, {p.recompute.value}, ZeRO {p.zero}, "
              f"MFU {sol.prediction.mfu:.1%} ({sol.status})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_known_args()[0].runs
    print(f"gpt3-175b search on dgx-a100-80gb, global batch 1536 ({runs} runs each)")
    print(f"{'devices_max':>11} {'min_s':>7} {'median_s':>8} {'max_s':>7}")
    for budget, times in measure(runs).items():
        print(f"{budget:>11} {min(times):>7.3f} {statistics.median(times):>8.3f} "
              f"{max(times):>7.3f}")
    moe_and_cp(max(1, runs // 2))


if __name__ == "__main__":
    main()
