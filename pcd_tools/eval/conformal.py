"""Held-out coverage of split conformal prediction sets (`FieldResult.prediction_set`).

`set_coverage` takes a calibration with conformal scores (every `pcd calibrate` fit stores
them, `pcd_tools.answers.conformal`) and PCD's raw log scores on labelled items that were
not in the calibration split, and reports per field and coverage target how often the
set held the true answer, its mean size and how often it was a single answer. `pcd eval
--calibration FILE` (and `--from-report`) puts this in the report's `prediction_sets`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..answers.conformal import (
    ConformalScores,
    TooFewCalibrationItemsError,
    conformal_quantile,
    prediction_set_indices,
)
from ..schema import Schema
from .datasets import label_index

__all__ = ["COVERAGES", "set_coverage"]

# The coverage targets a report measures.
COVERAGES = (0.8, 0.9, 0.95)


def set_coverage(
    schema: Schema,
    calibration: Any,
    log_scores: Sequence[Mapping[str, Sequence[float]]],
    labels: Sequence[Mapping[str, Any]],
    coverages: Sequence[float] = COVERAGES,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per field with conformal scores, per coverage target: the held-out coverage.

    Args:
        schema: The compiled schema the scores came from.
        calibration: A `Calibration` with `conformal` scores.
        log_scores: Per item, field -> its raw candidate log scores (declared order).
        labels: Per item, field -> the gold JSON label (a missing field is skipped).
        coverages: The targets, each in (0, 1).

    Returns:
        `{field: {str(target): {"target", "coverage", "mean_size", "singleton_rate",
        "threshold", "lac_coverage", "lac_empty_rate", "n", "n_cal"}}}`, or for a target
        the calibration is too small for, `{"target", "error"}`. `coverage` is that of
        `FieldResult.prediction_set` (never empty: the top answer is always kept, so it is
        at least the top-1 accuracy); `lac_coverage` and `lac_empty_rate` are those of the
        plain LAC set, which is empty when no answer reaches `1 - threshold`.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, entry in (getattr(calibration, "conformal", None) or {}).items():
        if name not in schema.field_names:
            continue
        spec = schema.field(name)
        rows = [(z[name], lab[name]) for z, lab in zip(log_scores, labels) if name in lab]
        if not rows:
            continue
        gold = [label_index(spec, v) for _, v in rows]
        sets: list[ConformalScores] = [
            ConformalScores(
                name,
                tuple(entry["scores"]),
                tuple(float(p) for p in calibration.probabilities(name, z, 1.0)),
            )
            for z, _ in rows
        ]
        per: dict[str, dict[str, Any]] = {}
        for c in coverages:
            try:
                q = conformal_quantile(sets[0].scores, c, name)
            except TooFewCalibrationItemsError as e:
                per[str(c)] = {"target": c, "error": str(e)}
                continue
            got = [prediction_set_indices(s.probs, q) for s in sets]
            sizes = np.array([len(s) for s in got])
            hit = np.array([g in s for g, s in zip(gold, got)])
            # plain LAC, which may return an empty set (no answer plausible enough)
            raw_hit = np.array([1.0 - s.probs[g] <= q + 1e-9 for g, s in zip(gold, sets)])
            raw_empty = np.array([1.0 - max(s.probs) > q + 1e-9 for s in sets])
            per[str(c)] = {
                "target": c,
                "coverage": float(hit.mean()),
                "mean_size": float(sizes.mean()),
                "singleton_rate": float((sizes == 1).mean()),
                "threshold": q,
                "lac_coverage": float(raw_hit.mean()),
                "lac_empty_rate": float(raw_empty.mean()),
                "n": len(rows),
                "n_cal": int(entry["n"]),
            }
        out[name] = per
    return out
