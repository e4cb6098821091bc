"""solve --plot (the chosen plan's time and memory breakdowns) and sweep --plot (transformers:
MFU and time to train against devices): the files are written with valid headers, and the
figures carry one bar per breakdown part (read from the Figure, not the pixels)."""

import sys

import pytest

from planner import api
from planner.errors import SpecError

pytest.importorskip("matplotlib")

from planner.plot import plan_plot, sweep_plot  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
GB = 1e9  # the plot draws memory in decimal GB, as the text output prints it


def _is_svg(data: bytes) -> bool:
    head = data[:400].lstrip()
    return head.startswith((b"<?xml", b"<svg")) and b"<svg" in data[:2000]


@pytest.fixture(scope="module")
def transformer():
    return api.solve("llama3-8b", "dgx-h100", global_batch=512, devices_max=64)


@pytest.fixture(scope="module")
def cnn():
    return api.solve("alexnet", "k80-fdr", global_batch=256)


@pytest.mark.parametrize("family", ["transformer", "cnn"])
@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plan_plot_has_a_bar_per_part(request, tmp_path, family, suffix):
    sol = request.getfixturevalue(family)
    pred = sol.prediction
    path = tmp_path / f"plan{suffix}"
    fig = plan_plot(pred, str(path), "t")
    data = path.read_bytes()
    assert data.startswith(PNG) if suffix == ".png" else _is_svg(data)
    ax_time, ax_mem = fig.axes[:2]
    # one bar per part of the iteration time, in the breakdown's order, in milliseconds
    # under a second per iteration, else in seconds
    assert len(ax_time.patches) == len(pred.time_breakdown)
    assert [t.get_text() for t in ax_time.get_yticklabels()] == list(pred.time_breakdown)
    scale = 1e3 if pred.iteration_time_s < 1 else 1.0
    assert ax_time.get_xlabel().startswith("milliseconds" if scale == 1e3 else "seconds")
    assert [p.get_width() for p in ax_time.patches] == pytest.approx(
        [v * scale for v in pred.time_breakdown.values()])
    # memory: one stacked segment per part; its top is the total; the capacity line
    assert len(ax_mem.patches) == len(pred.memory_breakdown)
    top = max(p.get_y() + p.get_height() for p in ax_mem.patches)
    assert top == pytest.approx(pred.memory_bytes_per_device / GB)
    (capacity,) = [ln for ln in ax_mem.lines if "capacity" in ln.get_label()]
    assert capacity.get_ydata()[0] == pytest.approx(pred.memory_capacity_bytes / GB)
    assert ax_mem.get_ylabel() == "GB per device" and " GB" in capacity.get_label()


def test_transformer_breakdown_has_the_communication_bubble_and_optimizer_parts(transformer):
    parts = set(transformer.prediction.time_breakdown)
    assert {"compute", "tp_comm", "pp_bubble", "pp_comm", "dp_comm_exposed",
            "optimizer"} <= parts
    assert {"weights", "gradients", "optimizer", "activations"} <= set(
        transformer.prediction.memory_breakdown)


def test_plan_plot_of_a_cnn_pipeline_split(tmp_path):
    sol = api.solve("vgg16", "k80-fdr", global_batch=1024, strategy="pipeline")
    fig = plan_plot(sol.prediction, str(tmp_path / "p.png"), "t")
    assert len(fig.axes[0].patches) == len(sol.prediction.time_breakdown)
    assert len(fig.axes[1].patches) == len(sol.prediction.memory_breakdown)


def test_plan_plot_with_a_front_adds_a_third_panel(tmp_path, cnn):
    front = [{"time_to_train_s": 3600.0, "cost_usd": 10.0},
             {"time_to_train_s": 7200.0, "cost_usd": 5.0}]
    fig = plan_plot(cnn.prediction, str(tmp_path / "p.png"), "t", front=front)
    assert len(fig.axes) == 3
    assert list(fig.axes[2].lines[0].get_ydata()) == [10.0, 5.0]


@pytest.mark.parametrize("args", [
    ["-m", "llama3-8b", "-H", "dgx-h100", "--global-batch", "512", "--devices-max", "64"],
    ["-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256"],
    ["-m", "vgg16", "-H", "k80-fdr", "--global-batch", "1024", "--strategy", "pipeline"],
], ids=["transformer", "cnn", "cnn-pipeline"])
def test_solve_plot_writes_the_file(tmp_path, run, args):
    for suffix in (".png", ".svg"):
        out = tmp_path / f"plan{suffix}"
        code, _, err = run("solve", *args, "--plot", str(out))
        assert code == 0, err
        data = out.read_bytes()
        assert data.startswith(PNG) if suffix == ".png" else _is_svg(data)


def test_solve_plot_needs_png_or_svg_and_matplotlib(tmp_path, run, monkeypatch):
    args = ["solve", "-m", "alexnet", "-H", "k80-fdr", "--global-batch", "256", "--plot"]
    code, _, err = run(*args, str(tmp_path / "p.pdf"))
    assert code == 2 and "use a .png or .svg file name" in err
    for verb in (args, ["sweep", *args[1:]]):  # an empty name too (it had drawn nothing, exit 0)
        code, _, err = run(*verb, "")
        assert code == 2 and "use a .png or .svg file name" in err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    code, _, err = run(*args, str(tmp_path / "p.png"))
    assert code == 2 and "pip install 'planner[plot]'" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("target", [False, True], ids=["iteration-time", "time-to-train"])
def test_transformer_sweep_plot_mfu_and_time_against_devices(tmp_path, target):
    kw = dict(critical_batch=1000.0, target_tokens=1e10) if target else {}
    sw = api.sweep("llama3-8b", "dgx-h100", nodes=[1, 2, 4], global_batch=512, **kw)
    path = tmp_path / "sweep.svg"
    fig = sweep_plot(sw, str(path), "t")
    assert _is_svg(path.read_bytes())
    pts = sorted(sw.points, key=lambda p: p.plan.devices)
    ax_mfu, ax_time = fig.axes
    (mfu,) = ax_mfu.lines
    (time,) = ax_time.lines
    assert list(mfu.get_xdata()) == [8, 16, 32] == list(time.get_xdata())
    assert list(mfu.get_ydata()) == pytest.approx([p.prediction.mfu for p in pts])
    want = ([p.training["time_to_train_s"] / 3600 for p in pts] if target
            else [p.prediction.iteration_time_s for p in pts])
    assert list(time.get_ydata()) == pytest.approx(want)
    assert ("time to train" if target else "iteration") in ax_time.get_title()


def test_sweep_plot_cli_for_a_transformer(tmp_path, run):
    out = tmp_path / "s.png"
    code, _, err = run("sweep", "-m", "llama3-8b", "-H", "dgx-h100", "--global-batch", "512",
                       "--nodes", "1,2", "--plot", str(out))
    assert code == 0, err
    assert out.read_bytes().startswith(PNG)


def test_an_empty_sweep_has_nothing_to_draw(tmp_path):
    from planner.sweeping import Sweep

    with pytest.raises(SpecError, match="no point to draw"):
        sweep_plot(Sweep([], [], (1,)), str(tmp_path / "s.png"), "t")
