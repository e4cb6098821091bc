"""Pipelines as they are run (pinned first / last stage layers, Megatron-LM's uneven split)
and tensor-parallel communication overlap (--tp-comm-overlap): each against numbers derived
independently from other evaluations, Megatron's rules as errors, the search against brute
force."""

import dataclasses
import itertools
import math
import re

import pytest

from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, activation_bytes_per_layer, iteration
from planner.errors import SpecError
from planner.launch import pipeline_layout
from planner.plan import Plan, check_pins
from planner.search.hybrid import HybridSolver, Search, predict
from planner.spec.hardware import Precision
from tests.brute import fastest_fitting

LLAMA = load_model("llama3-8b")  # 32 layers
H100 = Hardware.of(load_system("dgx-h100"), Precision.bf16)


def _cfg(**over):
    cfg = {"t": 1, "p": 1, "d": 1, "mb": 1, "acc": 8, "v": 1, "recompute": 0, "sp": 0,
           "zero": 0, "gpipe": 0}
    return cfg | over


def _run(**over):
    return {k: float(v) for k, v in iteration(LLAMA, H100, _cfg(**over)).items()}


def test_pinned_stages_set_the_pace_by_their_layers():
    """From p = 1 (32 x + logit) and an even p = 4 (8 x + logit) follow one layer's time x and
    the output layer's; 7 | 9 | 9 | 7 then runs at max(7 x, 9 x, 7 x + logit) per
    micro-batch."""
    m = 8
    one, even = _run()["compute"] / m, _run(p=4)["compute"] / m
    x = (one - even) / 24
    logit = even - 8 * x
    assert 0 < logit < 2 * x
    got = _run(p=4, first_stage_layers=7, last_stage_layers=7)["compute"] / m
    assert got == pytest.approx(max(7 * x, 9 * x, 7 * x + logit), rel=1e-9)
    # only the last pinned: the first three share 30 layers, the last holds 2 and the output
    got = _run(p=4, last_stage_layers=2)["compute"] / m
    assert got == pytest.approx(10 * x, rel=1e-9)


def test_a_lighter_first_stage_holds_fewer_activations():
    """1F1B: stage i holds min(p - i, m) micro-batches. 5 | 9 | 9 | 9 on p = 4 holds
    max(5 x 4, 9 x 3) = 27 layers' activations where the even 8 x 4 holds 32."""
    even = _run(p=4)["activations"]
    got = _run(p=4, first_stage_layers=5)["activations"]
    assert got == pytest.approx(even * 27 / 32, rel=1e-9)


@pytest.mark.parametrize("pins, message", [
    ({"pp": 4, "first": 6}, "the 26 layers left"),
    ({"pp": 1, "first": 8}, "pp: pinning the first / last stage layers needs pp >= 2"),
    ({"pp": 3, "first": 16, "last": 16}, "hold all 32 layers of .* none left for the 1 other stages"),
])
def test_megatron_uneven_rules(pins, message):
    with pytest.raises(SpecError, match=message):
        check_pins(LLAMA, **pins)


def test_megatron_uneven_layouts_that_hold():
    for pins in ({"pp": 2, "first": 16, "last": 16}, {"pp": 4, "first": 8, "last": 6},
                 {"pp": 4, "first": 6, "last": 6, "interleave": 2},
                 # a stage's layers need not divide into its chunks: Megatron-LM's layout
                 # flag places any count per chunk (the launcher writes it)
                 {"pp": 4, "first": 5, "interleave": 2}):
        check_pins(LLAMA, **pins)


@pytest.mark.slow
def test_search_with_pinned_stages_equals_brute_force():
    system = load_system("dgx-h100")
    B, budget, first = 32, 32, 5
    # predict checks the pinned stages against Megatron's rules (refused splits are skipped)
    best = fastest_fitting(LLAMA, system, B, budget, (
        {"t": t, "p": p, "d": d, "mb": mb} for t, p, d, mb in itertools.product(
            (1, 2, 4, 8), (2, 3, 4, 6, 8), (1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 32))),
        first_stage_layers=first)
    sol = HybridSolver(LLAMA, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, interleave=1, cp=1,
                              first_stage_layers=first)).solve()
    assert sol.status == "optimal" and sol.plan.first_stage_layers == first
    assert sol.plan.pp > 1
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


def test_the_search_offers_the_layouts_with_embedding_and_loss_in_their_own_chunks():
    """Megatron-LM's --account-for-embedding-in-pipeline-split / --account-for-loss-in-
    pipeline-split: L + 2 (or L + 1) slots split evenly over the p v chunks. Llama 3.1 405B's
    126 layers at pp 16 take 8 chunks each (the vendors' layout: the embedding alone in the
    first chunk, the loss in the last), which no even split gives; pp 16 x 7 is neither."""
    from planner.plan import chunk_layers
    from planner.search.hybrid_space import stage_ok

    m, q = load_model("llama3.1-405b"), Search(global_batch=64)
    assert m.layers == 126
    for p, v in ((16, 8), (8, 16), (4, 32), (2, 63), (2, 9)):
        assert stage_ok(m, q, p, v), (p, v)
    for p, v in ((16, 7), (4, 30), (16, 9)):
        assert not stage_ok(m, q, p, v), (p, v)
    layout = chunk_layers(126, 16, 8)  # what the cost model and the launchers take
    assert layout[0] == layout[-1] == 0 and set(layout[1:-1]) == {1}
    layout = chunk_layers(126, 8, 8)  # 128 slots of 2: the first and last chunks 1 layer
    assert layout[0] == layout[-1] == 1 and set(layout[1:-1]) == {2}
    layout = chunk_layers(95, 4, 8)  # 96 slots of 3: the embedding's chunk one layer short
    assert layout[0] == 2 and set(layout[1:]) == {3}


def test_search_over_the_embedding_and_loss_layouts_equals_brute_force():
    """A 6-layer model on up to 16 GPUs at pp 4: the search over every split against the brute
    force over the same layouts (one chunk per stage, or 8 slots over 4 x 2 chunks: the
    embedding and the loss each in a layer's slot), each plan priced alone; the two-chunk
    layout wins (a bubble of half the stage), so the search must offer it."""
    m = dataclasses.replace(LLAMA, layers=6)
    system = load_system("dgx-h100")
    B, budget = 16, 16
    best = fastest_fitting(m, system, B, budget, (
        {"t": t, "p": 4, "interleave": v, "d": d, "mb": mb}
        for t, v, d, mb in itertools.product((1, 2, 4), (1, 2), (1, 2, 4), (1, 2, 4, 8, 16))),
        cp=1)
    sol = HybridSolver(m, system, Precision.bf16,
                       Search(global_batch=B, devices_max=budget, cp=1, pp=4)).solve()
    assert sol.status == "optimal" and sol.plan.interleave == 2
    assert math.isclose(sol.prediction.iteration_time_s, best, rel_tol=1e-12)


def test_tp_overlap_leaves_the_first_chunk_where_the_gemms_are_longer():
    """Llama-3-70B at tp 4 on DGX H100: every block's GEMMs outlast its collective, so of each
    collective only the reduce-scatter's last of t chunks shows (the all-gather's first chunk
    is the rank's own shard), 1 / 2t of the ring, and the rest costs the share sigma / (1 +
    sigma) the compute beside it loses: with one flat GEMM rate and no launch floor (cutting
    a compute-bound GEMM into row chunks then costs nothing, nor the GPU's own time per chunk
    kernel) tp_comm falls to exactly 1 / 2t + share (2t - 1) / 2t; with the shape-dependent
    rate and the kernels' fixed times the thinner chunks add their own time."""
    m = load_model("llama3-70b")
    cfg = {**_cfg(t=4, sp=1, d=1, acc=1), "overlap": True}
    flat = dataclasses.replace(H100, launch_s=0.0, gemm_half_dim=0.0, kernel_gpu_s=0.0)
    plain = float(iteration(m, flat, cfg)["tp_comm"])
    hidden = float(iteration(m, flat, {**cfg, "tp_overlap": True})["tp_comm"])
    assert plain > 0
    share = H100.overlap_slowdown / (1 + H100.overlap_slowdown)
    assert hidden == pytest.approx(plain / 8 + share * plain * 7 / 8, rel=1e-9)
    plain = float(iteration(m, H100, cfg)["tp_comm"])
    hidden = float(iteration(m, H100, {**cfg, "tp_overlap": True})["tp_comm"])
    assert plain / 4 < hidden < plain


# (tp, micro-batch, whether the overlap pays: True, False, or None where it breaks even)
_OVERLAP_PAYS = {
    "gpt3-175b": ((2, 1, True), (4, 1, True), (2, 2, True), (4, 2, True), (8, 4, True),
                  (8, 1, None)),
    "llama3-8b": ((2, 1, True), (4, 1, True), (8, 4, True), (8, 1, True)),
}


@pytest.mark.parametrize("name", sorted(_OVERLAP_PAYS))
def test_tp_overlap_pays_where_the_chunks_stay_thick(name):
    """Overlap cuts each GEMM into t row chunks of b s / t tokens, which Transformer Engine's
    userbuffers loop issues from C++ (each its work and the GPU's own 6 us, not the host's
    56 us an eager Python op takes); it pays where the ring it hides outweighs what the thinner
    chunks cost at the fitted GEMM curve (H100 half dimension 180, about 2 % slower at 1,024
    rows than at 2,048, 9 % at 512); the backward runs the column-parallel collectives in bulk
    beside whole GEMMs, so only the forward's and the row-parallel dgrad's chunks cost. GPT-3
    (s 2048) pays at tp 2 and 4 with one micro-batch (0.52 s of tp time against 0.74 s; 0.95
    s against 1.25 s) and breaks even at tp 8 (256-token chunks: 1.796 s against 1.798 s); with
    more micro-batches it pays. Llama-3-8B (s 8192) pays at every tp. The compute itself is
    the same either way."""
    m = load_model(name)
    for t, mb, pays in _OVERLAP_PAYS[name]:
        cfg = _cfg(t=t, mb=mb, sp=1, recompute=2)
        plain = iteration(m, H100, cfg)
        hidden = iteration(m, H100, {**cfg, "tp_overlap": True})
        if pays is None:
            assert float(hidden["tp_comm"]) == pytest.approx(float(plain["tp_comm"]),
                                                             rel=0.01), (t, mb)
        else:
            assert (float(hidden["tp_comm"]) < float(plain["tp_comm"])) == pays, (t, mb)
        assert float(hidden["compute"]) == float(plain["compute"])


def test_tp_overlap_needs_sequence_parallel():
    """A plan that breaks a rule of planner.rules is refused when it is built."""
    with pytest.raises(SpecError, match="tp_overlap: tensor-parallel communication overlap"):
        Plan.split(4, 1, 2, 1, 8, node_size=8, tp_overlap=True)
    plan = Plan.split(4, 1, 2, 1, 8, node_size=8, tp_overlap=True, sequence_parallel=True)
    assert predict(LLAMA, load_system("dgx-h100"), Precision.bf16, plan).iteration_time_s > 0


def test_uneven_chunks_take_the_largest_chunk_per_bubble_slot():
    """Llama 3.1 405B, 126 layers on pp 16: each stage holds at most 8 layers; with v chunks
    a bubble slot is the largest chunk, ceil(126 / (16 v)) layers: 1 at v = 8, 3 at v = 3."""
    m = load_model("llama3.1-405b")
    cfg = _cfg(t=8, p=16, d=1, acc=16, sp=1)
    one = float(iteration(m, H100, cfg)["pp_bubble"])
    for v, chunk in ((8, 1), (3, 3), (2, 4)):
        got = float(iteration(m, H100, {**cfg, "v": v})["pp_bubble"])
        assert got == pytest.approx(one * chunk / 8, rel=1e-12)


def test_uneven_chunks_keep_the_largest_stage_in_memory():
    """Memory with uneven chunks is priced at ceil(126 / 16) = 8 layers holding the first
    stage's micro-batches: 32 of them leave Megatron's warm-up of 2 x 15 + 7 x 16 + 1 = 143
    chunks (16 x (1 + 15 / 128) micro-batches); 16 = p of them run all 128 chunk forwards
    first, as Meta ran Llama 3.1 405B (16 micro-batches on pp 16), holding 16."""
    m = load_model("llama3.1-405b")
    a = activation_bytes_per_layer(m, H100, 8, 1, "none", True)
    logits = 4 * m.seq_len * m.vocab / 8
    for acc, in_flight in ((32, 16 * (1 + 15 / 128)), (16, 16)):
        cfg = _cfg(t=8, p=16, d=1, acc=acc, sp=1, v=8)
        want = max(8 * a * in_flight, 8 * a + logits)
        assert float(iteration(m, H100, cfg)["activations"]) == pytest.approx(want, rel=1e-12)


def test_meta_llama_405b_plan_fits_on_h100():
    """A configuration a published run trained must fit: Llama 3.1 405B on 16,384 H100 with
    tp 8, pp 16 x 8 chunks, dp 128, batch 2,048 of 8,192 tokens, sequence parallel, no
    recomputation; FSDP sharding the optimizer state and the fp32 gradients but not the
    weights (ZeRO 2), as the paper describes (Llama 3 paper, sec. 3.3 and Table 4)."""
    plan = Plan.split(8, 16, 128, 1, 2048, node_size=8, interleave=8, sequence_parallel=True,
                      zero=2)
    m = dataclasses.replace(load_model("llama3.1-405b"), seq_len=8192)
    pred = predict(m, load_system("dgx-h100"), Precision.bf16, plan)
    assert pred.fits_memory
    assert 0.85 < pred.memory_bytes_per_device / (80 * 2**30) < 1


def test_uneven_chunks_price_the_last_stage_the_layout_gives():
    """Llama-2-70B, 80 layers on pp 3 x 2 chunks: the layout E+13|14|14|13|13|13+L leaves the
    last stage 27 layers and the output layer; from p = 1 (80 x + logit) and p = 4 (20 x +
    logit) follow x and the logit, and the stage runs 27 x + logit."""
    m, mb = load_model("llama2-70b"), 6
    run = lambda **o: float(iteration(m, H100, _cfg(t=8, sp=1, acc=mb, **o))["compute"]) / mb  # noqa: E731
    one, four = run(), run(p=4)
    x = (one - four) / 60
    logit = four - 20 * x
    assert pipeline_layout(80, 3, 2) == "E" + "t" * 13 + "|" + "|".join(
        "t" * n for n in (14, 14, 13, 13)) + "|" + "t" * 13 + "L"
    assert run(p=3, v=2) == pytest.approx(27 * x + logit, rel=1e-9)


def test_pipeline_layout_for_megatron():
    layout = pipeline_layout(126, 16, 8)
    chunks = layout.split("|")
    assert len(chunks) == 128 and layout.count("t") == 126
    assert chunks[0] == "E" and chunks[-1] == "L" and set(chunks[1:-1]) == {"t"}
    for layers, pp, v in ((96, 4, 5), (61, 16, 2), (32, 3, 4)):
        chunks = pipeline_layout(layers, pp, v).split("|")
        per_stage = [sum(c.count("t") for c in chunks[r::pp]) for r in range(pp)]
        assert sum(per_stage) == layers and max(per_stage) == -(-layers // pp)


def test_zero3_shows_the_first_layers_gather_of_each_pass():
    """ZeRO-3 / FSDP prefetches each layer's gather behind the layer before it: with the
    collectives short against the compute, only the first layer's two all-gathers (forward
    and backward) per micro-batch show, m sync / L, sync being the allreduce that the same
    plan without overlap exposes whole (ZeRO 2: one reduce-scatter of the gradients and one
    all-gather of the weights per iteration: the two gathers' bytes in fp16, where both have
    one width). Every collective overlapped also costs the share sigma / (1 + sigma) of its
    time that the compute beside it loses: the gradients' reduce-scatter (what ZeRO-3 without
    overlap shows beyond its m gathers) and both gathers of every micro-batch (sync)."""
    m = 4
    cfg = _cfg(d=8, acc=m, zero=3)
    fp16 = Hardware.of(load_system("dgx-h100"), Precision.fp16)
    sync = float(iteration(LLAMA, fp16, {**cfg, "zero": 2, "overlap": False})["dp_comm_exposed"])
    got = float(iteration(LLAMA, fp16, {**cfg, "overlap": True})["dp_comm_exposed"])
    share = fp16.overlap_slowdown / (1 + fp16.overlap_slowdown)
    alone = float(iteration(LLAMA, fp16, {**cfg, "overlap": False})["dp_comm_exposed"])
    scatter = alone - m * sync
    assert scatter == pytest.approx(sync / 2, rel=0.01)  # half the bytes, the same steps
    want = share * scatter + m * (share * sync + sync / LLAMA.layers)
    assert got == pytest.approx(want, rel=1e-9)


def test_interleaved_last_stage_holds_its_warm_up_and_the_logits():
    """The last of p stages runs (v - 1) p + 1 chunk forwards before its first backward
    (Megatron-LM's schedules.py), not one micro-batch: with a vocabulary that dwarfs the
    layers it sets the memory, here x act x ((v - 1) p + 1) / v + the fp32 logits."""
    from planner.spec.transformer import build_transformer

    m = build_transformer({"kind": "transformer", "name": "wide-vocab", "layers": 8,
                           "hidden": 64, "heads": 4, "seq_len": 2048, "vocab": 1_000_000},
                          "test")
    a = activation_bytes_per_layer(m, H100, 1, 1, "none", False)
    logits = 4 * 2048 * 1_000_000
    got = float(iteration(m, H100, _cfg(p=4, v=2, acc=8))["activations"])
    assert got == pytest.approx(2 * a * (4 + 1) / 2 + logits, rel=1e-12)
    one = float(iteration(m, H100, _cfg(p=4, v=1, acc=8))["activations"])
    assert one == pytest.approx(2 * a + logits, rel=1e-12)


def test_pipeline_sends_without_sequence_parallel_regather_over_nvlink():
    """SC21 sec. 4.1: each of the t ranks sends 1 / t of the stage boundary's b s h tensor and
    the next stage all-gathers it over NVLink; with sequence parallelism the shards are what
    the next stage needs. Both send the same bytes, so the difference is the all-gathers:
    (m + (p - 1)) slots x 2 directions x a ring all-gather of b s h over t ranks."""
    t, p, acc = 8, 4, 8
    plain, split = (_run(t=t, p=p, acc=acc, sp=sp)["pp_comm"] for sp in (0, 1))
    size = LLAMA.seq_len * LLAMA.hidden * H100.value_bytes
    gather = (t - 1) * H100.intra_lat + (t - 1) / t * size / H100.intra_bw
    assert plain - split == pytest.approx((acc + p - 1) * 2 * max(gather, H100.launch_s),
                                          rel=1e-9)


def test_pinned_stages_in_uneven_chunks_price_the_largest_chunk_as_the_bubble_slot():
    """NVIDIA's DeepSeek-V3 recipe (MLPerf Training v6.0, PIPELINE_LAYOUT
    "Et*4|(t*4|)*14tmL" at pp 4 x 4 chunks): 16 layers on each of the first three stages, 13 on
    the last with the MTP depth and the loss. Pinned as last_stage_layers 13, the busiest stage
    holds 16 layers in chunks of 4, so a bubble slot is 4 layers' time: the step is
    (m + 3 / 4) times the slowest stage, as with the even 16-layer stages' v = 4."""
    from planner.plan import largest_chunk, stage_chunks

    assert stage_chunks(13, 4) == [4, 3, 3, 3] and stage_chunks(16, 4) == [4] * 4
    assert largest_chunk(61, 4, 4, last=13) == 4
    m = load_model("llama2-70b")

    def bubble_in_stages(**o):
        """The bubble over the slowest stage's time a micro-batch (8 micro-batches)."""
        r = {k: float(v) for k, v in iteration(m, H100, _cfg(t=8, sp=1, acc=8, p=4, v=4,
                                                              **o)).items()}
        stage = sum(r[k] for k in ("compute", "tp_comm", "cp_comm", "ep_comm", "offload")) / 8
        return r["pp_bubble"] / stage

    # 20 layers a stage in chunks of 5, pinned or not: 3 slots of a quarter stage
    assert bubble_in_stages() == pytest.approx(3 / 4, rel=1e-9)
    assert bubble_in_stages(last_stage_layers=20) == pytest.approx(3 / 4, rel=1e-9)
    # 19 | 19 | 19 | 23: the slowest stage's chunks 6, 6, 6, 5, a slot 6 / 23 of it
    assert bubble_in_stages(last_stage_layers=23) == pytest.approx(3 * 6 / 23, rel=1e-9)


def test_pinned_stages_hold_a_layer_in_every_chunk_of_the_busiest():
    with pytest.raises(SpecError, match="interleave: 64 virtual stages"):
        check_pins(LLAMA, pp=4, first=8, last=8, interleave=64)
    check_pins(LLAMA, pp=4, first=8, last=8, interleave=8)


def test_megatron_refuses_the_fp8_output_projection_on_a_tied_head(run):
    """Megatron-LM's TELMHeadColumnParallelLinear needs its own weight: one stage holding a
    tied embedding and head is refused in one line (exit 2)."""
    code, _, err = run("evaluate", "-m", "gpt-1.7b", "-H", "dgx-b200", "--devices", "8",
                       "--tp", "1", "--pp", "1", "--global-batch", "64", "--precision",
                       "mxfp8", "--fp8-output-proj", "--format", "megatron")
    assert code == 2 and "fp8 output projection" in err
    assert len(err.strip().splitlines()) == 1
    # the same rule keeps the search for that form to plans it writes (planner.rules)
    code, out, err = run("solve", "-m", "gpt-1.7b", "-H", "dgx-b200", "--devices", "8",
                         "--global-batch", "64", "--precision", "mxfp8", "--fp8-output-proj",
                         "--format", "megatron")
    assert code == 0, err
    (pp,) = re.findall(r"--pipeline-model-parallel-size (\d+)", out)
    assert int(pp) > 1


def test_megatron_layout_for_pinned_stages_in_uneven_chunks(run):
    """`--pipeline-model-parallel-layout` for the pinned stages (each stage's layers split as
    `stage_chunks`), the MTP depth in the last chunk before the loss, each checked by the rules
    of Megatron-LM's PipelineParallelLayerLayout.validate_layer_layout (d98e8a6): the
    embedding first and the loss last, once each, the decoder layers the model's, the MTP
    depths after every decoder layer and in the last chunk; exclusive with the other layout
    flags (validate_args)."""
    from tests.test_launch import _megatron_flags, _out

    flags = _megatron_flags(_out(run, "evaluate", "-m", "deepseek-v3", "-H", "gb300-nvl72",
                                 "--devices", "512", "--tp", "1", "--pp", "4", "--interleave",
                                 "4", "--ep", "32", "--etp", "1", "--last-stage-layers", "13",
                                 "--global-batch", "15360", "--zero", "1", "--precision",
                                 "mxfp8", "--format", "megatron"))
    (layout,) = flags["--pipeline-model-parallel-layout"]
    chunks = layout.split("|")
    assert len(chunks) == 16 and layout.startswith("E") and layout.endswith("mL")
    assert layout.count("E") == layout.count("L") == layout.count("m") == 1
    assert chunks[-1] == "tttmL"  # the last stage's 13 layers: 4, 3, 3, 3
    per_stage = [sum(c.count("t") for c in chunks[r::4]) for r in range(4)]
    assert per_stage == [16, 16, 16, 13]
    assert not {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                "--num-virtual-stages-per-pipeline-rank"} & set(flags)
