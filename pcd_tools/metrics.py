"""Deprecated: moved to `pcd_tools.eval.metrics`; this path goes in the next release.

Every public name is re-exported from its new home (the same objects).
"""

from __future__ import annotations

import warnings

from .eval.metrics import (
    ECE_BINS,
    FieldMetrics,
    accuracy,
    aurc,
    brier,
    ece,
    ece_floor,
    field_metrics,
    macro_f1,
    nll,
    reliability_bins,
    risk_coverage,
)

__all__ = [
    "ECE_BINS",
    "FieldMetrics",
    "accuracy",
    "aurc",
    "brier",
    "ece",
    "ece_floor",
    "field_metrics",
    "macro_f1",
    "nll",
    "reliability_bins",
    "risk_coverage",
]

warnings.warn(
    "pcd_tools.metrics moved to pcd_tools.eval.metrics; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
