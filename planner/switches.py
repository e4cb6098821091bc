"""Every plan switch, declared once: the choices a plan makes beyond its split (tp, cp, ep, pp,
dp, micro-batch, interleave, recompute, ZeRO, schedule), each with its name, default, values,
the families it applies to, the upstream flag it mirrors and how `solve` treats it.

From this table come the fields of `planner.plan.Plan`, of the search request
(`planner.search.hybrid_space.Search`) and of the cost model's `planner.expr.choices.Choices`;
the command line's options (`planner.cli.options`), the Python API's and the JSONL keys; the
JSON schema of a plan; the refusals of the closed-form limits; the options line of the text
report; the launchers' defaults; and the switch table of docs/switches.md. The cost
expressions read a switch by its own name (`choices.tp_overlap`). Adding a switch is one entry
here, its physics and its tests.

Each switch also names the compute precisions it needs (the refusal is one line from its
entry) and whether a pipeline across pools of several node kinds prices it.

A leaf module: no SymPy, no click (the command line turns `kind`, `low` and `high` into its
parameter types).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from planner.errors import SpecError
from planner.vocabulary import TRANSFORMER_OPTIMIZERS, Kernels

# how a framework's launcher form treats a switch set away from its default (`Switch.launch`):
WRITES = "writes"  # the form writes it (its code refuses it where a condition fails)
# the framework always runs a bool switch away from planner's default, with no flag to change
# it: a plan for that form is priced so (`framework_pins`) and the default refused there
AS_DEFAULT = "always runs it"
MODEL_CODE = "model code"  # the framework leaves it to the training script's model code
# any other text: the form refuses the plan, with that reason; a form not named refuses too
FRAMEWORK_FORMS = ("megatron", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class Switch:
    """One plan switch. `kind`: bool, int (a positive count, None when unset), float, an Enum
    class or a tuple of allowed strings (None when unset)."""

    name: str  # the Plan field, API keyword, JSON / JSONL key and cost-model name
    default: Any
    what: str  # what it sets, one line (--help and the docs table)
    upstream: str  # the upstream flags / keys it mirrors
    kind: Any = bool
    low: float | None = None
    high: float | None = None
    solve: str = "pinned only"  # how `solve` treats it (the search does not choose it)
    families: tuple[str, ...] = ("transformer",)
    limits: bool = False  # the closed-form limits are derived with it (else refused)
    off_flag: str | None = None  # a bool's spelling when off (default: --no-<flag>)
    # the report's options fragment for this value of the plan (None: nothing to say)
    label: Callable[[Any, Any], str | None] = lambda value, plan: None
    # the cost model keeps it only with a ZeRO stage (it shards or gathers ZeRO's state)
    with_zero: bool = False
    # per framework form (FRAMEWORK_FORMS): WRITES, AS_DEFAULT, MODEL_CODE or why it refuses
    launch: dict[str, str] = dataclasses.field(default_factory=dict)
    # values a launcher form treats as the default (the optimizer: unset is adam there)
    launch_default: tuple = ()
    # the families whose plans the framework forms refuse for it (None: `families`)
    launch_families: tuple[str, ...] | None = None
    # the Megatron-LM flags written when a bool switch is away from its default (checked
    # against arguments.py at the commit planner.launch.megatron_lm names)
    megatron_flags: tuple[str, ...] = ()
    # `solve` chooses it per plan when the request leaves it unset (a bool); `applies`: where
    # it does anything, (a search row's structure column by name, its choice column by name)
    # -> bool array (on elsewhere it prices as off, so the search keeps it off there)
    # (the rules of `planner.rules` keyed by its name hold on every row it is on);
    # `tried_for(model, request)`: where it is tried at all (None: every model of its
    # families; a switch that does nothing there is not priced both ways)
    searched: bool = False
    applies: Callable[[Callable, Callable], Any] | None = None
    tried_for: Callable[[Any, Any], bool] | None = None
    # the models that run it on wherever it `applies` (the search keeps it on there; a plan
    # or a request with it off there is refused by its rule in `planner.rules`)
    required_for: Callable[[Any], bool] | None = None
    # the compute precisions it needs when on (None: any) and why, one line for the refusal
    precisions: tuple[str, ...] | None = None
    needs: str = ""
    # a pipeline across pools of several node kinds prices it (`planner.search.pools`)
    mixed: bool = False
    # switches it is not priced with: a plan with both on is refused (`check_exclusions`),
    # and the search keeps it off where a request pins one of them on
    excluded_by: tuple[str, ...] = ()
    # a count the cost model takes as a plan argument (its expressions are the same for every
    # value, so one program prices them all): a choice holds only whether it is set
    argument: bool = False
    # per framework form: (where, a predicate on the plan's ZeRO stage and precision) the form
    # runs a bool switch away from its default with no flag to change it, as `AS_DEFAULT`
    # does everywhere (`runs`)
    runs_where: dict[str, tuple[str, Callable[[int, str], bool]]] = dataclasses.field(
        default_factory=dict)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def spelled(self, on: bool) -> str:
        """A bool switch's flag for `on` or off."""
        return self.flag if on else self.off_flag or "--no-" + self.flag[2:]

    @property
    def optional(self) -> bool:
        """Whether unset (None) is a value of its own (a count not given, a family default)."""
        return self.default is None

    def annotation(self) -> str:
        kind = self.kind.__name__ if isinstance(self.kind, type) else "str"
        return f"{kind} | None" if self.optional else kind

    def check(self, value):
        """`value` as the plan holds it, or a one-line `SpecError` naming the switch."""
        if value is None and self.optional:
            return None
        if self.kind is bool:
            if isinstance(value, bool) or type(value).__name__ == "bool_":
                return bool(value)
            raise SpecError(f"{self.name}: must be true or false, got {value!r}")
        if self.kind is int:
            if (isinstance(value, bool) or not isinstance(value, int)
                    or not self.low <= value <= self.high):
                raise SpecError(f"{self.name}: must be a "
                                f"{'non-negative' if self.low == 0 else 'positive'} integer"
                                f"{f' up to {self.high:,}' if self.high else ''}, got {value!r}")
            return value
        if self.kind is float:
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or not self.low <= value <= self.high):
                raise SpecError(f"{self.name}: must be a number in [{self.low:g}, "
                                f"{self.high:g}], got {value!r}")
            return value
        allowed = self.values
        if isinstance(self.kind, type) and issubclass(self.kind, Enum):
            if isinstance(value, self.kind):
                return value
            if value in allowed:
                return self.kind(value)
        elif value in allowed:
            return value
        raise SpecError(f"{self.name}: unknown value {value!r} (allowed: {', '.join(allowed)})")

    @property
    def values(self) -> tuple[str, ...]:
        """The allowed strings of a choice."""
        if isinstance(self.kind, type) and issubclass(self.kind, Enum):
            return tuple(m.value for m in self.kind)
        return tuple(self.kind)

    def cost(self, value):
        """`value` as the cost model takes it: numpy scalars made plain, unset counts None."""
        if self.kind is bool:
            return bool(value)
        if self.kind is int:
            return int(value) if value else None
        if self.kind is float:
            return float(value)
        if value is None:
            return None
        return self.kind(value) if isinstance(self.kind, type) else str(value)

    def json(self, value):
        return value.value if isinstance(value, Enum) else value


def _offers_cp(model, request) -> bool:
    """Whether a search request offers a context-parallel degree beyond 1 for `model`."""
    from planner.search.hybrid_space import cps  # the search's own list; a leaf module here

    return max(cps(model, request)) > 1


def _on(text: str) -> Callable[[Any, Any], str | None]:
    return lambda value, plan: text if value else None


def _on_off(text: str) -> Callable[[Any, Any], str | None]:
    return lambda value, plan: f"{text} {'on' if value else 'off'}"


# the recompute-module switches: Megatron-LM's module name, what each frees and runs again
RECOMPUTE_MODULES = {
    "recompute_norms": ("layernorm", "the attention and FFN norms' outputs freed after their "
                        "GEMMs read them, the norms run again in the backward"),
    "recompute_moe_act": ("moe_act", "MoE: the routed experts' activation output (fc2's "
                          "input) freed, the activation run again in the backward"),
    "recompute_mla_up": ("mla_up_proj", "MLA: the up projections' Q, K and V freed after the "
                         "attention, the up projections and RoPE run again in the backward"),
}
# the models a recompute module needs, as Megatron-LM refuses it otherwise
# (transformer_config.py at d98e8a6: moe_act only with grouped-GEMM experts, mla_up_proj only
# with multi-latent attention): (whether the model has it, what the refusal says of the model)
RECOMPUTE_MODULE_NEEDS = {
    "recompute_moe_act": (lambda m: m.experts > 1,
                          "is a dense model (no experts' activation to recompute)"),
    "recompute_mla_up": (lambda m: bool(m.mla),
                         "has no multi-latent attention (no up projections to recompute)"),
}

_DS_MODEL = ("this ds_config has no pipeline layout or activation offload (DeepSpeed sets "
             "them in the model code); use --format megatron")

SWITCHES: tuple[Switch, ...] = (
    Switch("overlap", True, "gradient communication overlaps the backward pass",
           "Megatron-LM --overlap-grad-reduce", families=("cnn", "transformer"),
           limits=True, solve="pinned (default on)", label=_on_off("overlap"), mixed=True,
           launch={"megatron": WRITES, "deepspeed": WRITES,
                   "torchtitan": "torchtitan's FSDP always overlaps the gradient reduce-scatter "
                                 "with the backward; plan with --overlap, or use --format "
                                 "megatron"}),
    Switch("flash_attention", True, "attention scores stay on chip (FlashAttention)",
           "--attention-backend", limits=True, solve="pinned (default on)",
           label=_on_off("flash attention"), mixed=True,
           launch={"megatron": WRITES, "deepspeed": MODEL_CODE,
                   "torchtitan": "torchtitan's models run attention through fused kernels "
                                 "(SDPA, flex attention); plan with flash attention, or use "
                                 "--format megatron"}),
    Switch("tp_overlap", False, "tensor-parallel collectives pipelined with their GEMMs; "
           "needs sequence parallelism", "--tp-comm-overlap, torchtitan AsyncTP",
           solve="searched (pin it on or off)", searched=True, label=_on("tp overlap on"),
           mixed=True, applies=lambda st, ch: (st("t") > 1) & (ch("sp") == 1),
           launch={"megatron": WRITES, "torchtitan": WRITES, "deepspeed": WRITES}),
    Switch("cp_a2a", False, "context parallelism by all-to-all (DeepSpeed Ulysses): each "
           "rank gathers the whole sequence for 1 / c_p of its heads before the attention and "
           "sends the output back; off: ring attention, K and V passed round the c_p ranks "
           "beside the attention's steps", "--cp-comm-type a2a (Megatron-LM, Transformer "
           "Engine; the NeMo LoRA recipes' default)", solve="searched where cp > 1, on only with "
           "attention sinks (pin it on or off)", searched=True, label=_on("cp all-to-all"),
           applies=lambda st, ch: st("cp") > 1, tried_for=_offers_cp,
           # Transformer Engine: "Context parallelism only supports softmax_type=... with
           # cp_comm_type = 'a2a'" (attn_forward_func_with_cp, context_parallel.py at d0067d0)
           required_for=lambda m: m.attention_sinks,
           launch={"megatron": WRITES,
                   "torchtitan": "torchtitan's context parallelism is PyTorch's ring attention "
                                 "(context_parallel); use --format megatron for --cp-a2a",
                   "deepspeed": "DeepSpeed's Ulysses all-to-all wraps the attention in the "
                                "model code (DistributedAttention) and this ds_config form "
                                "writes no context parallelism; use --format megatron"},
           megatron_flags=("--cp-comm-type", "a2a")),
    Switch("capacity_factor", 1.0, "MoE: tokens of the busiest expert over the balanced mean "
           "(1: balanced)", "--moe-expert-capacity-factor with padding", kind=float, low=1,
           high=64, solve="pinned (default 1)", mixed=True,
           label=lambda value, plan: f"capacity factor {value:g}" if value != 1 else None,
           launch={"megatron": WRITES, "deepspeed": WRITES,
                   "torchtitan": "torchtitan's MoE is dropless (no capacity factor); use "
                                 "--format megatron"}),
    # Megatron-LM's sync-free MoE (docs/user-guide/features/paged_stash.md at d98e8a6): the
    # HybridEP dispatch and the fused grouped experts' buffers sized once, at a budget over
    # the balanced count, so the step has no device-to-host sync and CUDA graphs can capture
    # it; the paged stash packs the routed experts' saved activations into pages sized at
    # their own factor of the balanced count (`planner.expr.layer.LayerCosts.routed_held`)
    Switch("rank_capacity", 0.0, "MoE: each expert rank's dispatch and expert buffers sized "
           "at F x the balanced token count, the routed experts' saved activations with them "
           "(sync-free: no host sync for the token counts) [default 0: sized to the tokens "
           "each step]", "--moe-expert-rank-capacity-factor F (the flex HybridEP dispatcher "
           "and Transformer Engine's op fuser; NVIDIA's MLPerf v6.0 MoE recipes)", kind=float,
           low=0, high=64, solve="pinned (default off)",
           label=lambda value, plan: f"rank capacity {value:g}" if value else None,
           launch={"megatron": WRITES,
                   "torchtitan": "torchtitan's MoE sizes its buffers each step (no rank "
                                 "capacity); use --format megatron",
                   "deepspeed": "DeepSpeed's MoE has no rank capacity (sync-free "
                                "HybridEP buffers); use --format megatron"}),
    Switch("paged_stash", 0.0, "MoE, with --rank-capacity: the routed experts' saved "
           "activations packed into paged buffers of F x their balanced size, copied in "
           "after each forward and out before each backward [default 0: off]",
           "--moe-paged-stash --moe-paged-stash-buffer-size-factor-cuda F", kind=float,
           low=0, high=64, solve="pinned (default off)",
           label=lambda value, plan: f"paged stash {value:g}" if value else None,
           excluded_by=("offload_activations",),
           launch={"megatron": WRITES,
                   "torchtitan": "torchtitan has no paged stash; use --format megatron",
                   "deepspeed": "DeepSpeed has no paged stash; use --format megatron"}),
    Switch("first_stage_layers", None, "layers on the first pipeline stage, the rest split "
           "evenly", "--decoder-first-pipeline-num-layers", kind=int, low=1, high=100_000,
           launch={"megatron": WRITES, "torchtitan": WRITES, "deepspeed": _DS_MODEL}),
    Switch("last_stage_layers", None, "layers on the last pipeline stage",
           "--decoder-last-pipeline-num-layers", kind=int, low=1, high=100_000,
           launch={"megatron": WRITES, "torchtitan": WRITES, "deepspeed": _DS_MODEL}),
    Switch("offload_activations", False, "saved activations kept in host memory, copied over "
           "the system's host link (Grace NVLink-C2C)", "--fine-grained-activation-offloading",
           label=_on("activation offload on"),
           launch={"megatron": WRITES, "deepspeed": _DS_MODEL,
                   "torchtitan": "torchtitan has no activation offload; use --format megatron"}),
    # Megatron-LM's selective recomputation of modules (--recompute-granularity selective
    # --recompute-modules ..., transformer_config.py at d98e8a6): each frees a module's output
    # once its consumer has run and runs the module again in the backward (output-discarding
    # checkpoints); "core_attn" is `--recompute selective`
    *(Switch(name, False, what, f"Megatron-LM --recompute-modules {module}",
             label=_on(f"{module} recomputed"), excluded_by=("offload_activations",),
             launch={"megatron": WRITES,
                     "torchtitan": "torchtitan's activation checkpointing is per layer or per "
                                   "op (no module list); use --format megatron",
                     "deepspeed": "DeepSpeed checkpoints activations in the model code; use "
                                  "--format megatron"})
      for name, (module, what) in RECOMPUTE_MODULES.items()),
    Switch("ep_overlap", False, "MoE: each micro-batch's all-to-alls behind another's compute",
           "--overlap-moe-expert-parallel-comm", label=_on("ep overlap on"),
           solve="searched for MoE models (pin it on or off)", searched=True,
           applies=lambda st, ch: st("ep") > 1, tried_for=lambda m, q: m.experts > 1,
           precisions=("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp4"),
           needs="overlapping the all-to-alls needs a bf16 or fp16 model (Megatron-LM; fp8 "
                 "and fp4 GEMMs run inside one)",
           launch={"megatron": WRITES, "deepspeed": WRITES,
                   "torchtitan": "torchtitan does not overlap the MoE all-to-alls across "
                                 "micro-batches; use --format megatron"},
           megatron_flags=("--overlap-moe-expert-parallel-comm",)),
    Switch("kernels", Kernels.fused, "non-matmul ops fused (Megatron-LM, Transformer Engine, "
           "torch.compile) or eager, one PyTorch kernel each (Hugging Face, torchtitan "
           "without compile)", "Megatron's fusion flags, torch.compile", kind=Kernels,
           solve="pinned (default fused)", mixed=True,
           label=lambda value, plan: "eager kernels" if value == Kernels.eager else None,
           launch={"megatron": WRITES, "torchtitan": WRITES, "deepspeed": MODEL_CODE}),
    Switch("dp_shard", None, "hybrid sharding (HSDP): ZeRO over groups of N data-parallel "
           "replicas, the groups replicating (0: over all dp) [default: solve tries all dp "
           "and groups inside one scale-up domain]",
           "--num-distributed-optimizer-instances, torchtitan data_parallel_shard_degree",
           kind=int, low=0, high=2**23, with_zero=True, argument=True,
           solve="searched with ZeRO 3: all dp, or groups inside one scale-up domain (pin "
                 "N, or 0 for all dp)", searched=True, applies=lambda st, ch: ch("zero") >= 1,
           label=lambda value, plan: (f"ZeRO over groups of {value} replicas (HSDP)"
                                      if value and value < plan.dp else None),
           launch={"megatron": WRITES, "torchtitan": WRITES, "deepspeed": WRITES}),
    Switch("fp8_weight_gather", False, "with ZeRO and fp8 / fp4 training: the layers' "
           "weights held and all-gathered in the recipe's format (fp8, or nvfp4 with "
           "--fp4-param-gather)", "--fp8-param-gather / --fp4-param-gather, NeMo fp8_params, "
           "torchtitan enable_fsdp_float8_all_gather",
           with_zero=True, label=_on("fp8 weight gather"), precisions=("fp8", "mxfp8", "nvfp4"),
           solve="searched with fp8 training and ZeRO (pin it on or off)", searched=True,
           applies=lambda st, ch: ch("zero") >= 1,
           needs="gathering the weights in fp8 needs fp8 or fp4 training (--precision fp8, "
                 "mxfp8 or nvfp4: Megatron-LM's --fp8-param-gather / --fp4-param-gather, "
                 "torchtitan's float8 all-gather)",
           launch={"megatron": WRITES,
                   "torchtitan": "torchtitan gathers weights in bf16 (its Float8Linear "
                                 "recipes are rowwise, with no fp8 all-gather); use --format "
                                 "megatron for --fp8-weight-gather",
                   "deepspeed": "DeepSpeed has no fp8 weight all-gather; use --format "
                                "megatron"},
           megatron_flags=("--fp8-param-gather",)),
    Switch("weight_cache", True, "with fp8 / fp4 training: each layer weight's quantized "
           "copy (rowwise and columnwise, with its scales) cast at the step's first "
           "micro-batch and held for the others; off: cast in every micro-batch, nothing held",
           "Transformer Engine's weight workspace (Megatron-LM passes is_first_microbatch; "
           "TransformerConfig.disable_parameter_transpose_cache turns it off); torchtitan's "
           "float8 (torchao) casts in every forward", limits=True, solve="pinned (default on)",
           mixed=True, label=lambda value, plan: None if value else "weights cast every "
                                                                   "micro-batch",
           launch={"megatron": "Megatron-LM has no flag for TransformerConfig."
                               "disable_parameter_transpose_cache (arguments.py at d98e8a6 "
                               "keeps it off the command line): keep --weight-cache, or use "
                               "--format torchtitan",
                   # torchao's Float8Linear casts the weight in each forward; under FSDP2 TE
                   # skips its cache too (linear.py at d0067d0: cache_name None if is_fsdp2)
                   "torchtitan": AS_DEFAULT,
                   "deepspeed": "DeepSpeed has no fp8 / fp4 recipe of its own (Transformer "
                                "Engine's runs in the model code); use --format megatron"}),
    Switch("fp8_activation_input", False, "with fp8 / fp4 training: the FFN activation "
           "function's input (fc1's output) saved for its backward in fp8, 1 byte a value",
           "Megatron-LM TransformerConfig.activation_func_fp8_input_store (NeMo "
           "FP8_ACTIVATION / FP8_ACT, the MLPerf LoRA recipes)",
           label=_on("fp8 activation input"), precisions=("fp8", "mxfp8", "nvfp4"),
           mixed=True, needs="saving the activation's input in fp8 needs fp8 or fp4 training "
                             "(--precision fp8, mxfp8 or nvfp4)",
           launch={form: f"{form} has no flag for it (Megatron-LM's TransformerConfig."
                         "activation_func_fp8_input_store has no argument at the commit "
                         "checked; NeMo sets it); plan without --fp8-activation-input, or use "
                         "--format env, slurm or torchrun to start your own script"
                   for form in FRAMEWORK_FORMS}),
    Switch("fp8_activations", False, "with fp8 training: each fp8 GEMM's input saved for the "
           "backward in fp8, 1 byte a value", "Transformer Engine (torchao keeps it 16-bit)",
           label=_on("fp8 saved activations"), precisions=("fp8", "mxfp8"), mixed=True,
           solve="searched with fp8 training (pin it on or off)", searched=True,
           applies=lambda st, ch: st("t") >= 1, excluded_by=("offload_activations",),
           needs="saving the GEMM inputs in fp8 needs fp8 training (--precision fp8 or mxfp8)",
           launch={"megatron": AS_DEFAULT, "deepspeed": WRITES,
                   "torchtitan": "torchtitan's float8 linears (torchao) save their inputs at "
                                 "16 bits; the plan saves them in fp8 (Transformer Engine): "
                                 "use --format megatron, or plan without --fp8-activations"}),
    Switch("fp8_current_scaling", False, "with per-tensor fp8 training: each cast's scale "
           "from the tensor's own amax, not the delayed amax history (a scale kernel per "
           "cast, an amax pass over the attention output, and with sequence parallelism an "
           "amax all-reduce over tp per block and pass)",
           "--fp8-recipe tensorwise (Transformer Engine Float8CurrentScaling; NVIDIA's MLPerf "
           "v5 recipes)", label=_on("fp8 current scaling"), precisions=("fp8",), mixed=True,
           needs="current scaling is a per-tensor fp8 recipe (--precision fp8; mxfp8 and "
                 "nvfp4 scale each block in its cast)",
           launch={"megatron": WRITES,
                   "deepspeed": "DeepSpeed has no fp8 recipe of its own (Transformer Engine's "
                                "runs in the model code); use --format megatron",
                   "torchtitan": "torchtitan's float8 recipes (torchao) scale dynamically "
                                 "without Transformer Engine's separate amax and scale "
                                 "kernels; use --format megatron for --fp8-current-scaling"},
           megatron_flags=("--fp8-recipe", "tensorwise")),
    Switch("fp8_attention", False, "with fp8 / fp4 training: attention's products in fp8, "
           "Q, K, V and dO cast to it around the kernel (else 16-bit, as the recipes keep "
           "them)", "Transformer Engine fp8 dot-product "
           "attention (TransformerConfig.fp8_dot_product_attention, NeMo FP8_DPA)",
           label=_on("fp8 attention"), precisions=("fp8", "mxfp8", "nvfp4", "fp4"),
           mixed=True, needs="fp8 attention needs fp8 or fp4 training (--precision fp8, "
                             "mxfp8 or nvfp4)",
           launch={form: f"{form} has no flag for fp8 dot-product attention (Megatron-LM's "
                         "TransformerConfig.fp8_dot_product_attention has no argument at the "
                         "commit checked; NeMo sets it); plan without --fp8-attention, or use "
                         "--format env, slurm or torchrun to start your own script"
                   for form in FRAMEWORK_FORMS}),
    Switch("fp8_output_proj", False, "with an MXFP8 recipe: the output layer's projection "
           "(the LM head, and each MTP depth's) in MXFP8, else 16-bit outside Transformer "
           "Engine", "--fp8-output-proj (TransformerConfig.fp8_output_proj: Transformer "
           "Engine's TELMHeadColumnParallelLinear; NVIDIA's MLPerf v6.0 GB300 DeepSeek-V3 "
           "recipes, FP8_OUTPUT_PROJ)", label=_on("fp8 output projection"),
           precisions=("mxfp8",), mixed=True,
           needs="the fp8 output projection needs an MXFP8 recipe (--precision mxfp8: "
                 "Megatron-LM asks fp8_recipe mxfp8)",
           launch={"megatron": WRITES,
                   "deepspeed": "DeepSpeed has no fp8 recipe of its own (Transformer Engine's "
                                "runs in the model code); use --format megatron",
                   "torchtitan": "torchtitan's MXFP8 linears (torchao) leave the output "
                                 "layer in 16 bits; use --format megatron, or plan without "
                                 "--fp8-output-proj"},
           megatron_flags=("--fp8-output-proj",)),
    Switch("pp_overlap", True, "interleaved pipelines: the sends overlap the chunks' compute",
           "overlap_p2p_comm (--no-overlap-p2p-communication)", limits=True,
           solve="pinned (default on)",
           label=lambda value, plan: ("pipeline sends in line"
                                      if plan.interleave > 1 and not value else None),
           launch={"megatron": WRITES, "deepspeed": WRITES,
                   "torchtitan": "this torchtitan form does not write --no-pp-overlap (its "
                                 "pipeline schedules issue the sends themselves); use "
                                 "--format megatron"}),
    Switch("grad_reduce_bf16", False, "bf16 training: gradients accumulated and reduced in "
           "bf16, not fp32", "--grad-reduce-in-bf16 (NVIDIA's MLPerf recipes)", limits=True,
           off_flag="--grad-reduce-fp32", label=_on("bf16 gradient reduce"), mixed=True,
           launch={"megatron": WRITES, "deepspeed": WRITES,
                   "torchtitan": "torchtitan reduces gradients in float32 only; use --format "
                                 "megatron for --grad-reduce-bf16"},
           # DeepSpeed's bf16 data parallelism without ZeRO keeps and reduces its gradients in
           # bf16 (engine.py: fp32 accumulation there is an "unsupported mix")
           runs_where={"deepspeed": ("at ZeRO 0 in bf16",
                                     lambda zero, precision: zero == 0
                                     and precision == "bf16")},
           megatron_flags=("--grad-reduce-in-bf16",)),
    Switch("lora_rank", None, "fine-tuning: base weights frozen, LoRA adapters of rank R on "
           "the QKV and output projections train", "NeMo PEFT", kind=int, low=1,
           high=1_000_000,
           label=lambda value, plan: (f"LoRA rank {value} (base weights frozen)" if value
                                      else None),
           launch={form: f"{form} has no LoRA fine-tuning (NeMo PEFT runs it); use --format "
                         "env, slurm or torchrun to start your own script"
                   for form in FRAMEWORK_FORMS}),
    Switch("cuda_graphs", False, "the layers' kernels issued by CUDA graphs: no host issue "
           "time; each compute kernel takes its work plus the GPU's own fixed time per kernel "
           "(kernel_gpu_us)",
           "--cuda-graph-impl local", limits=True, label=_on("CUDA graphs"), mixed=True,
           launch={"megatron": WRITES, "torchtitan": WRITES,
                   "deepspeed": "a ds_config does not capture CUDA graphs for training; use "
                                "--format megatron or torchtitan"},
           megatron_flags=("--cuda-graph-impl", "local")),
    Switch("grad_accumulation_fusion", True, "each weight-gradient GEMM adds into the main "
           "gradient in its epilogue; off: it writes the gradient and a kernel per weight adds "
           "it (PyTorch autograd, FSDP2)", "--no-gradient-accumulation-fusion (APEX / "
           "Transformer Engine fused wgrad)", limits=True, solve="pinned (default on)",
           mixed=True,
           label=lambda value, plan: None if value else "gradient accumulation unfused",
           launch={"megatron": WRITES, "torchtitan": AS_DEFAULT, "deepspeed": AS_DEFAULT},
           megatron_flags=("--no-gradient-accumulation-fusion",)),
    Switch("host_sync", True, "the training loop reads a value back from the device every "
           "step (a gradient norm, loss scale or overflow flag), so the host's time after that "
           "sync (kernels.step_sync_us) adds to each step; off: nothing read back between log "
           "steps, the host runs ahead", "NeMo's ON_DEVICE_CLIP_GRAD=1 turns it off; "
           "torchtitan runs so", limits=True, solve="pinned (default on)", mixed=True,
           label=lambda value, plan: None if value else "no host sync a step",
           launch={"megatron": "Megatron-LM's training loop reads the loss scale back after "
                               "every train_step (training/training.py at d98e8a6) with no flag "
                               "to stop it: keep --host-sync, or use --format torchtitan",
                   # trainer.py at b5bcd76: torch._assert_async checks the loss and grad norm
                   # "without synchronizing the host on every step"; read back at log steps
                   "torchtitan": AS_DEFAULT,
                   "deepspeed": "DeepSpeed's ZeRO optimizer reads its overflow flag back every "
                                "step (runtime/zero/stage_1_and_2.py has_overflow at edaa722): "
                                "keep --host-sync, or use --format torchtitan"}),
    Switch("optimizer", None, "the optimizer whose state is held and stepped [default: "
           "momentum for CNNs, adam for transformers]; adafactor and muon: transformers only",
           "--optimizer adam|sgd|muon", kind=TRANSFORMER_OPTIMIZERS,
           families=("cnn", "transformer"), solve="pinned (default adam)",
           label=lambda value, plan: f"optimizer {value}" if value else None,
           launch={"megatron": WRITES,
                   **{form: f"this {form} form writes AdamW only; use --format megatron for "
                            "sgd, momentum and muon" for form in ("torchtitan", "deepspeed")}},
           launch_default=("adam",),
           # a CNN's plans are ZeRO 0 and no form writes their optimizer: the script's runs
           launch_families=("transformer",)),
    Switch("softsync", None, "parameter server run asynchronously (n-softsync): learners never "
           "wait, the server updates after every (devices / N) gradients, staleness about N "
           "[default: synchronous]", "Rudra's n-softsync (Zhang, Gupta et al. 2016)", kind=int,
           low=1, high=2**23, families=("cnn",),
           label=lambda value, plan: (f"asynchronous parameter server ({value}-softsync, "
                                      f"staleness about {value})" if value else None),
           launch={form: f"{form} has no asynchronous parameter server; use --format env, "
                         "slurm or torchrun to start your own script"
                   for form in FRAMEWORK_FORMS}),
)
BY_NAME: dict[str, Switch] = {s.name: s for s in SWITCHES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# the switches only transformer plans take (a CNN request naming one is refused)
TRANSFORMER_ONLY: tuple[str, ...] = tuple(s.name for s in SWITCHES
                                          if s.families == ("transformer",))
# the switches `solve` chooses per plan where the request leaves them unset
SEARCHED: tuple[str, ...] = tuple(s.name for s in SWITCHES if s.searched)
# of those, the on / off choices a search row carries (a plan argument such as dp_shard is a
# column of its own: `planner.search.hybrid`)
PER_ROW: tuple[str, ...] = tuple(n for n in SEARCHED if not BY_NAME[n].argument)
# the switches only CNN plans take (a transformer request naming one is refused)
CNN_ONLY: tuple[str, ...] = tuple(s.name for s in SWITCHES if s.families == ("cnn",))
# not switches: the transformer search's bounds on a degree (`Search` fields of these names,
# --cp-max / --ep-max), which a CNN request is refused too
SEARCH_BOUNDS: tuple[str, ...] = ("cp_max", "ep_max")


def add_fields(cls):
    """Class decorator (under @dataclass): every switch as a field of `cls` with its default,
    after the fields `cls` declares itself (which may override one)."""
    annotations = cls.__dict__.get("__annotations__")
    if annotations is None:
        annotations = {}
        cls.__annotations__ = annotations
    for s in SWITCHES:
        if s.name not in annotations:
            annotations[s.name] = s.annotation()
            setattr(cls, s.name, s.default)
    return cls


def expressible(s: Switch, form: str | None) -> bool:
    """Whether the launcher form `form` expresses `s` set away from its default: a framework
    form (`FRAMEWORK_FORMS`) where it writes it or runs so anyway; env, torchrun, slurm or
    none always (the script is the user's)."""
    return form not in FRAMEWORK_FORMS or s.launch.get(form) in (WRITES, AS_DEFAULT, MODEL_CODE)


def left_to_search(given: dict, form: str | None = None) -> tuple[str, ...]:
    """The switches of `SEARCHED` a request's keywords leave unset (None or absent), less
    those the launcher form `form` cannot write (they stay off) or always runs one way
    (`framework_pins`), so that `solve --format FORM` picks the fastest plan the form starts
    rather than one it refuses."""
    return tuple(name for name in SEARCHED
                 if given.get(name) is None and expressible(BY_NAME[name], form)
                 and runs(BY_NAME[name], form) is None)


def runs(s: Switch, form: str | None, zero: int | None = None,
         precision: str | None = None):
    """The value framework form `form` always runs `s` at (`AS_DEFAULT`: away from planner's
    default, no flag changing it; `Switch.runs_where`: so at this ZeRO stage and precision),
    else None (the form writes the plan's value, or refuses)."""
    if form not in FRAMEWORK_FORMS:
        return None
    where = s.runs_where.get(form)
    if s.launch.get(form) == AS_DEFAULT or (where is not None and zero is not None
                                             and where[1](zero, precision)):
        return not s.default
    return None


def framework_pins(given: dict, form: str | None, precision: str,
                   zero: int | None = None) -> dict[str, Any]:
    """The switches a request leaves unset that framework form `form` always runs away from
    planner's default (`runs`, at the `zero` stage pinned), at that value, where the precision
    runs them at all (`Switch.precisions`): a plan for that form is priced as the framework
    runs it (torchtitan's and DeepSpeed's unfused gradient accumulation; Transformer Engine's
    fp8 saved inputs under Megatron-LM; DeepSpeed's bf16 gradients without ZeRO)."""
    return {s.name: value for s in SWITCHES
            if given.get(s.name) is None and (value := runs(s, form, zero, precision)) is not None
            and (s.precisions is None or precision in s.precisions)}


def checked(obj) -> None:
    """Replace each switch field of the frozen dataclass `obj` by its checked value."""
    for s in SWITCHES:
        object.__setattr__(obj, s.name, s.check(getattr(obj, s.name)))


def values(obj) -> dict[str, Any]:
    """The switch values of a Plan, a Search or Choices, by name."""
    return {s.name: getattr(obj, s.name) for s in SWITCHES}


def given(kwargs: dict) -> dict[str, Any]:
    """The switches set in keyword arguments (None: unset, so the default)."""
    return {k: v for k, v in kwargs.items() if k in BY_NAME and v is not None}


def describe(plan) -> list[str]:
    """The report's options fragments of a plan's switches, in the table's order."""
    return [text for s in SWITCHES if (text := s.label(getattr(plan, s.name), plan))]


def to_json(s: Switch) -> dict:
    """One switch as `planner list switches --format json` prints it."""
    return {"name": s.name, "flag": s.flag, "default": s.json(s.default),
            "values": None if s.kind in (bool, int, float) else list(s.values),
            "families": list(s.families), "what": s.what, "upstream": s.upstream,
            "solve": s.solve, "limits": s.limits,
            "precisions": None if s.precisions is None else list(s.precisions),
            "across_pools": s.mixed}


def check_exclusions(obj) -> None:
    """A one-line `SpecError` where `obj` (a Plan or a search request) turns on two switches
    that are not priced together (`Switch.excluded_by`)."""
    for s in SWITCHES:
        for other in s.excluded_by:
            if getattr(obj, s.name, None) and getattr(obj, other, None):
                raise SpecError(f"{s.name}: {s.flag} is not priced with {BY_NAME[other].flag}; "
                                f"drop one of the two")


def check_precision(obj, precision: str) -> None:
    """A one-line `SpecError` for a switch `obj` (a Plan or a search request) turns on that
    the compute `precision` cannot run (`Switch.precisions`)."""
    for s in SWITCHES:
        if s.precisions is not None and getattr(obj, s.name, None) and precision not in \
                s.precisions:
            raise SpecError(f"{s.name}: {s.needs}; got {precision}")


def megatron_flags(plan: dict) -> list[str]:
    """The Megatron-LM flags of the switches that declare them, for a plan's values."""
    return [flag for s in SWITCHES if s.megatron_flags and plan.get(s.name, s.default)
            != s.default for flag in s.megatron_flags]


def refuse_unwritten(fmt: str, plan: dict, precision: str | None = None,
                     family: str = "transformer") -> None:
    """A framework form refuses a plan with a switch it cannot write: the reason the switch
    declares, or, where it declares none for the form, that the form does not write it; and
    a plan of `family` priced with a switch at planner's default that the form always runs
    the other way (`runs`; at a `precision` that runs the switch)."""
    if fmt not in FRAMEWORK_FORMS:
        return  # env, torchrun, slurm: the variables and the script are the user's
    for s in SWITCHES:
        fixed = runs(s, fmt, plan.get("zero", 0), precision)
        if (fixed is not None and family in s.families
                and plan.get(s.name, s.default) != fixed
                and (s.precisions is None or precision in s.precisions)):
            where = s.runs_where[fmt][0] + " " if fmt in s.runs_where else ""
            raise SpecError(f"format: {fmt} always runs {s.spelled(fixed)} {where}and the plan "
                            f"is priced with {s.spelled(not fixed)}; leave it unset with "
                            f"--format {fmt} (priced as {fmt} runs it), or use --format env, "
                            f"slurm or torchrun to start your own script")
        value = plan.get(s.name)
        if value is None or value == s.json(s.default) or value in s.launch_default or \
                family not in (s.launch_families or s.families):
            continue
        if not expressible(s, fmt):
            raise SpecError("format: " + s.launch.get(
                fmt, f"this {fmt} form does not write {s.flag}; plan without it, or use "
                     f"--format env, slurm or torchrun to start your own script"))


def markdown_table() -> str:
    """The switch table of docs/switches.md."""
    rows = ["| switch | what it sets | upstream | in `solve` | `limits` | Megatron / torchtitan / "
            "DeepSpeed forms |", "|---|---|---|---|---|---|"]
    for s in SWITCHES:
        if s.kind is bool:
            flag = f"`{s.flag}/{s.spelled(False)}`"
        elif s.kind in (int, float):
            flag = f"`{s.flag} {'N' if s.kind is int else 'F'}`"
        else:
            flag = f"`{s.flag} {'|'.join(s.values)}`"
        forms = " / ".join(s.launch[f] if s.launch[f] in (WRITES, AS_DEFAULT, MODEL_CODE)
                           else "refuses" for f in FRAMEWORK_FORMS)
        what = s.what + (f" [precisions: {', '.join(s.precisions)}]" if s.precisions else "")
        cells = [flag, what, s.upstream, s.solve, "taken" if s.limits else "refused", forms]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


DOC = "docs/switches.md"
MARK = "<!-- generated by `python -m planner.switches`"


def write_doc(path: str = DOC) -> None:
    """Rewrite the table of docs/switches.md (the text above the marker kept)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, sep, tail = text.partition(MARK)
    kept = head + sep + tail.split("\n", 1)[0] + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(kept + markdown_table())


if __name__ == "__main__":
    write_doc()
