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


def sweep_plot(points, path: str, title: str) -> None:
    plt = _pyplot(path)
    nodes = [p.config.nodes for p in points]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(nodes, [p.prediction.speedup for p in points], "o-", label="predicted")
    ax1.plot(nodes, [p.config.devices for p in points], "k--", lw=0.8, label="linear")
    ax1.set(xscale="log", yscale="log", xlabel="nodes", ylabel="speed-up over one device")
    ax1.legend()
    ax2.plot(nodes, [p.prediction.compute_time_s for p in points], "o-", label="compute")
    ax2.plot(nodes, [p.prediction.communication_time_s for p in points], "s-",
             label="communication")
    ax2.plot(nodes, [p.prediction.exposed_communication_time_s for p in points], "^-",
             label="exposed communication")
    ax2.set(xscale="log", yscale="log", xlabel="nodes", ylabel="seconds per iteration")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, path)


def transformer_sweep_plot(points, path: str, title: str) -> None:
    """Tokens/s against devices (with linear scaling from the smallest point) and MFU."""
    plt = _pyplot(path)
    dev = [p.solution.plan.devices for p in points]
    tok = [p.solution.prediction["tokens_per_s"] for p in points]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(dev, tok, "o-", label="predicted")
    ax1.plot(dev, [tok[0] * d / dev[0] for d in dev], "k--", lw=0.8, label="linear")
    ax1.set(xscale="log", yscale="log", xlabel="devices", ylabel="tokens per second")
    ax1.legend()
    ax2.plot(dev, [p.solution.prediction["mfu"] for p in points], "o-")
    ax2.set(xscale="log", xlabel="devices", ylabel="model FLOPs utilisation", ylim=(0, 1))
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, path)
