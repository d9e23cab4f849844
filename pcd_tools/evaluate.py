"""Deprecated: moved to `pcd_tools.eval.evaluate`; this path goes in the next release.

Every public name is re-exported from its new home (the same objects): `run_pcd` now
lives in `pcd_tools.eval.runner` and `MethodReport` in `pcd_tools.eval.scoring`. `pcd
eval`'s `add_arguments` and `run` moved to `pcd_tools.cli.eval`, which the library does
not import.
"""

from __future__ import annotations

import warnings
from typing import Any

# `Baseline` (the type of a baseline callable) is public without being in `__all__`.
from .eval.evaluate import Baseline as Baseline
from .eval.evaluate import EvalError, EvalReport, evaluate, rescore
from .eval.runner import run_pcd
from .eval.scoring import MethodReport

__all__ = ["EvalError", "EvalReport", "MethodReport", "evaluate", "rescore", "run_pcd"]

warnings.warn(
    "pcd_tools.evaluate moved to pcd_tools.eval.evaluate; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)

_CLI = ("add_arguments", "run")


def __getattr__(name: str) -> Any:
    if name in _CLI:
        raise AttributeError(
            f"pcd_tools.evaluate.{name} moved to pcd_tools.cli.eval.{name} (argument parsing "
            "lives in pcd_tools.cli); call pcd_tools.eval.evaluate.evaluate instead."
        )
    raise AttributeError(f"module 'pcd_tools.evaluate' has no attribute {name!r}")
