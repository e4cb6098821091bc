"""The knee `solve` reports (where scaling stops), cross-checked against solves pinned to each
device count, for both model families; the low-efficiency warning and --knee-tolerance."""

import jsonschema
import pytest

import planner.api as api
from planner.errors import InfeasibleError
from planner.schema import schemas


def _best_time_at(model, hardware, devices, **kw) -> float | None:
    """The objective (time per sample) of the best plan pinned to `devices`, or None."""
    try:
        return api.solve(model, hardware, devices=devices, **kw).objective["value"]
    except InfeasibleError:
        return None


def _check(sol, model, hardware, counts, **kw):
    knee = sol.knee
    times = {d: t for d in counts if (t := _best_time_at(model, hardware, d, **kw)) is not None}
    best = min(times.values())
    assert knee["best_time_s"] == pytest.approx(best, rel=1e-9)
    assert knee["best_devices"] == min(d for d, t in times.items() if t <= best * (1 + 1e-12))
    # the knee: the fewest devices within the tolerance of the best
    within = [d for d, t in times.items() if t <= best * (1 + knee["tolerance"])]
    assert knee["devices"] == min(within)
    assert knee["time_s"] == pytest.approx(times[knee["devices"]], rel=1e-9)
    # the last doubling: best at half the devices over the best
    half = knee["best_devices"] // 2
    assert knee["last_doubling_from_devices"] == half
    assert knee["last_doubling_speedup"] == pytest.approx(times[half] / best, rel=1e-9)
    # scaling efficiency of the chosen plan against the fewest devices that fit
    d0 = min(times)
    assert knee["base_devices"] == d0
    assert knee["scaling_efficiency"] == pytest.approx(
        times[d0] * d0 / (sol.objective["value"] * sol.plan.devices), rel=1e-9)
    return knee


def test_cnn_knee_matches_pinned_solves():
    sol = api.solve("alexnet", "k80-fdr", global_batch=256)
    knee = _check(sol, "alexnet", "k80-fdr", [2**k for k in range(9)], global_batch=256)
    # the README's first command: 256 devices are only ~10 % faster than the knee's 16
    assert knee["devices"] < sol.plan.devices == 256
    assert knee["last_doubling_speedup"] < 1.1


def test_transformer_knee_matches_pinned_solves():
    kw = dict(global_batch=512)
    sol = api.solve("gpt2", "dgx-a100-80gb", devices_max=64, **kw)
    _check(sol, "gpt2", "dgx-a100-80gb", [2**k for k in range(7)], devices_max=64, **kw)


def test_tolerance_moves_the_knee_and_zero_is_the_best():
    wide = api.solve("alexnet", "k80-fdr", global_batch=256, knee_tolerance=0.5).knee
    narrow = api.solve("alexnet", "k80-fdr", global_batch=256, knee_tolerance=0.0).knee
    assert wide["devices"] <= narrow["devices"] == narrow["best_devices"]
    assert wide["tolerance"] == 0.5


def test_cost_objective_knee_is_in_time_to_train():
    sol = api.solve("alexnet", "k80-fdr", global_batch=256, objective="cost",
                    critical_batch=512, target_samples=1e7, price_per_device_hour=1.0)
    assert sol.knee["measure"] == "time to train"
    assert sol.knee["best_time_s"] <= sol.training["time_to_train_s"]


def test_json_knee_validates_and_text_has_a_knee_line(run, run_json):
    doc = run_json("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256")
    jsonschema.validate(doc, schemas()["solve"])
    assert set(doc["knee"]) >= {"devices", "time_s", "tolerance", "last_doubling_speedup"}
    code, out, err = run("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256")
    assert code == 0
    assert "knee" in out and "last doubling (128 -> 256 devices)" in out
    # 256 devices at 3 % efficiency: one warning line on stderr that names the knee
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planner: warning:")
    assert "3%" in lines[0] and "16 devices" in lines[0]


def test_no_warning_when_the_plan_scales(run):
    code, out, err = run("solve", "-m", "gpt3-175b", "-H", "dgx-a100-80gb", "--devices-max",
                         "4096", "--global-batch", "1536")
    assert code == 0 and "knee" in out and "warning" not in err


def test_knee_tolerance_flag(run):
    code, out, _ = run("solve", "--help")
    out = " ".join(out.split())
    assert "--knee-tolerance" in out and "default: 0.1" in out
    assert "default: throughput" in out
    code, _, err = run("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
                       "--knee-tolerance", "-1")
    assert code == 2 and "knee-tolerance" in err and "Traceback" not in err


def test_a_cnn_split_warns_too_and_has_no_knee(run):
    code, out, err = run("solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256",
                         "--devices", "256", "--strategy", "pipeline")
    assert code == 0 and "knee" not in out
    assert err.startswith("planner: warning: the chosen plan runs 256 devices")
