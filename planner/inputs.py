"""Arguments of the Python API turned into typed inputs: the family of a model, the CNN's
symbolic model, the transformer's spec and system, the statistical-efficiency inputs, a search
request; each bad value a one-line `SpecError`."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner import switches
from planner.catalog import load_model, one_pool_nodes, one_system, several_pools
from planner.errors import SpecError
from planner.plan import choice
from planner.search.training import Training
from planner.spec.hardware import Precision

if TYPE_CHECKING:
    from planner.expr.cnn import DataParallelModel


def whole_node(devices_per_node: int | None, node: int) -> None:
    """A transformer plan runs whole nodes: a devices_per_node other than the node's (what
    `solve`'s JSON config carries) is one line."""
    if devices_per_node not in (None, node):
        raise SpecError(f"devices_per_node: a transformer plan runs whole nodes of {node} "
                        f"devices (--devices-per-node {node}, or leave it out); got "
                        f"{devices_per_node}")


CNN_ONLY = ("devices_per_node", "local_batch", "local_batch_min", "collective", "servers",
            "strategy", "stages", *switches.CNN_ONLY)
# what a transformer plan refuses of them: devices_per_node it takes as its whole node
# (`whole_node`), as `solve`'s JSON config carries it
TRANSFORMER_REFUSES = tuple(k for k in CNN_ONLY if k != "devices_per_node")
TRANSFORMER_ONLY = ("tp", "cp", "ep", "etp", "pp", "dp", "micro_batch", "interleave",
                    "recompute", "sequence_parallel", "zero", "schedule", "seq_len",
                    "token_budget", "target_tokens", "recompute_layers",
                    *switches.TRANSFORMER_ONLY)


# The command line's option names (underscored) that the Python API spells otherwise: each
# verb of `planner.api` takes both, the command line's name mapped to the argument here (with
# the value turned as the command line turns it). One table for every verb: a name applies to
# a verb that takes its argument.
CLI_NAMES = {
    "tokens": "token_budget",  # solve --tokens
    "deadline": "deadline_s",  # solve --deadline
    "budget": "budget_usd",  # solve --budget
    "within": "fewest_nodes_within",  # solve --within
    "time_limit": "time_limit_s",  # solve / sweep --time-limit
    "global_batch_max": "global_batch_range",  # solve --global-batch-max M: the range 1:M
    "bandwidth": "bandwidths_GBps",  # sweep --bandwidth (one number or a list)
    "stall_timeout": "stall_timeout_s",  # sweep --stall-timeout
    "connect_timeout": "connect_timeout_s",  # sweep --connect-timeout
    "formula": "names",  # derive --formula (one name or several)
}
_CLI_VALUES = {
    "global_batch_max": lambda v: (1, v),
    "bandwidth": lambda v: list(v) if isinstance(v, list | tuple) else [v],
    "formula": lambda v: (v,) if isinstance(v, str) else tuple(v),
}
# Options of the command line that the Python API does not take (most shape its output, not
# the answer): what to do instead.
CLI_ONLY = {
    "format": "the Python API returns objects (planner.report renders them as the command "
              "line does)",
    "fmt": "the Python API returns objects (planner.report renders them as the command line "
           "does)",
    "plot": "draw with planner.plot.plan_plot or sweep_plot",
    "plot_path": "draw with planner.plot.plan_plot or sweep_plot",
    "batch": "call evaluate once per line (or planner.batch.batch for many solves)",
    "progress_every": "pass on_progress (with jobs or scheduler)",
}


def unknown_argument(verb: str, name: str, accepted) -> SpecError:
    """The one-line error for an argument `verb` does not take, with the closest accepted
    name ("did you mean") or what to do instead of a command-line-only option."""
    if name in CLI_ONLY:
        return SpecError(f"{verb}: '{name}' is a command-line option; {CLI_ONLY[name]}")
    close = difflib.get_close_matches(name, sorted(accepted), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return SpecError(f"{verb}: unknown argument '{name}'{hint}")


def cli_names(verb: str, given: dict, accepted) -> dict:
    """`given` keyword arguments with the command line's names (`CLI_NAMES`) turned into the
    arguments `verb` takes (`accepted`); a name it takes in neither spelling, or one argument
    given in both, is a one-line `SpecError`."""
    out = {}
    for name, value in given.items():
        internal = CLI_NAMES.get(name)
        if internal is not None and internal in accepted:
            if internal in given:
                raise SpecError(f"{verb}: give '{name}' or '{internal}', not both")
            out[internal] = value if value is None else _CLI_VALUES.get(name, _same)(value)
        elif name in accepted:
            out[name] = value
        else:
            names = set(accepted) | {k for k, v in CLI_NAMES.items() if v in accepted}
            raise unknown_argument(verb, name, names)
    return out


def _same(value):
    return value


def cli_flag(key: str) -> str:
    """The command line's flag for an argument (`token_budget`: tokens), without dashes."""
    flag = next((k for k, v in CLI_NAMES.items() if v == key and k != "global_batch_max"), key)
    return flag.replace("_", "-")


def enum_value(cls, value, key: str):
    """`plan.choice`, with None passed through (an option left unset)."""
    return None if value is None else choice(cls, value, key)


def only_for(family: str, given: dict, keys) -> None:
    """One-line error for an argument the other family takes."""
    for key in keys:
        if given.get(key) is not None:
            other = "CNN" if family == "transformer" else "transformer"
            raise SpecError(f"{key}: --{cli_flag(key)} applies to {other} models only")


_BUILT: dict[tuple, DataParallelModel] = {}


def build(model: str, hardware: str, precision: str | None = None, optimizer: str = "momentum",
          bucket_bytes: float | None = None, servers: int = 1, softsync: int | None = None,
          specs: Specs | None = None) -> DataParallelModel:
    """The symbolic model for a (model, hardware, options) triple (`bucket_bytes`: the
    gradient bucket, default `planner.expr.cnn.DEFAULT_BUCKET_BYTES`; `softsync`: the
    parameter server's n-softsync, None synchronous); cached per process by these arguments.
    `specs`: the request's specs, already loaded from `model`, `hardware` and `precision`."""
    key = (model, hardware, precision, optimizer, bucket_bytes, servers, softsync)
    if key not in _BUILT:
        _BUILT[key] = _build(specs or Specs.load(model, hardware, precision), optimizer,
                             bucket_bytes, servers, softsync)
    return _BUILT[key]


def _build(specs: Specs, optimizer, bucket_bytes, servers, softsync) -> DataParallelModel:
    from planner.expr.cnn import DEFAULT_BUCKET_BYTES, DataParallelModel, Options
    from planner.expr.memory import Optimizer

    specs.refuse_recommendation()
    if specs.family != "cnn":
        raise SpecError(f"model: '{specs.model_ref}' is a transformer; this command covers "
                        "CNNs (use evaluate or solve with --tp/--pp/--dp for transformers)")
    prec = specs.precision
    if servers < 1:
        raise SpecError(f"servers: must be a positive integer, got {servers}")
    opts = Options(prec, enum_value(Optimizer, optimizer, "optimizer"),
                   DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes, servers,
                   softsync)
    return DataParallelModel(specs.model, specs.system, opts)


def devices_of(devices: int | None, nodes: int | None, g: int) -> int | None:
    """The device count a request pins: `devices`, or `nodes` whole nodes of `g` devices
    (both given: they must agree)."""
    if nodes is None:
        return devices
    if devices is not None and devices != nodes * g:
        raise SpecError(f"devices: {devices} != nodes({nodes}) x {g} devices per node")
    return nodes * g


def cluster_precision(cluster) -> Precision:
    """The one precision a job over several kinds of node trains in when none is given (a
    pipeline across pools runs one format), whatever the order of the pools: of the pools'
    own default precisions the first in (bf16, fp16, then the enum's order) that every pool's
    device lists a peak for, else the first such format at all; none: give --precision."""
    devices = [pool.system.device for pool in cluster.pools]
    first = (Precision.bf16, Precision.fp16)
    rank = {p: (first.index(p) if p in first else len(first) + k)
            for k, p in enumerate(Precision)}
    defaults = sorted({d.default_precision for d in devices}, key=rank.__getitem__)
    for p in [*defaults, *sorted(Precision, key=rank.__getitem__)]:
        if all(p in d.peak_tflops for d in devices):
            return p
    raise SpecError(f"precision: no format runs on every pool of '{cluster.name}' "
                    f"({', '.join(d.name for d in devices)}); give --precision")


@dataclass(frozen=True)
class Specs:
    """What a request names, loaded once: the model (at the trained sequence length when it
    is a transformer), the hardware target (a system, or a cluster of pools) and the precision
    given. Every verb, and every output of the command line (the precision and price lines, a
    launcher form's model), reads these; nothing downstream loads a file again."""

    model_ref: str
    hardware_ref: str
    model: Any
    target: Any  # a `System`, or a `Cluster` of pools
    given_precision: Precision | None = None
    seq_len: int | None = None  # as given (applied to a transformer's spec)

    @classmethod
    def load(cls, model: str, hardware: str, precision: str | None = None,
             seq_len: int | None = None) -> Specs:
        """The specs `model` and `hardware` name (built-in names or paths), each loaded once."""
        from planner.catalog import load_target
        from planner.spec.transformer import Transformer, with_seq_len

        m = load_model(model)
        if isinstance(m, Transformer):
            m = with_seq_len(m, seq_len)
        specs = cls(model, hardware, m, load_target(hardware),
                    enum_value(Precision, precision, "precision"), seq_len)
        if precision is not None and not specs.is_cluster:
            specs.precision  # noqa: B018  (checked against the device now, as documented)
        return specs

    @property
    def family(self) -> str:
        """"transformer", "cnn" or "recommendation"."""
        return self.model.kind

    @property
    def is_cluster(self) -> bool:
        """Whether the target is a cluster of several pools (only `solve` plans over it)."""
        return several_pools(self.target)

    @property
    def pool_nodes(self) -> int | None:
        """The nodes of a one-pool cluster (None for a system): a search's node budget."""
        return one_pool_nodes(self.target)

    @property
    def system(self):
        """The one system (a one-pool cluster's pool); a cluster of several pools is refused
        (only `solve` and `limits` plan over several kinds of node)."""
        return one_system(self.target)

    @property
    def precision(self) -> Precision:
        """The precision priced: the one given (checked against the device, one line naming
        what it offers), else the device's default (a cluster's: `cluster_precision`)."""
        if self.is_cluster:
            return self.given_precision or cluster_precision(self.target)
        device = self.system.device
        prec = self.given_precision or device.default_precision
        device.peak_flops(prec)  # fail early, with the device's offer, if unsupported
        return prec

    def price(self, flag: float | None = None) -> dict | None:
        """{"usd", "source"}: the price per device-hour (`flag`, else the device spec's with
        its source), or None when neither gives one."""
        if flag is not None:
            return {"usd": flag, "source": "--price-per-device-hour"}
        device = self.system.device
        if device.price_per_hour_usd is None:
            return None
        source = device.sources.get("price")
        return {"usd": device.price_per_hour_usd,
                "source": f"device '{device.name}'" + (f": {source}" if source else "")
                + "; --price-per-device-hour to change"}

    def refuse_recommendation(self) -> None:
        """A recommendation model outside `solve`: one line saying where it is planned."""
        if self.family == "recommendation":
            raise SpecError(f"model: '{self.model_ref}' is a recommendation model; only "
                            "`planner solve` plans it (the placement of its tables: give "
                            "--devices)")

    def transformer(self):
        """(model, system, precision) of a transformer request; another family refused."""
        self.refuse_recommendation()
        if self.family != "transformer":
            raise SpecError(f"model: '{self.model_ref}' is not a transformer")
        return self.model, self.system, self.precision


def is_recommendation(model: str) -> bool:
    return load_model(model).kind == "recommendation"


def is_transformer(model: str) -> bool:
    return load_model(model).kind == "transformer"


def training_of(device_price: float | None, critical_batch: float | None,
                target_steps: float | None, target_samples: float | None,
                price_per_device_hour: float | None, deadline_s: float | None,
                budget_usd: float | None, budget_samples: float | None = None
                ) -> Training | None:
    """The statistical-efficiency inputs as a checked `Training` (None without a critical
    batch); the price defaults to the device spec's. Without a critical batch, a token
    budget (`budget_samples`: its tokens over the sequence length) is a fixed one, which the
    deadline, the budget and the time / cost objectives read the same way."""
    if critical_batch is None and budget_samples is not None:
        if target_steps is not None or target_samples is not None:
            raise SpecError("token_budget: --tokens fixes the tokens; --target-steps / "
                            "--target-samples / --target-tokens need --critical-batch instead")
        training = Training(None, target_samples=budget_samples,
                            price_per_device_hour=price_per_device_hour or device_price,
                            deadline_s=deadline_s, budget_usd=budget_usd)
        training.check(wants_price=False)
        return training
    if critical_batch is None:
        if any(x is not None for x in (target_steps, target_samples, deadline_s, budget_usd)):
            raise SpecError("critical_batch: --target-steps / --target-samples / "
                            "--target-tokens / --deadline / --budget need --critical-batch "
                            "(or, --deadline and --budget, a token budget: --tokens)")
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
    for unknown ones and for values of the wrong type (`check_type`)."""
    given = {k: v for k, v in problem.items() if v is not None}
    known = {f.name for f in dataclasses.fields(cls)} - set(fixed)
    unknown = sorted(set(given) - known)
    if unknown:
        raise unknown_argument("solve", unknown[0], known)
    hints = type_hints(cls)
    for key, value in given.items():
        if key not in switches.BY_NAME:  # the switches check themselves (`Switch.check`)
            check_type(key, value, hints[key])
    return cls(**given, **fixed)


@functools.cache
def type_hints(obj) -> dict:
    """The annotated types of a request class's fields or a verb's keywords (the switch
    fields' kinds resolved in `planner.switches`, which adds them)."""
    return typing.get_type_hints(obj, localns=vars(switches))


def check_type(key: str, value, hint) -> None:
    """Refuse a request value its field's type does not take, in one line (a Python caller's
    "lots" or 256.5 for a count, "256:1024" for a range): an int (not a bool) for an int, a
    finite number for a float, a pair of them for a pair, a bool for a bool, text for text."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    if len(kinds) != 1:  # a field of several types checks itself
        return
    kind = kinds[0]
    if typing.get_origin(kind) is tuple:
        inner = typing.get_args(kind)
        if len(inner) == 2 and inner[1] is Ellipsis:  # tuple[str, ...]: any number of them
            if not isinstance(value, tuple | list) or not all(_is(x, inner[0]) for x in value):
                raise SpecError(f"{key}: expected a list, got {value!r}")
        elif (not isinstance(value, tuple | list) or len(value) != len(inner)
                or not all(_is(x, t) for x, t in zip(value, inner, strict=True))):
            raise SpecError(f"{key}: expected {len(inner)} numbers (low, high), got {value!r}")
    elif kind in (int, float, bool, str) and not _is(value, kind):
        what = {int: "an integer", float: "a number", bool: "true or false", str: "text"}[kind]
        raise SpecError(f"{key}: expected {what}, got {value!r}")


def _is(value, kind) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return (isinstance(value, int | float) and not isinstance(value, bool)
                and value == value and abs(value) != float("inf"))
    return isinstance(value, kind) if isinstance(kind, type) else True
