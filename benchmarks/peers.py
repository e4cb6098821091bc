"""The planner against an analytical peer, Calculon (Isaev et al., SC23), on the A100 runs.

Calculon is run as its authors ship it (the `systems/a100_80g.json` A100 of its README, its
own efficiency tables, nothing refitted) on every A100 transformer run of the calibration set:
vTrain's 1,440 single-node runs (two groups, hidden 1,024 and 2,048) and SC21 Table 1 (pp = 1
and pp > 1). Each run is given to both tools as the source ran it: fp16, full recomputation,
no sequence parallelism, no distributed optimizer, the gradient all-reduce not overlapped,
1F1B. Where the source does not give the micro-batch and the interleaving (SC21), each tool
takes its own fastest that fits memory, as `planner solve` does with the split pinned.

The planner's columns are those of `benchmarks/accuracy.py`: in sample with the shipped
constants, and leave-one-group-out (its four A100 constants refitted without the group);
Calculon's are out of sample everywhere (none of its numbers came from these runs). MAPE of
the iteration time; bias = mean signed error.

Calculon models the transformer blocks only (no embedding, no output layer, no loss), so on
vTrain's small models with a 50,257-word vocabulary it misses the output layer's GEMMs; that
is part of what is compared, not corrected for.

    git clone https://github.com/calculon-ai/calculon /tmp/calculon   # commit caa4b11
    python benchmarks/peers.py --calculon /tmp/calculon               # about 40 s
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from planner import fit_transformer as ft
from planner.catalog import load_model
from planner.published import sc21_runs

DTYPE = "float16"


def _execution(tp: int, pp: int, dp: int, batch: int, micro: int, interleave: int,
               nets: tuple[int, int, int]) -> dict:
    """A Calculon execution for a run as the sources ran it (see the module docstring)."""
    return {"num_procs": tp * pp * dp, "tensor_par": tp, "pipeline_par": pp, "data_par": dp,
            "tensor_par_net": nets[0], "pipeline_par_net": nets[1], "data_par_net": nets[2],
            "batch_size": batch, "microbatch_size": micro, "datatype": DTYPE,
            "fused_activation": True, "attention_type": "multihead",
            "activation_recompute": "full", "pipeline_interleaving": interleave,
            "optimizer_sharding": False, "tensor_par_comm_type": "ar",
            "tensor_par_overlap": "none", "seq_par_ag_redo": False,
            "data_par_overlap": False, "weight_offload": False,
            "activations_offload": False, "optimizer_offload": False, "training": True}


class Calculon:
    """Calculon's Llm model on its shipped A100 system, one iteration's time per run."""

    def __init__(self, checkout: Path):
        sys.path.insert(0, str(checkout))
        try:
            from calculon.llm import Llm, System
        except ImportError:
            raise SystemExit(f"error: no Calculon checkout at {checkout} "
                             "(git clone https://github.com/calculon-ai/calculon)") from None
        self.Llm = Llm
        self.system = System(json.loads((checkout / "systems" / "a100_80g.json").read_text()))

    def time(self, dims: dict, exe: dict) -> float | None:
        """Seconds per iteration, or None where Calculon refuses the execution (memory, a
        network tier not filled, an interleaving that does not divide the blocks)."""
        import logging

        llm = self.Llm(self.Llm.Application(dims), logging.getLogger("calculon"))
        try:
            llm.compile(self.system, self.Llm.Execution.from_json(exe))
            llm.run(self.system)
        except self.Llm.Error:
            return None
        return llm.get_total_time()

    def fastest(self, dims: dict, tp: int, pp: int, dp: int, batch: int,
                nets: tuple[int, int, int]) -> float | None:
        """The fastest feasible time over every micro-batch dividing the local batch and every
        interleaving dividing the stage's blocks (what the source leaves free)."""
        local, blocks = batch // dp, dims["num_blocks"] // pp
        times = [self.time(dims, _execution(tp, pp, dp, batch, mb, v, nets))
                 for mb in range(1, local + 1) if local % mb == 0
                 for v in ([1] if pp == 1 else range(1, blocks + 1)) if blocks % v == 0]
        times = [t for t in times if t is not None]
        return min(times) if times else None


def _dims(hidden: int, heads: int, layers: int, seq_len: int, ffn: int) -> dict:
    return {"hidden": hidden, "feedforward": ffn, "seq_size": seq_len, "attn_heads": heads,
            "attn_size": hidden // heads, "num_blocks": layers}


def vtrain_errors(calc: Calculon, hidden: int) -> list[float]:
    """Calculon's error on each vTrain run of this hidden size (one node: every group on
    the NVLink tier)."""
    out = []
    for r in ft._vtrain_rows():
        if r["hidden"] != hidden:
            continue
        dims = _dims(r["hidden"], r["heads"], r["layers"], r["seq_len"], 4 * r["hidden"])
        t = calc.time(dims, _execution(r["tp"], r["pp"], r["dp"], r["global_batch"],
                                       r["micro_batch"], 1, (0, 0, 0)))
        out.append(np.nan if t is None else t * 1e3 / r["iteration_time_ms"] - 1)
    return out


def sc21_errors(calc: Calculon, pipelined: bool) -> list[float]:
    """Calculon's error on each SC21 Table 1 run with (or without) a pipeline: tp on the
    NVLink tier, pp and dp across nodes (the paper's placement)."""
    out = []
    for r in sc21_runs():
        if (r["pp"] > 1) != pipelined:
            continue
        m = load_model(r["model"])
        dims = _dims(m.hidden, m.heads, m.layers, m.seq_len, m.ffn_hidden)
        dp = r["gpus"] // (r["tp"] * r["pp"])
        t = calc.fastest(dims, r["tp"], r["pp"], dp, r["global_batch"], (0, 1, 1))
        out.append(np.nan if t is None else t / r["measured_s"] - 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calculon", type=Path, required=True,
                    help="a checkout of github.com/calculon-ai/calculon")
    calc = Calculon(ap.parse_args().calculon)

    c, gs = ft.Constants.shipped(), ft.groups()
    planner_rows = {r["group"]: r for r in ft.table(c, gs)}
    peer = {"vTrain h=1024": vtrain_errors(calc, 1024), "vTrain h=2048": vtrain_errors(calc, 2048),
            "SC21 pp=1": sc21_errors(calc, False), "SC21 pp>1": sc21_errors(calc, True)}

    print("A100 transformer runs: the planner (in sample, and leave-one-group-out) against "
          "Calculon (as shipped, a100_80g.json)")
    print(f"{'group':<28} {'planner':>8} {'LOGO':>8} {'Calculon':>9} {'bias':>7} "
          f"{'refused':>7}  ahead out of sample")
    for name, errs in peer.items():
        row = next(v for k, v in planner_rows.items() if k.startswith(name))
        e = np.array(errs, dtype=float)
        ok = e[~np.isnan(e)]
        if not len(ok):
            print(f"{row['group']:<28} Calculon refused every run")
            continue
        mape, bias = float(np.mean(np.abs(ok))), float(np.mean(ok))
        ahead = "yes" if row["logo_mape"] < mape else "no"
        print(f"{row['group']:<28} {row['mape']:>8.1%} {row['logo_mape']:>8.1%} {mape:>9.1%} "
              f"{bias:>+7.1%} {int(np.isnan(e).sum()):>7}  {ahead}")


if __name__ == "__main__":
    main()
