"""Fit the devices' compute efficiency to published measurements; report the error row by row.

One factor per device, `efficiency.compute`: the achieved fraction of peak FLOP/s in the layers
the roofline finds compute bound. It is fitted on single-device rows only, where nothing but
the device is measured. Every multi-device row is held out: it tests the communication and
overlap model, which has no fitted factor. Memory-bandwidth and link efficiencies are not
fitted; they stay the sourced values of the specs.

The measurements ship as `planner/calibration/published_runs.csv` (a copy of the project's
collection of published runs, each row with its citation); `--csv` reads another file with the
same columns.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from planner.catalog import list_models, load_model, load_system, read_file, shown
from planner.errors import SpecError
from planner.expr.cnn import DataParallelModel, Options
from planner.expr.collectives import Collective
from planner.prediction import Config, predict
from planner.spec.base import decimal_float, decimal_int, short
from planner.spec.hardware import Precision, System

REQUIRED_COLUMNS = ("citation", "model", "gpu", "gpus_total", "gpus_per_node", "global_batch",
                    "precision", "metric", "value")
THROUGHPUT_METRICS = ("images_per_sec", "sequences_per_sec")
MAX_ROWS = 100_000
MAX_CSV_BYTES = 16 * 2**20

# Which built-in system each row's hardware was: (text in the `gpu` column, GPUs per node).
SYSTEMS = (
    ("A100 40GB", 8, "dgx-a100-40gb"),
    ("A100 80GB", 8, "dgx-a100-80gb"),
    ("V100 16GB", 8, "dgx1-v100-16gb"),
    ("V100 32GB", 16, "dgx2-v100"),
    ("V100 32GB", 8, "dgx1-v100"),
    ("P100 (DGX-1)", 8, "p100-dgx1"),
    ("K80 (p2.8xlarge", 8, "aws-p2-8xlarge"),
)
FIT_BOUNDS = (0.01, 1.0)
CHECK_TOLERANCE = 0.005


def default_csv() -> Path:
    return Path(str(resources.files("planner") / "calibration" / "published_runs.csv"))


@dataclass(frozen=True)
class Run:
    """One usable measurement: a data-parallel run of a built-in model on a built-in system."""

    row: int
    label: str
    citation: str
    model: str
    system: str
    precision: Precision
    devices: int
    devices_per_node: int
    global_batch: int
    measured: float  # samples/s over all devices

    @property
    def nodes(self) -> int:
        return self.devices // self.devices_per_node


@dataclass(frozen=True)
class Skipped:
    row: int
    label: str
    reason: str


@dataclass(frozen=True)
class Result:
    run: Run
    role: str  # "fit" | "held-out"
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.run.measured - 1


# --- reading ----------------------------------------------------------------------------------


def _model_name(text: str) -> str | None:
    key = "".join(ch for ch in text.split("(")[0].lower().replace("v1.5", "") if ch.isalnum())
    return key if key in list_models() else None


def _system_name(gpu: str, per_node: int) -> str | None:
    return next((s for text, g, s in SYSTEMS if text in gpu and g == per_node), None)


def _precision(text: str) -> Precision | None:
    low = text.lower()
    if "mixed" in low or "fp16" in low:
        return Precision.fp16
    return Precision.fp32 if "fp32" in low else None


def _positive_int(text: str) -> int | None:
    value = decimal_int(text)
    return value if value is not None and value > 0 else None


def _cell(text: str) -> str:
    """A cell as labels show it: '?' when empty, bounded when long."""
    return (text if len(text) <= 40 else text[:37] + "...") if text else "?"


def _parse(i: int, rec: dict) -> Run | Skipped:
    label = (f"{_cell(rec['model'])} on {_cell(rec['gpus_total'])} x "
             f"{_cell(rec['gpu'])}")
    skip = functools.partial(Skipped, i, label)
    if rec["model"].startswith(("GPT", "BERT")):
        return skip("transformer row: predicted by planner.published "
                    "(python benchmarks/transformer_runs.py)")
    if rec["metric"] not in THROUGHPUT_METRICS:
        return skip(f"metric {short(rec['metric'])} is not a throughput")
    model = _model_name(rec["model"])
    if model is None:
        return skip(f"no built-in CNN for {short(rec['model'])}")
    devices, per_node = _positive_int(rec["gpus_total"]), _positive_int(rec["gpus_per_node"])
    batch = _positive_int(rec["global_batch"])
    if devices is None or per_node is None or batch is None:
        return skip("gpus_total, gpus_per_node and global_batch must be positive integers")
    system = _system_name(rec["gpu"], per_node)
    if system is None:
        return skip(f"no built-in system for {short(rec['gpu'])} with {per_node} GPUs per node")
    precision = _precision(rec["precision"])
    if precision is None:
        return skip(f"unknown precision {short(rec['precision'])}")
    dpn = min(devices, per_node)
    if devices % dpn or batch % devices:
        return skip(f"{devices} GPUs do not fill whole nodes or divide the batch {batch}")
    measured = decimal_float(rec["value"])
    if measured is None or measured <= 0:
        return skip(f"value {short(rec['value'])} is not a positive number")
    return Run(i, label, rec["citation"], model, system, precision, devices, dpn, batch, measured)


def read_runs(path: Path | None = None) -> tuple[list[Run], list[Skipped]]:
    """Rows are numbered from 1 after the header, as a spreadsheet shows them (minus one)."""
    path = Path(path) if path is not None else default_csv()
    raw = read_file(path, MAX_CSV_BYTES, "CSV file")  # regular files only, size checked first
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{shown(path)}: cannot read as CSV (not UTF-8 at byte {exc.start})") \
            from None
    if "\0" in text:
        raise SpecError(f"{shown(path)}: cannot read as CSV (binary file)")
    try:
        with io.StringIO(text, newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise SpecError(f"{shown(path)}: missing column(s) {', '.join(missing)}")
            records = []
            for rec in reader:
                if len(records) >= MAX_ROWS:
                    raise SpecError(f"{shown(path)}: more than {MAX_ROWS} rows")
                records.append({k: (rec.get(k) or "").strip() for k in REQUIRED_COLUMNS})
    except csv.Error as exc:
        raise SpecError(f"{shown(path)}: cannot read as CSV ({exc})") from None
    runs, skipped = [], []
    for i, rec in enumerate(records, 1):
        parsed = _parse(i, rec)
        (runs if isinstance(parsed, Run) else skipped).append(parsed)
    return runs, skipped


# --- predicting and fitting -------------------------------------------------------------------


def with_compute_efficiency(system: System, eta: float) -> System:
    dev = system.device
    eff = dev.efficiency.model_copy(update={"compute": eta})
    return dataclasses.replace(system, device=dev.model_copy(update={"efficiency": eff}))


def predicted_throughput(run: Run, eta: float | None = None) -> float:
    """Samples/s of `run` (ring allreduce overlapped with backward, as NCCL / Horovod do),
    with the spec's compute efficiency or `eta`."""
    system = load_system(run.system)
    if eta is not None:
        system = with_compute_efficiency(system, eta)
    model = DataParallelModel(load_model(run.model), system, Options(run.precision))
    cfg = Config(run.nodes, run.devices_per_node, run.global_batch, Collective.ring, True)
    return run.global_batch / predict(model, cfg).iteration_time_s


def _golden_min(f, lo: float, hi: float, tol: float = 1e-6) -> float:
    """Minimum of a unimodal f on [lo, hi] by golden-section search."""
    r = (math.sqrt(5) - 1) / 2
    a, z = lo, hi
    x1, x2 = z - r * (z - a), a + r * (z - a)
    f1, f2 = f(x1), f(x2)
    while z - a > tol:
        if f1 <= f2:
            z, x2, f2 = x2, x1, f1
            x1 = z - r * (z - a)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + r * (z - a)
            f2 = f(x2)
    return (a + z) / 2


def fit(runs: list[Run]) -> dict[str, float]:
    """Device name -> compute efficiency minimising the squared log error of its single-device
    rows. Predicted throughput rises monotonically with eta, so the loss is unimodal in log eta."""
    by_device: dict[str, list[Run]] = {}
    for run in runs:
        if run.devices == 1:
            by_device.setdefault(load_system(run.system).device.name, []).append(run)
    fitted = {}
    for device, rows in sorted(by_device.items()):
        def loss(log_eta, rows=rows):
            eta = math.exp(log_eta)
            return sum(math.log(predicted_throughput(r, eta) / r.measured) ** 2 for r in rows)

        lo, hi = (math.log(x) for x in FIT_BOUNDS)
        fitted[device] = math.exp(_golden_min(loss, lo, hi, tol=1e-4))
    return fitted


def report(runs: list[Run]) -> list[Result]:
    """Every usable row predicted with the specs' efficiencies as they are."""
    return [Result(r, "fit" if r.devices == 1 else "held-out", predicted_throughput(r))
            for r in runs]


def summary(results: list[Result]) -> dict:
    def mape(rows):
        return 100 * sum(abs(r.error) for r in rows) / len(rows) if rows else None

    held = [r for r in results if r.role == "held-out"]
    return {"rows": len(results), "fit_rows": len(results) - len(held), "held_out_rows": len(held),
            "mape_all_pct": mape(results), "mape_held_out_pct": mape(held)}
