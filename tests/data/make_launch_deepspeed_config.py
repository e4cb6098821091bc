"""Writes tests/data/launch_deepspeed_config.json: the ds_config keys DeepSpeed reads and what it
checks them with, read from DeepSpeed's own source at a given commit:

    python tests/data/make_launch_deepspeed_config.py /path/to/DeepSpeed.git COMMIT

The source is read with `git show COMMIT:path` (a bare mirror is enough) and parsed with `ast`:
nothing of DeepSpeed is imported, so neither torch nor a GPU is needed.

DeepSpeedConfig (deepspeed/runtime/config.py) is a plain class over the JSON dict: every method
of it is followed, with the functions and classes it hands the dict to (get_zero_config,
get_bfloat16_config, get_tensor_parallel_config, DeepSpeedCommsConfig, ...), and every read of
the dict (`d[K]`, `d.get(K, default)`, `K in d`, `get_scalar_param(d, K, default)`) is kept as a
key path, its names resolved through deepspeed/runtime/constants.py and the other modules they
come from. Per key the file keeps where it is read, its default, the pydantic model it is
validated by (`Model(**d[K])`), the strings it is compared with (communication_data_type), the
lower bound _batch_assertion asserts (train_batch_size > 0, ...) and the enum the engine looks it
up in (`DtypeEnum(self._config.grad_accum_dtype)`, deepspeed/runtime/engine.py). Per pydantic
model (DeepSpeedConfigModel: extra="forbid", populate_by_name) its fields with their type as
written, default, alias, bounds and deprecation, and the enums their types name (ZeroStageEnum).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import upstream_source  # tests/data/upstream_source.py, beside this script

ENTRY = ("deepspeed.runtime.config", "DeepSpeedConfig")
ENGINE = "deepspeed.runtime.engine"
BASE_MODEL = ("deepspeed.runtime.config_utils", "DeepSpeedConfigModel")
READERS = {"get_scalar_param", "get_list_param", "get_dict_param"}  # config_utils: d.get(K, v)


class Source(upstream_source.Source):
    def lookup(self, module: str, name: str, seen=None) -> tuple[str, ast.AST] | None:
        """(module, node) defining `name` as bound at the top of `module`: a class, a function,
        or the value assigned; followed through imports and `import *`."""
        seen = seen or set()
        if (module, name) in seen or not module.startswith("deepspeed") or not self.has(module):
            return None
        seen.add((module, name))
        last, stars = None, []
        for node in self.module(module).body:
            hit = None
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
                hit = (module, node)
            elif ((isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == name for t in node.targets))
                  or (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                      and node.target.id == name and node.value is not None)):
                hit = (module, node.value)
            elif isinstance(node, ast.ImportFrom):
                origin = self.absolute(module, node)
                for a in node.names:
                    if a.name == "*":
                        stars.append(origin)
                    elif (a.asname or a.name) == name:
                        hit = (self.lookup(origin, a.name, seen)
                               or (("module", f"{origin}.{a.name}")
                                   if self.has(f"{origin}.{a.name}") else None))
            if hit:
                last = hit  # the last binding wins, as at import time
        if last:
            return last
        for origin in stars:
            hit = self.lookup(origin, name, seen)
            if hit:
                return hit
        return None


def value(src: Source, module: str, node: ast.AST, depth=0):
    """A constant expression's value: literals, names of constants (followed), pp_int(x)."""
    if depth > 20:
        raise ValueError
    if isinstance(node, ast.Name):
        hit = src.lookup(module, node.id)
        if hit is None or not isinstance(hit[1], ast.expr):
            raise ValueError(node.id)
        return value(src, hit[0], hit[1], depth + 1)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "pp_int"
            and node.args):
        return int(value(src, module, node.args[0], depth + 1))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "int", "float"):
        return {"int": int, "float": float}[node.func.id](value(src, module, node.args[0]))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -value(src, module, node.operand, depth + 1)
    if isinstance(node, ast.List | ast.Tuple):
        return [value(src, module, e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {value(src, module, k, depth + 1): value(src, module, v, depth + 1)
                for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)


def value_or_text(src: Source, module: str, node: ast.AST):
    try:
        v = value(src, module, node)
        json.dumps(v)
        return v
    except (ValueError, TypeError, SyntaxError, KeyError):
        return {"expr": ast.unparse(node)}


class Reads:
    """Follows the ds_config dict through DeepSpeedConfig and what it hands the dict to."""

    def __init__(self, src: Source):
        self.src = src
        self.keys: dict = {}  # nested: key -> {"readers", "default", "model", "keys", ...}
        self.attrs: dict[str, set] = {}  # DeepSpeedConfig attribute -> key paths
        self.done: set = set()
        self.models: set[tuple[str, str]] = set()

    def entry(self, path: tuple) -> dict:
        node = {"keys": self.keys}
        for k in path:
            node = node.setdefault("keys", {}).setdefault(k, {"readers": []})
        return node

    # --- one function, with some of its parameters bound to key paths of the dict
    def function(self, module: str, fn: ast.FunctionDef, bound: dict[str, tuple],
                 cls: tuple[str, ast.ClassDef] | None = None, consts: dict | None = None) -> set:
        consts = consts or {}
        sig = (module, fn.name, cls[1].name if cls else None,
               tuple(sorted(bound.items())), tuple(sorted(consts.items())))
        if sig in self.done:
            return set()
        self.done.add(sig)
        where = f"{module}:{(cls[1].name + '.') if cls else ''}{fn.name}"
        args = fn.args.posonlyargs + fn.args.args
        defaults = dict(zip([a.arg for a in args][len(args) - len(fn.args.defaults):],
                            fn.args.defaults, strict=True))
        defaults |= {k: ast.Constant(v) for k, v in consts.items()}  # the caller's constants
        local: dict[str, list] = {}
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        local.setdefault(t.id, []).append(n.value)
        ctx = {"module": module, "bound": bound, "local": local, "defaults": defaults,
               "where": where, "cls": cls, "resolving": set()}
        returns: set = set()
        for n in ast.walk(fn):
            self.expr(n, ctx)
            if isinstance(n, ast.Return) and n.value is not None:
                returns |= self.paths(n.value, ctx)
            if (isinstance(n, ast.Assign) and cls and cls[1].name == ENTRY[1]
                    and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute)
                    and isinstance(n.targets[0].value, ast.Name)
                    and n.targets[0].value.id == "self"):
                got = self.paths(n.value, ctx)
                if got:
                    self.attrs.setdefault(n.targets[0].attr, set()).update(got)
            if isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ast.Eq):
                side, other = n.left, n.comparators[0]
                if isinstance(other, ast.Name | ast.Attribute | ast.Call):
                    side, other = other, side
                try:
                    text = value(self.src, module, other)
                except (ValueError, SyntaxError):
                    continue
                if isinstance(text, str):
                    for p in self.paths(side, ctx):
                        e = self.entry(p)
                        if text not in e.setdefault("compared_with", []):
                            e["compared_with"].append(text)
                        if self._lowered(side, ctx):
                            e["lowered"] = True
        return returns

    def expr(self, n: ast.AST, ctx) -> None:
        """Records the reads one node makes (`d[K]`, `d.get(K)`, `K in d`, calls passing d)."""
        if isinstance(n, ast.Subscript | ast.Call):
            self.paths(n, ctx)
        elif (isinstance(n, ast.Compare) and len(n.ops) == 1
              and isinstance(n.ops[0], ast.In | ast.NotIn)):
            self.read(n.comparators[0], n.left, None, ctx, "in")

    def _lowered(self, node, ctx) -> bool:
        if isinstance(node, ast.Name):
            return any(
                isinstance(v, ast.IfExp | ast.Call) and "lower()" in ast.unparse(v)
                for v in ctx["local"].get(node.id, []))
        return False

    def key(self, node: ast.AST, ctx) -> str | None:
        if isinstance(node, ast.Name) and node.id in ctx["defaults"] and \
                node.id not in ctx["local"]:
            node = ctx["defaults"][node.id]
        try:
            k = value(self.src, ctx["module"], node)
        except (ValueError, SyntaxError, KeyError):
            return None
        return k if isinstance(k, str) else None

    def read(self, base, keynode, default, ctx, how: str) -> set:
        out = set()
        k = self.key(keynode, ctx)
        if k is None:
            return out
        for p in self.paths(base, ctx, reads=False):
            q = p + (k,)
            e = self.entry(q)
            if ctx["where"] not in e["readers"]:
                e["readers"].append(ctx["where"])
            if default is not None:
                d = default
                if isinstance(d, ast.Name) and d.id in ctx["defaults"]:
                    d = ctx["defaults"][d.id]
                e.setdefault("default", value_or_text(self.src, ctx["module"], d))
            out.add(q)
        return out

    def paths(self, node: ast.AST, ctx, reads=True, depth=0) -> set:
        """The key paths of the ds_config dict `node` evaluates to."""
        if depth > 12:
            return set()
        if isinstance(node, ast.Name):
            if node.id in ctx["bound"]:
                return {ctx["bound"][node.id]}
            out = set()
            if node.id in ctx["resolving"]:
                return out
            ctx["resolving"].add(node.id)
            for v in ctx["local"].get(node.id, []):
                out |= self.paths(v, ctx, reads, depth + 1)
            ctx["resolving"].discard(node.id)
            return out
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and node.attr == "_param_dict" and ctx["cls"]
                and ctx["cls"][1].name == ENTRY[1]):
            return {()}
        if isinstance(node, ast.IfExp):
            return (self.paths(node.body, ctx, reads, depth + 1)
                    | self.paths(node.orelse, ctx, reads, depth + 1))
        if isinstance(node, ast.Subscript):
            return self.read(node.value, node.slice, None, ctx, "[]")
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "get" and node.args:
                return self.read(f.value, node.args[0],
                                 node.args[1] if len(node.args) > 1 else ast.Constant(None),
                                 ctx, "get")
            if isinstance(f, ast.Attribute) and f.attr == "lower":
                return self.paths(f.value, ctx, reads, depth + 1)
            if isinstance(f, ast.Name) and f.id in READERS and len(node.args) >= 2:
                return self.read(node.args[0], node.args[1],
                                 node.args[2] if len(node.args) > 2 else ast.Constant(None),
                                 ctx, f.id)
            return self.call(node, ctx, depth + 1)
        return set()

    def call(self, node: ast.Call, ctx, depth=0) -> set:
        """A call handing (part of) the dict on: follow it into DeepSpeed's function or class."""
        args = [(i, self.paths(a, ctx, depth=depth)) for i, a in enumerate(node.args)]
        kw = {k.arg: self.paths(k.value, ctx, depth=depth) for k in node.keywords if k.arg}
        star = [self.paths(k.value, ctx, depth=depth) for k in node.keywords if k.arg is None]
        if not any(p for _, p in args) and not any(kw.values()) and not any(star):
            return set()
        f = node.func
        target = None
        if isinstance(f, ast.Name):
            target = self.src.lookup(ctx["module"], f.id)
        elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
              and f.value.id == "self" and ctx["cls"]):
            m = self.method(*ctx["cls"], f.attr)
            if m:
                target = (m[0], m[1], m[2])
        if target is None:
            return set()
        if len(target) == 3:  # a method of the current class (or a base)
            module, fn, cls = target
            bound = self._bind(fn, args, kw, skip=1)
            return self.function(module, fn, bound, cls) if bound else set()
        module, fn = target
        if isinstance(fn, ast.FunctionDef):
            bound = self._bind(fn, args, kw, skip=0)
            names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            consts = {}
            for i, a in enumerate(node.args):  # constants passed: get_x(d, KEY, DEFAULT)
                v = value_or_text(self.src, ctx["module"], a)
                if i < len(names) and not args[i][1] and isinstance(v, str | int | float):
                    consts[names[i]] = v
            return self.function(module, fn, bound, consts=consts) if bound else set()
        if isinstance(fn, ast.ClassDef):
            if self.is_model(module, fn):
                for paths in star + [p for _, p in args]:
                    for p in paths:
                        e = self.entry(p)
                        e["model"] = f"{module}:{fn.name}"
                        self.models.add((module, fn.name))
                return set()
            init = self.method(module, fn, "__init__")
            if init:
                bound = self._bind(init[1], args, kw, skip=1)
                if bound:
                    self.function(init[0], init[1], bound, (init[2][0], init[2][1]))
        return set()

    @staticmethod
    def _bind(fn: ast.FunctionDef, args, kw, skip: int) -> dict:
        names = [a.arg for a in fn.args.posonlyargs + fn.args.args][skip:]
        bound = {}
        for i, paths in args:
            if paths and i < len(names) and len(paths) == 1:
                bound[names[i]] = next(iter(paths))
        for k, paths in kw.items():
            if paths and len(paths) == 1:
                bound[k] = next(iter(paths))
        return bound

    def bases(self, module: str, cls: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        out = []
        for b in cls.bases:
            if isinstance(b, ast.Name):
                hit = self.src.lookup(module, b.id)
                if hit and isinstance(hit[1], ast.ClassDef):
                    out.append(hit)
        return out

    def method(self, module: str, cls: ast.ClassDef, name: str):
        for n in cls.body:
            if isinstance(n, ast.FunctionDef) and n.name == name:
                return module, n, (module, cls)
        for bm, b in self.bases(module, cls):
            hit = self.method(bm, b, name)
            if hit:
                return hit
        return None

    def is_model(self, module: str, cls: ast.ClassDef) -> bool:
        if (module, cls.name) == BASE_MODEL:
            return True
        return any(self.is_model(bm, b) for bm, b in self.bases(module, cls))


def batch_bounds(src: Source, reads: Reads) -> None:
    """DeepSpeedConfig._batch_assertion: `x = self.attr` ... `assert (x > N)`."""
    _, cls = src.lookup(*ENTRY)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef)
              and n.name == "_batch_assertion")
    local = {t.id: n.value.attr for n in ast.walk(fn) if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Attribute)}
    for n in ast.walk(fn):
        if (isinstance(n, ast.Assert) and isinstance(n.test, ast.Compare)
                and isinstance(n.test.ops[0], ast.Gt) and isinstance(n.test.left, ast.Name)):
            bound = ast.literal_eval(n.test.comparators[0])
            for p in reads.attrs.get(local.get(n.test.left.id, ""), ()):
                reads.entry(p)["gt"] = bound
                reads.entry(p)["checked_by"] = f"{ENTRY[0]}:{ENTRY[1]}._batch_assertion"


def engine_enums(src: Source, reads: Reads) -> None:
    """deepspeed/runtime/engine.py `Enum(self._config.attr)`: the key is looked up in Enum."""
    for n in ast.walk(src.module(ENGINE)):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.args
                and isinstance(n.args[0], ast.Attribute)
                and ast.unparse(n.args[0].value) == "self._config"):
            hit = src.lookup(ENGINE, n.func.id)
            if not hit or not isinstance(hit[1], ast.ClassDef) or not is_enum(hit[1]):
                continue
            for p in reads.attrs.get(n.args[0].attr, ()):
                reads.entry(p)["enum"] = f"{hit[0]}:{hit[1].name}"
                reads.entry(p)["checked_by"] = f"{ENGINE}: {ast.unparse(n)}"


def is_enum(cls: ast.ClassDef) -> bool:
    return any(ast.unparse(b).split(".")[-1] == "Enum" for b in cls.bases)


def enum_info(src: Source, module: str, cls: ast.ClassDef) -> dict:
    members = {}
    for n in cls.body:
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name):
            elts = n.value.elts if isinstance(n.value, ast.Tuple) else [n.value]
            vals = [value_or_text(src, module, e) for e in elts]
            members[n.targets[0].id] = vals
    # a member with several values registers each in _value2member_map_ (DtypeEnum.__new__)
    multi = any(isinstance(n, ast.FunctionDef) and n.name == "__new__"
                and "_value2member_map_" in ast.unparse(n) for n in cls.body)
    return {"bases": [ast.unparse(b) for b in cls.bases], "members": members,
            "every_value_looks_up": multi}


FIELD_KEYS = ("alias", "ge", "gt", "le", "lt")


def model_info(src: Source, reads: Reads, module: str, cls: ast.ClassDef, out: dict,
               enums: dict) -> str:
    key = f"{module}:{cls.name}"
    if key in out:
        return key
    entry = out[key] = {"bases": [], "fields": {}}
    for n in cls.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "model_config"
                                             for t in n.targets):
            entry["model_config"] = {k.arg: value_or_text(src, module, k.value)
                                     for k in n.value.keywords}
        if not (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)):
            continue
        ann = ast.unparse(n.annotation)
        if ann.startswith("ClassVar"):
            continue
        field = {"type": ann}
        v = n.value
        if (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "Field"):
            kws = {k.arg: k.value for k in v.keywords}
            if v.args:
                field["default"] = value_or_text(src, module, v.args[0])
            elif "default" in kws:
                field["default"] = value_or_text(src, module, kws["default"])
            elif "default_factory" in kws:
                field["default_factory"] = ast.unparse(kws["default_factory"])
            for k in FIELD_KEYS:
                if k in kws:
                    field[k] = value_or_text(src, module, kws[k])
            extra = kws.get("json_schema_extra")
            if isinstance(extra, ast.Dict):
                for k, val in zip(extra.keys, extra.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value in ("deprecated", "new_param"):
                        field[k.value] = value_or_text(src, module, val)
        elif v is not None:
            field["default"] = value_or_text(src, module, v)
        else:
            field["required"] = True
        entry["fields"][n.target.id] = field
        # the classes the annotation names: enums and nested models
        for name in {x.id for x in ast.walk(n.annotation) if isinstance(x, ast.Name)}:
            hit = src.lookup(module, name)
            if not hit or not isinstance(hit[1], ast.ClassDef):
                continue
            if is_enum(hit[1]):
                enums[f"{hit[0]}:{hit[1].name}"] = enum_info(src, *hit)
                field.setdefault("classes", {})[name] = f"{hit[0]}:{hit[1].name}"
            elif reads.is_model(*hit):
                field.setdefault("classes", {})[name] = model_info(src, reads, *hit, out, enums)
    for bm, b in reads.bases(module, cls):
        entry["bases"].append(model_info(src, reads, bm, b, out, enums))
    return key


def main(git_dir: str, commit: str) -> dict:
    src = Source(git_dir, commit)
    full = subprocess.run(["git", "-C", git_dir, "rev-parse", commit], capture_output=True,
                          text=True, check=True).stdout.strip()
    reads = Reads(src)
    module, cls = src.lookup(*ENTRY)
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef):
            names = [a.arg for a in fn.args.args]
            bound = {n: () for n in names if n in ("param_dict", "config")}
            reads.function(module, fn, bound, (module, cls))
    batch_bounds(src, reads)
    engine_enums(src, reads)
    models: dict = {}
    enums: dict = {}
    for m, name in sorted(reads.models):
        model_info(src, reads, m, src.lookup(m, name)[1], models, enums)

    def used_enums(node):
        for e in node.get("keys", {}).values():
            if "enum" in e:
                m, _, name = e["enum"].partition(":")
                enums[e["enum"]] = enum_info(src, m, src.lookup(m, name)[1])
            used_enums(e)

    used_enums({"keys": reads.keys})
    return {"repository": "deepspeedai/DeepSpeed", "commit": full,
            "entry": f"{ENTRY[0]}:{ENTRY[1]}", "keys": reads.keys, "models": models,
            "enums": enums}


if __name__ == "__main__":
    data = main(sys.argv[1], sys.argv[2])
    json.dump(data, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
