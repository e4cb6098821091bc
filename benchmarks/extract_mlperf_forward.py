"""Extract the forward-only step time of MLPerf Training submissions into
planner/calibration/mlperf_forward.csv: the validation steps their result logs time
(`tracked_stats` with `validation_step_time`, NeMo's v5.x LLM pretraining callbacks: one
evaluation batch of the global batch's size, forward only, no gradient sync or optimizer step).

For every row of planner/calibration/mlperf_training.csv (duplicates left out) whose result
files log such steps: per run, the median over its validation steps but the first of each
evaluation (the first after each `eval_start`, which carries the evaluation's own start: 0.28 s
against 0.045 s after it in University of Florida's 64-GPU 8B run, 6.9 s against 2.75 s in a
405B run); over runs, the median. A training step is
forward and backward, its gradient sync and its optimizer step; set beside it, the forward
alone says which half of a step the cost model misses (`python benchmarks/accuracy.py`).

Needs the snapshots `mlcommons/training_results_v5.0` and `_v5.1` under /work/.mirror (the
library's `fetch`), at the commits the training rows name:

    python benchmarks/extract_mlperf_forward.py
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
from pathlib import Path

MIRROR = Path("/work/.mirror")
ROOT = Path(__file__).resolve().parents[1] / "planner" / "calibration"
FIELDS = ("round", "submitter", "system", "benchmark", "forward_step_s", "forward_min_run_s",
          "forward_max_run_s", "n_runs", "n_steps", "repository", "commit", "result_files")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True,
                          text=True, check=True).stdout


def validation_steps(log: str) -> list[float]:
    """The timed validation steps of one result log, the first after each `eval_start` left
    out (it carries the evaluation's own start)."""
    out, first = [], False
    for line in log.splitlines():
        if ":::MLLOG " not in line:
            continue
        event = json.loads(line.split(":::MLLOG ", 1)[1])
        value = event.get("value")
        if event.get("key") == "eval_start":
            first = True
        elif isinstance(value, dict) and "validation_step_time" in value:
            if not first:
                out.append(float(value["validation_step_time"]))
            first = False
    return out


def row_of(train: dict) -> dict | None:
    """The forward row of one training row, or None where its logs time no validation step."""
    repo = MIRROR / train["repository"].replace("/", "+") / "repo"
    if not repo.exists():
        return None
    folder, pattern = train["result_files"].split(" ")[0].rsplit("/", 1)
    prefix = pattern.split("*")[0]
    names = [n for n in _git(repo, "ls-tree", "--name-only", train["commit"], folder + "/")
             .split() if n.rsplit("/", 1)[-1].startswith(prefix) and n.endswith(".txt")]
    runs, steps = [], 0
    for name in sorted(names):
        times = validation_steps(_git(repo, "show", f"{train['commit']}:{name}"))
        if times:
            runs.append(statistics.median(times))
            steps += len(times)
    if not runs:
        return None
    return {"round": train["round"], "submitter": train["submitter"], "system": train["system"],
            "benchmark": train["benchmark"], "forward_step_s": round(statistics.median(runs), 6),
            "forward_min_run_s": round(min(runs), 6), "forward_max_run_s": round(max(runs), 6),
            "n_runs": len(runs), "n_steps": steps, "repository": train["repository"],
            "commit": train["commit"], "result_files": f"{folder}/{pattern} ({len(runs)} used)"}


def main() -> None:
    with open(ROOT / "mlperf_training.csv", newline="", encoding="utf-8") as fh:
        trains = [r for r in csv.DictReader(fh) if not r["duplicate_of"]]
    rows = [r for r in map(row_of, trains) if r is not None]
    with open(ROOT / "mlperf_forward.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows with timed validation steps -> {ROOT / 'mlperf_forward.csv'}")


if __name__ == "__main__":
    main()
