"""Fit the in-training GEMM share of each GPU family and the host's time per training step to
the MLPerf Training submissions (`planner/calibration/mlperf_training.csv`), and report both
leave-one-benchmark-out.

A device's large-GEMM rate is its best-shape GEMM microbenchmark (S. Bekman's Maximum
Achievable Matmul FLOPS table, each device spec's source) times the share of that ceiling
Megatron-shaped GEMMs reach in training. On the A100 that share is fitted (0.701 / 0.869 =
0.807, `planner.fit_transformer`) and carried to every device; this module fits it per family
to the family's MLPerf rows instead, where they say the carried value is wrong:

- the share is one number per family (Hopper, Blackwell, AMD CDNA), applied to the bf16 and
  the fp8 microbenchmark fractions of every device of the family alike (`MICROBENCHMARK`);
- beside it, one host time per training step for every device (`KernelCosts.step_sync_us`):
  the training loop synchronises the host once a step, so the host's work from there until
  the device has work again adds to every step whatever its size; it shows where steps are
  short (Llama 3.1 8B at 85-190 ms a step: 20-35 ms slow as the rest predicts them);
- fitted together on the mean squared log error of the step time over every family's rows:
  each family's share by golden-section search with the host time held, the host time over
  all rows with the shares held, alternately until neither moves (every other constant as
  shipped: the attention kernels, the GEMM shape curve, the links, from microbenchmarks);
- reported leave-one-benchmark-out: both refitted without one benchmark (model), that
  benchmark's rows predicted with them: the error on a model the fit has not seen.

Only the families in `APPLIED` take their share (the device specs carry round(fraction x
share, 3) and name this command); Hopper's share is printed as a check of the carried A100
share, and its rows fit the host time with that carried share.

    python -m planner.fit_mlperf       # the fits, their errors, the spec values (about 3 min)
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
    "gb300": (0.786, 0.745),  # B300's: the same Blackwell Ultra die, no row of its own
    "mi300x": (0.511, None), "mi325x": (0.6, None), "mi355x": (0.622, None),
    "mi350x": (0.622, None),  # MI355X's: the same die at a lower clock, no row of its own
}
# an NVFP4 GEMM's fraction of the fp4 peak over a bf16 GEMM's of the bf16 peak, measured at the
# same shapes (no best-shape NVFP4 table is published), so each Blackwell device's fp4
# microbenchmark is its bf16 one times this (`efficiency.matmul_fp4`). B200 (GB200: the same
# die): pytorch/ao pull request #2427, benchmarks/float8/bench_matmul.py --recipe nvfp4,
# torch._scaled_mm at M = N = K = 6144 and 8192: NVFP4 0.611 and 0.597, bf16 0.646 and 0.631.
# Blackwell Ultra (B300; GB300 the same chip): Transformer Engine's GEMM profiling guide
# (NVIDIA/TransformerEngine pull request #2863, docs/examples/gemm_profiling/gemm_profiling.rst
# at 8f2e635), B300, a 5B config's per-layer GEMMs pre-quantized (M 15,872; K, N 4,096-16,384):
# NVFP4 3.764 ms, BF16 13.102 ms at 13,500 and 2,250 TFLOP/s peaks. Its fp4 peak is 1.5x
# B200's; its NVFP4 GEMMs reach about the TFLOP/s B200's do, not 1.5x. GB300, unmeasured, keeps
# the fp4 fraction of peak it carried from GB200 (0.729 x B200's ratio), written over its
# die's bf16 fraction: B300's ratio, from a 1.1 kW board, would put the 1.4 kW GB300's NVFP4
# GEMMs at B300's TFLOP/s, and its MLPerf NVFP4 rows, 0-11 % fast with the carried fraction,
# are 8-19 % slow with that ratio
_B200_FP4 = round((0.611 / 0.646 + 0.597 / 0.631) / 2, 3)
FP4_OVER_BF16 = {"b200": _B200_FP4, "gb200": _B200_FP4,
                 "gb300": round(MICROBENCHMARK["gb200"][0] * _B200_FP4
                                / MICROBENCHMARK["gb300"][0], 3),
                 "b300": round(13.102 / 3.764 * 2250 / 13500, 3)}
# an MXFP8 GEMM's rate over a per-tensor fp8 one's, the same guide's B300 pre-quantized
# per-layer totals (FP8 current scaling 6.812 ms, MXFP8 7.161 ms: the 1 x 32 E8M0 block
# scales' cost), carried to every Blackwell device (`efficiency.matmul_mxfp8`)
MXFP8_OVER_FP8 = round(6.812 / 7.161, 3)
# the families as the error bands group devices (`planner.bands.family`)
FAMILIES = {fam: tuple(d for d in MICROBENCHMARK if family(d) == fam)
            for fam in dict.fromkeys(family(d) for d in MICROBENCHMARK)}
APPLIED = ("Blackwell", "AMD CDNA")
FP4_DEVICES = FAMILIES["Blackwell"]  # the devices `FP4_OVER_BF16` sets `matmul_fp4` on
assert set(FP4_DEVICES) == set(FP4_OVER_BF16)
BOUNDS = (0.4, 1.0)


SYNC_BOUNDS = (0.0, 0.1)  # seconds per step


def with_share(system, share: float | None = None, sync_s: float | None = None):
    """The system with its device's GEMM rates at `share` of its microbenchmark (None: as
    shipped) and its host time per step at `sync_s` (None: as shipped)."""
    dev = system.device
    update = {}
    if share is not None:
        bf16, fp8 = MICROBENCHMARK[dev.name]
        rates = ({"matmul": bf16 * share}
                 | ({"matmul_fp8": fp8 * share} if fp8 is not None else {})
                 | ({"matmul_fp4": bf16 * FP4_OVER_BF16[dev.name] * share,
                     "matmul_mxfp8": fp8 * MXFP8_OVER_FP8 * share}
                    if dev.name in FP4_DEVICES else {}))
        update["efficiency"] = dev.efficiency.model_copy(update=rates)
    if sync_s is not None:
        update["kernels"] = dev.kernels.model_copy(update={"step_sync_us": sync_s * 1e6})
    return dataclasses.replace(system, device=dev.model_copy(update=update))


def runs(fam: str) -> list[mlperf.Run]:
    """The family's priceable MLPerf rows of dense models from the fitted rounds. The
    mixture-of-experts rows (v6.0's DeepSeek-V3 and gpt-oss-20b) are held out of every fit:
    the shares are what GEMMs reach, and an MoE step's error is first the routing, dispatch
    and grouped-GEMM terms', which these rows test out of sample; so is every row of a round
    in `mlperf.HELD_OUT_ROUNDS` (v6.0: a later software release than the fit's)."""
    return [r for r in mlperf.read() if not r.why_not
            and load_system(r.system).device.name in FAMILIES[fam]
            and not r.held_out]


def key(run: mlperf.Run) -> tuple:
    """A row's identity: its values as the CSV gives them."""
    return tuple(run.row.values())


_BASE: dict[tuple, float | None] = {}


def _base(run: mlperf.Run, share: float | None) -> float | None:
    """A row's predicted step time at `share` (None: as shipped) with no host time: the host
    time adds to it (one sync a step, where the run's plan has one), so the fit prices each
    row at each share once."""
    k = (key(run), share)
    if k not in _BASE:
        _BASE[k], _ = mlperf.predicted(run, with_share(load_system(run.system), share, 0.0))
    return _BASE[k]


def _family_of(run: mlperf.Run) -> str:
    return family(load_system(run.system).device.name)


@dataclasses.dataclass(frozen=True)
class Fit:
    """The host time per step and the `APPLIED` families' shares (the others: as shipped)."""

    sync_s: float
    shares: dict

    def share(self, run: mlperf.Run) -> float | None:
        return self.shares.get(_family_of(run))

    def system(self, system):
        """`system` priced with this fit."""
        return with_share(system, self.shares.get(family(system.device.name)), self.sync_s)

    def log_errors(self, rows: list[mlperf.Run]) -> np.ndarray:
        """log(predicted / measured) of each row under this fit."""
        return log_errors(rows, self.share, self.sync_s)


def log_errors(rows: list[mlperf.Run], share, sync_s: float) -> np.ndarray:
    """log(predicted / measured) of each row at `share` (a number, or a function of the row:
    None as shipped) and `sync_s` of host time a step (rows the planner refuses: none)."""
    out = []
    for run in rows:
        t = _base(run, share(run) if callable(share) else share)
        if t is not None:
            synced = mlperf.plan_of(run).host_sync  # a run that reads nothing back pays none
            out.append(math.log((t + sync_s * synced) / run.measured_s))
    return np.array(out)


def fit_share(rows: list[mlperf.Run], sync_s: float = 0.0) -> float:
    """The share minimising the mean squared log error of `rows` at `sync_s`."""
    return round(_golden_min(lambda s: float(np.mean(log_errors(rows, s, sync_s) ** 2)),
                             *BOUNDS, tol=1e-3), 4)


def fit(rows: list[mlperf.Run], rounds: int = 8) -> Fit:
    """The host time and the `APPLIED` families' shares minimising the mean squared log error
    of `rows` (every family's), fitted alternately until neither moves."""
    by_fam = {fam: [r for r in rows if _family_of(r) == fam] for fam in APPLIED}
    current = Fit(0.0, {fam: A100_SHARE for fam, rs in by_fam.items() if rs})
    for _ in range(rounds):
        shares = {fam: fit_share(rs, current.sync_s) for fam, rs in by_fam.items() if rs}
        pick = Fit(0.0, shares).share
        sync = round(_golden_min(lambda c, pick=pick: float(np.mean(
            log_errors(rows, pick, c) ** 2)), *SYNC_BOUNDS, tol=1e-4), 4)
        moved = (abs(sync - current.sync_s) > 2e-4
                 or any(abs(shares[f] - current.shares.get(f, 0)) > 2e-3 for f in shares))
        current = Fit(sync, shares)
        if not moved:
            break
    return current


def every_run() -> list[mlperf.Run]:
    """Every family's priceable rows."""
    return [r for fam in FAMILIES for r in runs(fam)]


@functools.cache
def shipped_fit() -> Fit:
    """The fit over every row (what the device specs carry)."""
    return fit(every_run())


@functools.cache
def held_out_fits() -> dict[str, Fit]:
    """Benchmark -> the fit without its rows."""
    rows = every_run()
    benches = sorted({r.row["benchmark"] for r in rows})
    return {b: fit([r for r in rows if r.row["benchmark"] != b]) for b in benches}


@functools.cache
def held_out_predictions() -> dict[tuple, float]:
    """`key(run)` -> its step time predicted leave-one-benchmark-out, for every priceable row:
    what the error bands and `benchmarks/accuracy.py` take as those rows' out-of-sample
    prediction."""
    out = {}
    for bench, f in held_out_fits().items():
        for run in every_run():
            if run.row["benchmark"] == bench:
                err = f.log_errors([run])  # empty where the planner refuses the row
                if len(err):
                    out[key(run)] = run.measured_s * math.exp(err[0])
    return out


def _mape(log_err: np.ndarray) -> float:
    return float(100 * np.mean(np.abs(np.expm1(log_err))))


def main() -> None:
    rows = every_run()
    f = shipped_fit()
    held = held_out_fits()
    print(f"host time per step: {1e3 * f.sync_s:.1f} ms over {len(rows)} rows "
          f"(leave-one-benchmark-out: "
          + ", ".join(f"{b} {1e3 * h.sync_s:.1f}" for b, h in held.items()) + ")")
    for fam in FAMILIES:
        fam_rows = runs(fam)
        share = f.shares.get(fam) or fit_share(fam_rows, f.sync_s)
        before = log_errors(fam_rows, A100_SHARE, 0.0)
        after = log_errors(fam_rows, share if fam in APPLIED else None, f.sync_s)
        print(f"{fam}: {len(fam_rows)} rows; share {share:.3f} of the microbenchmark "
              f"(carried A100 share {A100_SHARE}, no host time: MAPE {_mape(before):.1f} %, "
              f"bias {100 * np.mean(np.expm1(before)):+.1f} %); as fitted: MAPE "
              f"{_mape(after):.1f} % in sample, bias {100 * np.mean(np.expm1(after)):+.1f} %"
              + ("" if fam in APPLIED else " (the share not applied: the carried one is kept)"))
        every = []
        for bench, h in held.items():
            err = h.log_errors([r for r in fam_rows if r.row["benchmark"] == bench])
            if len(err):
                every.append(err)
                print(f"  held out {bench}: share {h.shares.get(fam, A100_SHARE):.3f}, host "
                      f"{1e3 * h.sync_s:.1f} ms without it, its {len(err)} rows MAPE "
                      f"{_mape(err):.1f} % (bias {100 * np.mean(np.expm1(err)):+.1f} %)")
        if every:
            print(f"  leave-one-benchmark-out over all {sum(map(len, every))} rows: MAPE "
                  f"{_mape(np.concatenate(every)):.1f} %")
        if fam in APPLIED:
            for dev in FAMILIES[fam]:
                bf16, fp8 = MICROBENCHMARK[dev]
                spec = f"matmul: {round(bf16 * share, 3)}"
                if fp8 is not None:
                    spec += f", matmul_fp8: {round(fp8 * share, 3)}"
                if dev in FP4_DEVICES:
                    spec += (f", matmul_fp4: {round(bf16 * FP4_OVER_BF16[dev] * share, 3)}"
                             f", matmul_mxfp8: {round(fp8 * MXFP8_OVER_FP8 * share, 3)}")
                print(f"  {dev}: {spec}")
    print(f"every device: kernels.step_sync_us: {round(f.sync_s * 1e6, -2):.0f}")


if __name__ == "__main__":
    main()
