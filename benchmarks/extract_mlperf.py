#!/usr/bin/env python3
"""Extract calibration rows from MLPerf Training results repositories.

Reads bare git mirrors of ``mlcommons/training_results_v*`` (as the ``fetch`` tool
leaves them, e.g. ``/work/.mirror/mlcommons+training_results_v5.1/repo``) and writes
one row per submission (submitter x system x benchmark) of the transformer LLM
benchmarks (gpt3, llama31_405b, llama31_8b, llama2_70b_lora) to a CSV.

    python benchmarks/extract_mlperf.py \
        --mirrors '/work/.mirror/mlcommons+training_results_v*/repo' \
        --out planner/calibration/mlperf_training.csv \
        --excluded planner/calibration/mlperf_training_excluded.txt

Every value comes from the submission's own files: the parallel layout from its
launch configuration (the ``config_*.sh`` scripts are *sourced by bash* in an empty
environment, ``env -i``, inside a scratch copy of the implementation's shell files, and
the resulting environment is read), the step time from its MLLOG result logs.  See
``planner/calibration/mlperf_training.md`` for the columns and the derivation.
Nothing is guessed: where a value cannot be read the cell stays empty and ``notes``
says why; submissions whose configuration cannot be identified unambiguously are
left out and listed in the ``--excluded`` file.

Standard library only; needs ``git`` and ``bash``.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

BENCHMARKS = {
    "gpt3": "GPT-3 175B",
    "llama31_405b": "Llama 3.1 405B",
    "llama31_8b": "Llama 3.1 8B",
    "llama2_70b_lora": "Llama 2 70B LoRA",
}
# accelerators the planner can model; TPU and Gaudi submissions are skipped
SKIP_SUBMITTERS = {"Google", "Intel-HabanaLabs", "Intel"}
VENDORED = re.compile(
    r"/(Megatron-LM|TransformerEngine|NeMo|megatron|apex|3rdparty|nccl|maxtext_fork|NeMo-[^/]*)/")

COLUMNS = [
    "benchmark", "model", "round", "submitter", "system", "accelerator", "framework",
    "nodes", "gpus_per_node", "gpus", "tp", "pp", "vp", "cp", "dp", "sequence_parallel",
    "micro_batch", "local_batch", "grad_accum", "global_batch", "seq_len", "precision",
    "fp8_recipe", "fp8_attention", "tp_comm_overlap", "cuda_graph", "dist_optimizer",
    "overlap_grad_reduce", "overlap_param_gather", "fp8_param_gather", "on_device_clip_grad",
    "recompute", "recompute_layers", "weight_cache", "fp8_activation_input",
    "model_tflop_per_sample", "step_time_s", "step_time_min_run_s", "step_time_max_run_s", "n_runs",
    "n_steps_or_blocks",
    "step_time_method", "crosscheck_s", "crosscheck_method",
    "repository", "commit", "config_file", "config_selected_by", "result_files", "duplicate_of", "notes",
    "cp_comm_type",
]
SEEN_BLOBS = {}
# variables whose defaults may be taken from the implementation's own YAML (${oc.env:VAR,default})
YAML_VARS = {"INTERLEAVED_PIPELINE", "FP8", "MICRO_BATCH_SIZE", "TP_COMM_OVERLAP", "CONTEXT_PARALLEL",
             "SEQ_PARALLEL", "FP8_RECIPE", "USE_DIST_OPTIMIZER", "OVERLAP_GRAD_REDUCE",
             "OVERLAP_PARAM_GATHER", "FP8_PARAM_GATHER", "FP8_PARAMS", "CP_COMM_TYPE"}


def git(repo, *args, check=True):
    r = subprocess.run(["git", "-C", repo, *args], capture_output=True)
    if check and r.returncode:
        raise RuntimeError(r.stderr.decode(errors="replace"))
    return r.stdout.decode(errors="replace") if r.returncode == 0 else None


# --------------------------------------------------------------------------- logs
MLLOG = re.compile(r":::MLLOG (\{.*\})\s*$")
DLPAL = re.compile(r":::DLPAL\s+\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+(\S+)")


def parse_log(text):
    ev = []
    dlpal = set()
    for line in text.splitlines():
        m = MLLOG.search(line)
        if m:
            with contextlib.suppress(ValueError):
                ev.append(json.loads(m.group(1)))
            continue
        m = DLPAL.search(line)
        if m:
            dlpal.add(m.group(1).strip("'\""))
    return ev, dlpal


# NeMo prints its resolved model config into the result log (one "key: value" line each):
# the layout that ran, whatever the config file the submission ships says
LAYOUT = re.compile(r"^[ \t]*(?:\d+:[ \t]*)?(tensor_model_parallel_size|pipeline_model_parallel_size|"
                    r"context_parallel_size|micro_batch_size): (\d+)[ \t]*$", re.M)
LAYOUT_FIELD = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
                "context_parallel_size": "cp", "micro_batch_size": "micro_batch"}


# ... and its switches, "key: true|false": the GEMM format (fp4, fp8), CUDA graphs and
# userbuffers' tp overlap. Which config variable sets each CUDA-graph switch is the
# implementation's own YAML's to say (`GRAPH_BINDING`): the v5.x LoRA recipes read
# enable_cuda_graph from MCORE_CUDA_GRAPH and external_cuda_graph from LAYER_CUDA_GRAPH, v4.x's
# and several v5.x submitters' enable_cuda_graph from LAYER_CUDA_GRAPH
SWITCH = re.compile(r"^[ \t]*(?:\d+:[ \t]*)?(fp4|fp8|enable_cuda_graph|external_cuda_graph|"
                    r"ub_tp_comm_overlap): (true|false)[ \t]*$", re.M)
GRAPH_BINDING = re.compile(r"^[ \t]*(enable_cuda_graph|external_cuda_graph):[ \t]*"
                           r"\$\{(?:oc\.decode:\$\{)?oc\.env:(\w+)", re.M)


def logged_layout(text):
    """{tp, pp, cp, micro_batch: value} the result log prints, each where it prints one value."""
    found = {}
    for m in LAYOUT.finditer(text):
        found.setdefault(LAYOUT_FIELD[m.group(1)], set()).add(int(m.group(2)))
    return {k: v.pop() for k, v in found.items() if len(v) == 1}


def logged_switches(text):
    """{switch: bool} of `SWITCH` the result log prints, each where it prints one value."""
    found = {}
    for m in SWITCH.finditer(text):
        found.setdefault(m.group(1), set()).add(m.group(2) == "true")
    return {k: v.pop() for k, v in found.items() if len(v) == 1}


def format_of(precision):
    """A config's precision as the log's switches name its GEMM format (None: not known)."""
    precision = (precision or "").lower()
    return ("fp4" if "fp4" in precision else "fp8" if "fp8" in precision
            else "bf16" if precision == "bf16" else None)


def agrees_with_log(f, layout, switches):
    """Whether a config's fields ran as the result log says: its layout (`logged_layout`), its
    GEMM format, its CUDA graphs (by its implementation's `GRAPH_BINDING`) and its tp overlap
    (`logged_switches`), each where the log prints it and the config says it: a value the
    config leaves unknown contradicts nothing."""
    if not all(f.get(k) == v for k, v in layout.items()):
        return False
    fmt = format_of(f["precision"])
    if "fp4" in switches and "fp8" in switches and fmt is not None:
        ran = "fp4" if switches["fp4"] else "fp8" if switches["fp8"] else "bf16"
        if fmt != ran:
            return False
    if f["cuda_graph"] != "":
        graphs = set(f["cuda_graph"].split("+"))
        if any(key in switches and (var in graphs) != switches[key]
               for key, var in f["_graph_binding"].items()):
            return False
    overlap = switches.get("ub_tp_comm_overlap")
    return overlap is None or f["tp_comm_overlap"] in ("", int(overlap))


def honour_log(pool, path, fl, how, layout, gbs_log, sys_gpn, system):
    """The config and fields that agree with the layout the result log prints: the selected
    config where it does; else the one config of the same GPU count and global batch whose
    layout is the logged one; else the selected config's with the logged layout written over
    its own (dp and the local batch derived again), noted. A log that prints no layout leaves
    the selection as it is."""
    if not layout or all(fl.get(k) == v for k, v in layout.items()):
        return path, fl, how
    cands = {p: fields(e, sys_gpn) for p, e in pool.cfg.items()}
    agree = sorted((p for p, f in cands.items()
                    if f["gpus"] == fl["gpus"] and all(f.get(k) == v for k, v in layout.items())
                    and not (gbs_log and f["cfg_global_batch"]
                             and f["cfg_global_batch"] != gbs_log)),
                   key=lambda p: (-_system_name_match(p, system), p))
    shown = ", ".join(f"{k} {v}" for k, v in sorted(layout.items()))
    if agree and len({sig(cands[p]) for p in agree}) == 1:
        return agree[0], cands[agree[0]], (
            f"{how}; the result log prints layout {shown}, not that of "
            f"{os.path.basename(path)}: the config that agrees with the log")
    f = dict(fl)
    old = ", ".join(f"{k} {fl.get(k)}" for k in sorted(layout))
    f.update(layout)
    tp, pp, cp = f["tp"], f["pp"], f["cp"]
    f["dp"] = (f["gpus"] // (tp * pp * cp) if f["gpus"] and tp and pp and cp
               and f["gpus"] % (tp * pp * cp) == 0 else None)
    f["local_batch"] = gbs_log // f["dp"] if gbs_log and f["dp"] else None
    f["_notes"] = fl["_notes"] + [
        f"the result log prints layout {shown} where the config says {old}: the log's is what "
        "ran (dp and local batch derived from it, the config's other settings kept)"]
    return path, f, how


def first(ev, key):
    for e in ev:
        if e.get("key") == key:
            return e.get("value")
    return None


def _is_step_key(k):
    return k.startswith("train_step_tim")


def run_step_time(ev, gbs):
    """Step time of one run (result file).  Returns (value, method, n, crosscheck, cc_method)."""
    stats = [e for e in ev if e.get("key") == "tracked_stats" and isinstance(e.get("value"), dict)]
    per_step, per_block, thr = [], [], []
    for e in stats:
        v = e["value"]
        sk = [k for k in v if _is_step_key(k)]
        if sk:
            md = e.get("metadata", {})
            if "reduced_train_loss" in v or ("samples_count" not in md and "throughput" not in v
                                             and "max_memory_usage" not in v):
                stp = md.get("step")
                per_step.append((e["time_ms"], float(v[sk[0]]), None if stp is None else float(stp)))
            else:
                per_block.append(float(v[sk[0]]))
        elif "throughput" in v and "validation" not in "".join(v):
            thr.append(float(v["throughput"]))
    # v5.1 logs a per-block train_step_time alone with metadata samples_count: treat as block
    # A per-step list is only accepted when the wall-clock spacing of consecutive entries
    # matches the logged value (i.e. the logger fired every step).
    if len(per_step) >= 3:
        vals = [v for _, v, _ in per_step]
        med = statistics.median(vals)
        # wall-clock per step between consecutive entries; metadata.step counts steps (v5),
        # or consumed tokens (v3 gpt3) or is absent (then one step per entry is assumed)
        pairs = [(b[0] - a[0], (b[2] - a[2]) if a[2] is not None and b[2] is not None else None)
                 for a, b in zip(per_step, per_step[1:], strict=False)]
        dsteps = [d for _, d in pairs if d]
        # metadata.step is in steps, samples (x gbs) or tokens (x gbs x seq) depending on the logger:
        # the unit is the one of these that divides the increments and brings the wall clock closest
        # to the logged value (a unit choice, not a fit: the three candidates differ by >= gbs)
        seq = first(ev, "max_sequence_length") or 0
        units = [1.0] + ([float(gbs)] if gbs else []) + ([float(gbs * seq)] if gbs and seq else [])
        best = None
        for unit in units:
            if dsteps and any(d / unit < 1 - 1e-9 or abs(d / unit - round(d / unit)) > 1e-9 for d in dsteps):
                continue
            per = [dt / 1000.0 / ((d / unit) if d else 1.0) for dt, d in pairs if d is None or d > 0]
            if not per:
                continue
            cand = statistics.median(per)
            if best is None or abs(cand / med - 1) < abs(best / med - 1):
                best = cand
        med_dt = best if best is not None else float("nan")
        meth = "median of per-step train_step_time(ing) MLLOG entries"
        if abs(med_dt / med - 1) >= 0.1:
            meth += f" (wall clock per step between entries differs: {med_dt:.4g} s)"
        return med, meth, len(vals), med_dt, "median wall-clock time per step between consecutive " \
            "train_step_time MLLOG entries (steps from metadata.step)"
    blocks = per_block
    if blocks:
        use = blocks[1:] if len(blocks) >= 2 else blocks
        cc, ccm = _loss_interval(ev, gbs)
        return statistics.median(use), "median over training blocks (first block dropped when >=2) of the " \
            "per-block mean train_step_time MLLOG entry", len(use), cc, ccm
    if thr and gbs:
        use = thr[1:] if len(thr) >= 2 else thr
        steps = [gbs / t for t in use]
        cc, ccm = _block_walltime(ev, gbs)
        return statistics.median(steps), "global_batch / per-block throughput (samples/s) MLLOG entry; " \
            "median over blocks (first block dropped when >=2)", len(use), cc, ccm
    bl = _block_epoch_count(ev, gbs)
    if bl:
        use = bl[1:] if len(bl) >= 2 else bl
        return statistics.median(use), "block wall clock (block_start..block_stop) / steps in block " \
            "(metadata epoch_count tokens / (global_batch x max_sequence_length)); median over blocks, " \
            "first block dropped when >=2", len(use), None, ""
    return None, None, 0, None, None


def _block_epoch_count(ev, gbs):
    seq = first(ev, "max_sequence_length")
    out, start = [], None
    for e in ev:
        if e.get("key") == "block_start":
            start = e
        elif e.get("key") == "block_stop" and start is not None:
            ec = start.get("metadata", {}).get("epoch_count")
            if ec and seq and gbs:
                steps = ec / (gbs * seq)
                if steps >= 1 and abs(steps - round(steps)) < 1e-9:
                    out.append((e["time_ms"] - start["time_ms"]) / 1000.0 / steps)
            start = None
    return out


def _loss_interval(ev, gbs):
    """Cross-check: consecutive train-loss entries carrying metadata.step inside one block."""
    pts = []
    for e in ev:
        k = e.get("key")
        if k in ("block_stop", "eval_start", "block_start"):
            pts.append(None)
        elif k == "tracked_stats" and isinstance(e.get("value"), dict) and \
                ("train_loss" in e["value"] or "reduced_train_loss" in e["value"]):
            st = e.get("metadata", {}).get("step")
            if st is not None:
                pts.append((e["time_ms"], float(st)))
    per = []
    for a, b in zip(pts, pts[1:], strict=False):
        if a and b and b[1] > a[1]:
            per.append((b[0] - a[0]) / 1000.0 / (b[1] - a[1]))
    if len(per) >= 3:
        return statistics.median(per), "median wall-clock time per step between consecutive train-loss " \
            "MLLOG entries (metadata.step) inside a block"
    return None, None


def _block_walltime(ev, gbs):
    """Cross-check: block_start -> block_stop wall clock over samples in the block."""
    out = []
    start = None
    for e in ev:
        if e.get("key") == "block_start":
            start = e
        elif e.get("key") == "block_stop" and start is not None:
            s0 = start.get("metadata", {}).get("samples_count")
            s1 = e.get("metadata", {}).get("samples_count")
            if s0 is not None and s1 is not None and s1 > s0:
                dt = (e["time_ms"] - start["time_ms"]) / 1000.0
                out.append(dt / ((s1 - s0) / gbs))
            start = None
    if len(out) >= 2:
        out = out[1:]
    if out:
        return statistics.median(out), "median block wall clock (block_start..block_stop) / " \
            "(samples in block / global_batch), first block dropped when >=2"
    return None, None


# ------------------------------------------------------------------------ configs
EVAL_SH = r'''cd "$1" || exit 3
trap 'env -0 > "$3"' EXIT
source "./$2" >/dev/null 2>&1 </dev/null
'''


class ConfigPool:
    """Shell files of every implementation of one (submitter, benchmark), sourced in bash."""

    def __init__(self, repo, files, sub, bench, scratch):
        self.repo, self.sub, self.bench, self.files = repo, sub, bench, files
        self._parsed: dict[str, dict[str, str]] = {}  # YAML file -> its defaults
        pre = f"{sub}/benchmarks/{bench}/"
        sh = [f for f in files if f.startswith(pre) and f.endswith(".sh") and not VENDORED.search(f)]
        self.readmes = [f for f in files if f.startswith(pre) and re.search(r"/README[^/]*\.md$", f)
                        and not VENDORED.search(f)]
        self.yamls = [f for f in files if f.startswith(pre) and re.search(r"\.ya?ml$", f)
                      and not VENDORED.search(f)]
        self.srcpy = [f for f in files if f.startswith(pre) and f.endswith(".py") and "/src/" in f
                      and not VENDORED.search(f)]
        self.root = os.path.join(scratch, sub.replace("/", "_"), bench)
        os.makedirs(self.root, exist_ok=True)
        if sh:
            arch = subprocess.run(["git", "-C", repo, "archive", "HEAD", *sh], capture_output=True)
            subprocess.run(["tar", "-x", "-C", self.root], input=arch.stdout, capture_output=True)
        base = self._env(None, None)
        self.cfg = {}
        for f in sh:
            name = os.path.basename(f)
            if not name.startswith("config_"):
                continue
            env = self._env(os.path.join(self.root, os.path.dirname(f)), name)
            env = {k: v for k, v in env.items()
                   if base.get(k) != v and k not in ("PWD", "OLDPWD", "SHLVL", "_")}
            miss = self._missing_sources(os.path.join(self.root, f))
            hard = [m for m, cond in miss if not cond]
            soft = [m for m, cond in miss if cond]
            if hard:
                env["__MISSING__"] = ",".join(hard)
            if soft:
                env["__MISSING_COND__"] = ",".join(soft)
            # the LoRA recipes' YAML turns Transformer Engine's weight cache off outright
            # (`disable_parameter_transpose_cache: True`, no variable)
            if self._yaml_literal(os.path.dirname(f), "disable_parameter_transpose_cache",
                                  "True"):
                env["__NO_WEIGHT_CACHE__"] = "1"
            env["__GRAPH_BINDING__"] = ",".join(
                f"{k}={v}" for k, v in self._graph_binding(os.path.dirname(f)).items())
            if not hard:
                # defaults the implementation's own Hydra/OmegaConf YAML gives to unset variables
                # (${oc.env:VAR,default}); only used when every sourced file is present
                for var, (val, src) in self._yaml_defaults(os.path.dirname(f)).items():
                    if var not in env and var in YAML_VARS:
                        env[var] = val
                        env.setdefault("__YAMLDEF__", "")
                        env["__YAMLDEF__"] += f"{var}={val} ({src}) "
                # the context-parallel exchange from the submission's one YAML default where
                # its configs and YAML sit in sibling folders (Nebius, Oracle, Lambda,
                # Supermicro copy NVIDIA's LoRA recipe that way)
                if "CP_COMM_TYPE" not in env and (one := self._only_default("CP_COMM_TYPE")):
                    env["CP_COMM_TYPE"] = one[0]
                    env.setdefault("__YAMLDEF__", "")
                    env["__YAMLDEF__"] += f"CP_COMM_TYPE={one[0]} ({one[1]}, the submission's " \
                                          "only YAML default for it) "
                elif "CP_COMM_TYPE" not in env and (
                        one := self._vendor_default(f, "CP_COMM_TYPE")):
                    env["CP_COMM_TYPE"] = one[0]
                    env.setdefault("__YAMLDEF__", "")
                    env["__YAMLDEF__"] += f"CP_COMM_TYPE={one[0]} ({one[1]}) "
            if any(k in env for k in ("DGXNNODES", "NNODES")):
                self.cfg[f] = env

    def _defaults_of(self, f):
        """{variable: default} a YAML file gives its unset variables (${oc.env:VAR,default}),
        read once per file."""
        if f not in self._parsed:
            txt = git(self.repo, "show", f"HEAD:{f}", check=False) or ""
            out = self._parsed[f] = {}
            for m in re.finditer(r"oc\.env:(\w+),\s*([^}\s]+)\}", txt):
                out.setdefault(m.group(1), m.group(2).strip("'\""))
        return self._parsed[f]

    def _yaml_defaults(self, impl_dir):
        out = {}
        for f in self.yamls:
            if f.startswith(impl_dir + "/"):
                for var, val in self._defaults_of(f).items():
                    out.setdefault(var, (val, os.path.basename(f)))
        return out

    def _only_default(self, var):
        """(value, file) of `var`'s default where every YAML of the submission's benchmark
        that gives one gives the same, else None."""
        return self._one_default(self.yamls, var)

    def _one_default(self, yamls, var):
        """(value, file) where every YAML of `yamls` that gives `var` a default gives the
        same, else None."""
        found = {}
        for f in yamls:
            if var in self._defaults_of(f):
                found.setdefault(self._defaults_of(f)[var], f)
        return next(iter(found.items())) if len(found) == 1 else None

    def _vendor_default(self, config, var):
        """(value, where from) of `var`'s default in NVIDIA's YAML for a submission whose own
        YAML gives none (Oracle's v5.0 and Lambda's v5.1 LoRA submissions ship shell files
        only, no YAML or train.py; Lambda's Dockerfile adds its build folder) and which runs
        NVIDIA's recipe of the same round: its config's config_common.sh is byte-identical to
        that of NVIDIA implementations whose YAML files give `var` one default. Else None."""
        if self.sub == "NVIDIA" or any(var in self._defaults_of(y) for y in self.yamls):
            return None
        blob = git(self.repo, "rev-parse", f"HEAD:{os.path.dirname(config)}/config_common.sh",
                   check=False)
        pre = f"NVIDIA/benchmarks/{self.bench}/"
        theirs = [f for f in self.files if f.startswith(pre) and not VENDORED.search(f)]
        roots = {m.group(1) for f in theirs if f.endswith("/config_common.sh")
                 and (m := re.match(r"(.*?/implementations/[^/]+)/", f))
                 and blob and git(self.repo, "rev-parse", f"HEAD:{f}", check=False) == blob}
        one = self._one_default([f for f in theirs if re.search(r"\.ya?ml$", f)
                                 and any(f.startswith(r + "/") for r in roots)], var)
        if one is None:
            return None
        return one[0], (f"{one[1]}: this submission ships no YAML, and its config_common.sh "
                        f"is that NVIDIA implementation's, byte for byte")

    def _graph_binding(self, impl_dir):
        """{log switch: config variable} the implementation's YAML binds each CUDA-graph switch
        to (`GRAPH_BINDING`); a switch two of its YAMLs bind differently is left out."""
        found = {}
        for f in self.yamls:
            if f.startswith(impl_dir + "/"):
                txt = git(self.repo, "show", f"HEAD:{f}", check=False) or ""
                for m in GRAPH_BINDING.finditer(txt):
                    found.setdefault(m.group(1), set()).add(m.group(2))
        return {k: v.pop() for k, v in sorted(found.items()) if len(v) == 1}

    def _yaml_literal(self, impl_dir, key, value):
        """Whether a YAML file of the implementation sets `key: value` outright."""
        pattern = re.compile(rf"^\s*{re.escape(key)}:\s*{re.escape(value)}\s*(#.*)?$", re.M)
        return any(pattern.search(git(self.repo, "show", f"HEAD:{f}", check=False) or "")
                   for f in self.yamls if f.startswith(impl_dir + "/"))

    def _missing_sources(self, path, seen=None):
        """Files a config sources (source/. <dir>/config_x.sh) that the implementation does not contain."""
        seen = seen or set()
        out = []
        try:
            with open(path, errors="replace") as fh:
                txt = fh.read()
        except OSError:
            return out
        for m in re.finditer(r"^([ \t]*)(?:source|\.)[ \t]+(.*)$", txt, re.M):
            cond = bool(m.group(1))  # indented: inside an if/else branch
            mm = re.search(r"([\w.\-]+/)?([\w.\-]+\.sh)\b", m.group(2).split("#")[0])
            if not mm:
                continue
            base = mm.group(2)
            cand = os.path.join(os.path.dirname(path), (mm.group(1) or "").replace("$", ""), base)
            if not os.path.exists(cand):
                cand = os.path.join(os.path.dirname(path), base)
            if not os.path.exists(cand):
                out.append((base, cond))
            elif cand not in seen:
                seen.add(cand)
                out += [(b, c or cond) for b, c in self._missing_sources(cand, seen)]
        return out

    def _env(self, d, name):
        tmpd = tempfile.mkdtemp(dir=self.root)
        out = os.path.join(tmpd, "env")
        script = os.path.join(tmpd, "eval.sh")
        with open(script, "w") as fh:
            fh.write(EVAL_SH)
        try:
            subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", f"HOME={tmpd}", "timeout", "20", "bash",
                            script, d or tmpd, name or "/dev/null", out], capture_output=True, timeout=40)
            raw = ""
            if os.path.exists(out):
                with open(out, errors="replace") as fh:
                    raw = fh.read()
        finally:
            shutil.rmtree(tmpd, ignore_errors=True)
        return dict(x.split("=", 1) for x in raw.split("\0") if "=" in x)

    def readme_configs(self, system):
        """Config names a README-<system>.md names for this system."""
        out = []
        for f in self.readmes:
            if os.path.basename(f) != f"README-{system}.md":
                continue
            txt = git(self.repo, "show", f"HEAD:{f}", check=False) or ""
            out += re.findall(r"(config_[A-Za-z0-9_.\-]+?\.sh)", txt)
        return out


def _int(env, *keys):
    for k in keys:
        v = env.get(k)
        if v not in (None, ""):
            try:
                return int(float(v))
            except ValueError:
                return None
    return None


def _bool(v):
    if v is None or v == "":
        return None
    return v.strip().lower() in ("1", "true", "yes", "on")


def fields(env, sys_gpn):
    """Planner fields from a sourced configuration environment."""
    notes = []
    nodes = _int(env, "DGXNNODES", "NNODES")
    gpn = _int(env, "DGXNGPU", "GPUS_PER_NODE")
    if gpn is None and sys_gpn:
        gpn = sys_gpn
        notes.append("gpus_per_node not set by config (run script default); taken from systems JSON")
    tp = _int(env, "TENSOR_MODEL_PARALLEL", "TP")
    pp = _int(env, "PIPELINE_MODEL_PARALLEL", "PP")
    vp = _int(env, "INTERLEAVED_PIPELINE")
    cp = _int(env, "CONTEXT_PARALLEL", "CP")
    mbs = _int(env, "MICRO_BATCH_SIZE", "MBS")
    minibs = _int(env, "MINIBS")
    gbs = _int(env, "GLOBAL_BATCH_SIZE", "GBS")
    if cp is None and tp is not None:
        cp = 1
        notes.append("no CP variable in config: cp=1 (context parallelism not configured)")
    if pp is not None and pp > 1 and vp is None:
        notes.append("vp: no INTERLEAVED_PIPELINE in config")
    if pp == 1 and vp is None:
        vp = 1
    gpus = nodes * gpn if nodes and gpn else None
    dp = None
    if gpus and tp and pp and cp and gpus % (tp * pp * cp) == 0:
        dp = gpus // (tp * pp * cp)
    if gbs is None and minibs and dp:
        gbs = minibs * dp
    # precision
    fp4, fp8 = _bool(env.get("FP4")), _bool(env.get("FP8"))
    recipe = env.get("FP8_RECIPE") or ""
    if fp4:
        prec = env.get("FP4_RECIPE") or "nvfp4"
        recipe = env.get("FP4_RECIPE", "")
    elif fp8:
        prec = "mxfp8" if recipe.lower() == "mxfp8" else "fp8"
        if not recipe:
            recipe = "delayed(hybrid)" if _bool(env.get("FP8_HYBRID")) else ""
    elif fp8 is False:
        prec = "bf16"
    else:
        prec = ""
    fp8_dpa = env.get("FP8_DPA", "")
    cg = [k for k in ("FULL_CUDA_GRAPH", "MCORE_CUDA_GRAPH", "LAYER_CUDA_GRAPH") if _bool(env.get(k))]
    sp = env.get("SEQ_PARALLEL", env.get("SP", ""))
    return {
        "nodes": nodes, "gpus_per_node": gpn, "gpus": gpus, "tp": tp, "pp": pp, "vp": vp, "cp": cp, "dp": dp,
        "sequence_parallel": "" if sp == "" else int(bool(_bool(sp))),
        "micro_batch": mbs, "local_batch": minibs, "cfg_global_batch": gbs, "precision": prec,
        "fp8_recipe": recipe, "fp8_attention": "" if fp8_dpa == "" else int(bool(_bool(fp8_dpa))),
        "tp_comm_overlap": ("" if env.get("TP_COMM_OVERLAP") is None
                            else int(bool(_bool(env["TP_COMM_OVERLAP"])))),
        "cuda_graph": "+".join(cg) if cg else ("0" if any(k in env for k in (
            "FULL_CUDA_GRAPH", "MCORE_CUDA_GRAPH", "LAYER_CUDA_GRAPH")) else ""),
        "dist_optimizer": ("" if env.get("USE_DIST_OPTIMIZER") is None
                           else int(bool(_bool(env["USE_DIST_OPTIMIZER"])))),
        "overlap_grad_reduce": ("" if env.get("OVERLAP_GRAD_REDUCE") is None
                                else int(bool(_bool(env["OVERLAP_GRAD_REDUCE"])))),
        "overlap_param_gather": ("" if env.get("OVERLAP_PARAM_GATHER") is None
                                 else int(bool(_bool(env["OVERLAP_PARAM_GATHER"])))),
        # weights kept and all-gathered in fp8 (NeMo FP8_PARAM_GATHER; older configs FP8_PARAMS)
        "fp8_param_gather": next((int(bool(_bool(env[k]))) for k in (
            "FP8_PARAM_GATHER", "FP8_PARAMS") if env.get(k) not in (None, "")), ""),
        # the gradient norm clipped on the device, not read back to the host (NeMo's
        # ON_DEVICE_CLIP_GRAD, set by the v5.1 LoRA recipes): no host sync a step from it
        "on_device_clip_grad": ("" if env.get("ON_DEVICE_CLIP_GRAD") in (None, "")
                                else int(bool(_bool(env["ON_DEVICE_CLIP_GRAD"])))),
        # activation recomputation (NeMo's ACG granularity, ACM method, ACL layers: the AMD
        # LoRA recipes' full recompute of 21 layers a stage by the block method)
        "recompute": env.get("ACG", "") if env.get("ACG") in ("full", "selective") else "",
        "recompute_layers": (env.get("ACL", "") if env.get("ACG") == "full"
                             and env.get("ACM") == "block" else ""),
        # Transformer Engine's weight cache off (the recipe's YAML) : 0, else unset
        "weight_cache": 0 if env.get("__NO_WEIGHT_CACHE__") else "",
        # the FFN activation's input saved in fp8 (NeMo FP8_ACT / FP8_ACTIVATION ->
        # activation_func_fp8_input_store, the LoRA recipes)
        "fp8_activation_input": next((int(bool(_bool(env[k]))) for k in (
            "FP8_ACT", "FP8_ACTIVATION") if env.get(k) not in (None, "")), ""),
        "model_tflop_per_sample": env.get("MODEL_TFLOP_PER_SAMPLE", ""),
        # how context parallelism exchanges the sequence (NeMo CP_COMM_TYPE -> Megatron-LM's
        # cp_comm_type: p2p ring attention, Megatron's default, or a2a, the LoRA recipes' YAML
        # default from v4.1's B200 preview on)
        "cp_comm_type": env.get("CP_COMM_TYPE", ""),
        "_notes": notes + ([f"config sources file(s) absent from the submission: {env['__MISSING__']} "
                             "(values they would set are left empty)"] if env.get("__MISSING__") else [])
        + ([f"a conditional branch of the config sources file(s) absent from the submission: "
            f"{env['__MISSING_COND__']} (the default branch was evaluated)"]
           if env.get("__MISSING_COND__") else [])
        + ([f"defaults from the implementation's YAML for variables the config leaves unset: "
            f"{env['__YAMLDEF__'].strip()}"] if env.get("__YAMLDEF__") else []),
        "_dgxsystem": env.get("DGXSYSTEM", ""),
        "_graph_binding": dict(x.split("=", 1) for x in env.get("__GRAPH_BINDING__", "").split(",")
                               if "=" in x),
    }


SIG = ("tp", "pp", "vp", "cp", "micro_batch", "precision", "fp8_recipe", "cuda_graph", "tp_comm_overlap",
       "local_batch")


def sig(f):
    """A config's fields that make it another plan to price (`SIG`)."""
    return tuple(f[k] for k in SIG)


def norm(s):
    return re.sub(r"[^a-z0-9]", "", s.lower())


def _system_name_match(path, system):
    """How much of the system's name a config's file name carries (config_<SYSTEM>_1x8x....sh):
    the length of that name where the system's contains it, else 0 (a longer name is the
    closer: XE9680L over XE9680 for an XE9680L system)."""
    stem = os.path.splitext(os.path.basename(path))[0][len("config_"):]
    name = norm(stem.split("_")[0])
    return len(name) if len(name) > 4 and name in norm(system) else 0


def select_config(pool, system, sysjson, gbs_log, dlpal, layout=None, switches=None):
    """Return (path, fields, how, reason_if_none). Candidates that differ in layout or
    settings are told apart by what the result log prints (`layout`, `switches`)."""
    acc_apn = _int(sysjson, "accelerators_per_node")
    acc_nodes = _int(sysjson, "number_of_nodes")
    total = acc_apn * acc_nodes if acc_apn and acc_nodes else None
    cands = {p: fields(e, acc_apn) for p, e in pool.cfg.items()}
    if not cands:
        return None, None, None, "no config_*.sh defining DGXNNODES/NNODES in the benchmark's implementations"
    how = []
    # 1. README-<system>.md names the config
    named = pool.readme_configs(system)
    pick = [p for p in cands if os.path.basename(p) in named]
    if pick:
        how.append(f"README-{system}.md names it")
    # 2. DLPAL line in the result log carries DGXSYSTEM
    if not pick and dlpal:
        nd = {norm(d) for d in dlpal}
        pick = [p for p, f in cands.items() if norm(f["_dgxsystem"]) in nd or
                norm(os.path.basename(p)[7:-3]) in nd]
        if pick:
            how.append("DGXSYSTEM printed in the result log (:::DLPAL) matches")
    # 3. filter on GPU count and logged global batch
    pool_ = pick or list(cands)

    def ok(p):
        f = cands[p]
        if total and f["gpus"] and f["gpus"] != total:
            return False
        return not (gbs_log and f["cfg_global_batch"] and f["cfg_global_batch"] != gbs_log)
    flt = [p for p in pool_ if ok(p)]
    if pick and not flt:
        same_gpus = [p for p in pool_ if total and cands[p]["gpus"] == total]
        if len(same_gpus) == 1:
            p = same_gpus[0]
            f = dict(cands[p])
            f["_notes"] = f["_notes"] + [
                f"global batch in the named config ({f['cfg_global_batch']}) differs from the logged one "
                f"({gbs_log}): the local batch (MINIBS) was overridden at launch; local_batch left empty, "
                "global_batch is the logged value"]
            f["local_batch"] = None
            f["cfg_global_batch"] = None
            return p, f, "; ".join(how), None
        return None, None, None, (f"named config {pick} does not match systems JSON GPU count {total} "
                                  f"/ logged GBS {gbs_log}")
    if not pick:
        how.append(f"only configs with nodes x gpus = {total} (systems JSON) "
                   f"and global batch = {gbs_log} (log)")
        flt = [p for p in flt if cands[p]["gpus"] and cands[p]["cfg_global_batch"]]
        # prefer the implementation directory named after the system
        def impl(p):
            rest = p.split(f"/benchmarks/{pool.bench}/", 1)[1]
            rest = rest[len("implementations/"):] if rest.startswith("implementations/") else rest
            return norm(rest.split("/")[0]) if "/" in rest else ""
        own = [p for p in flt if impl(p) and (norm(system) in impl(p) or impl(p) in norm(system))]
        if own and len(own) < len(flt):
            flt = own
            how.append("implementation directory named after the system")
    if not flt:
        return None, None, None, f"no config matches systems JSON GPU count {total} and logged GBS {gbs_log}"
    sigs = {sig(cands[p]) for p in flt}
    if len(sigs) > 1:
        # accelerator token of the DGXSYSTEM name against the systems JSON accelerator
        acc = norm(sysjson.get("accelerator_model_name", ""))
        toks = {"gb300": "gb300", "gb200": "gb200", "b300": "b300", "b200": "b200", "h200": "h200",
                "h100": "h100", "mi355x": "mi355x", "mi350x": "mi350x", "mi325x": "mi325x",
                "mi300x": "mi300x", "l40s": "l40s"}
        mine = [t for t in toks if t in acc]
        mine = [t for t in mine if not any(t != u and t in u for u in mine)]
        if mine:
            same = [p for p in flt if mine[0] in norm(cands[p]["_dgxsystem"] or os.path.basename(p))]
            if same:
                flt = same
                sigs = {sig(cands[p]) for p in flt}
                how.append(f"config name carries the accelerator ({mine[0]})")
    if len(sigs) > 1 and (layout or switches):
        ran = [p for p in flt if agrees_with_log(cands[p], layout or {}, switches or {})]
        ran_sigs = {sig(cands[p]) for p in ran}
        if len(ran_sigs) == 1:
            flt, sigs = ran, ran_sigs
            how.append("the one candidate whose layout and settings the result log prints")
    if len(sigs) > 1:
        names = ", ".join(sorted(os.path.basename(p) for p in flt))
        return None, None, None, (f"ambiguous: {len(flt)} candidate configs differ in parallel "
                                  f"layout/precision: {names}")
    # of configs identical in SIG, one named after the system first (its other settings are
    # the system's own: a B300 row is not read from a GB300 config)
    flt.sort(key=lambda p: (-_system_name_match(p, system), p))
    if len(flt) > 1:
        how.append(f"{len(flt)} candidate configs identical in {'/'.join(SIG)}: "
                   + ", ".join(os.path.basename(p) for p in flt))
    return flt[0], cands[flt[0]], "; ".join(how), None


def src_precision(pool):
    """Precision hard-coded in the implementation's own src/*.py (e.g. AMD's fp8='hybrid')."""
    for f in pool.srcpy:
        txt = git(pool.repo, "show", f"HEAD:{f}", check=False) or ""
        if re.search(r"""\bfp8\s*=\s*["']hybrid["']""", txt):
            return "fp8", "delayed(hybrid)", f
    return None, None, None


# --------------------------------------------------------------------------- main
def process_repo(repo, scratch, rows, excluded):
    commit = git(repo, "rev-parse", "HEAD").strip()
    url = git(repo, "config", "--get", "remote.origin.url", check=False)
    m = re.search(r"training_results_v[\d.]+", repo)
    rnd = m.group(0).split("_")[-1] if m else ""
    repository = f"mlcommons/training_results_{rnd}" if rnd else (url or repo).strip()
    files = git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
    groups = {}
    for f in files:
        m = re.match(r"^([^/]+)/results/([^/]+)/([^/]+)/result_\d+\.txt$", f)
        if m and m.group(3) in BENCHMARKS:
            groups.setdefault(m.groups(), []).append(f)
    pools = {}
    for (sub, system, bench), rfiles in sorted(groups.items()):
        key = f"{repository} {sub}/{system}/{bench}"
        if sub in SKIP_SUBMITTERS:
            excluded.append(f"{key}: skipped (TPU / Gaudi submission)")
            continue
        sj = git(repo, "show", f"HEAD:{sub}/systems/{system}.json", check=False)
        try:
            sysjson = json.loads(sj) if sj else {}
        except ValueError:
            sysjson = {}
        per_run, gbs_log, seq_log, ga_log, dlpal, used = [], None, None, None, set(), []
        layout, switches = {}, {}
        methods, ccs, ccms, nsteps = set(), [], set(), []
        for rf in sorted(rfiles, key=lambda s: int(re.search(r"result_(\d+)", s).group(1))):
            txt = git(repo, "show", f"HEAD:{rf}", check=False)
            if txt is None:
                continue  # blob absent from the snapshot
            ev, dl = parse_log(txt)
            dlpal |= dl
            layout = layout or logged_layout(txt)
            switches = switches or logged_switches(txt)
            g = first(ev, "global_batch_size")
            if g is None:
                continue
            gbs_log = gbs_log or int(g)
            seq_log = seq_log or first(ev, "max_sequence_length")
            ga_log = ga_log if ga_log is not None else first(ev, "gradient_accumulation_steps")
            st, meth, n, cc, ccm = run_step_time(ev, int(g))
            if st is None:
                continue
            per_run.append(st)
            methods.add(meth)
            nsteps.append(n)
            used.append(rf)
            if cc is not None:
                ccs.append(cc)
                ccms.add(ccm)
        blobs = frozenset(b for b in (git(repo, "rev-parse", f"HEAD:{rf}", check=False) for rf in used) if b)
        dup = ""
        for (other, ob) in SEEN_BLOBS.items():
            if blobs and blobs == ob:
                dup = other
        sig = ("steps", bench, tuple(sorted(round(x, 6) for x in per_run)))
        if not dup and per_run and sig in SEEN_BLOBS.values():
            dup = [k for k, v in SEEN_BLOBS.items() if v == sig][0] + " (identical per-run step times)"
        if per_run and blobs:
            SEEN_BLOBS.setdefault(f"{rnd} {sub}/{system}", blobs)
            SEEN_BLOBS.setdefault(f"{rnd} {sub}/{system}/{bench}", sig)
        if not per_run:
            excluded.append(f"{key}: no step time derivable from the result logs "
                            f"({len(rfiles)} result files; no per-step/per-block step time or throughput "
                            "entries)")
            continue
        if (sub, bench) not in pools:
            pools[(sub, bench)] = ConfigPool(repo, files, sub, bench, scratch)
        pool = pools[(sub, bench)]
        path, fl, how, why = select_config(pool, system, sysjson, gbs_log, dlpal, layout,
                                           switches)
        if path is None:
            excluded.append(f"{key}: {why}")
            continue
        path, fl, how = honour_log(pool, path, fl, how, layout, gbs_log,
                                   _int(sysjson, "accelerators_per_node"), system)
        notes = list(fl["_notes"])
        prec, recipe = fl["precision"], fl["fp8_recipe"]
        if not prec:
            p2, r2, src = src_precision(pool)
            if p2:
                prec, recipe = p2, r2
                notes.append(f"precision from {src} (fp8='hybrid' hard-coded; config has no FP8 variable)")
            else:
                notes.append("precision: no FP8/FP4 variable in config")
        if fl["cfg_global_batch"] and gbs_log and fl["cfg_global_batch"] != gbs_log:
            notes.append(f"config GBS {fl['cfg_global_batch']} != logged {gbs_log}")
        total = None
        with contextlib.suppress(TypeError, ValueError):
            total = int(sysjson.get("number_of_nodes")) * int(sysjson.get("accelerators_per_node"))
        if total and fl["gpus"] and total != fl["gpus"]:
            notes.append(f"systems JSON says {total} accelerators, config {fl['gpus']}")
        if fl["dp"] is None:
            notes.append("dp not derivable (gpus not divisible by tp*pp*cp or a size missing)")
        ga_cfg = None
        if gbs_log and fl["dp"] and fl["micro_batch"]:
            ga_cfg = gbs_log / (fl["dp"] * fl["micro_batch"])
        if ga_log is not None and ga_cfg is not None and abs(float(ga_log) - ga_cfg) > 1e-6:
            notes.append(f"logged gradient_accumulation_steps {ga_log} != GBS/(dp*mbs) = {ga_cfg:g}")
        if seq_log is None and bench == "llama2_70b_lora":
            notes.append("seq_len not logged for this submission (benchmark's packed sequences are 8192 "
                         "tokens, but left empty: not in the submission's files as a value)")
        row = {
            "benchmark": bench, "model": BENCHMARKS[bench], "round": rnd, "submitter": sub,
            "system": system, "accelerator": sysjson.get("accelerator_model_name", ""),
            "framework": sysjson.get("framework", ""),
            **{k: ("" if fl[k] is None else fl[k]) for k in (
                "nodes", "gpus_per_node", "gpus", "tp", "pp", "vp", "cp", "dp", "sequence_parallel",
                "micro_batch",
                "local_batch", "fp8_attention", "tp_comm_overlap", "cuda_graph", "dist_optimizer",
                "overlap_grad_reduce", "overlap_param_gather", "fp8_param_gather",
                "on_device_clip_grad", "recompute", "recompute_layers", "weight_cache",
                "fp8_activation_input", "model_tflop_per_sample", "cp_comm_type")},
            "grad_accum": "" if ga_log is None else int(float(ga_log)),
            "global_batch": gbs_log, "seq_len": "" if seq_log is None else seq_log,
            "precision": prec, "fp8_recipe": recipe,
            "step_time_s": round(statistics.median(per_run), 6),
            "step_time_min_run_s": round(min(per_run), 6), "step_time_max_run_s": round(max(per_run), 6),
            "n_runs": len(per_run), "n_steps_or_blocks": sum(nsteps),
            "step_time_method": " | ".join(sorted(methods)) + "; median over runs",
            "crosscheck_s": round(statistics.median(ccs), 6) if ccs else "",
            "crosscheck_method": " | ".join(sorted(ccms)),
            "repository": repository, "commit": commit, "config_file": path, "config_selected_by": how,
            "result_files": f"{sub}/results/{system}/{bench}/result_*.txt ({len(used)} used)",
            "duplicate_of": dup,
            "notes": "; ".join(notes + ([f"same measurements as {dup} (result files byte-identical, or "
                                         "identical per-run step times): not an independent measurement"]
                                        if dup else [])),
        }
        if any(row[k] in ("", None) for k in ("tp", "pp", "cp", "dp")):
            excluded.append(f"{key}: parallel layout incomplete in the submission's files "
                            f"(tp={row['tp']} pp={row['pp']} cp={row['cp']} dp={row['dp']}; {row['notes']})")
            continue
        rows.append(row)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirrors", default="/work/.mirror/mlcommons+training_results_v*/repo",
                    help="glob of bare git mirrors")
    ap.add_argument("--out", default="planner/calibration/mlperf_training.csv")
    ap.add_argument("--excluded", default=None, help="write the excluded submissions and why to this file")
    a = ap.parse_args(argv)
    repos = sorted(glob.glob(a.mirrors), key=lambda s: [int(x) for x in re.findall(r"v(\d+)\.(\d+)", s)[0]]
                   if re.search(r"v(\d+)\.(\d+)", s) else [0])
    if not repos:
        sys.exit(f"no mirrors match {a.mirrors}")
    rows, excluded = [], []
    scratch = tempfile.mkdtemp(prefix="mlperf_cfg_")
    try:
        for r in repos:
            print("reading", r, file=sys.stderr)
            process_repo(r, os.path.join(scratch, os.path.basename(os.path.dirname(r))), rows, excluded)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    if a.excluded:
        with open(a.excluded, "w") as fh:
            fh.write("\n".join(excluded) + "\n")
    print(f"{len(rows)} rows -> {a.out}; {len(excluded)} submissions excluded", file=sys.stderr)
    for e in excluded:
        print("  excluded:", e, file=sys.stderr)


if __name__ == "__main__":
    main()
