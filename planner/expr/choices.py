"""The categorical choices of a transformer plan as the cost model takes them (`Choices`),
and the cost model's names for its outputs and encodings: a leaf module (no SymPy), so that a
plan priced by a cached program (`planner.cost.programs`) never loads the expressions."""

from __future__ import annotations

from dataclasses import dataclass

from planner import switches

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe")
# what `planner.expr.transformer.TransformerExpressions.terms` computes, in this order
OUTPUTS = ("time", "compute", "tp_comm", "cp_comm", "ep_comm", "offload", "pp_bubble", "pp_comm",
           "dp_comm_exposed", "optimizer", "host_sync", "memory", "weights", "gradients", "optimizer_state",
           "activations", "memory_zero1", "forward")
# one stage's parts per layer (`TransformerExpressions.stage_parts`): what a pipeline whose
# stages run on different devices is assembled from (`planner.cost.pools`)
STAGE_OUTPUTS = ("layer_time", "logit_time", "layer_backward", "layer_params",
                 "embedding_params", "head_params", "single_params", "layer_activations",
                 "transient_activations", "logit_activations", "send_bytes", "regather",
                 "grad_bytes", "weight_bytes", "state_bytes", "optimizer_per_param", "host_sync",
                 "weight_copy_bytes", "mtp_params")


@dataclass(frozen=True)
@switches.add_fields
class Choices:
    """The categorical choices of a plan: each combination has its own expressions. The
    per-row ones first (recompute, sequence parallelism, ZeRO, schedule, partial), then every
    switch of `planner.switches` by its own name (its physics where the expressions read it)."""

    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    schedule: str = "1f1b"
    # with recompute "full": only the first n_r layers of each pipeline chunk (the plan
    # symbol) are recomputed, the others keep their activations (Megatron-LM
    # --recompute-method block --recompute-num-layers N; torchtitan's every-k-th-layer
    # selective AC); False: every layer
    partial: bool = False

    def __post_init__(self):
        set_ = object.__setattr__
        for s in switches.SWITCHES:  # plain values: numpy scalars in, unset counts None
            value = s.cost(getattr(self, s.name))
            if s.with_zero and not self.zero:  # no ZeRO state to shard or gather
                value = s.cost(s.default)
            if s.argument and value is not None:  # its value is a plan argument: on or off
                value = True
            set_(self, s.name, value)
        set_(self, "optimizer", self.optimizer or "adam")  # a transformer's default

    @property
    def uneven(self) -> bool:
        return bool(self.first_stage_layers or self.last_stage_layers)
