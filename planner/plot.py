"""Plots for `solve --plot` and `sweep --plot` (matplotlib is the optional `plot` extra).

Each function writes the file and returns the matplotlib Figure (closed: nothing stays open
in pyplot), so a test can count its bars and read its lines instead of its pixels."""

from __future__ import annotations

from pathlib import Path

from planner.errors import SpecError


def check_path(path: str) -> str:
    """`path` if it names a .png or .svg file, else a one-line error (an empty name too)."""
    if Path(path).suffix.lower() not in (".png", ".svg") or not Path(path).stem:
        raise SpecError(f"plot: {path!r}: use a .png or .svg file name")
    return path


def _pyplot(path: str):
    """matplotlib's pyplot (headless), after checking the file name; a clear error without it."""
    check_path(path)
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


GB = 1e9  # memory in decimal GB, the unit the text output uses (`planner.report.render.si`)


def _plain_log_ticks(axis, fmt=lambda v: f"{v:g}") -> None:
    """Log-axis ticks as plain numbers at 1, 2 and 5 per decade ("0.5", "20", not
    "10^0"), the minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    axis.set_minor_formatter(NullFormatter())


def _dollars(v: float) -> str:
    if abs(v) >= 1e6:
        return f"${v / 1e6:,.3g}M"
    return f"${v:,.0f}" if abs(v) >= 100 else f"${v:,.3g}"


def pareto_plot(front: list[dict], path: str, title: str, chosen: dict | None = None):
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    _front(ax, front, chosen)
    ax.set_title(title)
    fig.tight_layout()
    return _save(plt, fig, path)


def _front(ax, front: list[dict], chosen: dict | None = None) -> None:
    """The (time to train, cost) front in hours or days (days when the slowest plan takes
    more than three), dollars on the cost axis, and the chosen plan (`chosen`: its
    time_to_train_s and cost_usd) marked with a star."""
    days = max(p["time_to_train_s"] for p in front) > 3 * 86400
    unit, scale = ("days", 86400) if days else ("hours", 3600)
    ax.plot([p["time_to_train_s"] / scale for p in front], [p["cost_usd"] for p in front],
            "o-", ms=3, label="Pareto front")
    if chosen is not None and chosen.get("cost_usd") is not None:
        ax.plot([chosen["time_to_train_s"] / scale], [chosen["cost_usd"]], "*", ms=14,
                color="tab:red", label="chosen plan", zorder=3)
    ax.set(xscale="log", xlabel=f"time to train ({unit})", ylabel="cost to train (USD)",
           title="Pareto front")
    _plain_log_ticks(ax.xaxis)
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _dollars(v)))
    ax.legend(fontsize="small", loc="upper right")


def plan_plot(prediction, path: str, title: str, front: list[dict] | None = None,
              chosen: dict | None = None):
    """One plan: a bar per part of the iteration time (the prediction's time breakdown:
    compute, each communication, bubble, optimizer, as the family keys them; milliseconds
    under a second, else seconds), and the memory per device in GB (the text's unit) as one
    stacked bar of its parts (weights, gradients, optimizer state, activations) against the
    device's capacity, the legend below the bar, clear of the capacity line. With `front`
    (solve --pareto), a third panel draws the (time to train, cost) front, the `chosen`
    plan (its time_to_train_s and cost_usd) marked on it."""
    plt = _pyplot(path)
    times = dict(prediction.time_breakdown)
    memory = dict(prediction.memory_breakdown)
    fig, axes = plt.subplots(1, 3 if front else 2, figsize=(14 if front else 10, 4.6),
                             gridspec_kw={"width_ratios": [3, 1.2, 3] if front else [3, 1.2]})
    ax_t, ax_m = axes[0], axes[1]
    names = list(times)
    unit, scale = ("ms", 1e3) if prediction.iteration_time_s < 1 else ("s", 1.0)
    ax_t.barh(range(len(names)), [times[k] * scale for k in names], color="tab:blue")
    ax_t.set_yticks(range(len(names)), names)
    ax_t.invert_yaxis()
    ax_t.set(xlabel=f"{'milliseconds' if unit == 'ms' else 'seconds'} per iteration",
             title=f"iteration {prediction.iteration_time_s * scale:.4g} {unit}")
    bottom = 0.0
    for k, part in enumerate(memory):
        ax_m.bar(0, memory[part] / GB, bottom=bottom, width=0.6, label=part,
                 color=plt.get_cmap("tab10")(k % 10))
        bottom += memory[part] / GB
    capacity = prediction.memory_capacity_bytes / GB
    ax_m.axhline(capacity, color="k", ls="--", lw=1, label=f"capacity {capacity:.3g} GB")
    ax_m.set(xticks=[], xlim=(-0.6, 0.6), ylim=(0, max(capacity, bottom) * 1.08),
             ylabel="GB per device",
             title="fits" if prediction.fits_memory else "does not fit")
    ax_m.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.02),
                frameon=False)
    if front:
        _front(axes[2], front, chosen)
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
