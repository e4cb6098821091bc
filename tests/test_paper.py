"""The seed paper's conclusions (docs/keuper-pfreundt-2016.md), held as numbers."""

import pytest

from planner import api
from planner.catalog import load_model
from planner.report import share

B = 1024


def lim(model, hw, collective="ring"):
    return api.limits(model, hw, global_batch=B, collective=collective, overlap=False)


def test_conv_layers_carry_the_flops_fc_layers_the_weights():
    alex, goog = share(load_model("alexnet")), share(load_model("googlenet"))
    assert alex["conv"]["flops_fraction"] > 0.9 and alex["fc"]["params_fraction"] > 0.95
    assert goog["conv"]["flops_fraction"] > 0.99 and goog["fc"]["params_fraction"] < 0.2


@pytest.mark.parametrize("hw", ["k80-fdr", "titanx-fdr", "knl-fdr", "knl-omnipath"])
def test_alexnet_is_communication_bound_within_a_few_dozen_nodes_on_2016_hardware(hw):
    L = lim("alexnet", hw)
    assert 2 < L.comm_bound_from_nodes < 60
    # the weight-light GoogLeNet turns communication bound far later on the same system
    assert lim("googlenet", hw).comm_bound_from_nodes > 5 * L.comm_bound_from_nodes


def test_batch_limit_on_k80_is_a_few_dozen_nodes_at_low_efficiency():
    L = lim("alexnet", "k80-fdr")
    assert 24 <= L.max_useful_nodes <= 128
    assert L.efficiency_at(L.max_useful_nodes) < 0.5


@pytest.mark.parametrize("model,hw", [("alexnet", "k80-fdr"), ("alexnet", "knl-omnipath"),
                                      ("googlenet", "titanx-fdr")])
def test_allreduce_scales_far_beyond_a_parameter_server(model, hw):
    ps, ring = lim(model, hw, "parameter-server"), lim(model, hw)
    assert ring.optimal_nodes > 10 * ps.optimal_nodes
    assert ring.max_speedup > 5 * ps.max_speedup


def test_todays_hardware_is_batch_bound_sooner_and_issue_bound_before_network_bound():
    """Today's GPUs need far larger local batches (b_min), so a fixed batch feeds fewer nodes;
    at the few samples per GPU it leaves, the kernels' issue time, not the network, stops the
    scaling: the A100 without its issue floor is communication bound sooner than the K80
    (compute grew faster than the network), with it later."""
    import dataclasses

    from planner.analysis.cnn_limits import Limits

    old, a100, h100 = lim("alexnet", "k80-fdr"), lim("alexnet", "dgx-a100-80gb"), \
        lim("alexnet", "dgx-h100")
    assert old.local_batch_min < a100.local_batch_min < h100.local_batch_min
    assert h100.max_useful_nodes <= a100.max_useful_nodes < old.max_useful_nodes
    assert a100.comm_bound_from_nodes > old.comm_bound_from_nodes
    dp = a100.dp
    device = dp.system.device.model_copy(update={"kernels": None})
    bare = type(dp)(dp.cnn, dataclasses.replace(dp.system, device=device), dp.options)
    fields = {f.name: getattr(a100, f.name) for f in dataclasses.fields(a100)
              if f.init and f.name not in ("dp", "_cache")}
    assert Limits(dp=bare, **fields).comm_bound_from_nodes < old.comm_bound_from_nodes
