"""Arguments of the Python API turned into typed inputs: the family of a model, the CNN's
symbolic model, the transformer's spec and system, the statistical-efficiency inputs, a search
request; each bad value a one-line `SpecError`."""

from __future__ import annotations

import dataclasses
import functools

from planner.catalog import load_model, load_system
from planner.errors import SpecError
from planner.expr.cnn import DEFAULT_BUCKET_BYTES, DataParallelModel, Options
from planner.expr.memory import Optimizer
from planner.plan import choice
from planner.search.training import Training
from planner.spec.cnn import CNN
from planner.spec.hardware import Precision

CNN_ONLY = ("devices_per_node", "local_batch", "local_batch_min", "collective", "optimizer",
            "servers", "strategy", "stages")
TRANSFORMER_ONLY = ("tp", "cp", "ep", "etp", "pp", "dp", "micro_batch", "interleave",
                    "recompute", "sequence_parallel", "zero", "schedule", "seq_len",
                    "token_budget", "target_tokens", "tp_overlap", "capacity_factor",
                    "first_stage_layers", "last_stage_layers", "offload_activations",
                    "ep_overlap", "kernels", "recompute_layers", "dp_shard",
                    "fp8_weight_gather", "fp8_activations", "pp_overlap", "grad_reduce_bf16",
                    "lora_rank", "cuda_graphs")


def enum_value(cls, value, key: str):
    """`plan.choice`, with None passed through (an option left unset)."""
    return None if value is None else choice(cls, value, key)


def only_for(family: str, given: dict, keys) -> None:
    """One-line error for an argument the other family takes."""
    for key in keys:
        if given.get(key) is not None:
            other = "CNN" if family == "transformer" else "transformer"
            raise SpecError(f"{key}: --{key.replace('_', '-')} applies to {other} models only")


@functools.cache
def build(model: str, hardware: str, precision: str | None = None, optimizer: str = "momentum",
          bucket_bytes: float = DEFAULT_BUCKET_BYTES, servers: int = 1) -> DataParallelModel:
    """The symbolic model for a (model, hardware, options) triple; cached per process."""
    cnn = load_model(model)
    if not isinstance(cnn, CNN):
        raise SpecError(f"model: '{model}' is a transformer; this command covers CNNs (use "
                        "evaluate or solve with --tp/--pp/--dp for transformers)")
    system = load_system(hardware)
    prec = enum_value(Precision, precision, "precision") or system.device.default_precision
    system.device.peak_flops(prec)  # fail early, with the device's offer, if unsupported
    if servers < 1:
        raise SpecError(f"servers: must be a positive integer, got {servers}")
    opts = Options(prec, enum_value(Optimizer, optimizer, "optimizer"), bucket_bytes, servers)
    return DataParallelModel(cnn, system, opts)


def is_transformer(model: str) -> bool:
    from planner.spec.transformer import Transformer

    return isinstance(load_model(model), Transformer)


def transformer_setup(model: str, hardware: str, precision: str | None,
                       seq_len: int | None = None):
    from planner.spec.transformer import Transformer, with_seq_len

    m = load_model(model)
    if not isinstance(m, Transformer):
        raise SpecError(f"model: '{model}' is not a transformer")
    m = with_seq_len(m, seq_len)
    system = load_system(hardware)
    prec = enum_value(Precision, precision, "precision") or system.device.default_precision
    system.device.peak_flops(prec)
    return m, system, prec


def training_of(device_price: float | None, critical_batch: float | None,
                target_steps: float | None, target_samples: float | None,
                price_per_device_hour: float | None, deadline_s: float | None,
                budget_usd: float | None) -> Training | None:
    """The statistical-efficiency inputs as a checked `Training` (None without a critical
    batch); the price defaults to the device spec's."""
    if critical_batch is None:
        if any(x is not None for x in (target_steps, target_samples, deadline_s, budget_usd)):
            raise SpecError("critical_batch: --target-steps / --target-samples / "
                            "--target-tokens / --deadline / --budget need --critical-batch")
        return None
    training = Training(critical_batch, target_steps, target_samples,
                        price_per_device_hour or device_price, deadline_s, budget_usd)
    training.check(wants_price=False)  # the solvers add what their objective needs
    return training


def samples_of_tokens(m, target_samples: float | None,
                       target_tokens: float | None) -> float | None:
    """E_min in sequences from --target-tokens (tokens / sequence length), or as given."""
    if target_tokens is None:
        return target_samples
    if target_samples is not None:
        raise SpecError("target_tokens: give --target-tokens or --target-samples, not both")
    return target_tokens / m.seq_len


def request(cls, problem: dict, **fixed):
    """A search request of type `cls` from keyword arguments (None: not given), one-line errors
    for unknown ones."""
    given = {k: v for k, v in problem.items() if v is not None}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise SpecError(f"solve: unknown argument '{unknown[0]}'")
    return cls(**given, **fixed)
