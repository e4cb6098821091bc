"""Error bands: how far a prediction may be from what such a run achieves, read from the
residuals of comparable calibration runs.

Every calibration run the planner can price leaves a residual (`planner/calibration/
residuals.csv`): leave-one-group-out where constants were fitted to its group (vTrain, SC21:
predicted with constants refitted without the group; MLPerf Training on Blackwell and AMD
CDNA, whose GEMM share `planner.fit_mlperf` fits: predicted with the share refitted without the
run's benchmark), held out otherwise (BERT-Large, MLPerf Training on Hopper: nothing fitted to
them). A prediction's band is the 10th-90th percentile of the
measured / predicted ratio over the most specific group of comparable runs with at least
`MIN_RUNS` of them: system family x precision x model size x scale (devices), then without the
scale, then family x precision, then family. Mixture-of-experts plans only borrow from
mixture-of-experts runs (a dense model's residuals say nothing of routing, permutation or
dispatch), plans that shard the weights
(ZeRO-3 / FSDP, gathered in every micro-batch) only from such runs, and plans that shard the
gradients (ZeRO-2, whose framework paths hold and reduce them otherwise than the distributed
optimizer of every calibration run) only from such runs, and LoRA plans through a pipeline
only from such runs (every LoRA run in the data is pp 1): with none in the data their band
says "not covered" rather than something it does not know. So does a plan whose context
parallelism goes beyond every calibration run of its system family (`covered_cp`: Hopper's
runs reach cp 2, Blackwell's cp 8): the ring's exposed steps and their merges at that degree
are terms no measurement of the family checks, and where the data has been checked beyond its
own range the model erred both ways (LoRA at cp 4 on B200 and MI300X 16-36 % too fast, at cp 8
on NVL72 9-16 % too slow). And so does a mixture-of-experts plan whose expert parallelism goes
beyond every MoE run of its family (`covered_ep`: Blackwell's reach ep 32): the all-to-all
over more ranks and the grouped GEMMs over fewer experts a rank are what the search trades
for memory there, and the model is most often too fast on MoE runs already (DeepSeek-V3 on
GB200, the search's pick at ep 64 promising up to 95 % more than NVIDIA's ep 32 runs reach).
And so does a plan that fills more of a device's usable memory, by the model, than any run of
its family (the fullest H100 / H200 run 94 %, Blackwell's 98 %, AMD's 71 %): every run fits,
so none tells how short the model's memory is near the top, and where a vendor's choice does
tell, it is short (AMD's MI300X recipe recomputes a quarter of the layers of a plan the model
fits without at 81 %); a search packing a device fuller than that walks into the corner
where the model is most optimistic that a plan fits.

    python -m planner.bands        # rewrite residuals.csv (about three minutes, the MLPerf
                                   # refits included)
"""

from __future__ import annotations

import csv
import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from planner.spec.hardware import Precision

CSV = Path(__file__).parent / "calibration" / "residuals.csv"
MIN_RUNS = 4
QUANTILES = (0.10, 0.90)
FIELDS = ("source", "group", "family", "precision", "size", "scale", "moe", "sharding",
          "lora_pipeline", "cp", "ep", "full", "measured_over_predicted")
# features a band never generalises over: a plan of another kind borrows nothing
STRICT = ("moe", "sharding", "lora_pipeline")


def family(device_name: str) -> str:
    """The system family a device belongs to (runs of one family share kernels and fabric)."""
    name = device_name.lower()
    for key, fam in (("a100", "A100"), ("h100", "H100 / H200"), ("h200", "H100 / H200"),
                     ("b200", "Blackwell"), ("b300", "Blackwell"), ("gb200", "Blackwell"),
                     ("gb300", "Blackwell"), ("mi3", "AMD CDNA")):
        if key in name:
            return fam
    return "other"


def precision_class(p: Precision) -> str:
    return {"fp8": "fp8", "mxfp8": "fp8", "nvfp4": "fp4", "fp4": "fp4"}.get(p.value, "16-bit+")


def size_class(params: int) -> str:
    return "under 20B" if params < 20e9 else "20B and over"


def scale_class(devices: int) -> str:
    return ("up to 64 devices" if devices <= 64 else "65-1,024 devices" if devices <= 1024
            else "over 1,024 devices")


def features(model, device_name: str, precision: Precision, zero: int = 0,
             devices: int = 1, replicas: int | None = None, hsdp: bool = False,
             lora_pipeline: bool = False, cp: int = 1, ep: int = 1,
             full: float | None = None) -> dict:
    """The features a band is looked up by, for a transformer `model` on `devices` devices with
    a plan of ZeRO stage `zero` (3: the weights sharded and gathered in every micro-batch; 2:
    the gradients sharded, which no calibration run does either: every one holds its whole
    gradient buffer, Megatron-LM's distributed optimizer being ZeRO 1) over `replicas` ranks
    holding the same weights (one: nothing is sharded, whatever the stage); `hsdp`: the state
    sharded over groups of them, the groups replicating (no calibration run does);
    `lora_pipeline`: LoRA fine-tuning through a pipeline (every LoRA run in the data is pp 1:
    its backward, without the base weights' gradient GEMMs, is half as long against the
    same bubble and sends, and no run measures the two together); `cp`: the context-parallel
    degree (covered up to the family's `covered_cp`); `ep`: the expert-parallel degree (a
    mixture-of-experts plan is covered up to the family's `covered_ep`); `full`: the share of
    a device's usable memory the plan fills by the model (covered up to the fullest run of
    the family, `covered(device, "full")`; None: not judged)."""
    sharded = replicas is None or replicas > 1
    if hsdp and sharded:
        return {**features(model, device_name, precision, 0, devices, 1,
                           lora_pipeline=lora_pipeline, cp=cp, ep=ep, full=full),
                "sharding": "hybrid sharded"}
    return {"family": family(device_name), "precision": precision_class(precision),
            "size": size_class(model.params()), "scale": scale_class(devices),
            "moe": "moe" if model.experts > 1 else "dense",
            "sharding": SHARDING.get(zero, "weights whole") if sharded else "weights whole",
            "lora_pipeline": "yes" if lora_pipeline else "no", "cp": int(cp), "ep": int(ep),
            "full": None if full is None else float(full)}


SHARDING = {3: "weights sharded", 2: "gradients sharded"}


def plan_features(model, device_name: str, precision: Precision, plan, **override) -> dict:
    """`features` of a transformer `plan` (a `planner.plan.Plan`) on `device_name`, with any
    feature replaced by `override` (`ep=1`: the plan as if its experts were not spread)."""
    kw = {"zero": plan.zero, "devices": plan.devices, "replicas": plan.dp * plan.cp,
          "hsdp": plan.dp_shard is not None and plan.dp_shard < plan.dp,
          "lora_pipeline": lora_pipeline(plan), "cp": plan.cp, "ep": plan.ep} | override
    return features(model, device_name, precision, **kw)


def lora_pipeline(plan) -> bool:
    """Whether `plan` (a `planner.plan.Plan`) fine-tunes with LoRA through a pipeline, which
    no calibration run does (`features`)."""
    return bool(plan.lora_rank) and plan.pp > 1


@dataclasses.dataclass(frozen=True)
class Band:
    """The measured time is likely (10th-90th percentile of comparable runs) between `low` and
    `high` times the predicted one; `runs` comparable runs in `group` (None: not covered)."""

    low: float | None
    high: float | None
    runs: int
    group: str | None
    note: str

    @property
    def spread(self) -> float | None:
        """high / low - 1: how much slower than another a plan may be predicted and still lie
        within its band (None where not covered)."""
        return None if self.low is None else self.high / self.low - 1

    def to_json(self, predicted_s: float) -> dict:
        out = {"runs": self.runs, "group": self.group, "note": self.note}
        if self.low is not None:
            out |= {"low_s": predicted_s * self.low, "high_s": predicted_s * self.high,
                    "low_ratio": self.low, "high_ratio": self.high}
        return out


def residuals(path: Path = CSV) -> tuple[dict, ...]:
    """The residual rows (read once a process: `cache_clear` forgets them)."""
    return _read(path)


@functools.lru_cache(maxsize=1)
def _read(path: Path) -> tuple[dict, ...]:
    with open(path, newline="", encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))


FEATURES = ("family", "precision", "size", "scale", "moe", "sharding",
            "lora_pipeline", "cp", "ep", "full")  # as `features` gives


def band(feat: dict, rows=None) -> Band:
    """The band of the most specific group of comparable runs (`feat` from `features`; the
    shipped residuals unless `rows`). The memory is judged last, on a plan the data otherwise
    covers (a ZeRO-2 or LoRA-pipeline plan is said to be that first)."""
    # (shipped: a handful of feature combinations, all but the memory's float, each looked
    # up once per process)
    out = (_shipped(tuple(feat[k] for k in FEATURES if k != "full")) if rows is None
           else _band(feat, rows))
    if out.low is not None and (beyond := _beyond(feat, rows, ("full",))) is not None:
        return beyond
    return out


def cache_clear() -> None:
    """Forget the residuals read, and every band and reach from them (after they change)."""
    for cached in (_read, _shipped, _covered):
        cached.cache_clear()


@functools.lru_cache(maxsize=512)
def _shipped(values: tuple[str, ...]) -> Band:
    keys = [k for k in FEATURES if k != "full"]
    return _band(dict(zip(keys, values, strict=True)), residuals())


@dataclasses.dataclass(frozen=True)
class Reach:
    """A feature a plan is covered up to: the most its family's calibration runs hold (for
    `moe_only`, its mixture-of-experts runs, where it has the MIN_RUNS a band takes); beyond
    that what the feature prices is checked by no measurement. `beyond`: the "not covered"
    note's words, formatted with the family, the reach and the plan's value; `parse`: a
    residual row's cell (None: the row does not say)."""

    beyond: str
    moe_only: bool
    parse: Callable[[str | None], float | None]


def _degree(cell: str | None) -> int:
    return int(cell or 1)  # rows written before a degree's column ran degree 1


# what each feature's reach covers, and why a plan beyond it is not covered
REACH = {
    "cp": Reach("no calibration run of context parallelism beyond cp {most} on {family} "
                "systems (this plan: cp {value}); the prediction rests on terms no "
                "measurement checks", False, _degree),
    "ep": Reach("no calibration run of expert parallelism beyond ep {most} on {family} "
                "systems (this plan: ep {value}); the all-to-all over that many ranks and the "
                "experts' GEMMs at that few experts a rank rest on terms no measurement "
                "checks", True, _degree),
    # the memory a plan fills by the model: every run of the data fitted, but none fuller
    # than this tells whether the model's memory is short near the top (the allocator's
    # fragmentation, communicator and workspace buffers are not in it: AMD recomputes 21 of
    # Llama 2 70B LoRA's 80 layers on the 192 GB MI300X where the model has the plan fit
    # without at 81 %, the same recipe on the 256 GB MI325X recomputing none)
    "full": Reach("no calibration run filling a device beyond {most:.1%} of its usable memory "
                  "by this model on {family} systems (this plan: {value:.1%}); whether it fits "
                  "rests on memory terms no run checks (allocator fragmentation, communicator "
                  "buffers)", False, lambda cell: float(cell) if cell else None),
}


def covered_cp(device_name: str, rows=None) -> int | None:
    """The highest context-parallel degree a calibration run of the device's family ran
    (the shipped residuals unless `rows`; None where the family has no run, whose plans are
    not covered at any degree): a plan beyond it is not covered (`band`)."""
    return covered(device_name, "cp", rows)


def covered_ep(device_name: str, rows=None) -> int | None:
    """The highest expert-parallel degree a mixture-of-experts calibration run of the
    device's family ran (None where it has fewer such runs than a band takes): a MoE plan
    beyond it is not covered (`band`)."""
    return covered(device_name, "ep", rows)


def covered(device_name: str, degree: str, rows=None) -> float | None:
    """The most of `degree` (a key of `REACH`: "cp", "ep", "full") the device family's runs
    cover (the shipped residuals unless `rows`; None: no bound the data gives)."""
    fam = family(device_name)
    return _covered(fam, degree) if rows is None else _most(fam, degree, rows)


@functools.lru_cache(maxsize=32)
def _covered(fam: str, degree: str) -> float | None:
    return _most(fam, degree, residuals())


def _most(fam: str, degree: str, rows) -> float | None:
    reach = REACH[degree]
    seen = [v for r in rows if r.get("family") == fam
            and (not reach.moe_only or r.get("moe") == "moe")
            and (v := reach.parse(r.get(degree))) is not None]
    if reach.moe_only and len(seen) < MIN_RUNS:
        return None
    return max(seen, default=None)


def _beyond(feat: dict, rows, degrees: tuple[str, ...]) -> Band | None:
    """The "not covered" band of the first of `degrees` (keys of `REACH`) `feat` goes beyond
    its family's reach in, or None (`rows`: None for the shipped residuals)."""
    for degree in degrees:
        reach, value = REACH[degree], feat.get(degree)
        if value is None or reach.moe_only and feat["moe"] != "moe":
            continue
        most = (_covered(feat["family"], degree) if rows is None
                else _most(feat["family"], degree, rows))
        if most is not None and value > most:  # (a family with no run: `_band`'s end)
            return Band(None, None, 0, None, "not covered: " + reach.beyond.format(
                family=feat["family"], most=most, value=value))
    return None


def _band(feat: dict, rows) -> Band:
    levels = (("family", "precision", "size", "scale"), ("family", "precision", "size"),
              ("family", "precision"), ("family",))
    if (out := _beyond(feat, rows, ("cp", "ep"))) is not None:
        return out
    for keys in levels:
        match = [r for r in rows if all(r.get(k) == feat[k] for k in (*STRICT, *keys))]
        if len(match) >= MIN_RUNS:
            ratio = np.array([float(r["measured_over_predicted"]) for r in match])
            low, high = np.quantile(ratio, QUANTILES)
            # (a plan that is no LoRA pipeline says nothing of it)
            group = ", ".join(feat[k] for k in (*keys, *STRICT)
                              if (k, feat[k]) != ("lora_pipeline", "no"))
            sources = sorted({r["source"] for r in match})
            return Band(float(low), float(high), len(match), group,
                        f"10th-90th percentile of measured / predicted over {len(match)} "
                        f"runs ({group}; {', '.join(sources)})")
    # what no run of the family holds: a MoE model only where the family has too few MoE
    # runs (on Blackwell the reason is the plan's sharding or pipeline)
    moe_runs = sum(r.get("moe") == "moe" and r.get("family") == feat["family"] for r in rows)
    what = ("a mixture-of-experts model" if feat["moe"] == "moe" and moe_runs < MIN_RUNS
            else "LoRA fine-tuning through a pipeline (every LoRA run is pp 1)"
            if feat["lora_pipeline"] == "yes"
            else "a plan with sharded weights (ZeRO-3 / FSDP)"
            if feat["sharding"] == "weights sharded"
            else "a plan with sharded gradients (ZeRO-2: Megatron-FSDP optim_grads, DeepSpeed "
                 "stage 2)" if feat["sharding"] == "gradients sharded"
            else "a plan with hybrid sharding (HSDP: ZeRO inside groups of replicas)"
            if feat["sharding"] == "hybrid sharded"
            else f"{feat['family']} systems")
    runs = "no calibration run"
    if what == "a mixture-of-experts model" and moe_runs:  # some, too few for a band
        runs = f"{moe_runs} calibration runs (a band takes {MIN_RUNS})"
        what += f" on {feat['family']} systems"
    return Band(None, None, 0, None,
                f"not covered: {runs} of {what}; the prediction rests on terms no "
                "measurement checks")


# --- writing the residuals ------------------------------------------------------------------


def _rows() -> list[dict]:
    """Every priced calibration run with its out-of-sample prediction."""
    from planner import fit_mlperf, mlperf
    from planner import fit_transformer as ft
    from planner.catalog import load_system

    out = []
    c, gs = ft.Constants.shipped(), ft.groups()
    # (the A100's runs are priced without their memory: vTrain's in arrays, SC21's and
    # BERT's micro-batch the search's own, so they give the family no memory reach)
    a100 = {"family": "A100", "precision": "16-bit+", "moe": "dense",
            "sharding": "weights whole", "lora_pipeline": "no", "cp": 1, "ep": 1, "full": None}
    for g in gs:
        system = ft.fit([h for h in gs if h is not g], c, rounds=1).system() if g.fitted \
            else c.system()
        # errors are log(predicted / measured) per run, in the group's own order
        errors = np.asarray(g.errors(system), dtype=float)
        assert len(errors) == len(g.devices), g.name
        for e, devices in zip(errors, g.devices, strict=True):
            # SC21 without a pipeline is its 1.7B-18.4B models, with one 39B-1T
            size = "20B and over" if g.name.startswith("SC21 pp>1") else "under 20B"
            out.append({"source": g.name.split(" (")[0].split(" ")[0], "group": g.name,
                        **a100, "size": size, "scale": scale_class(devices),
                        "measured_over_predicted": float(np.exp(-e))})
    held = fit_mlperf.held_out_predictions()
    for r in mlperf.rows():
        if r["error"] is None:
            continue
        run = r["run"]
        model = mlperf.benchmark_model(run)
        plan = mlperf.plan_of(run)
        feat = features(model, load_system(run.system).device.name, run.precision, plan.zero,
                        plan.devices, lora_pipeline=lora_pipeline(plan), cp=plan.cp,
                        ep=plan.ep, full=r["full"])
        out.append({"source": "MLPerf", "group": run.group, **feat,
                    "measured_over_predicted": run.measured_s / held.get(
                        fit_mlperf.key(run), r["predicted_s"])})
    return out


def main() -> None:
    rows = _rows()
    with open(CSV, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k in FIELDS})  # (the memory's share exact: a reach)
    cache_clear()  # this process reads the new rows from here on
    print(f"wrote {CSV} ({len(rows)} runs)")


if __name__ == "__main__":
    main()
