"""`kernels.gemm_half_dim` of H100 / H200, the Blackwell GPUs and MI355X: what
`python -m planner.fit_gemm` fits to XLA's published GEMM shape tables, with the cost model's
own curve (`gemm_share`)."""

import numpy as np
import pytest

from planner.catalog import load_device
from planner.fit_gemm import SOURCES, errors, fit, memory_Bps, rows
from planner.spec.hardware import gemm_share


@pytest.mark.parametrize("device, specs", SOURCES)
def test_shipped_half_dimension_is_the_fit(device, specs):
    data = rows(device)
    assert len(data["m"]) == 125  # M, N, K each in 256, 512, ..., 4096
    got = fit(data, memory_Bps(specs[0]))
    for spec in specs:
        assert load_device(spec).kernels.gemm_half_dim == got["half"], spec
    err = np.abs(errors(data, got, memory_Bps(specs[0])))
    assert err.mean() < 0.15, err.mean()
    # the benchmark's large-GEMM rate lies near its own largest measurement
    assert 0.9 < got["rate"] / (data["tflops"].max() * 1e12) < 1.2


def test_the_curve_is_half_at_the_half_dimension_and_saturates():
    assert gemm_share(180.0, 180.0) == 0.5
    assert gemm_share(4096.0, 180.0) == pytest.approx(1, abs=0.002)
    assert gemm_share(0.0, 180.0) == 0.0
