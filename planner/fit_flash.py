"""Fit each device's fused-attention rate (`flash_attention:` in its spec) to the published kernel
benchmarks in `planner/calibration/flash_attention.csv`: FlashAttention-2 on A100 (Dao 2023,
figs. 4-7), cuDNN's fused attention on H100 (Shah et al. 2024, FlashAttention-3, figs. 5-6),
the kernel Transformer Engine, and so Megatron-LM and NeMo, run on Hopper; cuDNN on B200
(9.13.0, Zadouri et al. 2026, FlashAttention-4's benchmark figures) and on GB200 and GB300
(backend 9.27.0, NVIDIA cudnn-frontend's published training benchmark), head dim 128 only.

The form: at head dimension d and k keys per query a direction (forward, backward) runs at
R[d] x k / (k + k_half), a saturating curve in the keys each query tile streams past (short
sequences leave the pipelined K/V loads and the softmax rescaling unamortised). R[d] per head
dimension and direction; k_half per direction, causal and not. Causal masking wastes the
diagonal tiles and leaves the tiles unevenly long: it adds about the same keys to k_half in
every direction measured (A100 FA2: forward +316, backward +371; H100 cuDNN forward +368),
so one `causal_extra_keys` per device, fitted on the forward, stands in for the directions a
source does not give (cuDNN's causal backward). Fitted by alternating the closed-form least
squares of each R (mean log ratio, k_half fixed) with a log-grid search of each k_half, on the
squared log error. The fp8 forward and backward, where benchmarked (cuDNN's forward on H100;
both directions on GB200 and GB300, per-tensor fp8 and MXFP8), are the same kernel with fp8
operands: each direction's R[d] and k_half are fitted with the 16-bit fit's causal extra held.
Blackwell's published rows are head dim 128 only; its 16-bit R at the head dims cuDNN's H100
rows have and its own lack (64, and 256 forward) is its R at 128 times H100's ratio of the two
(`carried`): the same kernel family, and FlashAttention-4 (Zadouri et al. 2026, sec. 2) names
Blackwell's exponential units, whose work per FLOP doubles at head dim 64, its bottleneck, so
the Hopper ratio is if anything kind to it.

    python -m planner.fit_flash          # the fitted blocks and their error per device
"""

from __future__ import annotations

import csv
from importlib import resources

import numpy as np

from planner.spec.hardware import FlashCurve

# (device spec, kernel in the CSV): the kernel the device's usual training stack runs
SOURCES = (("a100-sxm4-80gb", "flash-attention-2"), ("h100-sxm5-80gb", "cudnn"), ("b200", "cudnn"),
           ("gb200", "cudnn"), ("gb300", "cudnn"), ("mi300x", "aiter"), ("mi355x", "aiter"))
# devices with no benchmark of their own that take another's block (the same die on a board
# of another power and clock: MI325X's 1000 W and MI350X's 2.2 GHz against MI300X and MI355X,
# HGX B300's air-cooled 1,100 W Blackwell Ultra against GB300's 1,400 W), every rate scaled by
# the ratio of their 16-bit GEMM rates (peak x matmul efficiency): the kernel is compute-bound
# at training's sequence lengths
SCALED = (("mi325x", "mi300x"), ("mi350x", "mi355x"), ("b300", "gb300"))
# the one cuDNN fit across head dims (64, 128, 256), whose ratios the head-dim-128-only devices
# carry (`carried`)
REFERENCE = ("h100-sxm5-80gb", "cudnn")
_GRID = np.exp(np.linspace(0.0, np.log(20_000.0), 800))


LOW = FlashCurve.QUANTIZED  # the quantized directions a block may carry


def rows(device: str, kernel: str, fp8: bool = False) -> list[dict]:
    """The 16-bit forward and backward rows of one device and kernel (`fp8`: its fp8 and
    MXFP8 rows, directions "fp8_fwd", "fp8_bwd", "mxfp8_fwd", "mxfp8_bwd")."""
    path = resources.files("planner") / "calibration" / "flash_attention.csv"
    with path.open(newline="", encoding="utf-8") as fh:
        if fp8:
            return [{**r, "direction": f"{r['precision']}_{r['direction']}"}
                    for r in csv.DictReader(fh)
                    if r["device"] == device and r["kernel"] == kernel
                    and r["precision"] in ("fp8", "mxfp8") and r["direction"] in ("fwd", "bwd")]
        return [r for r in csv.DictReader(fh)
                if r["device"] == device and r["kernel"] == kernel
                and r["precision"] in ("fp16", "bf16") and r["direction"] in ("fwd", "bwd")]


def fit_fp8(data: list[dict], fitted: dict) -> dict:
    """Per quantized direction in `data` (`LOW`): R[d] and the half-rate keys (fp8 operands
    saturate later: the tiles finish sooner against the same softmax work)."""
    return {w: _fit_fp8_direction([r for r in data if r["direction"] == w], fitted)
            for w in LOW if any(r["direction"] == w for r in data)}


def _fit_fp8_direction(data: list[dict], fitted: dict) -> dict:
    """R[d] and the half-rate keys of one direction's fp8 rows, the 16-bit fit's causal
    extra held: the closed-form R per k_half on a log grid, the least squared log error."""
    extra = fitted["halves"][("fwd", True)] - fitted["halves"][("fwd", False)]
    keys = np.array([float(r["seq_len"]) for r in data])
    causal = np.array([r["causal"] == "true" for r in data])
    dims = np.array([int(r["head_dim"]) for r in data])
    y = np.log([float(r["tflops"]) for r in data])
    best = None
    for g in _GRID:
        shape = np.log(keys / (keys + g + causal * extra))
        rates = {int(d): float(np.mean(y[dims == d] - shape[dims == d])) for d in set(dims)}
        loss = float(np.sum((y - shape - np.array([rates[d] for d in dims])) ** 2))
        if best is None or loss < best[0]:
            best = (loss, g, rates)
    return {"rates": {d: float(np.exp(v)) for d, v in sorted(best[2].items())},
            "half_keys": float(best[1])}


def fit(data: list[dict]) -> dict:
    """R per (direction, head dim) and k_half per (direction, causal) for `data`; then, with
    every causal k_half replaced by the non-causal one plus the forward's causal extra (what
    the spec keeps), R refitted to them."""
    keys = np.array([float(r["seq_len"]) for r in data])
    y = np.log([float(r["tflops"]) for r in data])
    rate_key = [(r["direction"], int(r["head_dim"])) for r in data]
    half_key = [(r["direction"], r["causal"] == "true") for r in data]
    rates = dict.fromkeys(rate_key, 1.0)
    halves = dict.fromkeys(half_key, 100.0)

    def fit_rates():
        h = np.array([halves[k] for k in half_key])
        for k in rates:
            m = np.array([x == k for x in rate_key])
            rates[k] = float(np.exp(np.mean(y[m] - np.log(keys[m] / (keys[m] + h[m])))))

    for _ in range(40):
        fit_rates()
        r = np.array([rates[k] for k in rate_key])
        for k in halves:
            m = np.array([x == k for x in half_key])
            loss = [np.sum((y[m] - np.log(r[m] * keys[m] / (keys[m] + g))) ** 2) for g in _GRID]
            halves[k] = float(_GRID[int(np.argmin(loss))])
    halves = {k: round(v) for k, v in halves.items()}
    extra = halves[("fwd", True)] - halves[("fwd", False)]
    halves.update({(w, True): halves[(w, False)] + extra for w, _ in list(halves)})
    fit_rates()
    return {"rates": rates, "halves": halves}


def carried(fitted: dict, reference: dict) -> dict:
    """`fitted` with the 16-bit R of every head dim the `reference` fit has in a direction
    and `fitted` lacks: `fitted`'s R at its nearest measured dim times the reference's ratio of
    the two."""
    rates = dict(fitted["rates"])
    for (w, d), r in reference["rates"].items():
        own = [dd for ww, dd in fitted["rates"] if ww == w]  # the measured dims only
        if own and d not in own:
            near = min(own, key=lambda x: abs(x - d))
            rates[(w, d)] = fitted["rates"][(w, near)] * r / reference["rates"][(w, near)]
    return {**fitted, "rates": dict(sorted(rates.items()))}


def device_block(device: str, kernel: str) -> dict:
    """A device's `flash_attention:` block: its fit, the reference's head-dim ratios carried
    where its rows give one head dim only (`carried`), its quantized directions' fit."""
    data, data8 = rows(device, kernel), rows(device, kernel, fp8=True)
    fitted = fit(data)
    if (device, kernel) != REFERENCE and len({int(r["head_dim"]) for r in data}) == 1:
        fitted = carried(fitted, fit(rows(*REFERENCE)))
    return block(kernel, fitted, fit_fp8(data8, fitted) if data8 else None)


def scaled_block(device: str, source: str) -> dict:
    """`device`'s block: `source`'s shipped one with every rate times the ratio of the two
    devices' 16-bit GEMM rates (`SCALED`)."""
    from planner.catalog import load_device

    own, src = load_device(device), load_device(source)
    ratio = ((own.peak_tflops["bf16"] * own.efficiency.matmul)
             / (src.peak_tflops["bf16"] * src.efficiency.matmul))
    out = src.flash_attention.model_dump(exclude_none=True)
    for key, value in out.items():
        if key.endswith("_tflops"):
            out[key] = {d: round(r * ratio) for d, r in value.items()}
        elif isinstance(value, float):
            out[key] = round(value)
    return out


def block(kernel: str, fitted: dict, fp8: dict | None = None) -> dict:
    """The device spec's `flash_attention:` block from a fit (and its quantized directions',
    `fit_fp8`)."""
    rates, halves = fitted["rates"], fitted["halves"]
    extra = halves[("fwd", True)] - halves[("fwd", False)]
    out = {"kernel": kernel,
           "fwd_tflops": {d: round(v) for (w, d), v in sorted(rates.items()) if w == "fwd"},
           "bwd_tflops": {d: round(v) for (w, d), v in sorted(rates.items()) if w == "bwd"},
           "fwd_half_keys": round(halves[("fwd", False)]),
           "bwd_half_keys": round(halves[("bwd", False)]),
           "causal_extra_keys": round(extra)}
    for w, f in (fp8 or {}).items():
        out[f"{w}_tflops"] = {d: round(v) for d, v in f["rates"].items()}
        out[f"{w}_half_keys"] = round(f["half_keys"])
    return out


def errors(spec_block, data: list[dict]) -> np.ndarray:
    """Predicted over measured minus one for each row, with a device's `FlashAttention`."""
    curve = spec_block.curve()
    return np.array([curve.achieved(r["direction"], int(r["head_dim"]), float(r["seq_len"]),
                                    float(r["causal"] == "true")) / 1e12 / float(r["tflops"]) - 1
                     for r in data])


def main() -> None:
    from planner.catalog import load_device

    for device, kernel in SOURCES:
        data, data8 = rows(device, kernel), rows(device, kernel, fp8=True)
        print(f"{device} ({kernel}, {len(data)} rows, {len(data8)} fp8): "
              f"{device_block(device, kernel)}")
        shipped = load_device(device).flash_attention
        for what, rows_ in (("16-bit", data), *((w, [r for r in data8 if r["direction"] == w])
                                                for w in LOW)):
            if rows_:
                err = np.abs(errors(shipped, rows_))
                print(f"  shipped spec, {what}: MAPE {100 * err.mean():.1f} %, worst "
                      f"{100 * err.max():.1f} %")
    for device, source in SCALED:
        print(f"{device} ({source}'s, scaled by their GEMM rates): {scaled_block(device, source)}")


if __name__ == "__main__":
    main()
