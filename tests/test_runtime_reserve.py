"""The runtime reserve: the device memory a training process cannot give its tensors (the
capacity the driver keeps, the CUDA context, the collective library's buffers). A plan fits
when its weights, gradients, optimizer state and activations need at most the memory less the
reserve, times (1 - headroom); every MLPerf submission's own plan still fits
(`tests/test_weight_memory.py`)."""

import pytest

from planner import switches
from planner.catalog import HARDWARE, load_hardware_any, load_model, load_system
from planner.errors import SpecError
from planner.plan import Plan
from planner.search.hybrid import HybridSolver, Search, predict
from planner.spec.hardware import Precision

GiB = 2**30


@pytest.mark.parametrize("system, memory, reserve", [
    ("dgx-h100", 80, 3), ("dgx-a100-80gb", 80, 3), ("gb300-nvl72", 288, 3),
    ("mi300x-8", 192, 3)])
def test_a_plan_may_use_the_memory_less_the_reserve(system, memory, reserve):
    dev = load_system(system).device
    assert dev.memory_bytes == memory * GiB and dev.runtime_reserve_GiB == reserve
    assert dev.usable_memory_bytes == (memory - reserve) * GiB


def test_devices_of_the_2016_experiments_keep_their_whole_memory():
    """The K80 and Titan X of Keuper & Pfreundt's runs have no reserve: the paper's memory
    limits are reproduced as it states them."""
    for name in ("k80", "titan-x-maxwell"):
        dev = load_hardware_any(name)
        assert dev.runtime_reserve_GiB == 0 and dev.usable_memory_bytes == dev.memory_bytes


def _gpt3_h100(plan_args: dict):
    m, system = load_model("gpt3-175b"), load_system("dgx-h100")
    plan = Plan.split(4, plan_args["pp"], plan_args["dp"], plan_args["mb"], 3072,
                      node_size=8, interleave=plan_args["v"], sequence_parallel=True, zero=1,
                      grad_reduce_bf16=True, fp8_activations=True, tp_overlap=True)
    return m, system, predict(m, system, Precision.fp8, plan)


def test_a_plan_over_the_usable_memory_does_not_fit_though_under_the_device_memory():
    """GPT-3 175B on 768 H100 at tp 4 pp 6 x 8, micro-batch 2: the search's pick before the
    reserve (79.7 GiB of 80 by the model, fuller than any MLPerf run of an H100, whose fullest
    plan leaves 7.5 GiB free); with 3 GiB reserved it does not fit, and the pick fits 77."""
    m, system, pred = _gpt3_h100({"pp": 6, "dp": 32, "mb": 2, "v": 8})
    assert 77 * GiB < pred.memory_bytes_per_device < 80 * GiB
    assert pred.memory_capacity_bytes == 77 * GiB and not pred.fits_memory
    sol = HybridSolver(m, system, Precision.fp8,
                       Search(global_batch=3072, devices=768, grad_reduce_bf16=True,
                              searched=switches.SEARCHED)).solve()
    assert sol.prediction.memory_bytes_per_device <= 77 * GiB
    assert sol.prediction.memory_capacity_bytes == 77 * GiB


def test_the_headroom_applies_to_what_the_reserve_leaves():
    m, system = load_model("gpt3-175b"), load_system("dgx-h100")
    sol = HybridSolver(m, system, Precision.fp8,
                       Search(global_batch=3072, devices=768, tp=4, pp=8,
                              memory_headroom=0.1)).solve()
    assert sol.prediction.memory_capacity_bytes == pytest.approx(0.9 * 77 * GiB, rel=1e-12)


def test_a_reserve_as_large_as_the_memory_is_refused_in_one_line(tmp_path):
    k80 = (HARDWARE / "devices" / "k80.yaml").read_text()
    path = tmp_path / "dev.yaml"
    path.write_text(k80.replace("memory_GiB: 12", "memory_GiB: 12\nruntime_reserve_GiB: 12"))
    with pytest.raises(SpecError) as err:
        load_hardware_any(str(path))
    assert "\n" not in str(err.value) and "runtime_reserve_GiB" in str(err.value)


def test_show_and_evaluate_name_the_usable_memory(run, run_json):
    code, out, _ = run("show", "hardware", "h100-sxm5-80gb")
    assert code == 0 and "80 GiB (77 GiB usable: 3 GiB runtime reserve)" in out
    doc = run_json("show", "hardware", "h100-sxm5-80gb")
    assert doc["runtime_reserve_GiB"] == 3 and doc["memory_GiB"] == 80
    code, out, _ = run("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "8",
                       "--global-batch", "64")
    assert code == 0 and " of 82.7 GB usable (" in out  # 77 GiB
