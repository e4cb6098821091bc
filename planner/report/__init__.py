"""What each command shows: JSON documents and text for people, from typed results.

    render       the generic forms: the JSON / YAML document, aligned tables, SI numbers
    plans        evaluate, solve and sweep, for every model family
    specs        show: a model's layers and totals, a hardware spec
    limits       limits and derive
    calibration  calibrate

Nothing here computes. The renderers below load on first use (`from planner.report import
solution_doc` works as before), so that the command line imports none of the specs or
expressions a command does not need.
"""

from __future__ import annotations

import importlib

_HOME = {
    "plans": ("config_text", "evaluation_doc", "evaluation_text", "solution_doc",
              "solution_text", "split_doc", "split_text", "sweep_doc", "sweep_text"),
    "specs": ("hardware_doc", "hardware_text", "model_doc", "model_text", "share",
              "transformer_details", "transformer_doc"),
    "limits": ("derive_text", "limits_text", "transformer_limits_text"),
    "calibration": ("calibration_doc", "calibration_text"),
}
_MODULE = {name: module for module, names in _HOME.items() for name in names}

__all__ = sorted(_MODULE)


def __getattr__(name: str):
    module = _MODULE.get(name)
    if module is None:
        raise AttributeError(f"module 'planner.report' has no attribute {name!r}")
    return getattr(importlib.import_module(f"planner.report.{module}"), name)
