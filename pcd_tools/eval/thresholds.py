"""Choosing a confidence threshold on held-out data for a target risk or coverage.

Answer automatically only when a field's confidence is at least the threshold; the rest
go to a person or a bigger model. `choose_threshold` reads the risk-coverage curve
(`pcd_tools.eval.metrics.risk_coverage`) and returns a `ThresholdChoice`, which
`pcd calibrate --target-risk/--target-coverage` stores in the calibration file.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..answers.calibration import CalibrationError
from .metrics import risk_coverage

__all__ = ["ThresholdChoice", "choose_threshold"]


@dataclass
class ThresholdChoice:
    """A confidence threshold: answer automatically only when confidence >= `threshold`.

    Args:
        threshold: The chosen threshold.
        coverage: Fraction of the held-out items it accepts.
        risk: Error rate among the accepted items.
        target: `"risk"` or `"coverage"`.
        target_value: The requested risk or coverage.
        achieved: Whether the target was met.
        n: Held-out items it was chosen on.
    """

    threshold: float
    coverage: float
    risk: float
    target: str
    target_value: float
    achieved: bool
    n: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)


def choose_threshold(
    confidence: Any,
    correct: Any,
    *,
    target_risk: float | None = None,
    target_coverage: float | None = None,
) -> ThresholdChoice:
    """Picks a confidence threshold on held-out data for one target.

    - `target_risk`: the lowest threshold whose error rate among accepted items is at
      most the target (the largest coverage that meets it).
    - `target_coverage`: the highest threshold that still accepts at least that fraction.

    Args:
        confidence: Probability of each chosen answer.
        correct: Whether each answer was right.
        target_risk: Acceptable error rate in [0, 1].
        target_coverage: Required fraction answered automatically in (0, 1].

    Raises:
        CalibrationError: unless exactly one target in range is given.
    """
    if (target_risk is None) == (target_coverage is None):
        raise CalibrationError(
            "choose_threshold needs exactly one of target_risk or target_coverage; got "
            f"target_risk={target_risk!r}, target_coverage={target_coverage!r}."
        )
    thr, cov, risk = risk_coverage(confidence, correct)
    n = len(np.asarray(confidence))
    if not n:
        raise CalibrationError("choose_threshold needs at least one held-out item.")
    if target_risk is not None:
        if not 0.0 <= target_risk <= 1.0:
            raise CalibrationError(f"target_risk must lie in [0, 1]; got {target_risk!r}.")
        ok = np.flatnonzero(risk <= target_risk + 1e-12)
        if not ok.size:  # nothing meets it: accept nothing
            return ThresholdChoice(
                math.nextafter(float(thr[0]), math.inf), 0.0, 0.0, "risk", target_risk, False, n
            )
        j = int(ok[-1])
        return ThresholdChoice(
            float(thr[j]), float(cov[j]), float(risk[j]), "risk", target_risk, True, n
        )
    if target_coverage is None or not 0.0 < target_coverage <= 1.0:
        raise CalibrationError(f"target_coverage must lie in (0, 1]; got {target_coverage!r}.")
    j = int(np.flatnonzero(cov >= target_coverage - 1e-12)[0])
    return ThresholdChoice(
        float(thr[j]), float(cov[j]), float(risk[j]), "coverage", target_coverage, True, n
    )
