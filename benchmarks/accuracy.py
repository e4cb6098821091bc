"""Accuracy on every calibration set, per group: MAPE and signed bias in sample and
leave-one-group-out (refit without the group, predict it).

    python benchmarks/accuracy.py

Transformers: the four A100 constants of `planner.fit_transformer` as the specs ship them,
against vTrain's single-node runs, SC21 Table 1 and BERT-Large; the out-of-sample column refits
them without the group. CNNs: `planner calibrate`'s rows grouped by source, where only the
single-device rows are fitted (one compute efficiency per device), so every multi-device row is
already out of sample. MLPerf Training: every pretraining submission at the plan its config
pins (`planner.mlperf`); the Blackwell and AMD rows fitted one GEMM share per family
(`planner.fit_mlperf`), so their out-of-sample column refits it without the row's benchmark;
nothing is fitted to the Hopper rows; then the same rows by one feature at a time (precision,
model size, scale, CUDA graphs, LoRA, context parallelism, framework). Recommendation:
MLPerf's DLRM-DCNv2 runs against the table placement's prediction
(`benchmarks/dlrm_accuracy.py`). 3-D CNNs: MLPerf HPC's CosmoFlow runs against the
data-parallel prediction.
"""

from __future__ import annotations

from collections import defaultdict

from planner import bands, fit_mlperf, mlperf
from planner import calibrate as cal
from planner import fit_transformer as ft
from planner.bands import family
from planner.catalog import load_system


def transformers() -> None:
    print("Transformers (dgx-a100-80gb): in sample with the shipped constants; leave-one-"
          "group-out refits the four constants without the group")
    c, gs = ft.Constants.shipped(), ft.groups()
    ft.print_table(c, ft.table(c, gs))


def cnns() -> None:
    print("\nCNNs (planner calibrate): per source; fitted = the single-device rows")
    by_source: dict[str, list] = defaultdict(list)
    for r in cal.report(cal.read_runs()[0]):
        by_source[r.run.citation.split(",")[0][:40]].append(r)
    print(f"{'source':<42} {'rows':>4} {'fitted':>6} {'MAPE':>7} {'bias':>7} "
          f"{'held-out MAPE':>13}")
    for source, rows in sorted(by_source.items()):
        held = [r for r in rows if r.role == "held-out"]
        mape = sum(abs(r.error) for r in rows) / len(rows)
        bias = sum(r.error for r in rows) / len(rows)
        held_mape = f"{sum(abs(r.error) for r in held) / len(held):.1%}" if held else "-"
        print(f"{source:<42} {len(rows):>4} {len(rows) - len(held):>6} {mape:>7.1%} "
              f"{bias:>+7.1%} {held_mape:>13}")


def _errors(errors: list[float]) -> str:
    """MAPE, bias and the worst error of `errors`, formatted."""
    mape = sum(abs(e) for e in errors) / len(errors)
    bias = sum(errors) / len(errors)
    worst = max(errors, key=abs)
    return f"{mape:>7.1%} {bias:>+7.1%} {worst:>+7.1%}"


def _stats(errors: list[float]) -> str:
    return f"{len(errors):>4} {_errors(errors)}"


def mlperf_training() -> None:
    """Every MLPerf Training pretraining submission at its own pinned plan, by benchmark x
    system x precision, then by system family: in sample, and out of sample (the Blackwell and
    AMD rows with their family's GEMM share refitted without their benchmark,
    `planner.fit_mlperf`; the Hopper rows, fitted to nothing, as they are)."""
    rows = mlperf.rows()
    priced = [r for r in rows if r["error"] is not None]
    held = fit_mlperf.held_out_predictions()
    out = {id(r["run"]): held.get(fit_mlperf.key(r["run"]), r["predicted_s"]) / r["measured_s"]
           - 1 for r in priced}
    print("\nMLPerf Training (planner/calibration/mlperf_training.csv and v6.0's "
          "mlperf_training_v6.csv): each submission at its own plan; out of sample: "
          "leave-one-benchmark-out (the MoE rows and v6.0's: in no fit)")
    print(f"{'group':<36} {'rows':>4} {'MAPE':>7} {'bias':>7} {'worst':>7} {'held-out MAPE':>13}")
    by: dict[str, list[dict]] = defaultdict(list)
    for r in priced:
        by[r["group"]].append(r)
    fam: dict[str, list[dict]] = defaultdict(list)
    for r in priced:  # the fitted dense rows by family, the MoE and the held-out rounds apart
        run = r["run"]
        name = "mixture-of-experts" if run.moe else family(load_system(run.system).device.name)
        fam[name + (f" {run.row['round']} (in no fit)" if run.held_out and not run.moe
                    else "")].append(r)
    groups = [*sorted(by.items()), *((f"all {k}", v) for k, v in sorted(fam.items())),
              ("all priced", priced)]
    for group, rs in groups:
        held_mape = sum(abs(out[id(r["run"])]) for r in rs) / len(rs)
        print(f"{group:<36} {_stats([r['error'] for r in rs])} {held_mape:>13.1%}")
    by_feature([r for r in priced if not r["run"].held_out], out)
    forward_and_rest(priced)
    skipped: dict[str, int] = defaultdict(int)
    for r in rows:
        if r["error"] is None:
            skipped[r["why_not"]] += 1
    for why, n in sorted(skipped.items(), key=lambda x: -x[1]):
        print(f"  not priced ({n}): {why}")


def _feature_values(run: mlperf.Run) -> dict[str, str]:
    """One run's features: those its error band is looked up by (`planner.bands.features`:
    precision, model size, scale) and the recipe's (CUDA graphs, LoRA, context parallelism,
    the framework it names)."""

    r = run.row
    feat = bands.features(mlperf.benchmark_model(run), load_system(run.system).device.name,
                          run.precision, devices=int(r["gpus"]))
    framework = r["framework"].lower()
    return {"model": "mixture-of-experts" if feat["moe"] == "moe" else "dense",
            "precision": feat["precision"], "size": feat["size"], "scale": feat["scale"],
            "CUDA graphs": "CUDA graphs" if r["cuda_graph"] not in ("", "0") else "no graphs",
            "fine-tuning": "LoRA" if r["benchmark"] in mlperf.LORA else "pretraining",
            "context parallel": "cp > 1" if int(r["cp"]) > 1 else "cp 1",
            "framework": ("NeMo" if "nemo" in framework else "PyTorch (other)"
                          if "pytorch" in framework else "other")}


def by_feature(priced: list[dict], held: dict) -> None:
    """The fitted MLPerf rows (dense, of the fitted rounds) grouped by one feature at a time
    (every family together): in sample and out of sample, as the table above."""
    print(f"\nby feature (fitted rows){'':<11} {'rows':>4} {'MAPE':>7} {'bias':>7} "
          f"{'worst':>7} {'held-out MAPE':>13}")
    values = [(_feature_values(r["run"]), r) for r in priced]
    for name in values[0][0]:
        by: dict[str, list[dict]] = defaultdict(list)
        for feat, r in values:
            by[feat[name]].append(r)
        for value, rs in sorted(by.items()):
            held_mape = sum(abs(held[id(r["run"])]) for r in rs) / len(rs)
            label = f"{name}: {value}"
            print(f"{label:<36} {_stats([r['error'] for r in rs])} {held_mape:>13.1%}")


def forward_and_rest(priced: list[dict]) -> None:
    """The rows whose logs time a validation step (planner/calibration/mlperf_forward.csv): the
    forward of one global batch against the plan's evaluation step (`forward_time_s`), and the
    rest of a training step (backward, gradient sync, optimizer step) against the prediction
    less its forward. Where the forward is right and the rest is not, the error is in the
    backward or the sync, not in the GEMM and attention rates."""
    rows = [r for r in priced if r["forward_error"] is not None]
    print(f"\nforward and the rest ({len(rows)} rows timing validation steps; mlperf_forward.csv)"
          f"{'':<2} {'rows':>4} {'MAPE':>7} {'bias':>7} {'worst':>7}   rest: "
          f"{'MAPE':>6} {'bias':>7} {'worst':>7}")
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r["group"]].append(r)
    for group, rs in [*sorted(by.items()), ("all with a forward", rows)]:
        print(f"{group:<36} {_stats([r['forward_error'] for r in rs])}        "
              f"{_errors([r['rest_error'] for r in rs])}")


def recommendation() -> None:
    """MLPerf Training's DLRM-DCNv2 runs against the table placement's prediction
    (benchmarks/dlrm_accuracy.py; nothing fitted)."""
    import dlrm_accuracy

    print("\nRecommendation (planner/calibration/mlperf_dlrm.csv): each configuration's best "
          "placement at a 5 s limit; nothing fitted to these rows")
    dlrm_accuracy.report(5.0)


# MLPerf HPC accelerators -> the built-in system of that device (per-node layout aside)
HPC_SYSTEMS = (("A100-SXM4-80GB", "dgx-a100-80gb"), ("A100-SXM4-40GB", "dgx-a100-40gb"),
               ("H100", "dgx-h100"), ("V100-SXM2-16GB", "dgx1-v100-16gb"))


def cosmoflow() -> None:
    """MLPerf HPC's CosmoFlow strong-scaling runs (planner/calibration/mlperf_hpc_cosmoflow.csv,
    benchmarks/extract_mlperf_hpc.py) against the data-parallel prediction at each
    submission's GPUs and global batch, fp16 for AMP (nothing fitted; re-published logs and
    devices without a built-in system left out). The measured epoch includes the evaluation."""
    import csv
    from pathlib import Path

    from planner import api

    path = Path(__file__).resolve().parents[1] / "planner/calibration/mlperf_hpc_cosmoflow.csv"
    print("\nCNNs, 3-D (MLPerf HPC CosmoFlow, strong scaling): each submission's GPUs and "
          "global batch, data parallel; nothing fitted")
    print(f"{'submission':<44} {'system':<15} {'GPUs':>5} {'measured':>10} {'predicted':>10} "
          f"{'error':>7}")
    errors = []
    with open(path, encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            system = next((s for key, s in HPC_SYSTEMS if key in r["accelerator"]), None)
            if system is None or "re-published" in r["notes"] or not r["epoch_time_s"]:
                continue
            batch, gpus = int(r["global_batch"]), int(r["gpus"])
            measured = batch / float(r["samples_per_s"])
            pred = api.evaluate("cosmoflow", system, devices=gpus, global_batch=batch,
                                precision="fp16" if r["precision"] == "AMP" else None)
            error = pred.prediction.iteration_time_s / measured - 1
            errors.append(error)
            name = f"{r['round']} {r['submitter']} {r['system']}"[:44]
            print(f"{name:<44} {system:<15} {gpus:>5} {measured * 1e3:>8.2f}ms "
                  f"{pred.prediction.iteration_time_s * 1e3:>8.2f}ms {error:>+7.1%}")
    print(f"{'all':<44} {'':<15} {len(errors):>5}   MAPE {sum(map(abs, errors)) / len(errors):.1%}"
          f", bias {sum(errors) / len(errors):+.1%}")


if __name__ == "__main__":
    transformers()
    cnns()
    mlperf_training()
    recommendation()
    cosmoflow()
