"""Extract the MLPerf Training DLRM-DCNv2 runs into planner/calibration/mlperf_dlrm.csv: per
submission (system, nodes, accelerators per node, global batch) the measured training
throughput, read from its own result logs: between one evaluation's `eval_stop` and the next
`eval_start` the run trains `epoch_num` x `train_samples` samples; the median of those
intervals over every result file of the submission. Systems of 8 accelerators per node whose
accelerator has a built-in system (H100 SXM, H200 SXM, A100 SXM 80GB, B200) are kept.

Needs the `mlcommons/training_results_v*` snapshots under /work/.mirror (the library's
`fetch`):

    python benchmarks/extract_mlperf_dlrm.py
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import subprocess
from pathlib import Path

MIRROR = Path("/work/.mirror")
OUT = Path(__file__).resolve().parents[1] / "planner" / "calibration" / "mlperf_dlrm.csv"
SYSTEMS = {"H100-SXM5-80GB": "dgx-h100", "H100-SXM-80GB": "dgx-h100", "H100 80GB HBM3": "dgx-h100",
           "H200-SXM-141GB": "hgx-h200", "A100-SXM4-80GB": "dgx-a100-80gb",
           "B200-SXM-180GB": "dgx-b200"}
FIELDS = ("repository", "commit", "submitter", "system_file", "result_files", "system",
          "accelerator", "nodes", "accelerators_per_node", "global_batch", "samples_per_s")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


def _system(accelerator: str) -> str | None:
    for key, name in SYSTEMS.items():
        if key.lower().replace(" ", "") in accelerator.lower().replace(" ", ""):
            return name
    return None


def _throughput(log: str) -> tuple[int | None, list[float]]:
    """(global batch, samples per second of every training interval between evaluations)."""
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.splitlines()
              if ":::MLLOG " in line]
    batch = next((e["value"] for e in events if e["key"] == "global_batch_size"), None)
    epoch = next((e["value"] for e in events if e["key"] == "train_samples"), None)
    rates, stop = [], None
    for e in events:
        if e["key"] == "eval_stop":
            stop = e
        elif e["key"] == "eval_start" and stop is not None and epoch:
            samples = (e["metadata"]["epoch_num"] - stop["metadata"]["epoch_num"]) * epoch
            seconds = (e["time_ms"] - stop["time_ms"]) / 1e3
            if samples > 0 and seconds > 0:
                rates.append(samples / seconds)
            stop = None
    return batch, rates


def main() -> None:
    rows = []
    for repo in sorted(MIRROR.glob("mlcommons+training_results_v*/repo")):
        commit = _git(repo, "rev-parse", "HEAD").strip()
        files = _git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
        runs: dict[str, list[str]] = {}
        for f in files:
            m = re.match(r"([^/]+)/results/([^/]+)/dlrm_dcnv2/result_\d+\.txt$", f)
            if m:
                runs.setdefault(f"{m[1]}/{m[2]}", []).append(f)
        for key, logs in sorted(runs.items()):
            submitter, system = key.split("/")
            sysfile = f"{submitter}/systems/{system}.json"
            try:
                desc = json.loads(_git(repo, "show", f"HEAD:{sysfile}"))
            except (subprocess.CalledProcessError, json.JSONDecodeError):
                continue
            name = _system(str(desc.get("accelerator_model_name", "")))
            per_node = int(str(desc.get("accelerators_per_node", "0")) or 0)
            nodes = int(str(desc.get("number_of_nodes", "0")) or 0)
            if name is None or per_node != 8 or nodes < 1:
                continue
            batch, rates = None, []
            for f in logs:
                try:  # a snapshot may list a large file it does not hold
                    b, r = _throughput(_git(repo, "show", f"HEAD:{f}"))
                except subprocess.CalledProcessError:
                    continue
                batch, rates = batch or b, rates + r
            if not rates or not batch:
                continue
            rows.append({"repository": repo.parent.name.replace("+", "/"), "commit": commit,
                         "submitter": submitter, "system_file": sysfile,
                         "result_files": len(logs), "system": name,
                         "accelerator": desc["accelerator_model_name"], "nodes": nodes,
                         "accelerators_per_node": per_node, "global_batch": batch,
                         "samples_per_s": round(statistics.median(rates))})
    with open(OUT, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} submissions -> {OUT}")


if __name__ == "__main__":
    main()
