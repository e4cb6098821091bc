"""Recommendation models and the placement of their tables: the built-in DLRM-DCNv2 against
its published architecture counted by hand, the CP-SAT placement against brute force over
every sharding and device of a small model, and the command line (schema, exit codes)."""

import itertools
import json

import jsonschema
import pytest

from planner.catalog import load_model, load_system
from planner.cost import recommendation as rc
from planner.errors import SpecError
from planner.schema import schemas
from planner.search import placement
from planner.search.placement import place
from planner.spec.hardware import Precision

SMALL = """kind: recommendation
name: small
dense_features: 4
embedding_dim: 16
tables:
  - {name: big, rows: 100000, pooling: 20}
  - {name: mid, rows: 2000, pooling: 3}
  - {name: tiny, rows: 10, pooling: 1}
bottom_mlp: [32, 16]
interaction: {kind: dot}
top_mlp: [16, 1]
"""


def test_dlrm_dcnv2_is_the_mlperf_architecture():
    m = load_model("dlrm-dcnv2")
    assert len(m.tables) == 26 and sum(t.rows for t in m.tables) == 204_184_588
    assert sum(t.pooling for t in m.tables) == 214  # MULTI_HOT_SIZES
    assert m.interaction_width == 128 + 26 * 128 == 3456  # bottom output and 26 tables
    bottom = (13 * 512 + 512) + (512 * 256 + 256) + (256 * 128 + 128)
    cross = 3 * (3456 * 512 + 512 * 3456 + 3456)  # U, V^T and one bias per layer
    top = (3456 * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 512 + 512) \
        + (512 * 256 + 256) + (256 + 1)
    assert m.dense_params() == bottom + cross + top == 16_044_545
    assert m.embedding_params() == 204_184_588 * 128


@pytest.mark.parametrize("body, message", [
    (SMALL.replace("bottom_mlp: [32, 16]", "bottom_mlp: [32, 4]"), "must be the embedding dim"),
    (SMALL.replace("pooling: 20", "pooling: 0"), "pooling"),
    (SMALL.replace("name: mid", "name: big"), "two tables named 'big'"),
])
def test_bad_recommendation_spec_is_one_line(tmp_path, body, message):
    path = tmp_path / "m.yaml"
    path.write_text(body)
    with pytest.raises(SpecError, match=message):
        load_model(str(path))


def _all_placements(c, tables, devices):
    """Every option of every table on every device (shards of a column split anywhere)."""
    per = []
    for i in tables:
        choices = []
        for o in c.of(i):
            if o.mode in ("row", "data"):
                choices.append(rc.Placed(o, tuple(range(devices))))
            else:
                choices += [rc.Placed(o, ds)
                            for ds in itertools.product(range(devices), repeat=o.shards)]
        per.append(choices)
    return itertools.product(*per)


@pytest.mark.parametrize("devices, batch", [(2, 65536), (3, 98304)])
def test_placement_is_the_brute_force_best(tmp_path, devices, batch):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    m = load_model(str(path))
    roomy = rc.costs(m, load_system("dgx-h100"), Precision.bf16, devices, batch, 80e9)
    whole = {o.table: o.memory_bytes for o in roomy.options if o.mode == "table"}
    # plenty; and room for 60 % of 'big' beside the others: it must be split
    for cap in (80e9, roomy.dense_memory_bytes + 0.6 * whole[0] + whole[1] + whole[2]):
        c = rc.costs(m, load_system("dgx-h100"), Precision.bf16, devices, batch, cap)
        best = min((p for p in (rc.price(c, list(x)) for x in
                                _all_placements(c, range(3), devices)) if p.fits),
                   key=lambda p: p.embedding_time_s)
        got = place(c, ["big", "mid", "tiny"])
        assert got.status == "optimal" and got.priced.fits
        assert got.priced.embedding_time_s == pytest.approx(best.embedding_time_s, rel=1e-6)
        if cap < 80e9:  # the tight case: 'big' does not fit whole on one device
            assert got.placed[0].option.mode != "table"
    assert any(o.mode == "column" for o in c.options)  # the space has column shards


FOUR = """kind: recommendation
name: four
dense_features: 4
embedding_dim: 16
tables:
  - {name: big, rows: 1000000, pooling: %d}
  - {name: mid, rows: 2000, pooling: %d}
  - {name: low, rows: 300, pooling: %d}
  - {name: tiny, rows: 10, pooling: 1}
bottom_mlp: [32, 16]
interaction: {kind: dot}
top_mlp: [16, 1]
"""


@pytest.mark.parametrize("pools, isolates", [((200, 3, 2), True), ((100, 10, 5), True),
                                             ((400, 1, 1), True), ((60, 30, 2), False)])
def test_placement_bounds_never_pass_the_brute_force_best(tmp_path, pools, isolates):
    """Every bound the placement proves with stays at or below the best of every placement
    (brute force, 3 devices), for any incumbent at or above it; the options offered keep the
    best placement's; and the placement found is that best, proven."""
    path = tmp_path / "four.yaml"
    path.write_text(FOUR % pools)
    m = load_model(str(path))
    c = rc.costs(m, load_system("dgx-h100"), Precision.bf16, 3, 98304, 80e9)
    priced = [(rc.price(c, list(x)), x) for x in _all_placements(c, range(4), 3)]
    best_priced, best_x = min(priced, key=lambda t: t[0].embedding_time_s)
    best = best_priced.embedding_time_s
    for upper in (best, best * 1.0001, best * 1.05, best * 1.3):
        options = placement._offered(c, range(4), upper)
        assert all(p.option in options for p in best_x)
        assert placement._lower_bound(c, options, range(4)) <= best * (1 + 1e-9)
        iso = placement._isolation_bound(c, options, range(4), upper)
        assert iso <= max(best, upper - placement.GRID_S) * (1 + 1e-9)
    # with a heavy 'big' the isolation bound meets the best where the plain one falls short
    options = placement._offered(c, range(4), best)
    iso = placement._isolation_bound(c, options, range(4), best)
    assert (iso == pytest.approx(best - placement.GRID_S / 2, rel=1e-12)
            and iso > placement._lower_bound(c, options, range(4))) == isolates
    got = place(c, ["big", "mid", "low", "tiny"])
    assert got.status == "optimal"
    assert got.priced.embedding_time_s == pytest.approx(best, rel=1e-9)


def test_solve_places_dlrm_on_64_h100_proven(run):
    """The issue's case: DLRM-DCNv2 at MLPerf's batch on 64 H100, proven optimal: the
    heaviest table's 16 shards each sit alone on a device in any faster placement, and the
    others cannot share the 48 devices left fast enough (`_isolation_bound`)."""
    code, out, err = run("solve", "-m", "dlrm-dcnv2", "-H", "dgx-h100", "--devices", "64",
                         "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["status"] == "optimal" and doc["devices"] == 64


def test_solve_places_dlrm_proven(run):
    """128 H100 at MLPerf's multi-node batch: proven by the relaxation (every shard on a
    device of its own) meeting the placement."""
    code, out, err = run("solve", "-m", "dlrm-dcnv2", "-H", "dgx-h100", "--devices", "128",
                         "--global-batch", "135168", "--time-limit", "120", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, schemas()["solve"])
    assert doc["status"] == "optimal" and doc["devices"] == 128
    assert [t["name"] for t in doc["tables"]] == [f"cat_{i}" for i in range(26)]
    cap = load_system("dgx-h100").device.usable_memory_bytes
    assert all(d["memory_bytes"] <= cap for d in doc["per_device"])
    busiest = max(d["embedding_time_s"] for d in doc["per_device"])
    pred = doc["prediction"]
    assert pred["iteration_time_s"] == pytest.approx(busiest + pred["dense_time_s"])
    assert pred["samples_per_s"] == pytest.approx(135168 / pred["iteration_time_s"])


def test_a_table_that_fits_nowhere_names_it(run, tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text(SMALL.replace("{name: big, rows: 100000, pooling: 20}",
                                  "{name: big, rows: 100000000000, pooling: 20}"))
    code, _, err = run("solve", "-m", str(path), "-H", "dgx-h100", "--devices", "1",
                       "--global-batch", "64")
    assert code == 1 and "table 'big'" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (("evaluate", "-m", "dlrm-dcnv2", "-H", "dgx-h100", "--devices", "8", "--global-batch",
      "1024"), "only `planner solve` plans it"),
    (("solve", "-m", "dlrm-dcnv2", "-H", "dgx-h100", "--devices", "8", "--tp", "2"),
     "--tp does not apply to a recommendation model"),
    (("solve", "-m", "dlrm-dcnv2", "-H", "dgx-h100", "--devices", "8", "--format",
      "megatron"), "no form for a table placement"),
    (("solve", "-m", "dlrm-dcnv2", "-H", "dgx-h100"), "give --devices"),
    (("solve", "-m", "dlrm-dcnv2", "-H", "dgx-h100", "--devices", "12"), "not a multiple"),
])
def test_recommendation_refusals_are_one_line(run, args, message):
    code, out, err = run(*args)
    assert code == 2 and message in err and err.count("\n") == 1 and out == ""


def test_show_model_prints_the_tables(run):
    code, out, _ = run("show", "model", "dlrm-dcnv2", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    jsonschema.validate(doc, schemas()["show"])
    assert doc["embedding_params"] == 204_184_588 * 128 and doc["dense_params"] == 16_044_545


def test_python_api_places_tables():
    import planner

    got = planner.solve("dlrm-dcnv2", "dgx-h100", devices=128, global_batch=135168,
                        time_limit=120)
    assert got.status == "optimal" and len(got.placed) == 26
    assert got.priced.iteration_time_s == pytest.approx(
        got.priced.embedding_time_s + got.priced.dense_time_s)
    with pytest.raises(SpecError, match="places its tables"):
        planner.solve("dlrm-dcnv2", "dgx-h100", devices=8, tp=2)
