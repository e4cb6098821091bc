"""An upstream repository's Python source at one commit, read with `git show` from a (bare)
mirror and parsed with `ast`: nothing of it is imported. The data makers of the launcher
checks (make_launch_deepspeed_config.py, make_launch_torchtitan_config.py) read through it."""

from __future__ import annotations

import ast
import subprocess


class Source:
    def __init__(self, git_dir: str, commit: str):
        self.git_dir, self.commit = git_dir, commit
        self.trees: dict[str, ast.Module] = {}
        self.paths: dict[str, str] = {}

    def _show(self, path: str) -> str | None:
        r = subprocess.run(["git", "-C", self.git_dir, "show", f"{self.commit}:{path}"],
                           capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None

    def module(self, name: str) -> ast.Module:
        """The parsed module `name` (a.b.c: a/b/c.py or a/b/c/__init__.py)."""
        if name not in self.trees:
            base = name.replace(".", "/")
            for path in (f"{base}.py", f"{base}/__init__.py"):
                text = self._show(path)
                if text is not None:
                    self.trees[name], self.paths[name] = ast.parse(text), path
                    break
            else:
                raise FileNotFoundError(name)
        return self.trees[name]

    def has(self, name: str) -> bool:
        try:
            self.module(name)
            return True
        except FileNotFoundError:
            return False

    def is_package(self, name: str) -> bool:
        self.module(name)
        return self.paths[name].endswith("__init__.py")

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        """The module an `from ... import` in `module` reads from, relative levels resolved."""
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if self.is_package(module) else 0)
        return ".".join(parts[:keep] + ([node.module] if node.module else []))
