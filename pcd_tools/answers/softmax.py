"""Softmax and log-softmax over candidate scores: the one place they are written.

Every helper subtracts the maximum first (stable), and keeps the order of operations its
callers have always used, so results stay bit-identical across the package.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["log_softmax", "log_softmax_at", "logsumexp", "softmax"]


def softmax(z: Any, temperature: float = 1.0, bias: np.ndarray | None = None) -> np.ndarray:
    """`softmax(z / temperature + bias)` over the last axis, in float64.

    Args:
        z: Log scores, one row (or a stack of rows) of candidates.
        temperature: Divides the scores first.
        bias: Added after the division (a fitted calibration's per-value biases).

    Returns:
        The probabilities, the shape of `z`.
    """
    s = np.asarray(z, dtype=np.float64) / float(temperature)
    if bias is not None:
        s = s + bias
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(z: Any) -> np.ndarray:
    """`log(softmax(z))` of one row of scores, in float64."""
    s = np.asarray(z, dtype=np.float64)
    s = s - s.max()
    return s - np.log(np.exp(s).sum())


def log_softmax_at(logits: np.ndarray, t: int) -> float:
    """`log_softmax(logits)[t]` in the logits' own dtype (one decoded token's log-prob)."""
    m = float(logits.max())
    return float(logits[t] - m - np.log(np.exp(logits - m).sum()))


def logsumexp(x: np.ndarray) -> float:
    """`log(sum(exp(x)))`, stable."""
    m = float(np.max(x))
    return m + float(np.log(np.exp(x - m).sum()))
