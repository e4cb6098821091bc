"""The transformer cost engine against the pinned grid (`tests/data/transformer_grid.json`):
7,000 configurations over models, systems, precisions, splits and every categorical choice,
each of the 12 outputs equal to the pinned value at 1e-9 relative (or within 1e-15 absolute:
the grid was pinned from SymPy-built programs, which left rounding residues such as 5e-23 s
where the graph-built ones (`planner.expr.graph`) give exactly 0)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner.catalog import load_system
from planner.cost.transformer import Hardware, iteration
from planner.spec.hardware import Precision
from tests.data.make_transformer_grid import KEYS, model

BLOCKS = json.loads((Path(__file__).parent / "data" / "transformer_grid.json").read_text())


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b['model']}-{b['system']}-"
                         f"{b['precision']}-o{int(b['overlap'])}f{int(b['flash'])}")
def test_engine_matches_pinned_grid(block):
    hw = Hardware.of(load_system(block["system"]), Precision(block["precision"]))
    cfg = {k: np.array(v) for k, v in block["config"].items()}
    got = iteration(model(block["model"]), hw,
                    {**cfg, "overlap": block["overlap"], "flash_attention": block["flash"]})
    for key in KEYS:
        want = np.array(block["values"][key])
        np.testing.assert_allclose(np.broadcast_to(got[key], want.shape), want, rtol=1e-9,
                                   atol=1e-15, err_msg=key)
