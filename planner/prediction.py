"""What a plan is predicted to do: one type for every model family, and the CNN's prediction.

The keys are the same for every family; a family leaves out (None) what it does not model:
a transformer has no single-device speed-up, a CNN no tokens or MFU here. `predict` goes
straight down: a plan in, `DataParallelModel`'s expressions evaluated at its (n, g, b), a
`Prediction` out. The transformer's prediction is `planner.search.hybrid.predict`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.errors import SpecError
from planner.plan import Plan
from planner.vocabulary import Collective

if TYPE_CHECKING:
    from planner.expr.cnn import DataParallelModel


@dataclass(frozen=True)
class Prediction:
    iteration_time_s: float
    samples_per_s: float
    compute_time_s: float
    exposed_communication_time_s: float  # communication the compute does not hide
    optimizer_time_s: float
    time_breakdown: dict  # the parts of the iteration time: compute, *_comm*, optimizer, ...
    memory_bytes_per_device: float
    memory_breakdown: dict  # weights, gradients, optimizer, activations
    memory_capacity_bytes: float
    fits_memory: bool
    communication_time_s: float | None = None  # all of it, hidden or not
    tokens_per_s: float | None = None
    speedup: float | None = None  # over one device running the whole global batch
    efficiency: float | None = None  # speed-up / devices
    model_flops_per_iteration: float | None = None
    hardware_flops_per_iteration: float | None = None  # with recomputation
    tflops_per_device_model: float | None = None
    tflops_per_device_hardware: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    # CNN splits (per-layer modes, pipeline stages)
    activation_communication_time_s: float | None = None
    bubble_fraction: float | None = None
    stage_time_s: float | None = None
    p2p_time_s: float | None = None
    # transformers: an evaluation step, the forward of one global batch through the plan
    # (nothing saved, no backward, no gradient sync or optimizer step)
    forward_time_s: float | None = None
    # transformers: where the measured time likely lies, from comparable calibration runs'
    # residuals (`planner.bands.Band.to_json`: low_s, high_s, runs, group, note)
    time_band: dict | None = None
    # CNNs with the asynchronous parameter server: the protocol and its staleness
    asynchrony: dict | None = None

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples_per_s

    @property
    def fits_in_memory(self) -> bool:
        return self.fits_memory

    def to_json(self) -> dict:
        """Every key the family fills, with the older names kept: `throughput_samples_per_s`
        (= samples_per_s) and `fits_in_memory` (= fits_memory)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        out["throughput_samples_per_s"] = self.samples_per_s
        out["fits_in_memory"] = self.fits_memory
        return out

    def __getitem__(self, key: str):
        """Read as the JSON document (`pred["iteration_time_s"]`): kept for code written
        against the old dict predictions; prefer attributes."""
        doc = self.to_json()
        if key not in doc:
            raise KeyError(key)
        return doc[key]


def Config(nodes: int, devices_per_node: int, global_batch: int,  # noqa: N802
           collective: Collective | str, overlap: bool = True) -> Plan:
    """A data-parallel `Plan` (the name of the CNN's former configuration type)."""
    return Plan.data_parallel(nodes, devices_per_node, global_batch, collective, overlap)


def predict(model: DataParallelModel, plan: Plan) -> Prediction:
    if plan.tp != 1 or plan.pp != 1:
        raise SpecError(f"tp: tp({plan.tp}) x pp({plan.pp}): the data-parallel CNN model "
                        "predicts tp = pp = 1 plans (solve --strategy hybrid or pipeline splits)")
    n, g, b = plan.nodes, plan.devices_per_node, plan.local_batch
    col, ov = plan.collective or Collective.ring, plan.overlap
    if g > model.system.devices_per_node:
        raise SpecError(
            f"devices_per_node: {g} exceeds the {model.system.devices_per_node} devices per node "
            f"of '{model.system.name}'"
        )
    val = lambda name: float(model.numeric(name, col, ov)(n, g, b))  # noqa: E731
    if (plan.softsync or None) != model.options.softsync:
        raise SpecError(f"softsync: the plan's {plan.softsync} is not the model's "
                        f"{model.options.softsync} (build it with softsync=)")
    t_iter = val("iteration")
    # Speed-up against one device processing the whole global batch without communication.
    t_one = float(model.numeric("compute")(1, 1, plan.global_batch)) + val("optimizer")
    speedup = t_one / t_iter
    mem = {k: val(f"memory.{k}") for k in model.memory}
    capacity = model.system.device.usable_memory_bytes
    compute, exposed, optimizer = val("compute"), val("exposed"), val("optimizer")
    breakdown = {"compute": compute, "dp_comm_exposed": exposed, "optimizer": optimizer}
    asynchrony = None
    if model.asynchronous(col):  # the round: the slowest resource; the servers step
        parts = {k: val(f"async.{k}") for k in ("learner", "server_links", "server_updates")}
        optimizer = 0.0
        breakdown = {"compute": compute, "comm_exposed": exposed, "optimizer": optimizer}
        asynchrony = asynchrony_doc(plan.softsync, plan.devices, parts)
    return Prediction(
        iteration_time_s=t_iter,
        samples_per_s=plan.global_batch / t_iter,
        compute_time_s=compute,
        communication_time_s=val("comm"),
        exposed_communication_time_s=exposed,
        optimizer_time_s=optimizer,
        time_breakdown=breakdown,
        memory_bytes_per_device=sum(mem.values()),
        memory_breakdown=mem,
        memory_capacity_bytes=capacity,
        fits_memory=sum(mem.values()) <= capacity,
        speedup=speedup,
        efficiency=speedup / plan.devices,
        asynchrony=asynchrony,
    )


# Zhang, Gupta, Lian and Liu, "Staleness-aware async-SGD for distributed deep learning", IJCAI
# 2016 (the n-softsync protocol of Gupta, Zhang and Milthorpe, ICDM 2016, "Rudra")
SOFTSYNC_SOURCE = ("Zhang, Gupta, Lian, Liu, Staleness-aware async-SGD, IJCAI 2016: n-softsync "
                   "(sec. 2.2), staleness about n and at most 2n (sec. 2.4), learning rate "
                   "alpha0 / staleness (sec. 4.3)")


def asynchrony_doc(softsync: int, learners: int, parts: dict) -> dict:
    """What the n-softsync parameter server does with `learners` learners: the server updates
    after every learners / n gradients (n updates per round of one gradient per learner); a
    gradient is about n updates stale on average and under 2 n with probability above
    0.9999 (measured with 30 learners, Zhang et al. 2016 sec. 2.4), so the learning rate is
    divided by each gradient's staleness (sec. 4.3): a round's n updates, each of learners / n
    gradients about n updates stale, then move the weights as one synchronous step of the
    same global batch, and the samples to a target are the synchronous run's (their
    prescription keeps mini-batch x learners fixed). The
    round's bottleneck: the learner's compute and own exchange, the servers' links, or the
    servers' updates."""
    bottleneck = max(parts, key=parts.get)
    return {"protocol": "n-softsync", "softsync": softsync, "learners": learners,
            "gradients_per_update": learners / softsync, "updates_per_round": softsync,
            "mean_staleness": softsync, "max_staleness": 2 * softsync,
            "learning_rate": "alpha0 / staleness of each gradient",
            **{f"{k}_s": v for k, v in parts.items()},
            "bottleneck": bottleneck.replace("_", " "), "source": SOFTSYNC_SOURCE}
