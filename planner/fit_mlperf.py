"""Fit the in-training GEMM share of each GPU family to the MLPerf Training submissions
(`planner/calibration/mlperf_training.csv`), and report it leave-one-benchmark-out.

A device's large-GEMM rate is its best-shape GEMM microbenchmark (S. Bekman's Maximum
Achievable Matmul FLOPS table, each device spec's source) times the share of that ceiling
Megatron-shaped GEMMs reach in training. On the A100 that share is fitted (0.701 / 0.869 =
0.807, `planner.fit_transformer`) and carried to every device; this module fits it per family
to the family's MLPerf rows instead, where they say the carried value is wrong:

- the share is one number per family (Hopper, Blackwell, AMD CDNA), applied to the bf16 and
  the fp8 microbenchmark fractions of every device of the family alike (`MICROBENCHMARK`);
- fitted by golden-section search on the mean squared log error of the step time over the
  family's rows, every other constant as shipped (the attention kernels, the GEMM shape curve,
  the links: all from microbenchmarks);
- reported leave-one-benchmark-out: the share refitted without one benchmark (model), that
  benchmark's rows predicted with it: the error on a model the fit has not seen.

Only the families in `APPLIED` take their fit (the device specs carry round(fraction x share,
3) and name this command); Hopper's fit is printed as a check of the carried A100 share.

    python -m planner.fit_mlperf       # the fits, their errors, the spec values (about 2 min)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from planner import mlperf
from planner.bands import family
from planner.calibrate import _golden_min
from planner.catalog import load_system

A100_SHARE = 0.807  # planner.fit_transformer: 0.701 / 0.869, what every device carried
# device spec -> (bf16, fp8) best-shape GEMM microbenchmark as a fraction of the dense peak
# (each spec's `efficiency` source: Bekman's table; None: no fp8 row, fp8 takes the bf16 one)
MICROBENCHMARK = {
    "h100-sxm5-80gb": (0.803, 0.709), "h200-sxm-141gb": (0.803, 0.734),
    "b200": (0.776, 0.763), "gb200": (0.729, 0.723), "b300": (0.786, 0.745),
    "gb300": (0.729, 0.723),
    "mi300x": (0.511, None), "mi325x": (0.6, None), "mi355x": (0.622, None),
    "mi350x": (0.622, None),  # MI355X's: the same die at a lower clock, no row of its own
}
# the families as the error bands group devices (`planner.bands.family`)
FAMILIES = {fam: tuple(d for d in MICROBENCHMARK if family(d) == fam)
            for fam in dict.fromkeys(family(d) for d in MICROBENCHMARK)}
APPLIED = ("Blackwell", "AMD CDNA")
BOUNDS = (0.4, 1.0)


def with_share(system, share: float):
    """The system with its device's GEMM rates at `share` of its microbenchmark."""
    dev = system.device
    bf16, fp8 = MICROBENCHMARK[dev.name]
    update = {"matmul": bf16 * share}
    if fp8 is not None:
        update["matmul_fp8"] = fp8 * share
    eff = dev.efficiency.model_copy(update=update)
    return dataclasses.replace(system, device=dev.model_copy(update={"efficiency": eff}))


def runs(fam: str) -> list[mlperf.Run]:
    """The family's priceable MLPerf rows."""
    return [r for r in mlperf.read() if not r.why_not
            and load_system(r.system).device.name in FAMILIES[fam]]


def log_errors(rows: list[mlperf.Run], share: float) -> np.ndarray:
    """log(predicted / measured) of each row at `share` (rows the planner refuses: none)."""
    out = []
    for run in rows:
        t, _ = mlperf.predicted(run, with_share(load_system(run.system), share))
        if t is not None:
            out.append(math.log(t / run.measured_s))
    return np.array(out)


def fit(rows: list[mlperf.Run]) -> float:
    """The share minimising the mean squared log error of `rows`."""
    return _golden_min(lambda s: float(np.mean(log_errors(rows, s) ** 2)), *BOUNDS, tol=1e-3)


def held_out_shares(rows: list[mlperf.Run]) -> dict[str, float]:
    """Benchmark -> the share fitted to the other benchmarks' rows (none when it is the only
    one)."""
    benches = sorted({r.row["benchmark"] for r in rows})
    return {b: fit([r for r in rows if r.row["benchmark"] != b]) for b in benches
            if len(benches) > 1}


def held_out(rows: list[mlperf.Run]) -> dict[str, tuple[float, np.ndarray]]:
    """Benchmark -> (the share fitted without it, its rows' log errors at that share)."""
    return {b: (share, log_errors([r for r in rows if r.row["benchmark"] == b], share))
            for b, share in held_out_shares(rows).items()}


def key(run: mlperf.Run) -> tuple:
    """A row's identity: its values as the CSV gives them."""
    return tuple(run.row.values())


@functools.cache
def held_out_predictions() -> dict[tuple, float]:
    """`key(run)` -> its step time predicted leave-one-benchmark-out, for every priceable row
    of the `APPLIED` families: what the error bands and `benchmarks/accuracy.py` take as
    those rows' out-of-sample prediction."""
    out = {}
    for fam in APPLIED:
        rows = runs(fam)
        shares = held_out_shares(rows)
        for run in rows:
            t, _ = mlperf.predicted(run, with_share(load_system(run.system),
                                                    shares[run.row["benchmark"]]))
            if t is not None:
                out[key(run)] = t
    return out


def _mape(log_err: np.ndarray) -> float:
    return float(100 * np.mean(np.abs(np.expm1(log_err))))


def main() -> None:
    for fam in FAMILIES:
        rows = runs(fam)
        share = fit(rows)
        before, after = log_errors(rows, A100_SHARE), log_errors(rows, share)
        print(f"{fam}: {len(rows)} rows; share {share:.3f} of the microbenchmark "
              f"(carried A100 share {A100_SHARE}): MAPE {_mape(before):.1f} % -> "
              f"{_mape(after):.1f} % in sample, bias {100 * np.mean(np.expm1(before)):+.1f} "
              f"% -> {100 * np.mean(np.expm1(after)):+.1f} %"
              + ("" if fam in APPLIED else " (not applied: the carried share is kept)"))
        out = held_out(rows)
        for bench, (s, err) in out.items():
            print(f"  held out {bench}: share {s:.3f} without it, its {len(err)} rows "
                  f"MAPE {_mape(err):.1f} % (bias {100 * np.mean(np.expm1(err)):+.1f} %)")
        if out:
            every = np.concatenate([e for _, e in out.values()])
            print(f"  leave-one-benchmark-out over all {len(every)} rows: MAPE "
                  f"{_mape(every):.1f} %")
        if fam in APPLIED:
            for dev in FAMILIES[fam]:
                bf16, fp8 = MICROBENCHMARK[dev]
                spec = f"matmul: {round(bf16 * share, 3)}"
                if fp8 is not None:
                    spec += f", matmul_fp8: {round(fp8 * share, 3)}"
                print(f"  {dev}: {spec}")


if __name__ == "__main__":
    main()
