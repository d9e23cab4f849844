"""Each method's metrics on a sample, from what it answered.

- PCD: the raw candidate log scores per item and field, turned into distributions at a
  temperature (`pcd`) or under a calibration (`pcd_calibrated`).
- The grammar-constrained baseline: it emits one answer per field and the probability its
  sampler gave that answer (`value_probs`). That probability is its confidence; for Brier
  and NLL its distribution puts `p` on the answer and spreads `1 - p` evenly over the
  other candidates. An invalid or unmatched answer counts as wrong with confidence 0, and
  its distribution is uniform.

`pcd_tools.eval.evaluate` runs the methods and gathers these into an `EvalReport`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..schema import Schema
from .datasets import DatasetError, label_index
from .metrics import FieldMetrics, field_metrics

__all__ = ["MethodReport", "baseline_method", "pcd_methods"]


def _latency(ms: Sequence[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    if not a.size:
        return {"median_ms": math.nan, "p95_ms": math.nan, "mean_ms": math.nan, "total_s": 0.0}
    return {
        "median_ms": float(np.median(a)),
        "p95_ms": float(np.percentile(a, 95)),
        "mean_ms": float(a.mean()),
        "total_s": float(a.sum() / 1e3),
    }


@dataclass
class MethodReport:
    """One method's results on the sample.

    Args:
        method: `"pcd"`, `"pcd_calibrated"` or `"baseline"`.
        fields: Per-field metrics.
        latency: `median_ms`, `p95_ms`, `mean_ms` per item and `total_s`.
        latency_kind: `"per item"` or `"amortized over batches of B"`.
        passes: Mean sequential forward passes per call.
        invalid: Items whose output was not valid, schema-matching JSON (baseline).
        tokens: Mean generated tokens per item (baseline).
    """

    method: str
    fields: dict[str, FieldMetrics]
    latency: dict[str, float]
    latency_kind: str = "per item"
    passes: float = math.nan
    invalid: int = 0
    tokens: float = math.nan
    _arrays: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)

    def confidence_correct(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """`(confidence, correct)` arrays of one field, for diagrams and thresholds."""
        a = self._arrays[name]
        return a["confidence"], a["pred"] == a["gold"]

    def to_dict(self, *, curves: bool = False) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "method": self.method,
            "fields": {n: m.to_dict(curve=curves) for n, m in self.fields.items()},
            "latency": self.latency,
            "latency_kind": self.latency_kind,
            "passes": self.passes,
            "invalid": self.invalid,
            "tokens": self.tokens,
        }


def _pcd_method(
    name: str,
    schema: Schema,
    log_scores: Sequence[Mapping[str, Sequence[float]]],
    labels: Sequence[Mapping[str, Any]],
    probs_of: Callable[[str, np.ndarray], np.ndarray],
    ms: Sequence[float],
    batch_size: int,
    passes: float,
) -> MethodReport:
    """Metrics of PCD from raw log scores (per item, per field) under `probs_of`."""
    fields, arrays = {}, {}
    for spec in schema.fields:
        rows = [(z, lab) for z, lab in zip(log_scores, labels) if spec.name in lab]
        if not rows:
            continue
        z = np.array([zz[spec.name] for zz, _ in rows], dtype=np.float64)
        gold = np.array([label_index(spec, lab[spec.name]) for _, lab in rows])
        probs = probs_of(spec.name, z)
        fields[spec.name] = field_metrics(probs, gold)
        arrays[spec.name] = {
            "confidence": probs.max(axis=1),
            "pred": probs.argmax(axis=1),
            "gold": gold,
        }
    kind = "per item" if batch_size == 1 else f"amortized over batches of {batch_size}"
    return MethodReport(name, fields, _latency(ms), kind, passes, _arrays=arrays)


def pcd_methods(
    schema: Schema,
    log_scores: Sequence[Mapping[str, Sequence[float]]],
    labels: Sequence[Mapping[str, Any]],
    calibration: Any,
    temperature: float,
    ms: Sequence[float],
    batch_size: int,
    passes: float,
) -> dict[str, MethodReport]:
    """`pcd` (raw, at `temperature`) and, with a calibration, `pcd_calibrated`.

    Args:
        schema: The compiled schema.
        log_scores: Per item, field name -> raw candidate log scores.
        labels: Per item, `{field: label}`; a field missing from an item is not scored.
        calibration: A `Calibration` for `pcd_calibrated`, or `None`.
        temperature: PCD softmax temperature.
        ms: Per-item latency in milliseconds.
        batch_size: PCD batch size (it names the latency kind).
        passes: Mean sequential forward passes per call.
    """
    from ..answers.softmax import softmax

    def raw(_: str, z: np.ndarray) -> np.ndarray:
        return np.stack([softmax(row, temperature) for row in z])

    out = {"pcd": _pcd_method("pcd", schema, log_scores, labels, raw, ms, batch_size, passes)}
    if calibration is not None:

        def calibrated(name: str, z: np.ndarray) -> np.ndarray:
            out: np.ndarray = calibration.probabilities(name, z, temperature)
            return out

        out["pcd_calibrated"] = _pcd_method(
            "pcd_calibrated", schema, log_scores, labels, calibrated, ms, batch_size, passes
        )
    return out


def _baseline_row(spec: Any, res: Any) -> tuple[np.ndarray, int, float]:
    """(distribution, answer index or -1, confidence) of one baseline answer."""
    k = spec.cardinality
    ok = bool(getattr(res, "is_valid_json", False)) and bool(getattr(res, "schema_match", False))
    values = getattr(res, "values", None) if ok else None
    if not values or spec.name not in values:
        return np.full(k, 1.0 / k), -1, 0.0
    try:
        idx = label_index(spec, values[spec.name])
    except DatasetError:
        return np.full(k, 1.0 / k), -1, 0.0
    vp = getattr(res, "value_probs", None) or {}
    p = float(vp.get(spec.name, 1.0))
    row = np.full(k, (1.0 - p) / (k - 1))
    row[idx] = p
    return row, idx, p


def baseline_method(
    schema: Schema, results: Sequence[Any], labels: Sequence[Mapping[str, Any]], ms: Sequence[float]
) -> MethodReport:
    """The baseline's metrics from its answers (`GenerationResult`-like objects).

    Args:
        schema: The compiled schema.
        results: One baseline result per item.
        labels: Per item, `{field: label}`; a field missing from an item is not scored.
        ms: Per-item latency in milliseconds.
    """
    fields, arrays = {}, {}
    for spec in schema.fields:
        rows = [(r, lab) for r, lab in zip(results, labels) if spec.name in lab]
        if not rows:
            continue
        parts = [_baseline_row(spec, r) for r, _ in rows]
        probs = np.array([p[0] for p in parts])
        pred = np.array([p[1] for p in parts])
        conf = np.array([p[2] for p in parts])
        gold = np.array([label_index(spec, lab[spec.name]) for _, lab in rows])
        fields[spec.name] = field_metrics(probs, gold, confidence=conf, pred=pred)
        arrays[spec.name] = {"confidence": conf, "pred": pred, "gold": gold}
    invalid = sum(
        not (getattr(r, "is_valid_json", False) and getattr(r, "schema_match", False))
        for r in results
    )
    passes = [getattr(r, "passes", math.nan) for r in results]
    tokens = [getattr(r, "tokens", math.nan) for r in results]
    return MethodReport(
        "baseline",
        fields,
        _latency(ms),
        "per item",
        float(np.mean(passes)) if passes else math.nan,
        invalid,
        float(np.mean(tokens)) if tokens else math.nan,
        _arrays=arrays,
    )
