"""Fit each device's `kernels.gemm_half_dim` (the thinnest GEMM dimension at which a matmul
reaches half its large-GEMM rate) and `kernels.gemm_half_dim_fp8` (the same for GEMMs on 1-byte
operands) to published GEMM benchmarks by shape: `planner/calibration/gemm_shapes.csv`, the
tables XLA ships for its GPU cost model (openxla/xla `default_matmul_perf_table.txtpb`: every
M, N, K in 256 ... 4096, the median kernel time of 5 runs on H100 (sm_90) and B200 (sm_100), in
bf16 and in fp8 (e4m3 x e4m3 -> bf16); MI355X's (gfx950) are kept, not fitted). H100's fp8 rows
are kept but not fitted: six of them exceed the H100's datasheet fp8 peak (1,979 TFLOP/s), which
no kernel can, so the table did not time what it names there; Hopper's fp8 GEMMs take the bf16
half dimension.

The form: a GEMM of 2 M N K FLOPs takes t_0 + max(FLOPs / (R x share(min(M, N, K))),
bytes / HBM bandwidth), `share` being the cost model's curve (`planner.spec.hardware
.gemm_share`) and t_0 the fixed time of a kernel on the device (about 6 us: its launch on the
GPU, prologue and the last wave's tail), which the smallest shapes are made of. R (the
benchmark's large-GEMM rate) and t_0 are fitted with the half dimension but not shipped: the
cost model's large-GEMM rate is the spec's `efficiency.matmul`, and its kernels are floored by
the host's issue time (`kernels.launch_us`, ten times t_0), under which t_0 disappears. Fitted
on the squared log error of the times, over grids of the three.

    python -m planner.fit_gemm          # the fitted half dimension and its error per device
"""

from __future__ import annotations

import csv
from importlib import resources

import numpy as np

from planner.spec.hardware import gemm_share

# (benchmark device, operand format, the spec field it fits, the device specs that run its
# chip): H200 is H100's die with more HBM, GB200 B200's, B300 / GB300 the same Blackwell SM
# generation
HOPPER, BLACKWELL = ("h100-sxm5-80gb", "h200-sxm-141gb"), ("b200", "gb200", "b300", "gb300")
SOURCES = (("h100", "bf16", "gemm_half_dim", HOPPER),
           ("b200", "bf16", "gemm_half_dim", BLACKWELL),
           ("b200", "fp8", "gemm_half_dim_fp8", BLACKWELL))
OPERAND_BYTES = {"bf16": 2, "fp8": 1}  # the result is bf16 in both tables
# the table's MI355X (gfx950) rows are in the CSV but not fitted: the form misses them (MAPE 14 %,
# R 805 TFLOP/s where its largest shape measures 1,240), so MI355X keeps the A100's constant
_HALVES = np.arange(0.0, 1000.0, 5.0)
_FLOORS = np.exp(np.linspace(np.log(0.5e-6), np.log(50e-6), 40))


def rows(device: str, dtype: str = "bf16") -> dict:
    """m, n, k and TFLOP/s of one benchmark device's rows in one operand format (and the
    format's operand bytes)."""
    path = resources.files("planner") / "calibration" / "gemm_shapes.csv"
    with path.open(newline="", encoding="utf-8") as fh:
        data = [r for r in csv.DictReader(fh) if r["device"] == device and r["dtype"] == dtype]
    return {**{key: np.array([float(r[key]) for r in data])
               for key in ("m", "n", "k", "tflops")}, "operand_bytes": OPERAND_BYTES[dtype]}


def seconds(data: dict, rate, half: float, floor_s: float, mem_Bps: float) -> np.ndarray:
    """The form's time of every row (`rate` a number, or a column of them: one row each)."""
    m, n, k = data["m"], data["n"], data["k"]
    compute = 2 * m * n * k / (rate * gemm_share(np.minimum(np.minimum(m, n), k), half))
    memory = (data["operand_bytes"] * (m * k + k * n) + 2 * m * n) / mem_Bps  # bf16 result
    return floor_s + np.maximum(compute, memory)


def fit(data: dict, mem_Bps: float) -> dict:
    """The half dimension, R and t_0 minimising the squared log error of the times."""
    measured = 2 * data["m"] * data["n"] * data["k"] / (data["tflops"] * 1e12)
    top = float(data["tflops"].max()) * 1e12
    rates = np.exp(np.linspace(np.log(0.5 * top), np.log(2.5 * top), 161))[:, None]
    best = None
    for half in _HALVES:
        for floor_s in _FLOORS:
            loss = np.mean(np.log(seconds(data, rates, half, floor_s, mem_Bps) / measured) ** 2,
                           axis=1)
            i = int(np.argmin(loss))
            if best is None or loss[i] < best[0]:
                best = (loss[i], half, float(rates[i, 0]), float(floor_s))
    _, half, rate, floor_s = best
    return {"half": float(half), "rate": rate, "floor_s": floor_s}


def errors(data: dict, fitted: dict, mem_Bps: float) -> np.ndarray:
    """Predicted over measured time minus one, for each row."""
    measured = 2 * data["m"] * data["n"] * data["k"] / (data["tflops"] * 1e12)
    return seconds(data, fitted["rate"], fitted["half"], fitted["floor_s"], mem_Bps) \
        / measured - 1


def memory_Bps(spec: str) -> float:
    """The achievable HBM bandwidth of a device spec (datasheet x efficiency.memory)."""
    from planner.catalog import load_device

    dev = load_device(spec)
    return dev.memory_bandwidth_Bps * dev.efficiency.memory


def main() -> None:
    for device, dtype, field, specs in SOURCES:
        data, bw = rows(device, dtype), memory_Bps(specs[0])
        got = fit(data, bw)
        err = np.abs(errors(data, got, bw))
        print(f"{device} {dtype} ({len(data['m'])} rows) -> {', '.join(specs)}: {field} "
              f"{got['half']:.0f} (R {got['rate'] / 1e12:.0f} TFLOP/s, t_0 "
              f"{got['floor_s'] * 1e6:.1f} us); MAPE {100 * err.mean():.1f} %, worst "
              f"{100 * err.max():.1f} %")


if __name__ == "__main__":
    main()
