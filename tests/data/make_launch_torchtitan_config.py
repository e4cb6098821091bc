"""Writes tests/data/launch_torchtitan_config.json: the names and types the torchtitan form's
config module may use, read from torchtitan's own source at a given commit (its config
dataclasses, the model registries' flavors and arguments, what each imported module binds):

    python tests/data/make_launch_torchtitan_config.py /path/to/torchtitan.git COMMIT

The source is read with `git show COMMIT:path` (a bare mirror is enough) and parsed with `ast`:
nothing of torchtitan is imported, so neither torch nor a GPU is needed. Per config class the
file keeps its fields (name, annotation as written, whether it has a default) and its base
classes resolved to the classes they name, so the launcher tests can rebuild stand-ins that
accept exactly those keyword arguments and attributes (torchtitan's configs are
`@dataclass(kw_only=True, slots=True)`: an unknown keyword or attribute fails there too).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import upstream_source  # tests/data/upstream_source.py, beside this script

# the config classes the torchtitan form constructs or assigns, as (module, dotted class name)
CLASSES = [
    ("torchtitan.trainer", "Trainer.Config"),
    ("torchtitan.config.configs", "TrainingConfig"),
    ("torchtitan.config.configs", "ParallelismConfig"),
    ("torchtitan.config.configs", "CompileConfig"),
    ("torchtitan.distributed.activation_checkpoint", "FullAC.Config"),
    ("torchtitan.distributed.activation_checkpoint", "SelectiveAC.Config"),
    ("torchtitan.components.quantization.float8", "Float8LinearConverter.Config"),
    ("torchtitan.components.quantization.float8", "Float8GroupedExpertsConverter.Config"),
    ("torchtitan.components.quantization.mx", "MXFP8LinearConverter.Config"),
    ("torchtitan.components.quantization.mx", "MXFP8GroupedExpertsConverter.Config"),
    ("torchtitan.components.loss", "ChunkedLossWrapper.Config"),
    ("torchtitan.components.loss", "CrossEntropyLoss.Config"),
    ("torchtitan.components.data.loader", "GrainDataLoader.Config"),
    ("torchtitan.components.data.packing", "ConcatThenSplitPackingConfig"),
    ("torchtitan.components.checkpointer.dcp", "CheckpointManager.Config"),
    ("torchtitan.components.optimizer.lr_scheduler", "LRSchedulersContainer.Config"),
]
# functions the form calls: (module, name)
FUNCTIONS = [
    ("torchtitan.components.optimizer.optimizer", "default_adamw"),
    ("torchtitan.models.common.config_utils", "decoder_vocab_size"),
]
MODELS = ["llama3", "deepseek_v3", "qwen3"]  # torchtitan.models.<name>: model_registry, flavors
# modules the form imports from: every name each binds at top level is kept
MODULES = [
    "torchtitan.trainer", "torchtitan.config", "torchtitan.components.checkpointer",
    "torchtitan.components.data", "torchtitan.components.loss",
    "torchtitan.components.optimizer", "torchtitan.components.quantization",
    "torchtitan.distributed.activation_checkpoint", "torchtitan.hf_datasets.text_datasets",
    "torchtitan.models.common.config_utils", *(f"torchtitan.models.{m}" for m in MODELS),
]
ALIASES = [("torchtitan.distributed.activation_checkpoint", "ActivationCheckpointingConfig")]


Source = upstream_source.Source


def bound_names(src: Source, module: str) -> dict[str, str | None]:
    """Top-level names a module binds -> the module it imports them from (None: defined)."""
    names: dict[str, str | None] = {}
    for node in src.module(module).body:
        if isinstance(node, ast.ImportFrom):
            origin = src.absolute(module, node)
            for a in node.names:
                names[a.asname or a.name] = f"{origin}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                names[(a.asname or a.name).split(".")[0]] = a.name
        elif isinstance(node, ast.ClassDef | ast.FunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names[t.id] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
    return names


def resolve(src: Source, module: str, dotted: str) -> tuple[str, str]:
    """(module defining it, dotted class name) for a name as written in `module`."""
    head, _, rest = dotted.partition(".")
    origin = bound_names(src, module).get(head, None)
    if origin is None:
        return module, dotted
    mod, _, name = origin.rpartition(".")
    try:
        src.module(f"{mod}.{name}")  # `from pkg import submodule`
        return resolve(src, f"{mod}.{name}", rest) if rest else (f"{mod}.{name}", "")
    except FileNotFoundError:
        pass
    return resolve(src, mod, name + (f".{rest}" if rest else ""))


def find_class(src: Source, module: str, dotted: str) -> ast.ClassDef:
    body = src.module(module).body
    node = None
    for part in dotted.split("."):
        node = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == part)
        body = node.body
    return node


def class_info(src: Source, module: str, dotted: str, out: dict) -> str:
    """Adds the class (and its bases) to `out`; returns its key 'module:Dotted.Name'."""
    key = f"{module}:{dotted}"
    if key in out:
        return key
    node = find_class(src, module, dotted)
    fields = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            ann = ast.unparse(stmt.annotation)
            if ann.startswith("ClassVar"):
                continue
            fields[stmt.target.id] = {"type": ann, "default": stmt.value is not None}
    out[key] = {"fields": fields, "bases": []}
    outer = dotted.rpartition(".")[0]
    for b in node.bases:
        text = ast.unparse(b)
        if text in ("ABC", "Generic[T]") or text.startswith(("Protocol", "grain.")):
            continue
        # a name written inside a nested class may be the outer class's sibling
        if outer and text.split(".")[0] == outer.split(".")[-1]:
            mod, name = module, text
        else:
            mod, name = resolve(src, module, text)
        try:
            out[key]["bases"].append(class_info(src, mod, name, out))
        except (StopIteration, FileNotFoundError):
            out[key]["bases"].append(f"{mod}:{name}")  # outside torchtitan (torch, stdlib)
    return key


def function_params(src: Source, module: str, name: str) -> dict:
    node = next(n for n in src.module(module).body
                if isinstance(n, ast.FunctionDef) and n.name == name)
    a = node.args
    params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return {"params": params, "var_keyword": a.kwarg is not None,
            "returns": ast.unparse(node.returns) if node.returns else None}


def flavors(src: Source, module: str) -> list[str]:
    """The keys of the `*_configs` dict model_registry looks the flavor up in."""
    for node in src.module(module).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id.endswith("_configs")
                        for t in node.targets)):
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise LookupError(f"no *_configs dict in {module}")


def dict_keys(src: Source, module: str, name: str) -> list[str]:
    for node in src.module(module).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == name:
            return [k.value for k in node.value.keys]
    raise LookupError(name)


def alias(src: Source, module: str, name: str) -> str:
    for node in src.module(module).body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name):
            return ast.unparse(node.value)
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == name and node.value is not None):
            return ast.unparse(node.value)
        type_alias = getattr(ast, "TypeAlias", None)  # `type X = ...` (Python 3.12)
        if type_alias and isinstance(node, type_alias) and node.name.id == name:
            return ast.unparse(node.value)
    raise LookupError(name)


def main(git_dir: str, commit: str) -> dict:
    src = Source(git_dir, commit)
    full = subprocess.run(["git", "-C", git_dir, "rev-parse", commit], capture_output=True,
                          text=True, check=True).stdout.strip()
    classes: dict = {}
    for module, dotted in CLASSES:
        class_info(src, module, dotted, classes)
    for module in ("torchtitan.components.optimizer.optimizer",):
        class_info(src, module, "OptimizersContainer.Config", classes)
    return {
        "repository": "pytorch/torchtitan", "commit": full,
        "classes": classes,
        "functions": {f"{m}:{n}": function_params(src, m, n) for m, n in FUNCTIONS},
        "models": {m: {"flavors": flavors(src, f"torchtitan.models.{m}"),
                       "model_registry": function_params(src, f"torchtitan.models.{m}",
                                                         "model_registry")}
                   for m in MODELS},
        "modules": {m: bound_names(src, m) for m in MODULES},
        "datasets": dict_keys(src, "torchtitan.hf_datasets.text_datasets", "DATASETS"),
        "aliases": {f"{m}:{n}": alias(src, m, n) for m, n in ALIASES},
    }


if __name__ == "__main__":
    data = main(sys.argv[1], sys.argv[2])
    json.dump(data, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
