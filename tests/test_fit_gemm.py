"""`kernels.gemm_half_dim` of H100 / H200 and the Blackwell GPUs, and the Blackwell GPUs'
`kernels.gemm_half_dim_fp8`: what `python -m planner.fit_gemm` fits to XLA's published GEMM
shape tables, with the cost model's own curve (`gemm_share`)."""

import numpy as np
import pytest

from planner.catalog import load_device
from planner.fit_gemm import SOURCES, errors, fit, memory_Bps, rows
from planner.spec.hardware import gemm_share


@pytest.mark.parametrize("device, dtype, field, specs", SOURCES)
def test_shipped_half_dimension_is_the_fit(device, dtype, field, specs):
    data = rows(device, dtype)
    assert len(data["m"]) == 125  # M, N, K each in 256, 512, ..., 4096
    got = fit(data, memory_Bps(specs[0]))
    for spec in specs:
        assert getattr(load_device(spec).kernels, field) == got["half"], spec
    err = np.abs(errors(data, got, memory_Bps(specs[0])))
    assert err.mean() < 0.15, err.mean()
    # the benchmark's large-GEMM rate lies near its own largest measurement
    assert 0.9 < got["rate"] / (data["tflops"].max() * 1e12) < 1.2


def test_the_curve_is_half_at_the_half_dimension_and_saturates():
    assert gemm_share(180.0, 180.0) == 0.5
    assert gemm_share(4096.0, 180.0) == pytest.approx(1, abs=0.002)
    assert gemm_share(0.0, 180.0) == 0.0


def test_fp8_tiles_need_a_thicker_operand_on_blackwell():
    """The fp8 table's half dimension exceeds the bf16 one (a doubled rate per tile), and the
    H100 fp8 rows left unfitted are the ones no kernel can reach: some exceed the datasheet's
    fp8 peak, so Hopper keeps one half dimension for both formats."""
    b200 = load_device("b200").kernels
    assert b200.gemm_half_dim_fp8 > b200.gemm_half_dim
    h100 = load_device("h100-sxm5-80gb")
    assert h100.kernels.gemm_half_dim_fp8 is None
    assert rows("h100", "fp8")["tflops"].max() > h100.peak_tflops["fp8"]
    assert rows("b200", "fp8")["tflops"].max() < load_device("b200").peak_tflops["fp8"]


def test_an_fp8_gemm_takes_the_fp8_half_dimension():
    """Symbolic against numeric: a thin fp8 GEMM of the cost model runs at the fp8 curve's
    share of the fp8 rate, a 16-bit one (the LM head) at the bf16 curve's share."""
    from planner.catalog import load_model, load_system
    from planner.cost.transformer import Hardware
    from planner.expr.choices import Choices
    from planner.expr.layer import LayerCosts
    from planner.spec.hardware import Precision

    model = load_model("llama3-8b")
    hw = Hardware.of(load_system("dgx-b200"), Precision.fp8)
    costs = LayerCosts(model, hw, Choices(), cp=1, ep=1, etp=1)
    thin = 128
    work = costs._matmul(thin, 65536, 65536)
    flops = 2 * thin * 65536 * 65536
    fp8_time = float(work)
    expected = flops / (hw.matmul_flops * gemm_share(thin, hw.gemm_half_dim_fp8))
    assert expected > 10 * hw.launch_s  # the curve, not the host's issue floor, is tested
    assert fp8_time == pytest.approx(expected, rel=1e-9)
    sixteen = float(costs._matmul(thin, 65536, 65536, sixteen=True))
    rate16 = costs._sixteen_bit()[0]
    assert sixteen == pytest.approx(flops / (rate16 * gemm_share(thin, hw.gemm_half_dim)),
                                    rel=1e-9)
