"""CNN specs: layers as data, block templates, and shape inference.

A model YAML lists layers over a (channels, height, width) input, or (channels, depth,
height, width) for 3-D convolutions (CosmoFlow, 3-D U-Nets): a conv or pool layer's kernel,
stride and padding are one number or one per spatial dimension, padding also 'same' (Keras /
TensorFlow: output = ceil(input / stride), the padding split with the extra row after).
`block` entries instantiate a named template (with `$param` placeholders filled by plain
lookup, never evaluated) `repeat` times. `concat` joins branches
along channels (GoogLeNet), `residual` adds a branch to a shortcut (ResNet). Loading expands all
of it into a flat, ordered tuple of `Layer`s with inferred shapes, parameter and FLOP counts.

FLOP conventions (per sample, forward): conv and fc count 2 per multiply-add plus one per bias;
pooling counts one operation per window element; elementwise layers a few per element, as noted.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from planner.errors import SpecError
from planner.spec.base import Spec, short, validate

Dim = Annotated[int, Field(ge=0, le=1_000_000)]
# one number for every spatial dimension, or one each (2 for images, 3 for volumes)
Pair = Dim | Annotated[list[Dim], Field(min_length=2, max_length=3)]
# Kernels and strides are at least 1: a zero stride divides by zero in shape inference and a
# zero kernel grows the output (8x8 -> 9x9).
Size = Annotated[int, Field(ge=1, le=1_000_000)]
SizePair = Size | Annotated[list[Size], Field(min_length=2, max_length=3)]
SAME = "same"


def _per_dim(value, dims: int) -> tuple[int, ...] | None:
    """`value` for each of `dims` spatial dimensions; None when a list has another length."""
    if isinstance(value, int):
        return (value,) * dims
    return tuple(value) if len(value) == dims else None


@dataclass(frozen=True)
class Layer:
    """One layer after shape inference. Counts are per sample."""

    name: str
    type: str
    output_shape: tuple[int, ...]
    params: int
    macs: int
    forward_flops: int
    input_elements: int
    block: str  # the top-level entry (and repeat) this layer belongs to
    unit: int  # index of that entry instance: pipeline cuts and hybrid modes go between units
    # a conv or pool layer's window and stride per spatial dimension (empty for the others)
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()

    @property
    def activation_elements(self) -> int:
        return math.prod(self.output_shape)

    @property
    def has_weights(self) -> bool:
        return self.params > 0


@dataclass(frozen=True)
class CNN:
    name: str
    description: str
    input_shape: tuple[int, ...]  # (channels, height, width) or (channels, depth, height, width)
    layers: tuple[Layer, ...]

    kind = "cnn"

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def forward_flops(self) -> int:
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def macs(self) -> int:
        return sum(layer.macs for layer in self.layers)


# --- leaf layer specs -------------------------------------------------------------------------

PositiveInt = Field(ge=1, le=1_000_000)


class _Leaf(Spec):
    name: str | None = None


class ConvSpec(_Leaf):
    type: Literal["conv"]
    out: int = PositiveInt
    kernel: SizePair
    stride: SizePair = 1
    padding: Pair | Literal["same"] = 0
    groups: int = Field(default=1, ge=1, le=1_000_000)
    bias: bool = True


class FCSpec(_Leaf):
    type: Literal["fc"]
    out: int = PositiveInt
    bias: bool = True


class PoolSpec(_Leaf):
    type: Literal["maxpool", "avgpool"]
    kernel: SizePair
    stride: SizePair | None = None
    padding: Pair | Literal["same"] = 0
    ceil_mode: bool = False  # Caffe rounds pooled sizes up (GoogLeNet relies on it)


class LRNSpec(_Leaf):
    type: Literal["lrn"]
    size: int = Field(default=5, ge=1, le=1000)


class ElementwiseSpec(_Leaf):
    type: Literal["relu", "leakyrelu", "tanh", "batchnorm", "dropout", "softmax", "flatten",
                  "globalavgpool"]
    rate: float | None = Field(default=None, ge=0, lt=1)  # dropout only; no effect on cost


LEAVES: dict[str, type[_Leaf]] = {
    "conv": ConvSpec,
    "fc": FCSpec,
    "maxpool": PoolSpec,
    "avgpool": PoolSpec,
    "lrn": LRNSpec,
    **{t: ElementwiseSpec for t in ElementwiseSpec.model_fields["type"].annotation.__args__},
}

# Elementwise FLOPs per output element (forward).
_PER_ELEMENT = {
    "relu": 1,  # one max(0, x)
    "leakyrelu": 2,  # a compare and a multiply
    "tanh": 1,  # one special-function evaluation
    "dropout": 1,  # one multiply by the mask
    "softmax": 3,  # exp, sum, divide
    "batchnorm": 4,  # subtract mean, divide by std, scale, shift (statistics amortised)
    "flatten": 0,  # a view
}


class BlockSpec(Spec):
    params: list[str] = Field(default_factory=list)
    layers: list[Any] = Field(min_length=1)


class ModelFile(Spec):
    kind: Literal["cnn"]
    name: str = Field(min_length=1)
    description: str = ""
    source: str = ""
    input: Annotated[list[Annotated[int, Field(ge=1, le=1_000_000)]],
                     Field(min_length=3, max_length=4)]
    blocks: dict[str, BlockSpec] = Field(default_factory=dict)
    layers: list[Any] = Field(min_length=1)


# --- expansion and shape inference ------------------------------------------------------------


class _Builder:
    """Walks the layer list, filling templates and inferring shapes; collects `Layer`s in order."""

    MAX_LAYERS = 100_000
    MAX_DEPTH = 32

    def __init__(self, spec: ModelFile, where: str):
        self.spec = spec
        self.where = where
        self.layers: list[Layer] = []
        self.counters: dict[str, int] = {}
        self.block = ""
        self.unit = -1

    def fail(self, path: str, message: str) -> SpecError:
        return SpecError(f"{self.where}: {path}: {message}")

    def name_for(self, kind: str, given: str | None, scope: str) -> str:
        """Names start with their type's stem (conv*, fc*, pool*...), scoped by block instance."""
        stem = {"maxpool": "pool", "avgpool": "pool", "globalavgpool": "pool"}.get(kind, kind)
        if not scope:
            if given:
                return given
            key = ("", stem)
            self.counters[key] = self.counters.get(key, 0) + 1
            return f"{stem}{self.counters[key]}"
        if given:
            return f"{stem}_{scope}{given}"
        key = (scope, stem)
        self.counters[key] = self.counters.get(key, 0) + 1
        return f"{stem}_{scope}{self.counters[key]}"

    def run(self) -> tuple[Layer, ...]:
        shape: tuple[int, ...] = tuple(self.spec.input)
        if any(d < 1 for d in shape):
            raise self.fail("input", f"sizes must be positive, got {list(shape)}")
        for i, entry in enumerate(self.spec.layers):
            self.block = _entry_label(entry, i)
            self.unit += 1
            shape = self.sequence([entry], shape, f"layers[{i}]", {}, "", 0)
        return tuple(self.layers)

    def sequence(self, entries, shape, path, args, scope, depth):
        if depth > self.MAX_DEPTH:
            raise self.fail(path, f"nesting deeper than {self.MAX_DEPTH}")
        if not isinstance(entries, list):
            raise self.fail(path, f"must be a list of layers, got {short(entries)}")
        for j, entry in enumerate(entries):
            shape = self.entry(entry, shape, f"{path}" if len(entries) == 1 else f"{path}[{j}]",
                               args, scope, depth)
        return shape

    def entry(self, entry, shape, path, args, scope, depth):
        if not isinstance(entry, dict):
            raise self.fail(path, f"a layer must be a mapping, got {short(entry)}")
        entry = {k: _fill(v, args, self, f"{path}.{k}") for k, v in entry.items()}
        name = entry.get("name")
        if name is not None and not isinstance(name, str):
            raise self.fail(f"{path}.name", f"must be a string, got {short(name)}")
        if "block" in entry:
            return self.block_instance(entry, shape, path, scope, depth)
        kind = entry.get("type")
        if not isinstance(kind, str):
            raise self.fail(f"{path}.type", f"must be a layer type name (a string), got "
                            f"{short(kind)}")
        if kind == "concat":
            return self.concat(entry, shape, path, args, scope, depth)
        if kind == "residual":
            return self.residual(entry, shape, path, args, scope, depth)
        if kind not in LEAVES:
            raise self.fail(f"{path}.type", f"unknown layer type {short(kind)} (known: "
                            f"{', '.join(sorted([*LEAVES, 'concat', 'residual']))}, or 'block')")
        leaf = validate(LEAVES[kind], entry, self.where, path)
        return self.leaf(leaf, shape, path, scope)

    def block_instance(self, entry, shape, path, scope, depth):
        allowed = {"block", "name", "repeat", "args", "then"}
        extra = set(entry) - allowed
        if extra:
            raise self.fail(path, f"unknown key '{sorted(extra)[0]}' in a block entry")
        name = entry["block"]
        if not isinstance(name, str) or name not in self.spec.blocks:
            raise self.fail(f"{path}.block", f"unknown block {short(name)} "
                            f"(defined: {', '.join(self.spec.blocks) or 'none'})")
        template = self.spec.blocks[name]
        repeat = entry.get("repeat", 1)
        if not isinstance(repeat, int) or isinstance(repeat, bool) or not 1 <= repeat <= 10_000:
            raise self.fail(f"{path}.repeat", f"must be an integer in [1, 10000], got {short(repeat)}")
        for key in ("args", "then"):
            if not isinstance(entry.get(key, {}), dict):
                raise self.fail(f"{path}.{key}", f"must be a mapping, got {short(entry[key])}")
        label = entry.get("name") or name
        for r in range(repeat):
            if not scope and repeat > 1:  # each repeat of a top-level block is its own unit
                self.block, self.unit = f"{label}.{r + 1}", self.unit + (r > 0)
            values = dict(entry.get("args", {}))
            if r > 0:
                values.update(entry.get("then", {}))
            missing = [p for p in template.params if p not in values]
            if missing:
                raise self.fail(f"{path}.args", f"block '{name}' needs '{missing[0]}'")
            unknown = [k for k in values if k not in template.params]
            if unknown:
                raise self.fail(f"{path}.args", f"block '{name}' has no parameter '{unknown[0]}'")
            inner = f"{scope}{label}{'.' + str(r + 1) if repeat > 1 else ''}_"
            shape = self.sequence(list(template.layers), shape, f"{path}(block {name})", values,
                                  inner, depth + 1)
        return shape

    def concat(self, entry, shape, path, args, scope, depth):
        extra = set(entry) - {"type", "name", "branches"}
        if extra:
            raise self.fail(path, f"unknown key '{sorted(extra)[0]}' in concat")
        branches = entry.get("branches")
        if not isinstance(branches, list) or not branches:
            raise self.fail(f"{path}.branches", "must be a non-empty list of layer lists")
        outs = [self.sequence(b, shape, f"{path}.branches[{k}]", args, scope, depth + 1)
                for k, b in enumerate(branches)]
        if any(len(o) < 3 for o in outs) or len({o[1:] for o in outs}) != 1:
            raise self.fail(path, f"branch outputs differ in spatial size: {outs}")
        out = (sum(o[0] for o in outs), *outs[0][1:])
        self.add(self.name_for("concat", entry.get("name"), scope), "concat", out, 0, 0, 0,
                 sum(math.prod(o) for o in outs))
        return out

    def residual(self, entry, shape, path, args, scope, depth):
        extra = set(entry) - {"type", "name", "branch", "shortcut"}
        if extra:
            raise self.fail(path, f"unknown key '{sorted(extra)[0]}' in residual")
        out = self.sequence(entry.get("branch"), shape, f"{path}.branch", args, scope, depth + 1)
        shortcut = entry.get("shortcut", "auto")
        if isinstance(shortcut, list):
            side = self.sequence(shortcut, shape, f"{path}.shortcut", args, scope, depth + 1)
        elif shortcut in ("auto", "identity"):
            side = shape
            if shortcut == "auto" and shape != out:
                # ResNet option B: a strided 1x1 projection (+ BN) when the shapes differ.
                if (len(shape) < 3 or len(out) != len(shape)
                        or any(a % z for a, z in zip(shape[1:], out[1:], strict=True))):
                    raise self.fail(path, f"cannot project shortcut {shape} to {out}")
                stride = [a // z for a, z in zip(shape[1:], out[1:], strict=True)]
                proj = [{"type": "conv", "out": out[0], "kernel": 1, "stride": list(stride),
                         "bias": False}, {"type": "batchnorm"}]
                side = self.sequence(proj, shape, f"{path}.shortcut", {}, scope + "down_", depth + 1)
        else:
            raise self.fail(f"{path}.shortcut", f"must be auto, identity or a layer list, "
                            f"got {short(shortcut)}")
        if side != out:
            raise self.fail(path, f"residual shapes differ: branch {out} vs shortcut {side}")
        self.add(self.name_for("add", entry.get("name"), scope), "add", out, 0, 0,
                 math.prod(out), 2 * math.prod(out))
        return out

    def leaf(self, spec: _Leaf, shape, path, scope):
        kind = spec.type
        name = self.name_for(kind, spec.name, scope)
        elems_in = math.prod(shape)
        if kind == "fc":
            inputs = elems_in  # an implicit flatten, as frameworks do
            macs = inputs * spec.out
            params = macs + (spec.out if spec.bias else 0)
            flops = 2 * macs + (spec.out if spec.bias else 0)
            return self.add(name, kind, (spec.out,), params, macs, flops, elems_in)
        if kind == "flatten":
            return self.add(name, kind, (elems_in,), 0, 0, 0, elems_in)
        if kind in _PER_ELEMENT and kind != "batchnorm":
            return self.add(name, kind, shape, 0, 0, _PER_ELEMENT[kind] * elems_in, elems_in)
        if len(shape) not in (3, 4):
            raise self.fail(path, f"'{kind}' needs a (channels, height, width) or (channels, "
                            f"depth, height, width) input, got {shape}")
        c, spatial = shape[0], shape[1:]
        if kind == "batchnorm":
            # 2 parameters per channel (scale and shift), as the ResNet-50 total counts them.
            return self.add(name, kind, shape, 2 * c, 0, _PER_ELEMENT[kind] * elems_in, elems_in)
        if kind == "lrn":
            # square-sum over `size` channels (2*size), then scale, power, divide.
            return self.add(name, kind, shape, 0, 0, (2 * spec.size + 3) * elems_in, elems_in)
        if kind == "globalavgpool":
            return self.add(name, kind, (c,) + (1,) * len(spatial), 0, 0, elems_in, elems_in)
        dims = len(spatial)
        stride_given = spec.stride if (kind == "conv" or spec.stride is not None) else spec.kernel
        ks, ss = _per_dim(spec.kernel, dims), _per_dim(stride_given, dims)
        for key, got in (("kernel", ks), ("stride", ss)):
            if got is None:
                raise self.fail(f"{path}.{key}", f"needs one number or {dims} (one per spatial "
                                f"dimension of {shape})")
        if spec.padding == SAME:  # Keras / TensorFlow: out = ceil(in / stride)
            outs = tuple(-(-x // st) for x, st in zip(spatial, ss, strict=True))
        else:
            ps = _per_dim(spec.padding, dims)
            if ps is None:
                raise self.fail(f"{path}.padding", f"needs one number or {dims} (one per "
                                f"spatial dimension of {shape})")
            if any(k > x + 2 * p for k, x, p in zip(ks, spatial, ps, strict=True)):
                padded = "x".join(str(x + 2 * p) for x, p in zip(spatial, ps, strict=True))
                raise self.fail(f"{path}.kernel", f"kernel {'x'.join(map(str, ks))} larger than "
                                f"its padded input {padded}")
            rnd = math.ceil if getattr(spec, "ceil_mode", False) else math.floor
            outs = tuple(rnd((x + 2 * p - k) / st) + 1
                         for x, p, k, st in zip(spatial, ps, ks, ss, strict=True))
        window = math.prod(ks)
        if kind == "conv":
            if c % spec.groups or spec.out % spec.groups:
                raise self.fail(f"{path}.groups", f"groups={spec.groups} must divide input "
                                f"channels {c} and out {spec.out}")
            weights = spec.out * (c // spec.groups) * window
            positions = math.prod(outs)
            macs = weights * positions
            bias = spec.out if spec.bias else 0
            return self.add(name, kind, (spec.out, *outs), weights + bias, macs,
                            2 * macs + bias * positions, elems_in, ks, ss)
        return self.add(name, kind, (c, *outs), 0, 0, window * c * math.prod(outs), elems_in,
                        ks, ss)

    def add(self, name, kind, out, params, macs, flops, elems_in, kernel=(), stride=()):
        if len(self.layers) >= self.MAX_LAYERS:
            raise self.fail("layers", f"more than {self.MAX_LAYERS} layers after expansion")
        self.layers.append(Layer(name, kind, tuple(out), params, macs, flops, elems_in, self.block,
                                 self.unit, tuple(kernel), tuple(stride)))
        return tuple(out)


def _entry_label(entry: Any, index: int) -> str:
    if isinstance(entry, dict):
        label = entry.get("name") or entry.get("block") or entry.get("type")
        if isinstance(label, str):
            return label
    return f"layer{index}"


def _fill(value: Any, args: dict[str, Any], builder: _Builder, path: str) -> Any:
    """Replace `$name` strings by the block argument of that name (a lookup, never an eval)."""
    if isinstance(value, str) and value.startswith("$"):
        key = value[1:]
        if key not in args:
            raise builder.fail(path, f"placeholder '{value}' has no value (block args: "
                               f"{', '.join(args) or 'none'})")
        return args[key]
    if isinstance(value, list) and args:
        return [_fill(v, args, builder, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict) and args:
        return {k: _fill(v, args, builder, f"{path}.{k}") for k, v in value.items()}
    return value


def build_cnn(data: dict, where: str) -> CNN:
    spec = validate(ModelFile, data, where)
    layers = _Builder(spec, where).run()
    counts = Counter(layer.name for layer in layers)
    dupes = sorted(name for name, k in counts.items() if k > 1)
    if dupes:
        raise SpecError(f"{where}: layer name '{dupes[0]}' is used twice")
    return CNN(spec.name, spec.description, tuple(spec.input), layers)
