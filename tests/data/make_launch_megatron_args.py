"""Writes tests/data/launch_megatron_args.json: every argument Megatron-LM's pretrain_gpt.py
accepts, read from the parser Megatron-LM itself builds (megatron/training/arguments.py
`add_megatron_arguments`, which runs every `_add_*_args` and the ArgumentGroupFactory over the
config dataclasses), at a given checkout:

    python tests/data/make_launch_megatron_args.py /path/to/Megatron-LM COMMIT

torch and the GPU packages are not needed: a permissive stand-in module is put in their place,
enough to import the modules that define the parser (nothing is run on it). The file keeps, per
argument, its option strings, destination, action, nargs, type name and choices, as data; the
launcher tests rebuild an argparse parser from it and parse the megatron form's arguments.
"""

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("torch", "transformer_engine", "apex", "flash_attn", "triton", "einops",
           "nvidia_resiliency_ext", "tensorstore", "zarr", "flashinfer", "mamba_ssm",
           "causal_conv1d", "nv_one_logger", "wandb", "tensorboard", "onnx", "deep_ep",
           "grouped_gemm", "emerging_optimizers", "multistorageclient", "modelopt", "nvtx",
           "cuda", "cupy", "safetensors", "transformers", "tiktoken", "sentencepiece",
           "megatron.energon", "hybrid_ep", "fla", "tqdm")


_CLASSES = {"dtype", "device", "Tensor", "Size", "Generator", "Stream", "Event"}


class _Stub:
    """Any torch object: an attribute, a call, a decorator, a base class, a type hint."""

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def __repr__(self):
        return f"<stub {self._name}>"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self._name}.{name}")

    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]  # used as a decorator
        return _Stub(self._name + "()")

    def __getitem__(self, item):
        return self

    def __iter__(self):
        return iter(())

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __bool__(self):
        return False

    def __len__(self):
        return 0

    def __lt__(self, o):
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def __float__(self):
        return 0.0

    def __mro_entries__(self, bases):
        return (type(self._name.rsplit(".", 1)[-1], (), {}),)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def __hash__(self):
        return hash(self._name)

    def __eq__(self, other):
        return isinstance(other, _Stub) and other._name == self._name


def _make(name):
    return _Stub(name)


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if full in sys.modules:
            return sys.modules[full]
        # names used with isinstance() are plain classes
        value = (type(name, (), {"__init__": lambda self, *a, **k: None}) if name in _CLASSES
                 else _make(full))
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if any(fullname == p or fullname.startswith(p + ".") for p in STUBBED):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        m.__version__ = "2.9.0"
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())

import typing  # noqa: E402

if not hasattr(typing, "override"):  # Python 3.12's typing.override, a no-op decorator
    typing.override = lambda f: f


def dump(checkout: str, commit: str) -> dict:
    import argparse
    import enum

    sys.path.insert(0, checkout)
    import megatron.training.arguments as arguments  # noqa: PLC0415

    parser = argparse.ArgumentParser(allow_abbrev=False)
    arguments.add_megatron_arguments(parser)
    out = []
    for action in parser._actions:
        if not action.option_strings or "-h" in action.option_strings:
            continue
        typ = action.type
        name = None if typ is None else (typ.__name__ if typ in (int, float, str)
                                         else getattr(typ, "__qualname__", repr(typ)))
        if name and "enum_type_handler" in name:
            name = "enum"
        choices = None
        if action.choices is not None:
            choices = [c.name if isinstance(c, enum.Enum) else c for c in action.choices]
        kind = type(action).__name__.strip("_").removesuffix("Action").lower() or "store"
        out.append({"flags": list(action.option_strings), "dest": action.dest,
                    "action": {"store": "store", "storetrue": "store_true",
                               "storefalse": "store_false", "storeconst": "store_const",
                               "append": "append"}.get(kind, kind),
                    "nargs": action.nargs, "type": name, "choices": choices})
    return {"repository": "NVIDIA/Megatron-LM", "commit": commit,
            "source": "megatron/training/arguments.py add_megatron_arguments (argparse actions)",
            "arguments": out}


if __name__ == "__main__":
    import json

    data = dump(sys.argv[1], sys.argv[2])
    path = __file__.replace("make_launch_megatron_args.py", "launch_megatron_args.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=0, sort_keys=True)
        f.write("\n")
    print(f"{len(data['arguments'])} arguments -> {path}")
