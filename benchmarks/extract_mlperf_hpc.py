#!/usr/bin/env python3
"""Extract a CosmoFlow calibration table from the MLPerf HPC results repositories.

What: one CSV row per strong-scaling (time-to-train) CosmoFlow submission, i.e. per
(round, submitter, system), found in bare git mirrors of ``mlcommons/hpc_results_v*``
as the ``fetch`` tool leaves them (``/work/.mirror/mlcommons+hpc_results_v2.0/repo``):

    python benchmarks/extract_mlperf_hpc.py --mirrors /work/.mirror
    python benchmarks/extract_mlperf_hpc.py --mirrors /work/.mirror --out /tmp/x.csv

How:
* Submissions are the directories ``<submitter>/results/<system>/strong/cosmoflow``.
  Weak-scaling directories (``.../weak/cosmoflow``, many concurrent model instances, a
  throughput metric) are skipped and reported on stderr.
* Hardware comes from ``<submitter>/systems/<system>.json``; batch sizes, sample counts,
  division and node counts from the ``:::MLLOG {json}`` lines of every ``result_*.txt``.
* Epoch time: for each run, ``epoch_stop.time_ms - epoch_start.time_ms`` paired by
  ``metadata.epoch_num`` (and ``metadata.instance`` when present); epochs that start after
  the run's ``run_stop`` are ignored; the first epoch is dropped; the median over the
  remaining epochs is the run's epoch time; the row's value is the median over runs.
  ``samples_per_s = train_samples / epoch_time_s``.
* The launch config is looked up heuristically in the submitter's CosmoFlow
  implementation tree (see ``find_config``); files it sources or names are followed to
  read the precision (e.g. ``DTYPE="amp"``, ``amp: True``) and the per-GPU batch size.
* Result sets that are byte-identical (same git blobs) to a submission of an earlier
  round are kept but flagged in ``notes``.

No value is invented: cells that cannot be read stay empty and ``notes`` says why.
Standard library only; needs the ``git`` executable.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field

BENCHMARK = "cosmoflow"
REPO_PATTERN = re.compile(r"^(?P<owner>[^+]+)\+(?P<name>hpc_results_v(?P<round>\d+(?:\.\d+)*))$")
RESULT_DIR = re.compile(
    r"^(?P<submitter>[^/]+)/results/(?P<system>[^/]+)/(?P<scaling>strong|weak)/" + BENCHMARK + r"/")
RESULT_FILE = re.compile(r"/result_[^/]*\.txt$")
CONFIG_EXTENSIONS = (".sh", ".yaml", ".yml", ".sbatch")
CONFIG_SKIP_WORDS = ("weak", "dryrun", "test")
ACCELERATOR_FAMILIES = ("a100", "h100", "v100", "a64fx")

COLUMNS = [
    "round", "submitter", "system", "division", "scaling", "accelerator", "nodes",
    "accelerators_per_node", "gpus", "framework", "local_batch", "global_batch",
    "train_samples", "precision", "epoch_time_s", "samples_per_s", "n_runs", "method",
    "repository", "commit", "result_files", "config_file", "notes",
]


# --------------------------------------------------------------------------- git access

class Mirror:
    """Read-only view of one bare mirror at its HEAD commit."""

    def __init__(self, git_dir: str, repository: str, round_name: str):
        self.git_dir = git_dir
        self.repository = repository
        self.round = round_name
        self.commit = self._git("rev-parse", "HEAD").strip()
        self.entries = self._list_tree()          # path -> (mode, blob sha)
        self.paths = sorted(self.entries)

    def _git(self, *args: str) -> str:
        out = subprocess.run(["git", "--git-dir", self.git_dir, *args],
                             check=True, capture_output=True)
        return out.stdout.decode("utf-8", errors="replace")

    def _list_tree(self) -> dict[str, tuple[str, str]]:
        entries = {}
        for line in self._git("ls-tree", "-r", "-z", "HEAD").split("\0"):
            if not line:
                continue
            meta, path = line.split("\t", 1)
            mode, _kind, sha = meta.split()
            entries[path] = (mode, sha)
        return entries

    def read(self, path: str) -> str:
        return self._git("show", f"HEAD:{path}")

    def blob(self, path: str) -> str:
        return self.entries[path][1]

    def is_symlink(self, path: str) -> bool:
        return self.entries.get(path, ("",))[0] == "120000"


def find_mirrors(root: str) -> list[Mirror]:
    """Bare git dirs of ``<owner>+hpc_results_v*`` under ``root``, oldest round first."""
    mirrors = []
    for name in sorted(os.listdir(root)):
        match = REPO_PATTERN.match(name)
        if not match:
            continue
        base = os.path.join(root, name)
        git_dir = os.path.join(base, "repo") if os.path.isdir(os.path.join(base, "repo")) else base
        repository = f"{match['owner']}/{match['name']}"
        mirrors.append(Mirror(git_dir, repository, "v" + match["round"]))
    return sorted(mirrors, key=lambda m: [int(p) for p in m.round[1:].split(".")])


# --------------------------------------------------------------------------- MLLOG parsing

def mllog_events(text: str) -> list[dict]:
    """All well-formed ``:::MLLOG {json}`` events of one log, in file order."""
    events = []
    for line in text.splitlines():
        _, sep, payload = line.partition(":::MLLOG")
        if not sep:
            continue
        try:
            events.append(json.loads(payload))
        except json.JSONDecodeError:
            continue
    return events


def first_value(events: list[dict], key: str):
    for event in events:
        if event.get("key") == key:
            return event.get("value")
    return None


def event_times(events: list[dict], key: str) -> list[int]:
    return [e["time_ms"] for e in events if e.get("key") == key]


def epoch_key(event: dict):
    meta = event.get("metadata") or {}
    return meta.get("instance"), meta.get("epoch_num")


@dataclass
class RunTiming:
    epoch_times_s: list[float]          # per epoch, first epoch dropped
    dropped_after_stop: int = 0
    eval_inside_epoch: bool | None = None
    logged_throughput: float | None = None
    status: str | None = None


def epoch_intervals(events: list[dict]) -> list[tuple[int, int, int]]:
    """(epoch_num, start_ms, stop_ms) pairs matched on (instance, epoch_num)."""
    starts = {}
    intervals = []
    for event in events:
        key = event.get("key")
        if key == "epoch_start":
            starts[epoch_key(event)] = event["time_ms"]
        elif key == "epoch_stop" and epoch_key(event) in starts:
            start = starts.pop(epoch_key(event))
            intervals.append((epoch_key(event)[1], start, event["time_ms"]))
    return sorted(intervals)


def eval_is_inside(events: list[dict], intervals) -> bool | None:
    """True when every eval_start lies within the epoch interval with the same epoch_num."""
    by_epoch = {num: (start, stop) for num, start, stop in intervals}
    checks = []
    for event in events:
        if event.get("key") != "eval_start":
            continue
        span = by_epoch.get(epoch_key(event)[1])
        if span:
            checks.append(span[0] <= event["time_ms"] <= span[1])
    return all(checks) if checks else None


def logged_throughput(events: list[dict]) -> float | None:
    """Median of the implementation's own per-epoch throughput log (samples/s), if any."""
    values = []
    for event in events:
        value = event.get("value")
        if event.get("key") == "throughput" and isinstance(value, (int, float)):
            values.append(float(value))
        elif (event.get("key") == "tracked_stats" and isinstance(value, dict)
              and isinstance(value.get("throughput"), (int, float))):
            values.append(float(value["throughput"]))
    return statistics.median(values) if values else None


def run_timing(events: list[dict]) -> RunTiming | None:
    """Median-ready epoch times of one run; None if it has fewer than two epochs."""
    intervals = epoch_intervals(events)
    stops = event_times(events, "run_stop")
    kept = [iv for iv in intervals if not stops or iv[1] < stops[0]]
    if len(kept) < 2:
        return None
    run_stop = next((e for e in events if e.get("key") == "run_stop"), None)
    return RunTiming(
        epoch_times_s=[(stop - start) / 1000.0 for _num, start, stop in kept[1:]],
        dropped_after_stop=len(intervals) - len(kept),
        eval_inside_epoch=eval_is_inside(events, kept),
        logged_throughput=logged_throughput(events),
        status=((run_stop or {}).get("metadata") or {}).get("status"),
    )


# --------------------------------------------------------------------------- config lookup

def implementation_paths(mirror: Mirror, submitter: str) -> list[str]:
    """Files of the submitter's CosmoFlow implementation(s), in either directory layout."""
    roots = (f"{submitter}/benchmarks/{BENCHMARK}/implementations/",
             f"{submitter}/benchmarks/implementations/{BENCHMARK}/")
    return [p for p in mirror.paths if p.startswith(roots)]


def system_dirs(mirror: Mirror, impl_paths: list[str], system: str) -> list[str]:
    """Implementation sub-directories named after the system (prefix match either way),
    with symlinked directories resolved to their target."""
    dirs = set()
    for path in impl_paths:
        parts = path.split("/")
        for depth in range(4, len(parts)):
            name = parts[depth - 1]
            if name and (system.startswith(name) or name.startswith(system)):
                dirs.add("/".join(parts[:depth]))
    for path in impl_paths:
        name = path.rsplit("/", 1)[-1]
        if mirror.is_symlink(path) and (system.startswith(name) or name.startswith(system)):
            target = mirror.read(path).strip()
            dirs.add(path.rsplit("/", 1)[0] + "/" + target)
    return sorted(dirs)


def uncommented(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def referenced_names(text: str) -> set[str]:
    """Base names of config-like files mentioned on non-comment lines."""
    names = re.findall(r"[\w.+-]+(?:\.sh|\.ya?ml|\.sbatch)\b", uncommented(text))
    return {n.rsplit("/", 1)[-1] for n in names}


def is_config_candidate(path: str) -> bool:
    base = path.rsplit("/", 1)[-1].lower()
    if not base.endswith(CONFIG_EXTENSIONS):
        return False
    if any(word in base for word in CONFIG_SKIP_WORDS):
        return False
    return "/configs/" in path or base.startswith(("config", "run_", "cosmo"))


def size_token(nodes, per_node, local_batch) -> re.Pattern | None:
    """``<nodes>x<per_node>x<local_batch>`` as a whole token (NVIDIA-style config name)."""
    if not (nodes and per_node and local_batch):
        return None
    return re.compile(rf"(?<![\dx]){nodes}x{per_node}x{local_batch}(?![\dx])")


def score_config(path: str, sub: Submission, referenced: set[str]) -> int:
    base = path.rsplit("/", 1)[-1].lower()
    score = 0
    if path.rsplit("/", 1)[-1] in referenced:
        score += 4
    token = size_token(sub.nodes, sub.accelerators_per_node, sub.local_batch)
    if token and token.search(base):
        score += 3
    if sub.gpus and re.search(rf"(?<!\d){sub.gpus}gpus", base):
        score += 2
    if sub.system.split("_")[0].split("-")[0].lower() in base:
        score += 1
    if names_other_division(path, sub.division):
        return -1
    if sub.division and re.search(rf"(?<![a-z]){sub.division}(?![a-z])", base):
        score += 2
    return score


def names_other_division(path: str, division: str | None) -> bool:
    other = {"closed": "open", "open": "closed"}.get(division or "")
    base = path.rsplit("/", 1)[-1].lower()
    return bool(other and re.search(rf"(?<![a-z]){other}(?![a-z])", base))


def find_config(mirror: Mirror, sub: Submission) -> tuple[list[str], str]:
    """Best launch config for the submission plus the files it sources / names.

    Score per candidate: +4 named by a file in the system's own implementation
    directory, +3 ``NxGxB`` size token, +2 ``<gpus>gpus``, +2 same division word,
    +1 system family word.  A candidate is rejected when it, or a file it names,
    names the other division.  The best candidate with score >= 2 wins; a lone
    candidate is accepted with any score.  Returns (paths, how it was chosen).
    """
    impl = implementation_paths(mirror, sub.submitter)
    referenced = set()
    for directory in system_dirs(mirror, impl, sub.system):
        for path in impl:
            if path.startswith(directory + "/") and not mirror.is_symlink(path):
                referenced |= referenced_names(mirror.read(path))
    candidates = [p for p in impl if is_config_candidate(p)]
    scored = sorted(((score_config(p, sub, referenced), not p.endswith(".sh"), len(p), p)
                     for p in candidates), key=lambda t: (-t[0], t[1], t[2]))
    for score, _not_sh, _length, path in scored:
        if score < 2 and len(candidates) > 1:
            break
        chain = follow_references(mirror, impl, path)
        if any(names_other_division(p, sub.division) for p in chain):
            continue
        how = f"heuristic score {score}" if len(candidates) > 1 else "only candidate"
        return chain, how
    return [], "no config identified"


def resolve(impl: list[str], origin: str, name: str) -> str | None:
    """Path of a referenced base name, preferring the origin's directory, then its parent."""
    matches = [p for p in impl if p.rsplit("/", 1)[-1] == name]
    if not matches:
        return None
    origin_dir = origin.rsplit("/", 1)[0]
    parent = origin_dir.rsplit("/", 1)[0]
    matches.sort(key=lambda p: (p.rsplit("/", 1)[0] != origin_dir,
                                not p.startswith(parent + "/"), len(p)))
    return matches[0]


def follow_references(mirror: Mirror, impl: list[str], start: str, depth: int = 2) -> list[str]:
    """``start`` and the config files it names (sourced scripts, CONFIG_FILE yamls)."""
    chain, frontier = [start], [start]
    for _ in range(depth):
        nxt = []
        for path in frontier:
            for name in sorted(referenced_names(mirror.read(path))):
                target = resolve(impl, path, name)
                if target and target not in chain and is_config_candidate(target):
                    chain.append(target)
                    nxt.append(target)
        frontier = nxt
    return chain


def missing_references(mirror: Mirror, paths: list[str], texts: list[str]) -> list[str]:
    """Config-like names mentioned by the chain that no file in the repository has."""
    present = {p.rsplit("/", 1)[-1] for p in mirror.paths}
    names = set().union(*(referenced_names(t) for t in texts))
    return sorted(n for n in names if n not in present and "$" not in n)


def config_precision(texts: list[str]) -> str:
    """Precision as stated in the config files; empty if none is stated."""
    found = []
    for text in map(uncommented, texts):
        for value in re.findall(r"DTYPE\s*=\s*[\"']?([\w.]+)", text):
            found.append(value.upper() if value.lower() == "amp" else value)
        if re.search(r"^\s*amp\s*:\s*true\b", text, re.I | re.M):
            found.append("AMP")
        for value in re.findall(r"\b(bf16|bfloat16|fp16|float16|mixed_float16)\b", text, re.I):
            found.append(value.lower())
    return "; ".join(dict.fromkeys(found))


def config_value(texts: list[str], shell_name: str, yaml_name: str) -> str | None:
    """First ``export NAME="v"`` or ``name: v`` number in the config files, if any."""
    for text in map(uncommented, texts):
        match = re.search(rf"\b{shell_name}\s*=\s*[\"']?([\d.eE+-]+)", text) or \
            re.search(rf"^\s*{yaml_name}\s*:\s*([\d.eE+-]+)\s*$", text, re.M)
        if match:
            return match.group(1)
    return None


def config_batch(texts: list[str]) -> str | None:
    """Per-GPU batch size written in the config files, if any."""
    return config_value(texts, "BATCHSIZE", "batch_size")


# --------------------------------------------------------------------------- submissions

@dataclass
class Submission:
    mirror: Mirror
    submitter: str
    system: str
    scaling: str
    result_files: list[str]
    system_json: dict = field(default_factory=dict)
    division: str | None = None
    nodes: int | None = None
    accelerators_per_node: int | None = None
    gpus: int | None = None
    local_batch: int | None = None
    base_lr: float | None = None
    notes: list[str] = field(default_factory=list)


def find_submissions(mirror: Mirror) -> list[Submission]:
    grouped: dict[tuple, list[str]] = {}
    for path in mirror.paths:
        match = RESULT_DIR.match(path)
        if match and RESULT_FILE.search(path):
            grouped.setdefault((match["submitter"], match["system"], match["scaling"]),
                               []).append(path)
    return [Submission(mirror, sub, system, scaling, sorted(files, key=natural_key))
            for (sub, system, scaling), files in sorted(grouped.items())]


def natural_key(path: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def load_system_json(sub: Submission) -> None:
    path = f"{sub.submitter}/systems/{sub.system}.json"
    if path not in sub.mirror.entries:
        sub.notes.append(f"no systems JSON {path}")
        return
    try:
        sub.system_json = json.loads(sub.mirror.read(path))
    except json.JSONDecodeError as err:
        sub.notes.append(f"systems JSON unreadable ({err})")


def as_int(value) -> int | None:
    try:
        return int(float(str(value).strip()))
    except (TypeError, ValueError):
        return None


def accelerator_name(system_json: dict) -> str:
    name = str(system_json.get("accelerator_model_name", "")).strip()
    if name and name.upper() not in ("N/A", "NA", "NONE"):
        return name
    cpu = str(system_json.get("host_processor_model_name", "")).strip()
    return f"{cpu} (CPU only)" if cpu else ""


def consistent(values: list, label: str, notes: list[str]):
    """The common value of a per-run quantity; notes disagreement between runs."""
    present = [v for v in values if v is not None]
    distinct = sorted(set(map(str, present)))
    if len(distinct) > 1:
        notes.append(f"{label} differs between runs: {', '.join(distinct)}")
    return present[0] if present else None


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return str(value)


def describe_method(timings: list[RunTiming]) -> str:
    inside = {t.eval_inside_epoch for t in timings}
    if inside == {True}:
        scope = "interval includes the per-epoch evaluation"
    elif inside == {False}:
        scope = "interval excludes evaluation"
    else:
        scope = "evaluation placement not determined"
    return ("median over runs of (median over epochs 2..N of epoch_stop-epoch_start "
            f"MLLOG time_ms, paired by epoch_num); {scope}")


def build_row(sub: Submission, earlier: dict) -> dict:
    mirror = sub.mirror
    load_system_json(sub)
    logs = [mllog_events(mirror.read(p)) for p in sub.result_files]
    notes = sub.notes

    sub.division = consistent([first_value(e, "submission_division") for e in logs],
                              "submission_division", notes) or sub.system_json.get("division")
    log_nodes = consistent([first_value(e, "number_of_nodes") for e in logs], "number_of_nodes", notes)
    log_apn = consistent([first_value(e, "accelerators_per_node") for e in logs],
                         "accelerators_per_node", notes)
    ranks = consistent([first_value(e, "number_of_ranks") for e in logs], "number_of_ranks", notes)
    global_batch = consistent([first_value(e, "global_batch_size") for e in logs],
                              "global_batch_size", notes)
    logged_local = consistent([first_value(e, "local_batch_size") for e in logs],
                              "local_batch_size", notes)
    train_samples = consistent([first_value(e, "train_samples") for e in logs], "train_samples", notes)
    sub.base_lr = consistent([first_value(e, "opt_base_learning_rate") for e in logs],
                             "opt_base_learning_rate", notes)

    sub.nodes = as_int(sub.system_json.get("number_of_nodes")) or as_int(log_nodes)
    sub.accelerators_per_node = as_int(sub.system_json.get("accelerators_per_node"))
    if sub.accelerators_per_node is None:
        sub.accelerators_per_node = as_int(log_apn)
    if as_int(log_nodes) not in (None, sub.nodes):
        notes.append(f"log number_of_nodes={log_nodes} differs from systems JSON {sub.nodes}")
    if sub.nodes is not None and sub.accelerators_per_node is not None:
        sub.gpus = sub.nodes * sub.accelerators_per_node
    sub.local_batch = derive_local_batch(sub, logged_local, global_batch, ranks)

    config_paths, config_how = find_config(mirror, sub)
    config_texts = [mirror.read(p) for p in config_paths]
    precision = config_precision(config_texts)
    check_config(sub, config_paths, config_texts, config_how)

    timings, failed = [], 0
    for path, events in zip(sub.result_files, logs, strict=True):
        timing = run_timing(events)
        if timing is None:
            failed += 1
            notes.append(f"{path.rsplit('/', 1)[-1]}: fewer than 2 epoch_start/epoch_stop pairs")
        else:
            timings.append(timing)
    epoch_time = statistics.median(statistics.median(t.epoch_times_s) for t in timings) \
        if timings else None
    samples_per_s = train_samples / epoch_time if (epoch_time and train_samples) else None
    add_timing_notes(sub, timings, samples_per_s)
    add_duplicate_note(sub, earlier)

    return {
        "round": mirror.round, "submitter": sub.submitter, "system": sub.system,
        "division": sub.division or "", "scaling": sub.scaling,
        "accelerator": accelerator_name(sub.system_json), "nodes": fmt(sub.nodes),
        "accelerators_per_node": fmt(sub.accelerators_per_node), "gpus": fmt(sub.gpus),
        "framework": str(sub.system_json.get("framework", "")).strip(),
        "local_batch": fmt(sub.local_batch), "global_batch": fmt(global_batch),
        "train_samples": fmt(train_samples), "precision": precision,
        "epoch_time_s": fmt(epoch_time), "samples_per_s": fmt(samples_per_s, 1),
        "n_runs": str(len(timings)),
        "method": describe_method(timings) if timings else
        "no epoch_start/epoch_stop pairs in the logs; epoch time not derived",
        "repository": mirror.repository, "commit": mirror.commit,
        "result_files": ";".join(sub.result_files), "config_file": ";".join(config_paths),
        "notes": "; ".join(dict.fromkeys(notes)),
    }


def derive_local_batch(sub: Submission, logged_local, global_batch, ranks) -> int | None:
    if logged_local is not None:
        return as_int(logged_local)
    workers = sub.gpus or as_int(ranks)
    if not (global_batch and workers):
        sub.notes.append("local batch unknown (no local_batch_size and no worker count)")
        return None
    if sub.gpus is None or sub.gpus == 0:
        sub.notes.append(f"no accelerators: local_batch = global_batch_size / number_of_ranks ({ranks})")
    else:
        sub.notes.append("local_batch = global_batch_size / gpus (log has no local_batch_size)")
    if int(global_batch) % workers:
        sub.notes.append(f"global batch {global_batch} not divisible by {workers} workers")
        return None
    return int(global_batch) // workers


def check_config(sub: Submission, paths: list[str], texts: list[str], how: str) -> None:
    if not paths:
        sub.notes.append("config: " + how)
        return
    sub.notes.append(f"config chosen by {how}")
    missing = missing_references(sub.mirror, paths, texts)
    if missing:
        sub.notes.append("config names files absent from the repository: " + ", ".join(missing))
    batch = config_batch(texts)
    if batch and sub.local_batch is not None and int(batch) != sub.local_batch:
        sub.notes.append(f"config batch size {batch} differs from derived local batch {sub.local_batch}")
    config_lr = config_value(texts, "LR", "lr")
    if config_lr and sub.base_lr is not None and float(config_lr) != float(sub.base_lr):
        sub.notes.append(f"config learning rate {config_lr} differs from logged "
                         f"opt_base_learning_rate {sub.base_lr} (config may not be the one used)")
    accel = accelerator_name(sub.system_json).lower()
    base = paths[0].rsplit("/", 1)[-1].lower()
    named = [f for f in ACCELERATOR_FAMILIES if f in base]
    if named and not any(f in accel for f in named):
        sub.notes.append(f"config file is named for {named[0].upper()} but system has {accel}")


def add_timing_notes(sub: Submission, timings: list[RunTiming], samples_per_s) -> None:
    if not timings:
        sub.notes.append("no per-epoch MLLOG events: epoch_time_s left empty")
        return
    dropped = sum(t.dropped_after_stop for t in timings)
    if dropped:
        sub.notes.append(f"{dropped} epochs logged after run_stop ignored")
    bad = [t.status for t in timings if t.status not in (None, "success")]
    if bad:
        sub.notes.append(f"{len(bad)} runs with run_stop status {sorted(set(bad))}")
    per_run = [statistics.median(t.epoch_times_s) for t in timings]
    if len(per_run) > 1:
        sub.notes.append(f"per-run epoch time range {min(per_run):.2f}-{max(per_run):.2f} s")
    logged = [t.logged_throughput for t in timings if t.logged_throughput]
    if logged and samples_per_s:
        median_logged = statistics.median(logged)
        sub.notes.append(f"implementation-logged throughput median {median_logged:.0f} samples/s "
                         f"({median_logged / samples_per_s:.2f}x the epoch-interval rate)")


def add_duplicate_note(sub: Submission, earlier: dict) -> None:
    key = tuple(sorted(sub.mirror.blob(p) for p in sub.result_files))
    if key in earlier:
        sub.notes.append(f"result files byte-identical to {earlier[key]} (re-published, "
                         "not a new measurement)")
    else:
        earlier[key] = f"{sub.mirror.round} {sub.submitter}/{sub.system}"


# --------------------------------------------------------------------------- main

def default_out() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "planner", "calibration", "mlperf_hpc_cosmoflow.csv")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirrors", required=True,
                        help="directory holding <owner>+hpc_results_v*/repo mirrors")
    parser.add_argument("--out", default=default_out(), help="CSV to write")
    args = parser.parse_args(argv)

    mirrors = find_mirrors(args.mirrors)
    if not mirrors:
        print(f"no hpc_results_v* mirrors under {args.mirrors}", file=sys.stderr)
        return 1
    rows, earlier = [], {}
    for mirror in mirrors:
        for sub in find_submissions(mirror):
            if sub.scaling != "strong":
                print(f"skip {mirror.round} {sub.submitter}/{sub.system}: {sub.scaling} scaling "
                      f"({len(sub.result_files)} result files)", file=sys.stderr)
                continue
            rows.append(build_row(sub, earlier))
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
