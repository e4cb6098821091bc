"""Plots for `sweep --plot` (matplotlib is the optional `plot` extra)."""

from __future__ import annotations

from pathlib import Path

from planner.errors import SpecError


def _pyplot(path: str):
    """matplotlib's pyplot (headless), after checking the file name; a clear error without it."""
    if Path(path).suffix.lower() not in (".png", ".svg"):
        raise SpecError(f"plot: {path}: use a .png or .svg file name")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("plot: matplotlib is not installed; pip install 'planner[plot]'") from None
    return plt


def _save(plt, fig, path: str) -> None:
    try:
        fig.savefig(path)
    except OSError as exc:
        raise SpecError(f"plot: {path}: cannot write ({exc.strerror})") from None
    finally:
        plt.close(fig)


def pareto_plot(front: list[dict], path: str, title: str) -> None:
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["time_to_train_s"] / 3600 for p in front], [p["cost_usd"] for p in front],
            "o-", ms=3)
    ax.set(xscale="log", xlabel="time to train (hours)", ylabel="cost to train (USD)",
           title=title)
    fig.tight_layout()
    _save(plt, fig, path)


def sweep_plot(sweep, path: str, title: str) -> None:
    """Any family's sweep: samples/s against devices with linear scaling from the smallest
    point, and the iteration time's parts per point (MFU on a second axis where the family
    reports it)."""
    plt = _pyplot(path)
    pts = sorted(sweep.points, key=lambda p: p.plan.devices)
    if not pts:
        raise SpecError("plot: the sweep has no point to draw")
    dev = [p.plan.devices for p in pts]
    rate = [p.prediction.samples_per_s for p in pts]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(dev, rate, "o-", label="predicted")
    ax1.plot(dev, [rate[0] * d / dev[0] for d in dev], "k--", lw=0.8, label="linear")
    ax1.set(xscale="log", yscale="log", xlabel="devices", ylabel="samples per second")
    ax1.legend()
    parts = list(dict.fromkeys(k for p in pts for k in p.prediction.time_breakdown))
    for part in parts:
        values = [p.prediction.time_breakdown.get(part, 0.0) for p in pts]
        if any(v > 0 for v in values):
            ax2.plot(dev, [v if v > 0 else float("nan") for v in values], "o-", ms=3,
                     label=part)
    ax2.set(xscale="log", yscale="log", xlabel="devices", ylabel="seconds per iteration")
    ax2.legend(fontsize="small")
    if all(p.prediction.mfu is not None for p in pts):
        ax3 = ax2.twinx()
        ax3.plot(dev, [p.prediction.mfu for p in pts], "k:", label="MFU")
        ax3.set(ylabel="model FLOPs utilisation (dotted)", ylim=(0, 1))
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, path)
