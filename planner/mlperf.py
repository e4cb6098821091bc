"""MLPerf Training submissions (`planner/calibration/mlperf_training.csv`, and v6.0's in
`mlperf_training_v6.csv`, which no fit reads), predicted as their submitters pinned them.

Each row is one submission's own configuration (parallel sizes, batches, precision, overlap
switches, read from its `config_*.sh`) and its logged step time (`mlperf_training.md` says how
each was derived). `rows()` prices every row at exactly that plan with the specs as they ship
(the Blackwell and AMD GEMM shares are fitted to these rows by `planner.fit_mlperf`, which
also predicts them leave-one-benchmark-out; nothing is fitted to the Hopper rows), a Run's
`why_not` says why a row cannot be priced (a device or precision the catalog lacks, or a
logged gradient accumulation that contradicts the split: the 2 rows whose logs print no
layout; `benchmarks/extract_mlperf.py` takes the layout a log prints over its config's), and
`python benchmarks/accuracy.py` reports the error by group.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import re
from pathlib import Path

from planner import rules, switches
from planner.catalog import load_model, load_system
from planner.errors import SpecError
from planner.plan import Plan
from planner.search.hybrid import predict
from planner.search.memory_fit import filled
from planner.spec.hardware import Precision
from planner.spec.transformer import with_seq_len

CSV = Path(__file__).parent / "calibration" / "mlperf_training.csv"
# the v6.0 round's submissions (its two mixture-of-experts benchmarks, and some of its dense
# ones), transcribed from the stored copy of its results through the file index (no mirror of
# the repository could be fetched): the same columns plus the expert-parallel sizes, the
# pipeline layout and the MoE switches (`mlperf_training.md`)
TRANSCRIBED = CSV.with_name("mlperf_training_v6.csv")
# the same submissions' forward-only (validation) steps, where their logs time them
# (`benchmarks/extract_mlperf_forward.py`)
FORWARD_CSV = CSV.with_name("mlperf_forward.csv")

# the benchmark's model as the catalog writes it (the MLPerf reference's architecture)
MODELS = {"gpt3": "gpt3-175b", "llama31_405b": "llama3.1-405b", "llama31_8b": "llama3-8b",
          "llama2_70b_lora": "llama2-70b", "deepseekv3_671b": "deepseek-v3",
          "gpt_oss_20b": "gpt-oss-20b"}
# the benchmark's model where it differs from the catalog's: MLPerf's gpt-oss-20b reads the
# Llama 3.1 tokenizer (128,256 tokens; training_results_v6.0 NVIDIA/benchmarks/gpt_oss_20b/
# implementations/nemo/pretrain.py and conf/gpt_oss.yaml; its logs print 20,495,244,864
# parameters, the catalog's 20,914,757,184 less the 2 x 72,832 x 2,880 of the vocabulary)
VARIANTS = {"gpt_oss_20b": {"vocab": 128256}}
# the Llama 2 70B LoRA reference: rank 16 on linear_qkv and linear_proj, packed sequences of
# 8,192 tokens (training_results_v5.0 NVIDIA/benchmarks/llama2_70b_lora/implementations/
# */train.py: lora_rank 16, target_modules; the logs do not give the sequence length)
LORA = {"llama2_70b_lora": (16, 8192)}
# rounds held out of every fit (`planner.fit_mlperf.runs`): v6.0 was transcribed after the
# shares were fitted to v3.0-v5.1, so its dense rows test what the fit carries to a newer
# software release (NGC 26.04) out of sample, as its mixture-of-experts rows test the MoE terms
HELD_OUT_ROUNDS = ("v6.0",)
# the accelerator column's words -> the built-in system of that node (8 GPUs, NDR / RoCE;
# NVL72 racks as trays of 4)
SYSTEMS = (("GB300", "gb300-nvl72"), ("GB200", "gb200-nvl72"), ("B300", "dgx-b300"),
           ("B200", "dgx-b200"), ("H200-SXM", "hgx-h200"), ("H100-SXM", "dgx-h100"),
           ("MI355X", "mi355x-8"), ("MI350X", "mi350x-8"), ("MI325X", "mi325x-8"),
           ("MI300X", "mi300x-8"))


@dataclasses.dataclass(frozen=True)
class Run:
    """One submission: what it is, the plan it ran and what it measured."""

    row: dict
    model: str
    system: str | None
    precision: Precision | None
    measured_s: float
    why_not: str | None  # None: expressible
    forward_s: float | None = None  # one validation step (a forward of the global batch)

    @property
    def moe(self) -> bool:
        """A mixture-of-experts benchmark (v6.0's), which no fit reads (`held_out`)."""
        return _is_moe(self.model)

    @property
    def held_out(self) -> bool:
        """In no fit: a mixture-of-experts row, or one of a held-out round."""
        return self.moe or self.row["round"] in HELD_OUT_ROUNDS

    @property
    def group(self) -> str:
        return f"{self.row['benchmark']} {self.system or self.row['accelerator']} " \
               f"{self.precision.value if self.precision else '?'}"


@functools.cache
def _is_moe(model: str) -> bool:  # a row's model, read once per process
    return load_model(model).experts > 1


def _flag(value: str, default: bool) -> bool:
    return default if value == "" else value not in ("0", "False", "false")


def read(path: Path | None = None) -> tuple[Run, ...]:
    """Every row of the file (None: the extracted rows and the transcribed ones), duplicates
    (the same measurement filed twice) left out (read once per process: the same Run objects
    every call)."""
    if path is None:
        return _read(CSV.resolve()) + _read(TRANSCRIBED.resolve())
    return _read(Path(path).resolve())


def _key(r: dict) -> tuple:
    return r["round"], r["submitter"], r["system"], r["benchmark"]


@functools.cache
def _forward_steps(path: Path) -> dict[tuple, float]:
    """(round, submitter, system, benchmark) -> the submission's median validation step."""
    if not path.exists():
        return {}
    with open(path, newline="", encoding="utf-8") as fh:
        return {_key(r): float(r["forward_step_s"]) for r in csv.DictReader(fh)}


@functools.cache
def _read(path: Path) -> tuple[Run, ...]:
    forward = _forward_steps(path.with_name(FORWARD_CSV.name))
    out = []
    with open(path, newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if r["duplicate_of"]:
                continue
            system = next((s for key, s in SYSTEMS if key in r["accelerator"]), None)
            precision = Precision(r["precision"]) if r["precision"] else None
            why = None
            if r["benchmark"] not in MODELS:
                why = f"no built-in model for {r['benchmark']}"
            elif system is None:
                why = f"no built-in system for {r['accelerator']}"
            elif precision is None:
                why = "precision not given by the submission's files"
            elif not all(r[k] for k in ("tp", "pp", "cp", "dp", "micro_batch", "global_batch")):
                why = "parallel sizes or batch not all given by the submission's files"
            elif r.get("pipeline_layout") and _layout_pins(r) is None:
                why = (f"the pipeline layout {r['pipeline_layout']} is not one the planner "
                       "prices (pinned first / last stages of the model's layers, each with "
                       "one at least, the others even)")
            elif r["grad_accum"] and int(r["grad_accum"]) * int(r["dp"]) * int(
                    r["micro_batch"]) != int(r["global_batch"]):
                # the log's accumulation and the config's split disagree: what ran is unknown
                why = (f"the logged gradient accumulation ({r['grad_accum']}) contradicts the "
                       f"config's split (global batch / (dp x micro-batch) = "
                       f"{int(r['global_batch']) // (int(r['dp']) * int(r['micro_batch']))}): "
                       "the plan that ran is not known")
            out.append(Run(r, MODELS.get(r["benchmark"], r["benchmark"]), system, precision,
                           float(r["step_time_s"]), why, forward.get(_key(r))))
    return tuple(out)


def plan_of(run: Run) -> Plan:
    """The plan as the submission's config sets it. Unset switches take NeMo / Megatron-LM's
    defaults for these recipes (fp8 attention only where the config sets it):
    sequence parallel with tp > 1, the distributed optimizer
    (ZeRO 1) with its gradient reduce overlapped, no recomputation, flash attention, and the
    gradients reduced in bf16, as the reference implementations set it (training_results_v4.0
    NVIDIA/benchmarks/gpt3/implementations/nemo/conf/optim/distributed_fused_adam.yaml:
    grad_sync_dtype bf16; v5.0 NVIDIA/benchmarks/llama31_405b/.../pretrain.py:
    grad_reduce_in_fp32=False). fp8 current scaling where the config's recipe is "tensorwise"
    (NVIDIA's v5 Blackwell recipes; rows whose recipe the files do not give run delayed
    scaling, Megatron-LM's default); the weights gathered in fp8 where the config sets
    FP8_PARAM_GATHER (with the distributed optimizer it shards); no host sync a step where it
    sets ON_DEVICE_CLIP_GRAD (the gradient norm, NeMo's one read-back a step, stays on the
    device); the LoRA recipes' own settings: base weights held in the recipe's format
    (`_fp8_weights`), Transformer Engine's weight cache off where their YAML turns it off,
    the FFN activation's input in fp8 (FP8_ACT / FP8_ACTIVATION) and the recomputation they
    set (ACG / ACM / ACL: the AMD recipes recompute 21 layers by the block method); the v6.0
    MoE recipes' rank capacity and paged stash (MOE_EXPERT_RANK_CAPACITY_FACTOR,
    MOE_PAGED_STASH_BUFFER_SIZE_FACTOR_CUDA)."""
    r = run.row
    tp, pp, cp, dp = (int(r[k]) for k in ("tp", "pp", "cp", "dp"))
    g = load_system(run.system).devices_per_node
    first, last = _layout_pins(r) if r.get("pipeline_layout") else (None, None)
    moe = {"ep": int(r.get("ep") or 1), "etp": int(r["etp"]) if r.get("etp") else None,
           "fp8_output_proj": r.get("fp8_output_proj") == "1",
           # MOE_EXPERT_RANK_CAPACITY_FACTOR and MOE_PAGED_STASH(_BUFFER_SIZE_FACTOR_CUDA)
           "rank_capacity": float(r.get("rank_capacity") or 0),
           "paged_stash": float(r.get("paged_stash") or 0)}
    plan = Plan.split(tp, pp, dp, int(r["micro_batch"]), int(r["global_batch"]),
                      node_size=g, cp=cp, interleave=int(r["vp"] or 1),
                      first_stage_layers=first, last_stage_layers=last, **moe,
                      sequence_parallel=tp > 1 and _flag(r["sequence_parallel"], True),
                      zero=1 if _flag(r["dist_optimizer"], True) else 0,
                      overlap=_flag(r["overlap_grad_reduce"], True),
                      tp_overlap=tp > 1 and _flag(r["tp_comm_overlap"], False),
                      grad_reduce_bf16=True,
                      lora_rank=LORA[r["benchmark"]][0] if r["benchmark"] in LORA else None,
                      cuda_graphs=r["cuda_graph"] not in ("", "0"),
                      fp8_attention=r["fp8_attention"] == "1",
                      # Megatron-LM's cp_comm_type: the LoRA recipes' YAML sets a2a
                      cp_a2a=cp > 1 and r.get("cp_comm_type") == "a2a",
                      fp8_current_scaling=r["fp8_recipe"] == "tensorwise",
                      # the gradient norm clipped on the device: nothing read back a step
                      host_sync=r["on_device_clip_grad"] != "1",
                      fp8_weight_gather=_fp8_weights(run),
                      weight_cache=_weight_cache(run),
                      fp8_activation_input=(r["fp8_activation_input"] == "1"
                                            and run.precision.value in switches.BY_NAME[
                                                "fp8_activation_input"].precisions),
                      recompute=r["recompute"] or "none",
                      recompute_layers=int(r["recompute_layers"]) if r["recompute_layers"]
                      else None)
    # the all-to-all overlap where Megatron-LM's rules let it run (`planner.rules`): Cisco's
    # H100 gpt-oss-20b runs set it with one micro-batch a step, where nothing pairs
    row = rules.row_of(plan)
    if r.get("ep_overlap") == "1" and all(rule.holds(row, plan) for rule in rules.RULES
                                          if rule.key == "ep_overlap"):
        plan = plan.replace(ep_overlap=True)
    return plan


def layout_stages(layout: str, pp: int, v: int = 1) -> list[int]:
    """Decoder layers on each pipeline stage of a Megatron-LM --pipeline-model-parallel-layout:
    chunks split by "|" (chunk k on stage k mod pp), "t" a decoder layer, "E" / "m" / "L" the
    embedding, an MTP depth and the loss; "x*n" and "(...)*n" repeat (MLPerf v6.0's
    DeepSeek-V3 layout "Et*4|(t*4|)*14tmL")."""
    text = layout.replace(",", "")  # Megatron-LM reads commas as spacing
    while True:  # innermost groups first
        done = re.sub(r"\(([^()]*)\)\*(\d+)", lambda g: g[1] * int(g[2]), text)
        done = re.sub(r"([EtmL|])\*(\d+)", lambda g: g[1] * int(g[2]), done)
        if done == text:
            break
        text = done
    chunks = text.split("|")
    if len(chunks) != pp * v or set(text) - set("EtmL|"):
        raise SpecError(f"pipeline layout {layout!r}: {len(chunks)} chunks for pp {pp} x "
                        f"{v}, or a letter other than E, t, m, L")
    return [sum(c.count("t") for c in chunks[k::pp]) for k in range(pp)]


def _layout_pins(r: dict) -> tuple[int | None, int | None] | None:
    """(first, last) stage layers of a row's pipeline layout, each None where it equals the
    middle stages'; None where the layout is not one the planner prices: unreadable, middle
    stages that differ, a stage with no layer, or not the benchmark model's layers."""
    return _pins(r["pipeline_layout"], int(r["pp"]), int(r["vp"] or 1), r["benchmark"])


@functools.cache
def _pins(layout: str, pp: int, v: int, benchmark: str):
    try:
        stages = layout_stages(layout, pp, v)
    except SpecError:
        return None
    middle = stages[1:-1] or stages[:1]
    if (len(set(middle)) > 1 or min(stages) < 1
            or sum(stages) != load_model(MODELS[benchmark]).layers):
        return None
    first, last = stages[0], stages[-1]
    return (first if first != middle[0] else None, last if last != middle[0] else None)


def _weight_cache(run: Run) -> bool:
    """Whether the run keeps Transformer Engine's cached weight copies: not where its YAML
    sets `disable_parameter_transpose_cache: True` (the v4.0 / v4.1 LoRA recipes and AMD's),
    nor in any fp8 LoRA recipe: the four H200 runs of the v5.0 / v5.1 recipe at tp 1 (70B of
    fp8 base weights on a 141 GB device, 1 byte each) leave no room for a transpose of each
    weight, so their frozen fp8 weights keep none (on Blackwell the held fp8 copy is the only
    one any GEMM reads, so it does not matter there). The NVFP4 LoRA recipes keep the
    columnwise copy their backward reads beside the held rowwise one."""
    r = run.row
    return r["weight_cache"] != "0" and not (r["benchmark"] in LORA
                                             and run.precision.value == "fp8")


def _fp8_weights(run: Run) -> bool:
    """Whether the run holds its layers' weights in the recipe's format: the config sets
    FP8_PARAM_GATHER (with the distributed optimizer it shards), or it is a LoRA recipe, whose
    frozen base weights are made fp8 with FP8 itself (every LoRA submission's
    megatron_gpt_peft_tuning_config.yaml: `fp8_params: ${FP8}`, te.fp8_model_init in
    custom_llama.py, training_results_v4.0 to v5.1) or quantized to NVFP4 in place
    (v5.1 NVIDIA custom_callbacks.py: "Pre-quantize model to FP8 and NVFP4")."""
    r = run.row
    if run.precision.value not in switches.BY_NAME["fp8_weight_gather"].precisions:
        return False
    if r["benchmark"] in LORA:
        return True
    return r["fp8_param_gather"] == "1" and _flag(r["dist_optimizer"], True)


def predicted(run: Run, system=None) -> tuple[float | None, str | None]:
    """(predicted step time, None), or (None, why the planner refuses the plan); `system`:
    priced on this one instead of the run's built-in system (`planner.fit_mlperf`)."""
    pred, why = prediction(run, system)
    return (None, why) if pred is None else (pred.iteration_time_s, None)


def prediction(run: Run, system=None):
    """(the `Prediction` of the run's own plan, None), or (None, why it is refused)."""
    if run.why_not:
        return None, run.why_not
    model = benchmark_model(run)
    seq = run.row["seq_len"] or LORA.get(run.row["benchmark"], (0, None))[1]
    if seq:
        model = with_seq_len(model, int(seq))
    try:
        return predict(model, system or load_system(run.system), run.precision,
                       plan_of(run)), None
    except SpecError as err:
        return None, f"refused: {err}"


def benchmark_model(run: Run):
    """The catalog model as the benchmark trains it (`VARIANTS`), at the catalog's sequence
    length (`prediction` sets the run's)."""
    return dataclasses.replace(load_model(run.model), **VARIANTS.get(run.row["benchmark"], {}))


def rows(path: Path | None = None) -> list[dict]:
    """Every run with its prediction and error (predicted / measured - 1), or why none."""
    out = []
    for run in read(path):
        pred, why = prediction(run)
        t = None if pred is None else pred.iteration_time_s
        forward = None if pred is None or run.forward_s is None else pred.forward_time_s
        out.append({"run": run, "group": run.group, "measured_s": run.measured_s,
                    "predicted_s": t, "why_not": why,
                    "error": None if t is None else t / run.measured_s - 1,
                    # the share of a device's usable memory the plan fills by the model
                    "full": None if pred is None else
                    filled(pred.memory_bytes_per_device, load_system(run.system).device),
                    "forward_error": None if forward is None else forward / run.forward_s - 1,
                    # the rest of a step: backward, gradient sync and optimizer
                    "rest_error": None if forward is None else
                    (t - forward) / (run.measured_s - run.forward_s) - 1})
    return out
