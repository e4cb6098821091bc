"""Activation offload to host memory (Grace NVLink-C2C), as Megatron's fine-grained offload
does it: what it moves written out by hand, the copies' exposed time against its formula, what
the device keeps, and the systems that cannot offload."""

import dataclasses

import pytest

from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, activation_bytes_per_layer, iteration
from planner.errors import SpecError
from planner.plan import Plan
from planner.search.hybrid import predict
from planner.spec.hardware import Precision

M = load_model("llama3-8b")
GB200 = Hardware.of(load_system("gb200-nvl72"), Precision.bf16)
CFG = {"t": 2, "p": 1, "d": 1, "mb": 1, "acc": 4, "v": 1, "recompute": 0, "sp": 1, "zero": 0,
       "gpipe": 0, "offload_activations": True}


def test_gb200_offloads_over_its_share_of_nvlink_c2c():
    c2c = load_system("gb200-nvl72").host_link
    assert GB200.host_bw == pytest.approx(c2c.bandwidth_Bps / 2)  # two GPUs per Grace


def _moved() -> float:
    """What Megatron's fine-grained offload moves of one Llama-3-8B layer at t = 2 with
    sequence parallelism, written out: the attention part (its norm's input and output, 4
    bytes per value of h outside the tp region, Q, K, V and O, 2 x 2 (4,096 + 1,024) / 4,096
    = 5 inside) and the FFN norm's input (2 outside): s h (6 / 2 + 5 / 2)."""
    return M.seq_len * M.hidden * (6 / 2 + 5 / 2)


def test_copies_slower_than_the_compute_show_by_their_excess():
    """With a host link slow enough that every copy outlasts its layer's forward and backward,
    the exposed time is L (2 moved / bw - layer time) per micro-batch: two links differ by
    m L 2 moved (1 / bw1 - 1 / bw2)."""
    slow, slower = (dataclasses.replace(GB200, host_bw=bw) for bw in (1e9, 5e8))
    one, two = (float(iteration(M, hw, CFG)["offload"]) for hw in (slow, slower))
    assert two - one == pytest.approx(4 * M.layers * 2 * _moved() * (1 / 5e8 - 1 / 1e9),
                                      rel=1e-9)


def test_the_device_keeps_what_is_not_moved_and_two_layers_in_transfer():
    """p = 1, one micro-batch in flight: L layers of what stays (the dense FFN's insides and
    such), the logits of the last stage, and the moved part of two layers."""
    a = activation_bytes_per_layer(M, GB200, 2, 1, "none", True)
    logits = 4 * M.seq_len * M.vocab / 2
    got = float(iteration(M, GB200, CFG)["activations"])
    assert got == pytest.approx(M.layers * (a - _moved()) + logits + 2 * _moved(), rel=1e-12)
    assert got < float(iteration(M, GB200, {**CFG, "offload_activations": False})["activations"])


def test_a_system_without_a_host_link_cannot_offload():
    plan = Plan.split(2, 1, 4, 1, 8, node_size=8, sequence_parallel=True,
                      offload_activations=True)
    with pytest.raises(SpecError, match="offload_activations: 'dgx-h100' has no host link"):
        predict(M, load_system("dgx-h100"), Precision.bf16, plan)
