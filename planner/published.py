"""Published transformer runs from the calibration CSV, predicted by a pinned hybrid solve.

The SC21 Table 1 rows (Narayanan et al. 2021: GPT 1.7B-1T on up to 3,072 A100s) give achieved
TFLOP/s per GPU counted with eq. 3 (full recompute); the measured iteration time is therefore
F_eq3 x B / (GPUs x TFLOP/s). The planner pins what the paper reports (GPUs, global batch, tp,
pp, full recompute, no ZeRO, no sequence parallelism, 2021 attention without flash) and lets the
solver choose what the table leaves out (micro-batch, interleaving).
"""

from __future__ import annotations

import csv
import dataclasses
import math

from planner.calibrate import _golden_min, default_csv
from planner.catalog import load_model, load_system
from planner.cost.transformer import hardware_flops_per_sequence
from planner.search.hybrid import HybridSolver, Search
from planner.spec.hardware import Precision

SC21_SYSTEMS = {("A100-SXM4-80GB", 8): "dgx-a100-80gb"}


def _sc21_model(name: str) -> str:
    size = name.removeprefix("GPT-").removesuffix("B")
    return "gpt-1t" if size == "1008.0" else f"gpt-{size.lower()}b"


def sc21_runs(path=None) -> list[dict]:
    """The SC21 Table 1 rows of the calibration CSV, with the measured iteration time."""
    out = []
    with open(path or default_csv(), newline="", encoding="utf-8") as fh:
        for rec in csv.DictReader(fh):
            if "Narayanan" not in rec["citation"] or rec["metric"] != "achieved_tflops_per_gpu":
                continue
            model = _sc21_model(rec["model"])
            gpus, batch = int(rec["gpus_total"]), int(rec["global_batch"])
            tflops = float(rec["value"])
            flops = hardware_flops_per_sequence(load_model(model), "full",  # eq. 3
                                                count_masked=True) * batch
            out.append({"model": model, "system": SC21_SYSTEMS[(rec["gpu"],
                                                                int(rec["gpus_per_node"]))],
                        "gpus": gpus, "global_batch": batch, "tp": int(rec["tp"]),
                        "pp": int(rec["pp"]), "measured_tflops": tflops,
                        "measured_s": flops / (gpus * tflops * 1e12)})
    return out


def solve_run(run: dict, matmul_efficiency: float | None = None, system=None):
    """The pinned solve of one SC21 row, on the built-in system (or `system`), with the spec's
    matmul efficiency or the one given."""
    system = system or load_system(run["system"])
    if matmul_efficiency is not None:
        dev = system.device
        eff = dev.efficiency.model_copy(update={"matmul": matmul_efficiency})
        system = dataclasses.replace(system, device=dev.model_copy(update={"efficiency": eff}))
    q = Search(global_batch=run["global_batch"], devices=run["gpus"], tp=run["tp"],
               pp=run["pp"], recompute="full", sequence_parallel=False, zero=0,
               schedule="1f1b", overlap=False, flash_attention=False, pp_overlap=False)
    return HybridSolver(load_model(run["model"]), system, Precision.fp16, q).solve()


def sc21_rows(path=None) -> list[dict]:
    """Each SC21 row measured vs predicted with the specs as they are."""
    out = []
    for run in sc21_runs(path):
        sol = solve_run(run)
        predicted = sol.prediction["iteration_time_s"]
        out.append({**run, "micro_batch": sol.plan.micro_batch,
                    "interleave": sol.plan.interleave, "predicted_s": predicted,
                    # in SC21's count (eq. 3: causal attention in full)
                    "predicted_tflops": run["measured_tflops"] * run["measured_s"] / predicted,
                    "error": predicted / run["measured_s"] - 1})
    return out


def fit_matmul_efficiency(path=None) -> float:
    """The matmul efficiency minimising the squared log error of the SC21 iteration times
    (predicted time falls monotonically with it, so the loss is unimodal)."""
    runs = sc21_runs(path)

    def loss(eta):
        return sum(math.log(solve_run(r, eta).prediction["iteration_time_s"] / r["measured_s"])
                   ** 2 for r in runs)

    return _golden_min(loss, 0.3, 1.0, tol=1e-3)


def bert_runs(path=None) -> list[dict]:
    """The BERT-Large phase-1 rows of the calibration CSV (NVIDIA DeepLearningExamples, DGX
    A100 80GB, 8 to 256 GPUs, sequence 128): what the table pins and the measured sequences/s."""
    out = []
    with open(path or default_csv(), newline="", encoding="utf-8") as fh:
        for rec in csv.DictReader(fh):
            if "BERT" in rec["model"] and rec["metric"] == "sequences_per_sec":
                out.append({"gpus": int(rec["gpus_total"]),
                            "global_batch": int(rec["global_batch"]),
                            "micro_batch": int(rec["micro_batch"]),
                            "seq_len": int(rec["seq_len"]), "measured_seq_s": float(rec["value"])})
    return out


def bert_rows(path=None) -> list[dict]:
    """NVIDIA DeepLearningExamples BERT-Large phase-1 pre-training on DGX A100 80GB (8 to 256
    GPUs, sequence 128): sequences/s measured vs predicted. Held out: nothing was fitted to
    them. The table gives dp, the per-GPU batch and the global batch; its modeling.py runs
    attention without flash (the scores go through HBM) and the rest as eager PyTorch ops
    (only the layer norm and bias-GeLU fused), so the plan's kernels are eager."""
    from planner import api

    out = []
    with open(path or default_csv(), newline="", encoding="utf-8") as fh:
        for rec in csv.DictReader(fh):
            if "BERT" not in rec["model"] or rec["metric"] != "sequences_per_sec":
                continue
            gpus, batch = int(rec["gpus_total"]), int(rec["global_batch"])
            ev = api.evaluate_transformer(
                "bert-large", "dgx-a100-80gb", global_batch=batch, devices=gpus,
                micro_batch=int(rec["micro_batch"]), seq_len=int(rec["seq_len"]),
                flash_attention=False, kernels="eager", precision="fp16")
            measured = float(rec["value"])
            predicted = ev.prediction["samples_per_s"]
            out.append({"gpus": gpus, "global_batch": batch, "micro_batch": ev.plan.micro_batch,
                        "measured_seq_s": measured, "predicted_seq_s": predicted,
                        "error": predicted / measured - 1})
    return out
