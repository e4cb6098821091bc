"""Fit the transformer kernel constants of the A100 to the calibration data, and report the error
per group, in sample and leave-one-group-out.

    python -m planner.fit_transformer            # fit, then the per-group table
    python benchmarks/accuracy.py               # the table with the constants as shipped

Four constants, the only fitted numbers of the transformer cost model on the A100 (every other
rate is a datasheet figure times a sourced efficiency):

- `efficiency.matmul`: the rate of a large GEMM, as a fraction of the dense peak;
- `kernels.launch_us`: the host time to issue one kernel, the floor of every kernel's time;
- `kernels.gemm_half_dim`: the thinnest GEMM dimension at which a GEMM runs at half that rate;
- the NVSwitch link's `latency_us`: NCCL's time per ring step inside the node.

They are fitted to two published sets, weighted equally, by coordinate-wise golden-section
search on the mean squared log error: vTrain's 1,440 single-node Megatron-LM runs (Bang et al.,
MICRO 2024) and the ten SC21 Table 1 runs (Narayanan et al. 2021). NVIDIA's six BERT-Large DGX
A100 runs are held out (never fitted). Leave-one-group-out refits without a group
(warm-started from the full fit) and predicts it.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import numpy as np

from planner.calibrate import _golden_min
from planner.catalog import load_model, load_system
from planner.cost.transformer import Hardware, iteration
from planner.plan import Plan
from planner.spec.hardware import Precision, System
from planner.spec.transformer import Transformer, build_transformer

SYSTEM = "dgx-a100-80gb"
VTRAIN_VOCAB = 50_257  # GPT-2 tokenizer, as vTrain's model code uses


@dataclass(frozen=True)
class Constants:
    matmul: float
    launch_us: float
    gemm_half_dim: float
    intra_latency_us: float

    BOUNDS = {"matmul": (0.5, 0.95, 0.002), "launch_us": (0.0, 120.0, 0.5),
              "gemm_half_dim": (0.0, 512.0, 2.0), "intra_latency_us": (0.5, 30.0, 0.2)}

    @classmethod
    def shipped(cls) -> Constants:
        """The constants as the built-in specs carry them."""
        s = load_system(SYSTEM)
        k = s.device.kernels
        return cls(s.device.efficiency.matmul, k.launch_us, k.gemm_half_dim,
                   s.intra_node.latency_us)

    def system(self) -> System:
        """The A100 system with these constants, its other kernel costs as its spec has them
        (the overlap slowdown, the GPU's own time per kernel)."""
        s = load_system(SYSTEM)
        dev = s.device
        dev = dev.model_copy(update={
            "efficiency": dev.efficiency.model_copy(update={"matmul": self.matmul}),
            "kernels": dev.kernels.model_copy(update={"launch_us": self.launch_us,
                                                      "gemm_half_dim": self.gemm_half_dim})})
        intra = s.intra_node.model_copy(update={"latency_us": self.intra_latency_us})
        return dataclasses.replace(s, device=dev, intra_node=intra)


# --- the calibration sets, each row as (group, measured seconds) and a way to predict it ------


def _vtrain_rows() -> list[dict]:
    path = resources.files("planner") / "calibration" / "vtrain_single_node.csv"
    with path.open(newline="", encoding="utf-8") as fh:
        return [{k: float(v) if k == "iteration_time_ms" else int(v) for k, v in rec.items()}
                for rec in csv.DictReader(fh)]


def _vtrain_model(hidden: int, heads: int, layers: int, seq_len: int) -> Transformer:
    return build_transformer({"kind": "transformer", "name": f"vtrain-{hidden}x{layers}",
                              "layers": layers, "hidden": hidden, "heads": heads,
                              "seq_len": seq_len, "vocab": VTRAIN_VOCAB, "dropout": 0.1},
                             "vtrain")  # Megatron-LM's default hidden dropout


def vtrain_errors(system: System, rows: list[dict]) -> np.ndarray:
    """Log error of each vTrain row (fp16, full recompute, 1F1B, gradient all-reduce not
    overlapped, no flash attention), priced in one array pass per model."""
    hw = Hardware.of(system, Precision.fp16)
    out = np.empty(len(rows))
    by_model: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        by_model.setdefault((r["hidden"], r["heads"], r["layers"], r["seq_len"]), []).append(i)
    for key, idx in by_model.items():
        def col(name, idx=idx):
            return np.array([rows[i][name] for i in idx])

        acc = col("global_batch") // (col("micro_batch") * col("dp"))
        res = iteration(_vtrain_model(*key), hw, {
            "t": col("tp"), "p": col("pp"), "d": col("dp"), "mb": col("micro_batch"),
            "acc": acc, "v": 1, "recompute": 2, "sp": 0, "zero": 0, "gpipe": 0,
            "overlap": False, "flash_attention": False})
        out[idx] = np.log(res["time"] * 1e3 / col("iteration_time_ms"))
    return out


def sc21_errors(system: System, runs: list[dict]) -> np.ndarray:
    from planner.published import solve_run

    return np.array([math.log(solve_run(r, system=system).prediction["iteration_time_s"]
                              / r["measured_s"]) for r in runs])


def bert_errors(system: System, runs: list[dict]) -> np.ndarray:
    from planner.search.hybrid import predict

    out = []
    for r in runs:
        plan = Plan.split(1, 1, r["gpus"], r["micro_batch"], r["global_batch"],
                          node_size=system.devices_per_node, flash_attention=False,
                          kernels="eager")
        model = dataclasses.replace(load_model("bert-large"), seq_len=r["seq_len"])
        seconds = predict(model, system, Precision.fp16, plan).iteration_time_s
        out.append(math.log(r["global_batch"] / seconds / r["measured_seq_s"]))
    return np.array(out)


@dataclass(frozen=True)
class Group:
    name: str
    errors: Callable[[System], np.ndarray]
    fitted: bool = True
    devices: tuple[int, ...] = ()  # each run's device count, in the order of `errors`


def groups() -> list[Group]:
    """The calibration data in groups: vTrain by hidden size, SC21 with and without pipeline,
    BERT."""
    from planner.published import bert_runs, sc21_runs

    vt, sc, bert = _vtrain_rows(), sc21_runs(), bert_runs()

    def vt_group(hidden):
        rows = [r for r in vt if r["hidden"] == hidden]
        return Group(f"vTrain h={hidden} ({len(rows)} runs)", lambda s: vtrain_errors(s, rows),
                     devices=tuple(r["gpus"] for r in rows))

    def sc_group(label, keep):
        runs = [r for r in sc if keep(r)]
        return Group(f"SC21 {label} ({len(runs)} runs)", lambda s: sc21_errors(s, runs),
                     devices=tuple(r["gpus"] for r in runs))

    return [vt_group(1024), vt_group(2048), sc_group("pp=1", lambda r: r["pp"] == 1),
            sc_group("pp>1", lambda r: r["pp"] > 1),
            Group(f"BERT-Large ({len(bert)} runs)", lambda s: bert_errors(s, bert), False,
                  tuple(r["gpus"] for r in bert))]


# --- fitting ------------------------------------------------------------------------------


# the sets weighted equally: vTrain's two groups are one set, SC21's two groups one set
_SET_OF = lambda name: name.split(" ")[0]  # noqa: E731


def loss(c: Constants, gs: list[Group]) -> float:
    sets: dict[str, list[np.ndarray]] = {}
    for g in gs:
        if g.fitted:
            sets.setdefault(_SET_OF(g.name), []).append(g.errors(c.system()))
    return float(np.mean([np.mean(np.concatenate(e) ** 2) for e in sets.values()]))


GRID = {"matmul": (0.65, 0.7, 0.75, 0.8), "launch_us": (40.0, 55.0, 70.0),
        "gemm_half_dim": (64.0, 128.0, 192.0, 256.0), "intra_latency_us": (4.0, 8.0, 12.0, 16.0)}


def fit(gs: list[Group], start: Constants | None = None, rounds: int = 2) -> Constants:
    """The best point of a coarse grid (`GRID`, when no `start` is given), then coordinate-wise
    golden-section search from it: the loss is flat along some directions and has more than
    one valley, so a local search alone depends on where it starts."""
    if start is None:
        points = (Constants(*x) for x in itertools.product(*GRID.values()))
        start = min(points, key=lambda x: loss(x, gs))
    c = start
    for _ in range(rounds):
        for name, (lo, hi, tol) in Constants.BOUNDS.items():
            best = _golden_min(lambda x, n=name, c=c: loss(dataclasses.replace(c, **{n: x}), gs),
                               lo, hi, tol)
            c = dataclasses.replace(c, **{name: best})
    return c


def table(c: Constants, gs: list[Group], out_of_sample: bool = True) -> list[dict]:
    """Per group: MAPE and signed bias in sample (with `c`) and leave-one-group-out."""
    rows = []
    for g in gs:
        e = np.expm1(g.errors(c.system()))
        row = {"group": g.name, "mape": float(np.mean(np.abs(e))), "bias": float(np.mean(e)),
               "fitted": g.fitted, "runs": len(e)}
        if out_of_sample:
            rest = [h for h in gs if h is not g]
            held = np.expm1(g.errors(fit(rest, c, rounds=1).system())) if g.fitted else e
            row |= {"logo_mape": float(np.mean(np.abs(held))), "logo_bias": float(np.mean(held))}
        rows.append(row)
    return rows + _overall(rows)


def _overall(rows: list[dict]) -> list[dict]:
    """Each fitted set with more than one group as a whole: its groups' means weighted by
    their runs (the same numbers as over the set's runs at once)."""
    out = []
    for name in dict.fromkeys(_SET_OF(r["group"]) for r in rows if r["fitted"]):
        part = [r for r in rows if r["fitted"] and _SET_OF(r["group"]) == name]
        if len(part) < 2:
            continue
        n = sum(r["runs"] for r in part)
        row = {"group": f"{name} overall ({n} runs)", "fitted": True, "runs": n}
        for key in ("mape", "bias", "logo_mape", "logo_bias"):
            if key in part[0]:
                row[key] = sum(r[key] * r["runs"] for r in part) / n
        out.append(row)
    return out


def print_table(c: Constants, rows: list[dict]) -> None:
    print(f"constants: matmul {c.matmul:.3f}, launch {c.launch_us:.1f} us, GEMM half-rate "
          f"dimension {c.gemm_half_dim:.0f}, NVSwitch step latency {c.intra_latency_us:.1f} us")
    logo = "logo_mape" in rows[0]
    print(f"{'group':<28} {'MAPE':>7} {'bias':>7}" + (f" {'LOGO MAPE':>10} {'LOGO bias':>10}"
                                                      if logo else ""))
    for r in rows:
        line = f"{r['group']:<28} {r['mape']:>7.1%} {r['bias']:>+7.1%}"
        if not r.get("fitted", True):
            line += "   (held out: never fitted)"
            print(line)
            continue
        if logo:
            line += f" {r['logo_mape']:>10.1%} {r['logo_bias']:>+10.1%}"
        print(line)


def main() -> None:
    gs = groups()
    c = fit(gs)
    print_table(c, table(c, gs))


if __name__ == "__main__":
    main()
