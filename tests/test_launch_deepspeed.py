"""The deepspeed form's ds_config, checked against what DeepSpeed itself reads and validates, as
data at the commit the form names (tests/data/launch_deepspeed_config.json, written by
tests/data/make_launch_deepspeed_config.py from DeepSpeed's source with `ast`): every key must be
one DeepSpeedConfig reads; a block DeepSpeed hands to a pydantic model (zero_optimization ->
DeepSpeedZeroConfig, bf16 / fp16 -> precision_config, tensor_parallel -> TPTrainingConfig) must
hold only that model's fields or aliases (DeepSpeedConfigModel: extra="forbid"), none
deprecated, each value of the field's annotated type, inside its bounds and enum
(ZeroStageEnum); communication_data_type one of the strings get_communication_data_type
accepts; data_types.grad_accum_dtype a value of DtypeEnum (engine.py looks it up there); the
batch sizes positive (_batch_assertion). An unknown key, a wrong type or a value outside the
enum fails."""

import ast
import json
from pathlib import Path

import pytest

from planner.launch.deepspeed_config import DEEPSPEED_COMMIT

DATA = json.loads((Path(__file__).parent / "data" / "launch_deepspeed_config.json").read_text())
assert DATA["commit"] == DEEPSPEED_COMMIT == "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"


def _fields(key: str) -> dict:
    """A vendored model's fields, its bases' included."""
    model = DATA["models"][key]
    out: dict = {}
    for base in model["bases"]:
        out |= _fields(base)
    return out | model["fields"]


def _model_config(key: str) -> dict:
    model = DATA["models"][key]
    out: dict = {}
    for base in model["bases"]:
        out |= _model_config(base)
    return out | model.get("model_config", {})


def _enum_values(key: str) -> list:
    enum = DATA["enums"][key]
    values = []
    for vals in enum["members"].values():
        # DtypeEnum registers every value of a member (its __new__); others only the first
        for v in (vals if enum["every_value_looks_up"] else vals[:1]):
            if not isinstance(v, dict):  # torch.bfloat16 and the like: not JSON
                values.append(v)
    return values


def _is(value, kind: type) -> bool:
    """JSON types, strictly: a bool is not an int, an int is a float."""
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def check_enum(key: str, value, where: str) -> None:
    allowed = _enum_values(key)
    assert any(value == a and type(value) is type(a) for a in allowed), \
        f"{where}: {value!r} is not a value of {key} {allowed}"


def check_type(node: ast.expr, value, classes: dict, where: str) -> None:
    """`value` against a field annotation as written (Optional, unions, Literal, Dict, the
    enums and models the data names); an annotation this cannot read fails."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([node.left, node.right], value, classes, where)
    if isinstance(node, ast.Constant) and node.value is None:
        assert value is None, f"{where}: {value!r} is not None"
        return None
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return _union([args[0], ast.Constant(None)], value, classes, where)
        if head == "Union":
            return _union(args, value, classes, where)
        if head == "Literal":
            allowed = [ast.literal_eval(a) for a in args]
            assert value in allowed, f"{where}: {value!r} not in Literal{allowed}"
            return None
        if head in ("Dict", "dict"):
            assert _is(value, dict), f"{where}: {value!r} is not a dict"
            return None
        if head in ("List", "list"):
            assert _is(value, list), f"{where}: {value!r} is not a list"
            for v in value:
                check_type(args[0], v, classes, where)
            return None
    if isinstance(node, ast.Name):
        simple = {"bool": bool, "int": int, "float": float, "str": str, "dict": dict,
                  "list": list}
        if node.id in simple:
            assert _is(value, simple[node.id]), f"{where}: {value!r} is not {node.id}"
            return None
        if node.id in ("Any", "object"):
            return None
        target = classes.get(node.id)
        if target in DATA["enums"]:
            return check_enum(target, value, where)
        if target in DATA["models"]:
            return check_model(target, value, where)
    raise AssertionError(f"{where}: no check for the annotation {ast.unparse(node)}")


def _union(options, value, classes, where) -> None:
    errors = []
    for o in options:
        try:
            check_type(o, value, classes, where)
            return
        except AssertionError as e:
            errors.append(str(e))
    raise AssertionError("; ".join(errors))


BOUNDS = {"ge": lambda v, b: v >= b, "gt": lambda v, b: v > b, "le": lambda v, b: v <= b,
          "lt": lambda v, b: v < b}


def check_model(key: str, value, where: str) -> None:
    """A block DeepSpeed builds `Model(**block)` from: pydantic with extra="forbid" and
    populate_by_name (a field's name or its alias)."""
    assert _is(value, dict), f"{where}: {value!r} is not a dict ({key})"
    config = _model_config(key)
    assert config.get("extra") == "forbid" and config.get("populate_by_name") is True
    names = {}
    for name, f in _fields(key).items():
        names[name] = (name, f)
        if "alias" in f:
            names[f["alias"]] = (name, f)
    for k, v in value.items():
        assert k in names, f"{where}.{k}: {key} has no field {k}"
        name, f = names[k]
        assert not f.get("deprecated"), f"{where}.{k}: deprecated in DeepSpeed"
        check_type(ast.parse(f["type"], mode="eval").body, v, f.get("classes", {}),
                   f"{where}.{k}")
        for bound, holds in BOUNDS.items():
            if bound in f:
                assert holds(v, f[bound]), f"{where}.{k}: {v} fails {bound} {f[bound]}"


def check_key(entry: dict, value, where: str) -> None:
    if "model" in entry:
        return check_model(entry["model"], value, where)
    if "enum" in entry:
        return check_enum(entry["enum"], value, where)
    if "compared_with" in entry:  # get_communication_data_type: val.lower() == "fp32" ...
        assert _is(value, str), f"{where}: {value!r} is not a string"
        got = value.lower() if entry.get("lowered") else value
        assert got in entry["compared_with"], \
            f"{where}: {value!r} is none of {entry['compared_with']}"
        return None
    if "gt" in entry:  # _batch_assertion: a count above the bound
        assert _is(value, int) and value > entry["gt"], f"{where}: {value!r} is not an int > " \
            f"{entry['gt']}"
        return None
    if entry.get("keys") and _is(value, dict):  # a plain dict read key by key (data_types)
        for k, v in value.items():
            assert k in entry["keys"], f"{where}.{k}: DeepSpeed reads no such key"
            check_key(entry["keys"][k], v, f"{where}.{k}")
        return None
    default = entry.get("default")
    if isinstance(default, bool | int | float | str):
        assert _is(value, type(default)), f"{where}: {value!r} is not {type(default).__name__}"
        return None
    raise AssertionError(f"{where}: no check vendored for this key")


def check_ds_config(cfg: dict) -> None:
    """Every key of a ds_config against DeepSpeed's own reads, models and enums."""
    assert isinstance(cfg, dict)
    for k, v in cfg.items():
        assert k in DATA["keys"], f"{k}: DeepSpeedConfig reads no such key at {DEEPSPEED_COMMIT}"
        check_key(DATA["keys"][k], v, k)
    # runtime/config.py _initialize_params: 'bfloat16 and fp16 modes cannot be simultaneously
    # enabled'
    assert not (cfg.get("bf16", {}).get("enabled") and cfg.get("fp16", {}).get("enabled")), \
        "bfloat16 and fp16 modes cannot be simultaneously enabled"


# no recomputation (a ds_config cannot turn it on): short sequences, one per micro-batch
LLAMA = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--global-batch", "64",
         "--seq-len", "1024", "--micro-batch", "1")
PLANS = {
    "zero0-bf16-pp": ("--devices", "16", "--pp", "2", "--micro-batch", "1", "--zero", "0",
                      "--precision", "bf16"),
    "zero0-fp16-autotp8": ("--devices", "8", "--tp", "8", "--zero", "0", "--precision", "fp16"),
    "zero1-bf16": ("--devices", "8", "--zero", "1", "--precision", "bf16"),
    "zero1-fp16-pp": ("--devices", "16", "--pp", "2", "--micro-batch", "1", "--zero", "1",
                      "--precision", "fp16"),
    "zero2-fp16": ("--devices", "8", "--zero", "2", "--precision", "fp16"),
    "zero3-bf16": ("--devices", "8", "--zero", "3", "--precision", "bf16"),
    "zero3-tf32": ("--devices", "8", "--zero", "3", "--precision", "tf32"),
    "zero1-bf16-autotp2": ("--devices", "8", "--tp", "2", "--zero", "1", "--precision", "bf16"),
    "zero2-fp16-autotp2": ("--devices", "16", "--tp", "2", "--zero", "2", "--precision", "fp16"),
    "zero3-bf16-mics": ("--devices", "32", "--zero", "3", "--dp-shard", "8", "--precision",
                        "bf16"),
    "zero1-bf16-grad-reduce-bf16": ("--devices", "16", "--zero", "1", "--precision", "bf16",
                                    "--grad-reduce-bf16"),
    "zero3-bf16-mics-grad-reduce-bf16": ("--devices", "16", "--zero", "3", "--dp-shard", "8",
                                         "--precision", "bf16", "--grad-reduce-bf16"),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_deepspeed_config_is_what_deepspeed_validates(run, run_json, name):
    args = (*LLAMA, *PLANS[name])
    plan = run_json(*args)["config"]
    code, out, err = run(*args, "--format", "deepspeed")
    assert code == 0, err
    ds = json.loads(out)
    check_ds_config(ds)
    # what the plan chose, as DeepSpeed reads it
    assert ds["zero_optimization"]["stage"] == plan["zero"]
    assert ds["train_batch_size"] == plan["micro_batch"] * plan["gradient_accumulation"] * \
        plan["dp"] == plan["global_batch"]
    assert ds.get("tensor_parallel", {}).get("autotp_size", 0) == (plan["tp"] if plan["tp"] > 1
                                                                   else 0)
    mics = ds["zero_optimization"].get("mics_shard_size", -1)
    assert mics == (plan["dp_shard"] if plan.get("dp_shard") and plan["dp"] > plan["dp_shard"]
                    else -1)
    assert mics == -1 or plan["zero"] == 3  # MiCS is DeepSpeed's ZeRO-3 (engine.py)
    if "data_types" in ds:
        # engine.py _do_optimizer_sanity_check: bf16 weights with fp32 accumulation only under
        # ZeRO ('unsupported mix' at stage 0); priced fp32 gradients, not --grad-reduce-bf16
        assert plan["zero"] >= 1 and not plan.get("grad_reduce_bf16")
        assert ds["communication_data_type"] == "fp32"
    elif "bf16" in ds and plan["zero"] >= 1:
        assert plan.get("grad_reduce_bf16")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.update(train_batch_sise=64), "reads no such key"),
    (lambda c: c["zero_optimization"].update(stage=4), "ZeroStageEnum"),
    (lambda c: c["zero_optimization"].update(stage="3"), "ZeroStageEnum"),
    (lambda c: c["zero_optimization"].update(overlap_comm="yes"), "bool"),
    (lambda c: c["zero_optimization"].update(mics_shard=8), "has no field"),
    (lambda c: c["zero_optimization"].update(reduce_bucket_size=-1), "ge"),
    (lambda c: c["zero_optimization"].update(cpu_offload=True), "deprecated"),
    (lambda c: c["bf16"].update(enabled=1), "bool"),
    (lambda c: c.update(communication_data_type="fp8"), "none of"),
    (lambda c: c.update(data_types={"grad_accum_dtype": "fp64"}), "DtypeEnum"),
    (lambda c: c.update(data_types={"grad_dtype": "fp32"}), "reads no such key"),
    (lambda c: c.update(tensor_parallel={"autotp_size": 2.0}), "int"),
    (lambda c: c.update(tensor_parallel={"tp_size": 2}), "has no field"),
    (lambda c: c.update(train_micro_batch_size_per_gpu=0), "int > 0"),
    (lambda c: c.update(fp16={"enabled": True}), "simultaneously"),
])
def test_the_check_fails_what_deepspeed_refuses(edit, message):
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
           "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 3, "overlap_comm": True, "mics_shard_size": 8},
           "communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"},
           "tensor_parallel": {"autotp_size": 2}}
    check_ds_config(cfg)
    edit(cfg)
    with pytest.raises(AssertionError) as e:
        check_ds_config(cfg)
    assert message in str(e.value), e.value
    # aliases are accepted, as pydantic populate_by_name does
    check_model("deepspeed.runtime.zero.config:DeepSpeedZeroConfig",
                {"stage3_prefetch_bucket_size": 10, "prefetch_bucket_size": 10}, "z")
