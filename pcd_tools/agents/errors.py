"""Errors of the agents extra: a decision below the caller's threshold, a failed cascade.

They live apart from `cascade` so that `structured` (which raises `LowConfidenceError`)
and `cascade` (which uses `structured`) do not import each other.
"""

from __future__ import annotations

from typing import Any

from ..errors import PcdToolsError

__all__ = ["CascadeError", "LowConfidenceError"]


class LowConfidenceError(PcdToolsError, RuntimeError):
    """A decision's confidence is below the caller's threshold (raised only on opt-in).

    Args:
        decision: The `Decision`, kept whole so a fallback can use it.
        threshold: The threshold it missed, if known.

    Attributes:
        decision: The `Decision`.
        fields: Names of the fields below the threshold.
    """

    def __init__(self, decision: Any, *, threshold: float | None = None):
        self.decision = decision
        self.threshold = threshold
        self.fields = decision.low_confidence(threshold) if threshold is not None else []
        where = f" below {threshold}" if threshold is not None else ""
        super().__init__(
            f"decision confidence {decision.confidence:.4f}{where}; low-confidence fields: "
            f"{self.fields or 'n/a'}"
        )


class CascadeError(PcdToolsError, RuntimeError):
    """No stage produced an answer for some field (every stage failed on it)."""
