"""The torchtitan form is a config module for today's torchtitan (its Python dataclass config
registry), run here against stand-ins of torchtitan built from its own config classes, dumped
as data at the commit the form names (tests/data/launch_torchtitan_config.json, written by
tests/data/make_launch_torchtitan_config.py): every import must be bound in that module at that
commit, every keyword and attribute a field of that class (torchtitan's configs are
kw_only / slots dataclasses), every value of the field's type (Literal choices included), every
flavor one of the model's registry; then the checks torchtitan makes at startup
(ParallelDims._validate, the trainer's token counts, Trainer.Config.__post_init__,
CompileConfig.__post_init__) are made on the result."""

import ast
import contextlib
import json
import math
import os
import sys
import types
from pathlib import Path

import pytest

from planner.launch.torchtitan_config import (
    CONFIG_NAME,
    MODULE_NAME,
    TORCHTITAN_COMMIT,
    TORCHTITAN_FLAVORS,
)

DATA = json.loads((Path(__file__).parent / "data" / "launch_torchtitan_config.json").read_text())
assert DATA["commit"] == TORCHTITAN_COMMIT == "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
PLACEHOLDERS = {"HF_ASSETS_PATH": "/assets/tokenizer", "DATASET": "c4", "LR": "3e-4",
                "TRAIN_STEPS": "100"}


def _fields(key: str) -> dict:
    """A vendored class's fields, its bases' included."""
    cls = DATA["classes"].get(key)
    if cls is None:
        return {}
    out = {}
    for base in cls["bases"]:
        out |= _fields(base)
    return out | cls["fields"]


def _mro(key: str) -> list[str]:
    cls = DATA["classes"].get(key, {"bases": []})
    return [key, *(k for b in cls["bases"] for k in _mro(b))]


class _Config:
    """A stand-in of one of torchtitan's config dataclasses: keywords and attributes are its
    fields only, each value checked against the field's annotation."""

    _key = ""

    def __init__(self, **kwargs):
        fields = _fields(self._key)
        unknown = set(kwargs) - set(fields)
        assert not unknown, f"{self._key} has no field {sorted(unknown)}"
        missing = {n for n, f in fields.items() if not f["default"]} - set(kwargs)
        assert not missing, f"{self._key} needs {sorted(missing)}"
        for name, value in kwargs.items():
            setattr(self, name, value)

    def __setattr__(self, name, value):
        fields = _fields(self._key)
        assert name in fields, f"{self._key} has no field {name}"
        _check(fields[name]["type"], value, f"{self._key}.{name}")
        object.__setattr__(self, name, value)

    @classmethod
    def bare(cls):
        return object.__new__(cls)


def _config_class(key: str) -> type:
    return type(key.rpartition(":")[2], (_Config,), {"_key": key})


_ALIASES = {k.rpartition(":")[2]: v for k, v in DATA["aliases"].items()}


def _check(annotation: str, value, where: str) -> None:
    """`value` is of the type torchtitan annotates (the annotation as written at the commit)."""
    assert _matches(ast.parse(annotation, mode="eval").body, value), \
        f"{where}: {value!r} is not {annotation}"


def _matches(node, value) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _matches(node.left, value) or _matches(node.right, value)
    if isinstance(node, ast.Constant) and node.value is None:
        return value is None
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Literal":
            return value in [a.value for a in args]
        if head == "Annotated":
            return _matches(args[0], value)
        if head == "list":
            return isinstance(value, list) and all(_matches(args[0], v) for v in value)
        if head in ("dict", "tuple"):
            return isinstance(value, dict if head == "dict" else tuple)
        return isinstance(value, _Config)
    name = ast.unparse(node)
    prims = {"int": int, "float": (int, float), "bool": bool, "str": str}
    if name in prims:
        return isinstance(value, prims[name]) and (name == "bool") == isinstance(value, bool)
    if name in _ALIASES:
        return _matches(ast.parse(_ALIASES[name], mode="eval").body, value)
    if name == "Any":
        return True
    if not isinstance(value, _Config):
        return False
    known = [k for k in DATA["classes"] if k.endswith(f":{name}")]
    return not known or any(k in _mro(value._key) for k in known)


_MODEL_SPEC = _config_class("ModelSpec")
_CONVERTER = "torchtitan.protocols.model:ModelConfigConverter.Config"


def _model_registry(model: str):
    reg = DATA["models"][model]["model_registry"]

    def model_registry(flavor, **kwargs):
        assert flavor in DATA["models"][model]["flavors"], (model, flavor)
        assert set(kwargs) <= set(reg["params"]), set(kwargs) - set(reg["params"])
        for c in kwargs.get("converters") or []:
            assert _CONVERTER in _mro(c._key), c._key
        spec = _MODEL_SPEC.bare()
        object.__setattr__(spec, "name", model)
        object.__setattr__(spec, "flavor", flavor)
        object.__setattr__(spec, "converters", kwargs.get("converters") or [])
        return spec

    return model_registry


def _default_adamw(lr=8e-4, **kwargs):
    _check("float", lr, "default_adamw(lr)")
    opt = _config_class("torchtitan.components.optimizer.optimizer:OptimizersContainer.Config")
    out = opt.bare()
    object.__setattr__(out, "lr", lr)
    return out


def _decoder_vocab_size(model_spec):
    assert isinstance(model_spec, _MODEL_SPEC)
    return 1


def _stand_ins() -> dict[str, types.ModuleType]:
    """torchtitan's modules the form imports from, each binding only the names it binds at the
    commit (DATA["modules"]) that the data describes."""
    classes: dict[str, object] = {}
    for key in DATA["classes"]:
        dotted = key.rpartition(":")[2]
        outer, _, inner = dotted.partition(".")
        if inner:
            ns = classes.setdefault(outer, type(outer, (), {}))
            setattr(ns, inner, _config_class(key))
        else:
            classes[outer] = _config_class(key)
    single = _config_class("SingleDatasetConfig")
    extra = {"default_adamw": _default_adamw, "decoder_vocab_size": _decoder_vocab_size,
             "DATASETS": {k: single.bare() for k in DATA["datasets"]}}
    modules: dict[str, types.ModuleType] = {}
    for name, bound in DATA["modules"].items():
        mod = types.ModuleType(name)
        for attr in bound:
            if name.startswith("torchtitan.models.") and attr == "model_registry" \
                    and name.count(".") == 2:
                setattr(mod, attr, _model_registry(name.rpartition(".")[2]))
            elif attr in classes:
                setattr(mod, attr, classes[attr])
            elif attr in extra:
                setattr(mod, attr, extra[attr])
        modules[name] = mod
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in modules:
                modules[parent] = types.ModuleType(parent)
                modules[parent].__path__ = []
    return modules


@contextlib.contextmanager
def _torchtitan(env: dict):
    saved_mods = {k: sys.modules.get(k) for k in _stand_ins()}
    saved_env = {k: os.environ.get(k) for k in PLACEHOLDERS}
    sys.modules.update(_stand_ins())
    for k in PLACEHOLDERS:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved_mods.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def torchtitan_config(text: str, env: dict | None = None, devices: int | None = None):
    """Runs the form's config module on torchtitan's stand-ins and returns the Trainer.Config
    its function builds, after torchtitan's startup checks (on `devices` ranks if given)."""
    env = PLACEHOLDERS if env is None else env
    with _torchtitan(env):
        namespace: dict = {"__name__": MODULE_NAME}
        exec(compile(text, f"{MODULE_NAME}.py", "exec"), namespace)  # noqa: S102
        cfg = namespace[CONFIG_NAME]()
    assert "torchtitan.trainer:Trainer.Config" in _mro(cfg._key)
    _startup_checks(cfg, devices)
    return cfg


def _get(cfg, name):
    """A field as torchtitan sees it: set, or the dataclass default."""
    try:
        return object.__getattribute__(cfg, name)
    except AttributeError:
        defaults = {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                    "tensor_parallel_degree": 1, "context_parallel_degree": 1,
                    "pipeline_parallel_degree": 1, "expert_parallel_degree": 1,
                    "enable_sequence_parallel": True, "num_pp_microbatches": 1,
                    "num_tokens_per_train_step": -1, "disable_cuda_graphs": False,
                    "enable_async_tensor_parallel": False, "enable": False,
                    "components": ["model", "loss"]}
        return defaults[name]


def _startup_checks(cfg, devices):
    par, tr, comp = cfg.parallelism, cfg.training, cfg.compile
    dr, ds = _get(par, "data_parallel_replicate_degree"), _get(par, "data_parallel_shard_degree")
    cp, tp = _get(par, "context_parallel_degree"), _get(par, "tensor_parallel_degree")
    pp, ep = _get(par, "pipeline_parallel_degree"), _get(par, "expert_parallel_degree")
    assert ds >= 1  # the form writes every degree; -1 would take the leftover ranks
    if devices is not None:  # parallel_dims.py _validate
        assert dr * ds * cp * tp * pp == devices
    assert (ds * cp * tp) % ep == 0
    # trainer.py: tokens of a micro-batch divisible by (tp with SP) x (2 cp with cp)
    div = (tp if _get(par, "enable_sequence_parallel") else 1) * (2 * cp if cp > 1 else 1)
    per_mb = tr.num_tokens_per_microbatch_per_dp_rank
    assert per_mb % div == 0
    per_rank = per_mb * (_get(par, "num_pp_microbatches") if pp > 1 else 1)
    step = _get(tr, "num_tokens_per_train_step")
    assert step == -1 or step % (per_rank * dr * ds) == 0
    # Trainer.Config._validate_cuda_graphs: no CUDA graphs with pp, nor with ep's dispatcher
    if pp > 1 or ep > 1:
        assert _get(tr, "disable_cuda_graphs") is True
    # CompileConfig.__post_init__: AsyncTP needs the model compiled
    if _get(comp, "enable_async_tensor_parallel"):
        assert _get(comp, "enable") and "model" in _get(comp, "components")


def _out(run, *args):
    code, out, err = run(*args)
    assert code == 0, err
    return out


LLAMA = ("evaluate", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "32", "--tp", "8",
         "--pp", "4", "--micro-batch", "1", "--global-batch", "64", "--recompute", "full",
         "--sequence-parallel", "--precision", "bf16")
QWEN3_MOE = ("evaluate", "-m", "qwen3-30b-a3b", "-H", "dgx-h100", "--devices", "64", "--tp",
             "2", "--ep", "8", "--etp", "1", "--pp", "4", "--global-batch", "256", "--seq-len",
             "4096", "--recompute", "full", "--zero", "1")
DEEPSEEK = ("evaluate", "-m", "deepseek-v3", "-H", "dgx-h100", "--devices", "1024", "--tp", "2",
            "--pp", "8", "--ep", "64", "--etp", "1", "--global-batch", "4096", "--zero", "1",
            "--recompute", "full", "--sequence-parallel")
LLAMA8 = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--tp", "2",
          "--global-batch", "64", "--recompute", "full", "--precision", "bf16")


def test_every_flavor_exists_at_the_commit():
    for name, flavor, _ in TORCHTITAN_FLAVORS.values():
        assert flavor in DATA["models"][name]["flavors"], (name, flavor)


def test_header_names_the_commit_and_the_command(run):
    text = _out(run, *LLAMA, "--format", "torchtitan")
    lines = text.splitlines()
    assert TORCHTITAN_COMMIT in lines[0]
    assert any(f"-m torchtitan.train --module {MODULE_NAME} --config {CONFIG_NAME}" in line
               for line in lines[:10])
    assert "--nnodes=4 --nproc-per-node=8" in text
    ast.parse(text)  # a Python module


def test_llama3_70b_agrees_with_json(run, run_json):
    cfg_json = run_json(*LLAMA)["config"]
    cfg = torchtitan_config(_out(run, *LLAMA, "--format", "torchtitan"), devices=32)
    assert (cfg.model_spec.name, cfg.model_spec.flavor) == ("llama3", "70B")
    par, tr = cfg.parallelism, cfg.training
    assert par.tensor_parallel_degree == cfg_json["tp"] == 8
    assert par.pipeline_parallel_degree == cfg_json["pp"] == 4
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == cfg_json["dp"]
    assert par.num_pp_microbatches == cfg_json["gradient_accumulation"]
    assert tr.max_context_length == 8192
    assert tr.num_tokens_per_microbatch_per_dp_rank == cfg_json["micro_batch"] * 8192
    assert tr.num_tokens_per_train_step == cfg_json["global_batch"] * 8192
    assert tr.mixed_precision_param == "bfloat16" and tr.steps == 100
    assert type(cfg.activation_checkpoint).__name__ == "FullAC.Config"
    assert cfg.compile.enable is True and cfg.hf_assets_path == "/assets/tokenizer"
    assert cfg.optimizer.lr == 3e-4


def test_moe_float8_async_tp(run):
    text = _out(run, *QWEN3_MOE, "--precision", "fp8", "--tp-overlap", "--sequence-parallel",
                "--format", "torchtitan")
    cfg = torchtitan_config(text, devices=64)
    assert (cfg.model_spec.name, cfg.model_spec.flavor) == ("qwen3", "30B-A3B")
    kinds = [type(c).__name__ for c in cfg.model_spec.converters]
    assert kinds == ["Float8LinearConverter.Config", "Float8GroupedExpertsConverter.Config"]
    assert cfg.model_spec.converters[0].filter_fqns == ["lm_head", "router.gate"]
    par = cfg.parallelism
    assert (par.expert_parallel_degree, par.data_parallel_shard_degree) == (8, 8)
    assert par.fsdp_reshard_after_forward == "never"  # ZeRO 1
    assert cfg.compile.enable_async_tensor_parallel is True
    code, _, err = run(*QWEN3_MOE, "--capacity-factor", "1.5", "--format", "torchtitan")
    assert code == 2 and "dropless" in err


def test_deepseek_v3_flavor(run, tmp_path):
    from tests.test_launch_models import deepseek_v3_without_mtp

    model = deepseek_v3_without_mtp(tmp_path)
    cfg = torchtitan_config(_out(run, *DEEPSEEK[:2], model, *DEEPSEEK[3:], "--format",
                                 "torchtitan"), devices=1024)
    assert (cfg.model_spec.name, cfg.model_spec.flavor) == ("deepseek_v3", "671B")
    assert cfg.parallelism.expert_parallel_degree == 64


def test_zero_0_with_tp_is_replicate_only(run):
    """Today's torchtitan has no DDP path ('DDP has not supported > 1D parallelism' was 238fa99's):
    ZeRO 0 is FSDP2 over a replicate mesh with shard degree 1, whatever tp is."""
    cfg = torchtitan_config(_out(run, *LLAMA8, "--zero", "0", "--format", "torchtitan"),
                            devices=16)
    par = cfg.parallelism
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (8, 1)
    assert par.tensor_parallel_degree == 2


def test_zero_0_with_cp_is_refused(run):
    """FSDP shards over dp_shard x cp (fsdp.py resolve_fsdp_mesh): ZeRO 0 with cp would be
    sharded over the cp ranks, which the plan does not price."""
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--cp", "2",
            "--tp", "2", "--global-batch", "64", "--recompute", "full", "--precision", "bf16")
    code, _, err = run(*args, "--zero", "0", "--format", "torchtitan")
    assert code == 2 and "context-parallel" in err and "--format megatron" in err
    assert len(err.strip().splitlines()) == 1
    cfg = torchtitan_config(_out(run, *args, "--zero", "1", "--format", "torchtitan"),
                            devices=16)
    assert cfg.parallelism.context_parallel_degree == 2


def test_hsdp_replicate_and_shard_degrees(run):
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "32",
            "--global-batch", "64", "--precision", "bf16", "--dp-shard", "8", "--recompute",
            "full", "--zero", "3")
    par = torchtitan_config(_out(run, *args, "--format", "torchtitan"), devices=32).parallelism
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (4, 8)
    assert par.fsdp_reshard_after_forward == "always"


def test_mxfp8_with_tp_under_compile_is_refused_and_eager_is_written(run):
    args = ("evaluate", "-m", "llama3-8b", "-H", "dgx-b200", "--devices", "16", "--tp", "2",
            "--global-batch", "64", "--recompute", "full", "--zero", "1", "--precision",
            "mxfp8")
    code, _, err = run(*args, "--format", "torchtitan")
    assert code == 2 and "--kernels eager" in err and len(err.strip().splitlines()) == 1
    cfg = torchtitan_config(_out(run, *args, "--kernels", "eager", "--format", "torchtitan"),
                            devices=16)
    (conv,) = cfg.model_spec.converters
    assert type(conv).__name__ == "MXFP8LinearConverter.Config"
    assert conv.model_compile_enabled is False and cfg.compile.enable is False
    # tp 1: compiled, as priced
    cfg = torchtitan_config(_out(run, *args[:8], "1", *args[9:], "--format", "torchtitan"),
                            devices=16)
    assert cfg.compile.enable is True and cfg.model_spec.converters[0].model_compile_enabled


def test_placeholders_stop_the_run_until_set(run, run_json):
    text = _out(run, *LLAMA, "--format", "torchtitan")
    for name in ("HF_ASSETS_PATH", "DATASET", "LR", "TRAIN_STEPS"):
        env = {k: v for k, v in PLACEHOLDERS.items() if k != name}
        with pytest.raises(SystemExit, match=f"PLACEHOLDER: set {name}"):
            torchtitan_config(text, env)
    assert "c4_test" not in text  # never torchtitan's test data
    with pytest.raises(SystemExit, match="PLACEHOLDER: DATASET"):
        torchtitan_config(text, {**PLACEHOLDERS, "DATASET": "mine"})
    # with a training target the steps default to those priced
    args = ("solve", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "16", "--global-batch",
            "64", "--target-tokens", "1e9", "--critical-batch", "128")
    cfg = torchtitan_config(_out(run, *args, "--format", "torchtitan"),
                            {k: v for k, v in PLACEHOLDERS.items() if k != "TRAIN_STEPS"})
    assert cfg.training.steps == math.ceil(run_json(*args)["prediction"]["steps"]) > 1


def test_refused_with_exit_2_naming_the_format_that_can(run):
    fp8 = ("evaluate", "-m", "llama3-8b", "-H", "dgx-h100", "--devices", "8",
           "--global-batch", "32", "--precision", "fp8", "--recompute", "full")
    code, _, err = run(*fp8, "--fp8-weight-gather", "--zero", "3", "--format", "torchtitan")
    assert code == 2 and "--format megatron" in err
    layers = ("evaluate", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "64", "--tp", "8",
              "--pp", "4", "--micro-batch", "1", "--global-batch", "64", "--sequence-parallel",
              "--recompute-layers")
    code, _, err = run(*layers, "5", "--format", "torchtitan")
    assert code == 2 and "--format megatron" in err and len(err.strip().splitlines()) == 1
    # N covering a whole stage (20 layers) is full checkpointing
    cfg = torchtitan_config(_out(run, *layers, "20", "--format", "torchtitan"), devices=64)
    assert type(cfg.activation_checkpoint).__name__ == "FullAC.Config"


def test_eager_kernels_turn_compile_off(run):
    cfg = torchtitan_config(_out(run, *LLAMA8, "--zero", "1", "--kernels", "eager", "--format",
                                 "torchtitan"), devices=16)
    assert cfg.compile.enable is False
    code, _, err = run(*LLAMA8, "--zero", "1", "--sequence-parallel", "--kernels", "eager",
                       "--tp-overlap", "--format", "torchtitan")
    assert code == 2 and "torch.compile" in err


def test_stand_ins_reject_what_torchtitan_rejects():
    """The stand-ins fail on a field, value or flavor torchtitan lacks at the commit: the
    TOML-era keys, a wrong Literal, a flavor that does not exist."""
    good = ("from torchtitan.config import TrainingConfig\n"
            "def planner_plan():\n    return TrainingConfig({})\n")
    for bad in ("local_batch_size=8", "seq_len=8192", "mixed_precision_param='fp8'",
                "steps=1.5"):
        with _torchtitan({}), pytest.raises(AssertionError):
            ns: dict = {}
            exec(good.format(bad), ns)  # noqa: S102
            ns["planner_plan"]()
    with _torchtitan({}), pytest.raises(AssertionError):
        sys.modules["torchtitan.models.llama3"].model_registry("llama2-7b")
    with _torchtitan({}), pytest.raises(ImportError):
        exec("from torchtitan.config import JobConfig", {})  # noqa: S102
