"""The in-training GEMM share fitted per GPU family to the MLPerf Training rows
(`planner.fit_mlperf`): the shipped specs carry the fit, it beats the A100's carried share on
the family's rows, and the microbenchmark fractions it scales are the specs' own sources."""

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


@pytest.mark.slow
@pytest.mark.parametrize("family", fm.APPLIED)
def test_shipped_gemm_rates_are_the_family_fit_and_beat_the_carried_share(family):
    rows = fm.runs(family)
    share = fm.fit(rows)
    for device in fm.FAMILIES[family]:
        eff, (bf16, fp8) = load_device(device).efficiency, fm.MICROBENCHMARK[device]
        assert eff.matmul == pytest.approx(bf16 * share, abs=1.5e-3), device
        if fp8 is not None:
            assert eff.matmul_fp8 == pytest.approx(fp8 * share, abs=1.5e-3), device
    fitted = np.mean(fm.log_errors(rows, share) ** 2)
    carried = np.mean(fm.log_errors(rows, fm.A100_SHARE) ** 2)
    assert fitted < carried
    assert abs(np.mean(np.expm1(fm.log_errors(rows, share)))) < 0.05  # the bias is gone


@pytest.mark.slow  # refits each family once per benchmark held out (about a minute)
def test_held_out_predictions_cover_every_fitted_row_by_its_key():
    """Every priceable row of the fitted families has a leave-one-benchmark-out prediction,
    found by its values (not by the object that read it)."""
    held = fm.held_out_predictions()
    rows = [r for fam in fm.APPLIED for r in fm.runs(fam)]
    assert len(held) == len(rows) and all(fm.key(r) in held for r in rows)


def test_hopper_keeps_the_carried_a100_share():
    """Hopper is not refitted: its specs keep 0.807 of their microbenchmark."""
    assert "H100 / H200" not in fm.APPLIED
    for device in fm.FAMILIES["H100 / H200"]:
        bf16, fp8 = fm.MICROBENCHMARK[device]
        eff = load_device(device).efficiency
        assert eff.matmul == pytest.approx(bf16 * fm.A100_SHARE, abs=1.5e-3)
        assert eff.matmul_fp8 == pytest.approx(fp8 * fm.A100_SHARE, abs=1.5e-3)
