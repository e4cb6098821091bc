"""MLPerf Training v6.0's submissions (`planner/calibration/mlperf_training_v6.csv`,
transcribed from the round's stored results): the mixture-of-experts ones (DeepSeek-V3 671B on
GB200 / GB300 NVL72 and gpt-oss-20b on H100 to GB300), read as their configs ran them, their
FLOPs and parameters against what the benchmark's own files print, and the dense ones; all
kept out of every fit (they test the MoE terms, and what the fit carries to a newer software
release, out of sample)."""

import pytest

from planner import bands, fit_mlperf, mlperf
from planner.catalog import load_model
from planner.errors import SpecError
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len


def _transcribed():
    return mlperf.read(mlperf.TRANSCRIBED)


def test_every_transcribed_row_names_its_source_and_only_unread_cells_go_unpriced():
    runs = _transcribed()
    assert len(runs) == 63
    assert {r.row["benchmark"] for r in runs} == {"deepseekv3_671b", "gpt_oss_20b", "llama31_8b",
                                                  "llama31_405b", "llama2_70b_lora"}
    for run in runs:
        row = run.row
        assert row["round"] == "v6.0" and row["commit"] == "eabf23a07b2a0c60a289ff871dc3a46fff0d0421"
        assert row["config_file"] or "not stored" in row["notes"] or "inferred" in row["notes"]
        assert row["result_files"] and float(row["step_time_s"]) > 0
    unpriced = [r for r in runs if r.why_not]
    assert len(unpriced) == 19
    for run in unpriced:  # a layout or a precision the files do not give is not guessed at
        if run.moe:
            assert run.why_not == "parallel sizes or batch not all given by the submission's files"
            assert "the layout is inferred" in run.row["notes"]
        else:
            assert run.why_not == "precision not given by the submission's files"
            assert run.row["precision"] == ""


def test_the_v6_round_is_held_out_of_every_fit():
    """v6.0's dense rows test what the shares fitted to v3.0-v5.1 carry to a newer release."""
    dense = [r for r in _transcribed() if not r.moe]
    assert len(dense) == 13 and all(r.held_out for r in dense)
    fitted = {fit_mlperf.key(r) for r in fit_mlperf.every_run()}
    assert not any(fit_mlperf.key(r) in fitted for r in _transcribed())
    assert not any(r.held_out for r in mlperf.read(mlperf.CSV))


def test_deepseek_rows_run_nvidias_layout_and_switches():
    """Every DeepSeek-V3 submission: pp 4 x 4 chunks in the layout "Et*4|(t*4|)*14tmL" (16
    layers on each of the first three stages, 13 with the MTP depth and the loss on the last),
    ep 32 with the experts whole (etp 1), the all-to-alls overlapped, full-iteration CUDA
    graphs, the gradient norm clipped on the device; GB300's recipes run the output layer in
    MXFP8 (FP8_OUTPUT_PROJ), GB200's at tp 2 do not."""
    runs = [r for r in _transcribed() if r.row["benchmark"] == "deepseekv3_671b"]
    assert len(runs) == 10 and not any(r.why_not for r in runs)
    for run in runs:
        plan = mlperf.plan_of(run)
        assert (plan.pp, plan.interleave, plan.ep, plan.etp, plan.cp) == (4, 4, 32, 1, 1)
        assert (plan.first_stage_layers, plan.last_stage_layers) == (None, 13)
        assert plan.ep_overlap and plan.cuda_graphs and not plan.host_sync
        assert plan.fp8_attention and plan.fp8_weight_gather and plan.zero == 1
        assert plan.fp8_output_proj == (run.system == "gb300-nvl72") == (plan.tp == 1)
        assert run.precision is Precision.mxfp8


def test_deepseek_flops_per_sample_match_the_benchmarks_own_count():
    """Two independent counts: the planner's model FLOPs of DeepSeek-V3 (MLA, 3 dense and 58
    MoE layers of top-8 of 256 plus the shared expert, the MTP depth, causal attention) at
    4,096 tokens against MODEL_TFLOP_PER_SAMPLE=1068 of NVIDIA's config_common.sh."""
    m = load_model("deepseek-v3")
    assert m.seq_len == 4096
    assert m.model_flops() / 1e12 == pytest.approx(1068, rel=1e-3)


def test_gpt_oss_rows_train_the_benchmarks_model():
    """MLPerf's gpt-oss-20b reads the Llama 3.1 tokenizer (128,256 tokens) at 8,192 tokens:
    its logs print 20,495,244,864 parameters, the planner's count of that variant."""
    runs = [r for r in _transcribed() if r.row["benchmark"] == "gpt_oss_20b"]
    assert len(runs) == 40
    model = mlperf.benchmark_model(runs[0])
    assert model.params() == 20_495_244_864 and model.vocab == 128256
    assert load_model("gpt-oss-20b").params() == 20_914_757_184  # the released model
    priced = [r for r in runs if not r.why_not]
    assert {int(r.row["seq_len"]) for r in priced} == {8192}
    # Cisco's H100 runs set the all-to-all overlap with one micro-batch a step: nothing pairs
    cisco = [r for r in priced if r.system == "dgx-h100"]
    assert len(cisco) == 2
    assert all(not mlperf.plan_of(r).ep_overlap and mlperf.plan_of(r).tp == 2 for r in cisco)


@pytest.mark.parametrize("layout, pp, v, stages", [
    ("Et*4|(t*4|)*14tmL", 4, 4, [16, 16, 16, 13]),
    ("Ettt|tttt|tttt|ttL", 4, 1, [3, 4, 4, 2]),
    ("E|(t|)*5tL", 7, 1, [0, 1, 1, 1, 1, 1, 1]),
    ("Ettt|(tt|)*2,m|L", 5, 1, [3, 2, 2, 0, 0]),  # commas are spacing, as Megatron reads them
])
def test_megatron_layouts_expand_to_their_stages(layout, pp, v, stages):
    assert mlperf.layout_stages(layout, pp, v) == stages


def test_a_layout_that_does_not_fit_the_pipeline_is_refused():
    with pytest.raises(SpecError, match="chunks for pp 4 x 4"):
        mlperf.layout_stages("Et*4|(t*4|)*13tmL", 4, 4)


def test_a_row_whose_layout_the_planner_cannot_price_says_why():
    """Unreadable, a stage with no layer, or not the model's layers: the row is not priced
    (and the file is still read)."""
    (row,) = [r.row for r in _transcribed() if r.row["system"] == "theia_ngpu512_ngc26.04_nemo"
              and r.row["benchmark"] == "deepseekv3_671b"]
    for layout in ("Et*4|(t*4|)*13tmL", "E|t*20|t*20|t*21mL", "Et*4|(t*4|)*14ttmL"):
        assert mlperf._layout_pins({**row, "pipeline_layout": layout}) is None
    assert mlperf._layout_pins(row) == (None, 13)


def test_moe_rows_stay_out_of_every_fit():
    assert all(load_model(r.model).experts <= 1 for r in fit_mlperf.every_run())
    held = fit_mlperf.held_out_predictions()
    assert not any(fit_mlperf.key(r) in held for r in _transcribed())


def test_moe_plans_on_blackwell_borrow_the_moe_rows_band():
    """With the v6.0 rows a mixture-of-experts plan on Blackwell has a band of its own runs'
    residuals; on Hopper (two runs) it is still not covered, and a dense plan never borrows
    from MoE runs."""
    m = with_seq_len(load_model("deepseek-v3"), 4096)
    b = bands.band(bands.features(m, "gb200", Precision.mxfp8, 1, 512, 64))
    assert b.low is not None and b.runs >= 4 and "moe" in b.group
    hopper = bands.band(bands.features(m, "h100-sxm5-80gb", Precision.fp8, 1, 512, 64))
    assert hopper.low is None and hopper.note.startswith(
        "not covered: 2 calibration runs (a band takes 4) of a mixture-of-experts model on "
        "H100 / H200 systems")
    # a sharded MoE plan on Blackwell is uncovered for its sharding, not for being MoE
    sharded = bands.band(bands.features(m, "gb200", Precision.mxfp8, 2, 512, 64))
    assert sharded.low is None and "sharded gradients" in sharded.note
    dense = bands.band(bands.features(load_model("llama3-70b"), "gb200", Precision.mxfp8))
    rows = [r for r in bands.residuals() if r["moe"] == "moe"]
    assert len(rows) == 36 and dense.group and "moe" not in dense.group
