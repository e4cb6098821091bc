"""The in-training GEMM share per GPU family and the host time per step, fitted to the MLPerf
Training rows (`planner.fit_mlperf`): the shipped specs carry the fit, it beats the A100's
carried share without host time, and the microbenchmark fractions it scales are the specs' own
sources."""

import numpy as np
import pytest

from planner import fit_mlperf as fm
from planner.catalog import load_device


@pytest.mark.parametrize("device", sorted(fm.MICROBENCHMARK))
def test_microbenchmark_fractions_are_the_ones_each_spec_cites(device):
    """The fractions the fit scales are the device spec's own Bekman rows (its source text)."""
    bf16, fp8 = fm.MICROBENCHMARK[device]
    text = load_device(device).sources["efficiency"]
    assert f"microbenchmark fraction {bf16} x" in text
    if fp8 is not None:
        assert f"fp8 GEMM microbenchmark fraction {fp8} (" in text


@pytest.mark.slow  # fits the host time and the shares together (about a minute)
def test_shipped_specs_are_the_fit_and_beat_the_carried_share_without_host_time():
    f = fm.shipped_fit()
    for family in fm.APPLIED:
        for device in fm.FAMILIES[family]:
            eff, (bf16, fp8) = load_device(device).efficiency, fm.MICROBENCHMARK[device]
            assert eff.matmul == pytest.approx(bf16 * f.shares[family], abs=1.5e-3), device
            if fp8 is not None:
                assert eff.matmul_fp8 == pytest.approx(fp8 * f.shares[family], abs=1.5e-3)
            if device in fm.FP4_DEVICES:
                assert eff.matmul_fp4 == pytest.approx(
                    bf16 * fm.FP4_OVER_BF16[device] * f.shares[family], abs=1.5e-3)
                assert eff.matmul_mxfp8 == pytest.approx(
                    fp8 * fm.MXFP8_OVER_FP8 * f.shares[family], abs=1.5e-3)
    for device in fm.MICROBENCHMARK:  # one host time for every device the fit covers
        assert load_device(device).kernels.step_sync_us == pytest.approx(f.sync_s * 1e6,
                                                                          abs=100), device
    rows = fm.every_run()
    fitted = f.log_errors(rows)
    carried = fm.log_errors(rows, fm.A100_SHARE, 0.0)
    assert np.mean(fitted ** 2) < np.mean(carried ** 2)
    assert abs(np.mean(np.expm1(fitted))) < 0.05  # the bias is gone


def test_the_host_time_adds_to_the_base_prediction_once():
    """The fit prices each share once with no host time and adds it: the same as pricing the
    system with the host time in its spec (one sync a step, whatever the plan)."""
    from planner import mlperf
    from planner.catalog import load_system

    run = next(r for r in fm.runs("Blackwell") if r.row["benchmark"] == "llama31_8b")
    system = load_system(run.system)
    t, _ = mlperf.predicted(run, fm.with_share(system, 0.7, 0.0123))
    (err,) = fm.log_errors([run], 0.7, 0.0123)
    assert run.measured_s * np.exp(err) == pytest.approx(t, rel=1e-12)
    bare, _ = mlperf.predicted(run, fm.with_share(system, 0.7, 0.0))
    assert t - bare == pytest.approx(0.0123, rel=1e-9)
    # a run whose recipe clips the gradient norm on the device reads nothing back: none
    clip = next(r for r in fm.runs("Blackwell") if r.row["on_device_clip_grad"] == "1")
    assert not mlperf.plan_of(clip).host_sync
    (err,) = fm.log_errors([clip], 0.7, 0.0123)
    t, _ = mlperf.predicted(clip, fm.with_share(load_system(clip.system), 0.7, 0.0))
    assert clip.measured_s * np.exp(err) == pytest.approx(t, rel=1e-12)


@pytest.mark.slow  # refits once per benchmark held out (about five minutes)
def test_held_out_predictions_cover_every_row_by_its_key():
    """Every priceable row has a leave-one-benchmark-out prediction, found by its values (not
    by the object that read it)."""
    held = fm.held_out_predictions()
    rows = fm.every_run()
    assert len(held) == len(rows) and all(fm.key(r) in held for r in rows)


def test_hopper_keeps_the_carried_a100_share():
    """Hopper is not refitted: its specs keep 0.807 of their microbenchmark."""
    assert "H100 / H200" not in fm.APPLIED
    for device in fm.FAMILIES["H100 / H200"]:
        bf16, fp8 = fm.MICROBENCHMARK[device]
        eff = load_device(device).efficiency
        assert eff.matmul == pytest.approx(bf16 * fm.A100_SHARE, abs=1.5e-3)
        assert eff.matmul_fp8 == pytest.approx(fp8 * fm.A100_SHARE, abs=1.5e-3)


@pytest.mark.parametrize("device", fm.FP4_DEVICES)
def test_4_bit_gemms_run_at_their_own_fraction_and_other_formats_do_not(device):
    """An nvfp4 plan's GEMMs run at `matmul_fp4` of the fp4 peak, an mxfp8 one's at
    `matmul_mxfp8` of the fp8 peak (below per-tensor fp8's); fp8 and bf16 ones at their own;
    the source names the benchmark the fp4 / bf16 ratio comes from."""
    from planner.catalog import load_system
    from planner.cost.transformer import Hardware
    from planner.spec.hardware import Precision

    system = next(load_system(s) for s in ("dgx-b200", "gb200-nvl72", "dgx-b300",
                                           "gb300-nvl72") if load_system(s).device.name == device)
    dev = system.device
    ultra = device == "b300"  # its own measured ratio
    assert ("NVIDIA/TransformerEngine pull request #2863" if ultra
            else "pytorch/ao pull request #2427") in dev.sources["efficiency"]
    assert f"x {fm.FP4_OVER_BF16[device]} x" in dev.sources["efficiency"]
    assert dev.efficiency.matmul_fp4 < dev.efficiency.matmul
    assert dev.efficiency.matmul_mxfp8 < dev.efficiency.matmul_fp8
    for precision, eff in ((Precision.nvfp4, dev.efficiency.matmul_fp4),
                           (Precision.mxfp8, dev.efficiency.matmul_mxfp8),
                           (Precision.fp8, dev.efficiency.matmul_fp8),
                           (Precision.bf16, dev.efficiency.matmul)):
        assert Hardware.of(system, precision).matmul_flops == pytest.approx(
            dev.peak_flops(precision) * eff, rel=1e-12)


def test_a_device_without_its_own_gemm_benchmark_carries_its_die_s():
    """GB300 publishes no GEMM microbenchmark: it takes the fractions B300 measures (the same
    Blackwell Ultra die), as MI350X takes MI355X's, at its own peaks, so its 16-bit and fp8
    GEMMs run at B300's rates times the boards' peak ratio (2,500 / 2,250: 1.4 kW against
    1.1 kW), and ahead of GB200's (another die's fraction, 0.729)."""
    from planner.catalog import load_system
    from planner.cost.transformer import Hardware
    from planner.spec.hardware import Precision

    assert fm.MICROBENCHMARK["gb300"] == fm.MICROBENCHMARK["b300"]
    assert fm.MICROBENCHMARK["mi350x"] == fm.MICROBENCHMARK["mi355x"]
    gb300, b300, gb200 = (load_system(s) for s in ("gb300-nvl72", "dgx-b300", "gb200-nvl72"))
    for precision in (Precision.bf16, Precision.fp8, Precision.mxfp8):
        rate = {s.device.name: Hardware.of(s, precision).matmul_flops for s in (gb300, b300, gb200)}
        assert rate["gb300"] == pytest.approx(rate["b300"] * 2500 / 2250, rel=3e-3), precision
        assert rate["gb300"] > 1.02 * rate["gb200"], precision
