"""Write `transformer_grid.json`: the transformer cost model's outputs on a fixed random grid of
models, systems, precisions, splits and every categorical choice.

The file pins the numbers of the cost model as it was when the transformer physics moved from
hand-written numpy to SymPy expressions (issue: one symbolic cost engine), regenerated when the
physics issue added the kernel floor, GEMM rates by shape, fp8 on the GEMMs only and the A100 fit,
when MoE layers got expert tensor parallelism and their own collectives (the MoE cases draw
ep, etp and cp too), activations their per-tensor count, uneven chunks their own bubble, and
the data-parallel allreduce NCCL's pipelined ring (docs/nccl-check.md), and ZeRO-3 the first
layer's gathers, and when compute beside an overlapped collective slowed down, MoE layers
paid their routing and token permutation, and a single pipeline stage held the embedding and
the untied output layer both, and an fp8 recipe's unfused attention kept its 16-bit rate,
and the LM head its 16-bit rate in an fp8 / fp4 recipe, and each GEMM input's cast its
transposed copy and scales (`Precision.quantize_bytes`), and a group straddling two scale-up
domains (pp 3 on 8-GPU nodes) its links across them (`planner.expr.domain`), and each
step the host's time after its sync (`KernelCosts.step_sync_us`), and fp8 attention the casts
of its Q, K, V and dO (`LayerCosts._attention_casts`);
`test_transformer_grid` holds the engine to them at 1e-9 relative.
Regenerate only when the physics changes on purpose:

    python tests/data/make_transformer_grid.py
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.spec.hardware import Precision

CASES = [  # (model, system, precision)
    ("gpt3-175b", "dgx-a100-80gb", "bf16"),
    ("gpt3-175b", "dgx-h100", "fp8"),
    ("llama3-70b", "dgx-h100", "bf16"),
    ("llama2-7b", "dgx1-v100", "fp16"),
    ("bert-large", "dgx-a100-40gb", "fp32"),
    ("gpt2", "k80-fdr", "fp32"),
    ("llama3-8b+moe", "dgx-a100-80gb", "bf16"),
    ("mixtral-8x7b", "dgx-h100", "bf16"),
]
ROWS = 250  # per case and (overlap, flash)
KEYS = ("time", "compute", "tp_comm", "cp_comm", "ep_comm", "pp_bubble", "pp_comm",
        "dp_comm_exposed", "optimizer", "memory", "weights", "gradients", "optimizer_state", "activations")


def model(name: str):
    if name.endswith("+moe"):  # no built-in MoE yet: Llama-3-8B with 8 experts, top-2
        return dataclasses.replace(load_model(name.removesuffix("+moe")), experts=8, top_k=2)
    return load_model(name)


def grid(rng: np.random.Generator, moe: bool) -> dict:
    pick = lambda values: rng.choice(np.array(values), ROWS)  # noqa: E731
    out = {"t": pick([1, 2, 4, 8, 16]), "p": pick([1, 2, 3, 4, 8, 16]),
            "d": pick([1, 2, 3, 8, 64, 512]), "mb": pick([1, 2, 4, 8]),
            "acc": pick([1, 2, 8, 32, 96]), "v": pick([1, 2, 3, 4]),
            "recompute": pick([0, 1, 2]), "sp": pick([0, 1]), "zero": pick([0, 1, 2, 3]),
            "gpipe": pick([0, 1])}
    if moe:
        out |= {"ep": pick([1, 2, 4, 8]), "cp": pick([1, 2])}
        out["etp"] = np.where(pick([0, 1]) == 1, 1, out["t"])
    return out


def main() -> None:
    rng = np.random.default_rng(2026)
    out = []
    for name, system_name, precision in CASES:
        m, system = model(name), load_system(system_name)
        hw = Hardware.of(system, Precision(precision))
        for overlap in (True, False):
            for flash in (True, False):
                cfg = grid(rng, m.experts > 1)
                r = iteration(m, hw, {**cfg, "overlap": overlap, "flash_attention": flash})
                out.append({"model": name, "system": system_name, "precision": precision,
                            "overlap": overlap, "flash": flash,
                            "config": {k: v.tolist() for k, v in cfg.items()},
                            "values": {k: np.broadcast_to(r[k], (ROWS,)).tolist()
                                       for k in KEYS}})
    path = Path(__file__).with_name("transformer_grid.json")
    path.write_text(json.dumps(out, separators=(",", ":")))
    print(f"wrote {path} ({len(out)} blocks x {ROWS} rows)")


if __name__ == "__main__":
    main()
