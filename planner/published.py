"""Published transformer runs from the calibration CSV, predicted by a pinned hybrid solve.

The SC21 Table 1 rows (Narayanan et al. 2021: GPT 1.7B-1T on up to 3,072 A100s) give achieved
TFLOP/s per GPU counted with eq. 3 (full recompute); the measured iteration time is therefore
F_eq3 x B / (GPUs x TFLOP/s). The planner pins what the paper reports (GPUs, global batch, tp,
pp, full recompute, no ZeRO, no sequence parallelism, 2021 attention without flash) and lets the
solver choose what the table leaves out (micro-batch, interleaving).
"""

from __future__ import annotations

import csv

from planner import api
from planner.calibrate import default_csv
from planner.catalog import load_model
from planner.cost.transformer import hardware_flops_per_sequence

SC21_SYSTEMS = {("A100-SXM4-80GB", 8): "dgx-a100-80gb"}


def _sc21_model(name: str) -> str:
    size = name.removeprefix("GPT-").removesuffix("B")
    return "gpt-1t" if size == "1008.0" else f"gpt-{size.lower()}b"


def sc21_rows(path=None) -> list[dict]:
    out = []
    with open(path or default_csv(), newline="", encoding="utf-8") as fh:
        for rec in csv.DictReader(fh):
            if "Narayanan" not in rec["citation"] or rec["metric"] != "achieved_tflops_per_gpu":
                continue
            model = _sc21_model(rec["model"])
            system = SC21_SYSTEMS[(rec["gpu"], int(rec["gpus_per_node"]))]
            gpus, batch = int(rec["gpus_total"]), int(rec["global_batch"])
            tp, pp = int(rec["tp"]), int(rec["pp"])
            measured_tflops = float(rec["value"])
            flops = hardware_flops_per_sequence(load_model(model), "full") * batch
            measured = flops / (gpus * measured_tflops * 1e12)
            sol = api.solve_transformer(model, system, global_batch=batch, devices=gpus, tp=tp,
                                        pp=pp, recompute="full", sequence_parallel=False, zero=0,
                                        schedule="1f1b", overlap=False, flash_attention=False)
            predicted = sol.prediction["iteration_time_s"]
            out.append({"model": model, "gpus": gpus, "tp": tp, "pp": pp, "global_batch": batch,
                        "micro_batch": sol.plan.micro_batch, "interleave": sol.plan.interleave,
                        "measured_s": measured, "predicted_s": predicted,
                        "measured_tflops": measured_tflops,
                        "predicted_tflops": sol.prediction["tflops_per_device_hardware"],
                        "error": predicted / measured - 1})
    return out
