"""Plots for `solve --plot` and `sweep --plot` (matplotlib is the optional `plot` extra).

Each function writes the file and returns the matplotlib Figure (closed: nothing stays open
in pyplot), so a test can count its bars and read its lines instead of its pixels."""

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


def _save(plt, fig, path: str):
    try:
        fig.savefig(path)
    except OSError as exc:
        raise SpecError(f"plot: {path}: cannot write ({exc.strerror})") from None
    finally:
        plt.close(fig)
    return fig


def pareto_plot(front: list[dict], path: str, title: str):
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    _front(ax, front)
    ax.set_title(title)
    fig.tight_layout()
    return _save(plt, fig, path)


def _front(ax, front: list[dict]) -> None:
    ax.plot([p["time_to_train_s"] / 3600 for p in front], [p["cost_usd"] for p in front],
            "o-", ms=3)
    ax.set(xscale="log", xlabel="time to train (hours)", ylabel="cost to train (USD)",
           title="Pareto front")


def plan_plot(prediction, path: str, title: str, front: list[dict] | None = None):
    """One plan: a bar per part of the iteration time (the prediction's time breakdown:
    compute, each communication, bubble, optimizer, as the family keys them), and the memory
    per device as one stacked bar of its parts (weights, gradients, optimizer state,
    activations) against the device's capacity. With `front` (solve --pareto), a third panel
    draws the (time to train, cost) front."""
    plt = _pyplot(path)
    times = dict(prediction.time_breakdown)
    memory = dict(prediction.memory_breakdown)
    fig, axes = plt.subplots(1, 3 if front else 2, figsize=(14 if front else 10, 4),
                             gridspec_kw={"width_ratios": [3, 1, 3] if front else [3, 1]})
    ax_t, ax_m = axes[0], axes[1]
    names = list(times)
    ax_t.barh(range(len(names)), [times[k] * 1e3 for k in names], color="tab:blue")
    ax_t.set_yticks(range(len(names)), names)
    ax_t.invert_yaxis()
    ax_t.set(xlabel="milliseconds per iteration",
             title=f"iteration {prediction.iteration_time_s * 1e3:.4g} ms")
    gib = 2**30
    bottom = 0.0
    for k, part in enumerate(memory):
        ax_m.bar(0, memory[part] / gib, bottom=bottom, width=0.6, label=part,
                 color=plt.get_cmap("tab10")(k % 10))
        bottom += memory[part] / gib
    capacity = prediction.memory_capacity_bytes / gib
    ax_m.axhline(capacity, color="k", ls="--", lw=1, label=f"capacity {capacity:.4g} GiB")
    ax_m.set(xticks=[], xlim=(-0.6, 1.6), ylabel="GiB per device",
             title="fits" if prediction.fits_memory else "does not fit")
    ax_m.legend(fontsize="small", loc="upper right")
    if front:
        _front(axes[2], front)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(plt, fig, path)


def sweep_plot(sweep, path: str, title: str):
    """A transformer sweep: MFU and time to train (iteration time without a training
    target) against devices. Another family's: samples/s against devices with linear scaling
    from the smallest point, and the iteration time's parts per point."""
    plt = _pyplot(path)
    pts = sorted(sweep.points, key=lambda p: p.plan.devices)
    if not pts:
        raise SpecError("plot: the sweep has no point to draw")
    if all(p.solution is not None and p.prediction.mfu is not None for p in pts):
        return _transformer_sweep_plot(plt, pts, path, title)
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
    return _save(plt, fig, path)


def _transformer_sweep_plot(plt, pts, path: str, title: str):
    dev = [p.plan.devices for p in pts]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(dev, [p.prediction.mfu for p in pts], "o-")
    ax1.set(xscale="log", xlabel="devices", ylabel="model FLOPs utilisation", ylim=(0, 1),
            title="MFU")
    if all(p.training and p.training.get("time_to_train_s") for p in pts):
        ax2.plot(dev, [p.training["time_to_train_s"] / 3600 for p in pts], "o-")
        ax2.set(ylabel="time to train (hours)", title="time to train")
    else:
        ax2.plot(dev, [p.prediction.iteration_time_s for p in pts], "o-")
        ax2.set(ylabel="seconds per iteration", title="iteration time (no training target)")
    ax2.set(xscale="log", yscale="log", xlabel="devices")
    for ax in (ax1, ax2):  # the swept device counts as plain numbers
        ax.minorticks_off()
        ax.set_xticks(dev, [str(d) for d in dev])
    fig.suptitle(title)
    fig.tight_layout()
    return _save(plt, fig, path)
