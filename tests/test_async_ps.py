"""The asynchronous parameter server (n-softsync, Zhang, Gupta et al. 2016): its round against
a hand computation from the system spec, its bounds against the synchronous server, the
solver's pick against every plan priced one by one, and the refusals."""

import math

import jsonschema
import pytest

from planner import api, switches
from planner.catalog import load_system
from planner.errors import SpecError
from planner.inputs import build
from planner.launch.common import TRANSFORMER_FORMS
from planner.plan import Plan
from planner.prediction import predict


def _hand_round(n: int, g: int, b: int, softsync: int, servers: int = 1) -> dict:
    """The round from the spec's numbers, written out without the model's expressions: the
    learner's compute and its own push + pull (its 1 / g share of the node's NICs), the
    servers' links carrying every learner's push and pull, the servers' softsync updates."""
    sync = build("alexnet", "k80-fdr")
    model = build("alexnet", "k80-fdr", softsync=softsync, servers=servers)
    system = load_system("k80-fdr")
    m = model.grad_bytes
    calls = max(1, math.ceil(m / model.options.bucket_bytes))
    compute = float(sync.numeric("compute")(n, g, b))
    t_opt = float(sync.numeric("optimizer")(n, g, b))
    beta = min(system.inter_node_bandwidth_Bps, system.intra_node.bandwidth_Bps)
    alpha = system.inter_node.latency_s
    learner = compute + 2 * alpha * calls + 2 * m * g / beta
    links = 2 * n * g * m / (servers * beta)
    updates = softsync * t_opt / servers
    return {"learner": learner, "links": links, "updates": updates,
            "round": max(learner, links, updates)}


@pytest.mark.parametrize("n,g,b,softsync,servers", [(8, 2, 64, 1, 1), (4, 2, 128, 8, 1),
                                                    (16, 2, 32, 32, 4), (2, 2, 256, 2, 8)])
def test_round_is_the_slowest_resource_by_hand(n, g, b, softsync, servers):
    model = build("alexnet", "k80-fdr", softsync=softsync, servers=servers)
    plan = Plan.data_parallel(n, g, n * g * b, "parameter-server", True, softsync)
    pred = predict(model, plan)
    hand = _hand_round(n, g, b, softsync, servers)
    assert pred.iteration_time_s == pytest.approx(hand["round"], rel=1e-12)
    a = pred.asynchrony
    assert a["learner_s"] == pytest.approx(hand["learner"], rel=1e-12)
    assert a["server_links_s"] == pytest.approx(hand["links"], rel=1e-12)
    assert a["server_updates_s"] == pytest.approx(hand["updates"], rel=1e-12)
    assert a["updates_per_round"] == softsync and a["mean_staleness"] == softsync
    assert a["gradients_per_update"] == pytest.approx(n * g / softsync)
    # the parts add up to the round on the learner's side; learners step nothing
    bd = pred.time_breakdown
    assert bd["compute"] + bd["comm_exposed"] == pytest.approx(pred.iteration_time_s)
    assert bd["optimizer"] == 0.0


def test_one_device_exchanges_nothing():
    model = build("alexnet", "k80-fdr", softsync=1)
    sync = build("alexnet", "k80-fdr")
    plan = Plan.data_parallel(1, 1, 128, "parameter-server", True, 1)
    same = Plan.data_parallel(1, 1, 128, "parameter-server", True)
    assert predict(model, plan).iteration_time_s == pytest.approx(
        predict(sync, same).iteration_time_s, rel=1e-12)


@pytest.mark.parametrize("nodes", [2, 4, 8, 16, 32])
def test_never_slower_than_the_barrier_while_servers_are_fewer_than_nodes(nodes):
    """1-softsync's round is the largest of terms whose sum (and more) the synchronous server
    without overlap pays, as long as the servers' links, not a learner's own, carry the most
    (servers <= nodes); and never faster than the servers' links allow."""
    sync = build("alexnet", "k80-fdr")
    model = build("alexnet", "k80-fdr", softsync=1)
    plan = Plan.data_parallel(nodes, 2, 1024, "parameter-server", False)
    t_sync = predict(sync, plan).iteration_time_s
    t_async = predict(model, Plan.data_parallel(nodes, 2, 1024, "parameter-server", False,
                                                1)).iteration_time_s
    links = _hand_round(nodes, 2, 1024 // (2 * nodes), 1)["links"]
    assert links <= t_async <= t_sync


def test_more_staleness_only_adds_server_updates():
    """n-softsync with more updates a round: the same learner and link times, n times the
    servers' update work (what the model charges staleness with in throughput)."""
    preds = {k: predict(build("alexnet", "k80-fdr", softsync=k),
                        Plan.data_parallel(16, 2, 1024, "parameter-server", True, k))
             for k in (1, 32)}
    a1, a32 = preds[1].asynchrony, preds[32].asynchrony
    assert a32["learner_s"] == pytest.approx(a1["learner_s"])
    assert a32["server_links_s"] == pytest.approx(a1["server_links_s"])
    assert a32["server_updates_s"] == pytest.approx(32 * a1["server_updates_s"])


def test_solve_picks_the_fastest_async_plan_of_all_priced_one_by_one():
    sol = api.solve("alexnet", "k80-fdr", global_batch=1024, nodes_max=16, softsync=1)
    assert sol.plan.softsync == 1 and sol.plan.collective.value == "parameter-server"
    best = max(api.evaluate("alexnet", "k80-fdr", nodes=n, devices_per_node=g,
                            global_batch=1024, softsync=1,
                            collective="parameter-server").prediction.samples_per_s
               for n in range(1, 17) for g in (1, 2) if 1024 % (n * g) == 0 and n * g > 1)
    assert sol.prediction.samples_per_s == pytest.approx(best, rel=1e-9)


def test_time_to_train_takes_the_synchronous_steps_at_the_round_time():
    """The staleness-aware learning rate keeps the samples to a target those of a synchronous
    run of the same global batch: time to train is its steps times the round."""
    kw = dict(global_batch=1024, nodes=8, critical_batch=4096, target_samples=1.2e8,
              collective="parameter-server", overlap=False)
    sync = api.solve("alexnet", "k80-fdr", **kw)
    async_ = api.solve("alexnet", "k80-fdr", softsync=1, **kw)
    assert async_.training["steps"] == pytest.approx(sync.training["steps"])
    assert async_.training["time_to_train_s"] == pytest.approx(
        async_.training["steps"] * async_.prediction.iteration_time_s, rel=1e-9)
    assert async_.training["time_to_train_s"] < sync.training["time_to_train_s"]


@pytest.mark.parametrize("args,message", [
    (["--collective", "ring", "--softsync", "1"], "softsync: the asynchronous protocol is a "
                                                  "parameter server's"),
    (["--softsync", "64"], "softsync: 64-softsync updates after every 16 / 64 gradients"),
])
def test_cli_refuses_in_one_line(run, args, message):
    code, out, err = run("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "8",
                         "--global-batch", "1024", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_other_families_and_strategies_refuse_it(run):
    with pytest.raises(SpecError, match="softsync"):
        api.evaluate("llama2-7b", "dgx-a100-80gb", devices=8, global_batch=8, softsync=1)
    with pytest.raises(SpecError, match="softsync"):
        api.solve("alexnet", "k80-fdr", global_batch=1024, nodes_max=4, softsync=1,
                  strategy="hybrid")
    for fmt in switches.FRAMEWORK_FORMS:  # each refuses with the reason the switch declares
        code, _, err = run("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "4",
                           "--global-batch", "1024", "--softsync", "1", "--format", fmt)
        assert code == 2
        if fmt in TRANSFORMER_FORMS:  # said first: no CNN plan has that form at all
            assert "needs a transformer model" in err
        else:
            assert err.strip() == \
                f"planner: format: {switches.BY_NAME['softsync'].launch[fmt]}"


def test_json_document_carries_the_protocol(run_json):
    doc = run_json("evaluate", "-m", "alexnet", "-H", "k80-fdr", "--nodes", "4",
                   "--global-batch", "1024", "--softsync", "2")
    assert doc["config"]["softsync"] == 2 and doc["config"]["collective"] == "parameter-server"
    a = doc["prediction"]["asynchrony"]
    assert a["protocol"] == "n-softsync" and a["max_staleness"] == 4
    assert "Zhang" in a["source"]
    from planner.schema import schemas

    jsonschema.validate(doc, schemas()["evaluate"])
