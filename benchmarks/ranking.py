"""The pick among measured configurations (`planner.ranking`): for every job measured in
several configurations, how much slower than the fastest is the one the planner predicts
fastest (the issue's bar: within 1 % of the best).

- vTrain's 1,440 single-node A100 runs (Bang et al., MICRO 2024): 144 jobs (devices, global
  batch, model), 2 to 26 configurations each (tp, dp, pp, micro-batch). In sample with the
  shipped constants (`planner.fit_transformer` fits four A100 constants to these runs and
  SC21's), and held out: each hidden size's jobs ranked with the constants refitted without
  that hidden size's runs.
- Calculon (Isaev et al., SC23) as its authors ship it, on the same jobs (`--calculon`: a
  checkout at commit caa4b11, as `benchmarks/peers.py` runs it).
- MLPerf Training: the jobs (benchmark, system, devices, global batch, precision) submitted
  in more than one configuration; each configuration's measured time is its fastest
  submission's (a slower one of the same plan is not what the plan reaches). Nothing is fitted
  to the Hopper rows; the Blackwell and AMD GEMM shares are (`planner.fit_mlperf`). Different
  submitters and software versions ran the configurations, so part of a job's spread is not
  the plan's.

    python benchmarks/ranking.py                              # about 20 s
    python benchmarks/ranking.py --calculon /tmp/calculon     # with the peer, 40 s more
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from planner import fit_transformer as ft
from planner import mlperf
from planner.ranking import TIE, by_job, regret, summarize


def _job(r: dict) -> tuple:
    return r["gpus"], r["global_batch"], r["hidden"], r["heads"], r["layers"], r["seq_len"]


def vtrain(system, rows: list[dict]) -> dict:
    """Each vTrain job's regret with the constants of `system`."""
    predicted = np.array([r["iteration_time_ms"] for r in rows]) * np.exp(
        ft.vtrain_errors(system, rows))
    return by_job((_job(r), r["iteration_time_ms"], p)
                  for r, p in zip(rows, predicted, strict=True))


def vtrain_held_out(rows: list[dict]) -> dict:
    """Each hidden size's jobs ranked with the four constants refitted without its runs
    (warm-started from the shipped ones, as `benchmarks/accuracy.py`'s held-out column)."""
    shipped, groups = ft.Constants.shipped(), ft.groups()
    out = {}
    for hidden in sorted({r["hidden"] for r in rows}):
        rest = [g for g in groups if not g.name.startswith(f"vTrain h={hidden} ")]
        refit = ft.fit(rest, shipped, rounds=1)
        out |= vtrain(refit.system(), [r for r in rows if r["hidden"] == hidden])
    return out


def calculon(checkout: Path, rows: list[dict]) -> dict:
    """Each vTrain job's regret by Calculon's times, over the configurations it prices (one it
    refuses is never its pick; a job left with fewer than two is not counted)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import peers

    calc = peers.Calculon(checkout)
    out = []
    for r in rows:
        dims = peers._dims(r["hidden"], r["heads"], r["layers"], r["seq_len"], 4 * r["hidden"])
        t = calc.time(dims, peers._execution(r["tp"], r["pp"], r["dp"], r["global_batch"],
                                             r["micro_batch"], 1, (0, 0, 0)))
        if t is not None:
            out.append((_job(r), r["iteration_time_ms"], t))
    return by_job(out)


def mlperf_jobs() -> list[tuple[tuple, list[tuple]]]:
    """(job, [(plan, fastest measured, predicted, submissions)]) for every MLPerf job priced
    in more than one configuration."""
    plans: dict[tuple, dict] = {}
    for r in mlperf.rows():
        if r["error"] is None:
            continue
        run, plan = r["run"], mlperf.plan_of(r["run"])
        job = (run.row["benchmark"], run.system, plan.devices, plan.global_batch,
               run.precision.value)
        best = plans.setdefault(job, {}).get(plan)
        if best is None or r["measured_s"] < best[1]:
            n = 1 if best is None else best[3] + 1
            plans[job][plan] = (plan, r["measured_s"], r["predicted_s"], n)
        else:
            plans[job][plan] = (*best[:3], best[3] + 1)
    return [(job, list(p.values())) for job, p in sorted(plans.items(), key=str) if len(p) > 1]


def _describe(plan, fields: list[str]) -> str:
    """The plan by the fields in which its job's configurations differ."""
    def value(name):
        x = getattr(plan, name)
        return getattr(x, "value", x)
    return " ".join(f"{name}={value(name)}" for name in fields)


def _differing(plans) -> list[str]:
    """The Plan fields whose values differ among `plans`."""
    names = [f.name for f in dataclasses.fields(plans[0])]
    return [n for n in names if len({repr(getattr(p, n)) for p in plans}) > 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calculon", type=Path, help="a checkout of github.com/calculon-ai/calculon")
    args = ap.parse_args()

    rows = ft._vtrain_rows()
    print("vTrain, 8 A100 (jobs with 2-26 measured configurations): the planner's pick and "
          "the measured best")
    shipped = vtrain(ft.Constants.shipped().system(), rows)
    held = vtrain_held_out(rows)
    print(f"  planner, in sample     {summarize(shipped.values()).line()}")
    print(f"  planner, held out      {summarize(held.values()).line()}")
    for hidden in sorted({r["hidden"] for r in rows}):
        part = [v for k, v in held.items() if k[2] == hidden]
        print(f"    hidden {hidden:<5} held out {summarize(part).line()}")
    if args.calculon:
        peer = calculon(args.calculon, rows)
        print(f"  Calculon (as shipped)  {summarize(peer.values()).line()}")

    print("\nMLPerf Training jobs submitted in more than one configuration (measured: the "
          "configuration's fastest submission; * the planner's pick, several where it predicts them equal)")
    regrets = []
    for job, plans in mlperf_jobs():
        fastest = min(p[2] for p in plans)
        regrets.append(regret([p[1] for p in plans], [p[2] for p in plans]))
        bench, system, devices, batch, precision = job
        print(f"  {bench} {system} {precision} {devices} GPUs B{batch}: regret "
              f"{regrets[-1]:.1%}")
        fields = _differing([p[0] for p in plans])
        for plan, m, p, n in plans:
            mark = "*" if p <= fastest * (1 + TIE) else " "
            print(f"    {mark} {_describe(plan, fields):<50} measured {m:7.3f} s "
                  f"({n} run{'s' if n > 1 else ''})  predicted {p:7.3f} s ({p / m - 1:+.1%})")
    print(f"  MLPerf                 {summarize(regrets).line()}")


if __name__ == "__main__":
    main()
