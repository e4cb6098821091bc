"""Calibration: the fit recovers known factors, the specs hold the fitted values, bad CSVs fail cleanly."""

import dataclasses
import math

import pytest

from planner import calibrate as cal
from planner.spec.hardware import Precision


def _run(**kw):
    base = dict(row=1, label="t", citation="synthetic", model="resnet50", system="dgx1-v100-16gb",
                precision=Precision.fp16, devices=1, devices_per_node=1, global_batch=128,
                measured=1.0)
    return cal.Run(**{**base, **kw})


@pytest.mark.parametrize("eta", [0.2, 0.45, 0.9])
def test_fit_recovers_the_efficiency_that_generated_the_data(eta):
    runs = [_run(global_batch=gb) for gb in (64, 256)]
    runs = [dataclasses.replace(r, measured=cal.predicted_throughput(r, eta)) for r in runs]
    assert math.isclose(cal.fit(runs)["v100-sxm2-16gb"], eta, rel_tol=1e-3)


def test_multi_device_rows_are_held_out_of_the_fit():
    one = _run()
    one = dataclasses.replace(one, measured=cal.predicted_throughput(one, 0.5))
    # A wildly wrong 8-GPU row must not move the factor: it is validation, not training data.
    eight = _run(devices=8, devices_per_node=8, global_batch=1024, measured=1.0)
    assert math.isclose(cal.fit([one, eight])["v100-sxm2-16gb"], 0.5, rel_tol=1e-3)
    roles = {r.role for r in cal.report([one, eight])}
    assert roles == {"fit", "held-out"}


def test_specs_hold_the_fitted_values(run):
    code, out, err = run("calibrate", "--check")
    assert code == 0, err


def test_calibrate_json_reports_every_row(run_json):
    doc = run_json("calibrate")
    assert doc["schema_version"] == 1 and doc["command"] == "calibrate"
    rows, skipped = doc["rows"], doc["skipped"]
    assert len(rows) + len(skipped) == len(cal.read_runs()[0]) + len(cal.read_runs()[1])
    for r in rows:
        assert math.isclose(r["error"], r["predicted_samples_per_s"] / r["measured_samples_per_s"] - 1)
    fit_rows = [r for r in rows if r["role"] == "fit"]
    assert fit_rows and all(abs(r["error"]) < 0.01 for r in fit_rows)
    assert doc["summary"]["held_out_rows"] == len(rows) - len(fit_rows)


def test_check_fails_when_a_spec_is_stale(run, tmp_path, monkeypatch):
    monkeypatch.setattr(cal, "CHECK_TOLERANCE", -1.0)  # any difference counts as stale
    code, _, err = run("calibrate", "--check")
    assert code == 1 and "out of date" in err and "Traceback" not in err


@pytest.mark.parametrize("content", [
    "a,b,c\n1,2,3\n",                       # wrong columns
    b"\xff\xfe\x00binary\x00",               # not UTF-8
])
def test_bad_csv_is_a_one_line_error(run, tmp_path, content):
    path = tmp_path / "runs.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = run("calibrate", "--csv", str(path))
    assert code == 2 and str(path) in err and len(err.strip().splitlines()) == 1


def test_csv_without_usable_rows_is_bad_input(run, tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(",".join(cal.REQUIRED_COLUMNS) + "\n" + "x,NoSuchNet,V100 16GB,1,8,64,fp32,"
                    "images_per_sec,10\n")
    code, _, err = run("calibrate", "--csv", str(path))
    assert code == 2 and "no row" in err


def test_missing_csv_is_bad_input(run, tmp_path):
    code, _, err = run("calibrate", "--csv", str(tmp_path / "nope.csv"))
    assert code == 2 and "nope.csv" in err
