"""Cascades measured: what escalating low-confidence fields to a larger model buys.

A threshold cascade keeps the small model's answer to a field when its confidence clears
the field's threshold and takes the large model's answer otherwise. Escalation only
chooses which of two answers is kept, so with both models' per-item results on the same
labelled items (`pcd eval --out`, or `ModelRun.from_decisions`) every threshold can be
measured without running a model again. That holds when an escalated field is scored over
all its candidates, as `DeciderStage` does by default; `top_k` simulates a narrowed stage
by renormalising the large model's distribution over the small model's top k (the real
narrowed prompt lists fewer candidates, so this is an approximation, and the report says
which was measured).

- `ModelRun`: one model's per-item results (log scores, prompt tokens, time per item);
- `evaluate_policy`: the metrics of one set of per-field thresholds;
- `sweep`: one global threshold swept from "never escalate" to "always escalate";
- `fit_cascade`: per-field thresholds chosen on a calibration split for a target
  (`max_escalation=0.3`: the best accuracy at that item budget; `max_accuracy_loss=0.01`:
  the least escalation within 1 point of large-only accuracy), stored in a calibration
  file (`CascadeFit.attach`) that `Cascade(..., threshold="fitted")` reads;
- `cascade_report`: the whole measurement behind `pcd eval --cascade SMALL,LARGE`: the
  items split into a calibration half and a held-out half, every gate signal (max
  probability, margin, entropy) from every source (raw, the small model's fitted `auto`
  calibration, the label-free contextual correction) swept on the held-out half, and the
  fits for both targets checked on it;
- `cross_fit`: the small model's calibration refitted without each item's fold, so that
  thresholds fitted on calibrated confidences do not see the calibration's in-sample
  confidences (`fit_cascade(calibration="fit")`, `pcd calibrate --cascade`).

Accuracy of a multi-field schema is the mean over fields. The escalation rate is the
fraction of items with at least one escalated field (each costs the large model a prefill
of the item); per field, the fraction of that field's answers escalated. The large
model's cost is its forward tokens on escalated items as a fraction of large-only (an
upper bound: the real narrowed prompt describes only the escalated fields), and the wall
time estimate is the small model's time on every item plus the large model's on the
escalated ones, over large-only; one real run (`pcd eval --cascade` with models) measures
it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..schema import compile_schema
from .cascade_data import (
    SIGNALS,
    CascadeEvalError,
    CrossFitted,
    ModelRun,
    Pair,
    common_ids,
    confidence,
    curve_area,
    evaluate_policy,
    gated_fields,
    pair_runs,
    separation,
    sweep,
    uniform,
)
from .cascade_fit import CascadeFit, fit_cascade, fit_pair
from .crossfit import cross_fit, fitted_calibration

__all__ = [
    "SIGNALS",
    "SOURCES",
    "CascadeEvalError",
    "CascadeFit",
    "CrossFitted",
    "ModelRun",
    "cascade_report",
    "confidence",
    "cross_fit",
    "evaluate_policy",
    "fit_cascade",
    "fitted_calibration",
    "pair_runs",
    "sweep",
]

# Where the small model's gate distribution comes from.
SOURCES: tuple[str, ...] = ("raw", "fitted", "contextual")

# --- the whole measurement --------------------------------------------------------------------


def split_ids(ids: Sequence[str], cal_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """A seeded random split of `ids` into (calibration, held-out)."""
    if not 0.0 < cal_fraction < 1.0:
        raise InvalidArgumentError(f"cal_fraction must lie in (0, 1); got {cal_fraction!r}.")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(ids))
    k = round(len(ids) * cal_fraction)
    if k < 1 or k >= len(ids):
        raise CascadeEvalError(
            f"{len(ids)} common items cannot be split {cal_fraction:.0%} / "
            f"{1 - cal_fraction:.0%}; evaluate on more items."
        )
    return [ids[i] for i in sorted(perm[:k])], [ids[i] for i in sorted(perm[k:])]


def cascade_report(
    schema: Any,
    small: ModelRun,
    large: ModelRun,
    *,
    contextual: ModelRun | None = None,
    cal_fraction: float = 0.5,
    seed: int = 0,
    points: int = 21,
    top_k: int | None = None,
    max_escalation: float = 0.3,
    max_accuracy_loss: float = 0.01,
    folds: int = 5,
    dataset: str = "",
) -> dict[str, Any]:
    """Sweeps, compares gates and fits thresholds; everything from saved results.

    The common items are split (seeded) into a calibration part (`cal_fraction`) and a
    held-out part. On the held-out part: small-only, large-only, and the sweep of every
    signal from every source (`raw`; `fitted`, the small model's `auto` calibration
    fitted on the calibration part; `contextual`, when a contextual run is given). The
    best gate is the one with the largest area under accuracy against the large model's
    token fraction. Each gate also reports its `separation`: the AUROC of its confidence
    for the small model's right against wrong answers (0.5: no separation). Then
    per-field thresholds are fitted on the calibration part for both targets with that
    gate (and with both models under their own fitted calibration, `both`: against a
    calibrated large model) and measured on the held-out part; for the `fitted` source they
    are fitted on cross-fitted confidences (`folds` folds: each calibration item scored by
    a calibration fitted without it), so calibration and thresholds never share an item.

    Returns:
        A JSON-serialisable report.
    """
    compiled = compile_schema(schema)
    n_items = pair_runs(compiled, small, large).n  # checks the schema and the common ids
    common = common_ids(small, large, *([contextual] if contextual is not None else []))
    cal_ids, test_ids = split_ids(common, cal_fraction, seed)
    small_cal, large_cal = small.subset(cal_ids), large.subset(cal_ids)
    small_test, large_test = small.subset(test_ids), large.subset(test_ids)
    fitted = fitted_calibration(compiled, small_cal)
    # the thresholds on the calibration part see out-of-fold calibrated confidences
    crossed = cross_fit(compiled, small_cal, fitted, folds=folds)
    sources: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "raw": ({}, {}),
        "fitted": ({"small_calibration": crossed}, {"small_calibration": fitted}),
    }
    if contextual is not None:
        sources["contextual"] = ({"gate": contextual}, {"gate": contextual})
    gates: dict[str, dict[str, Any]] = {}
    pairs: dict[str, tuple[Pair, Pair]] = {}
    for src, (cal_kw, kw) in sources.items():
        cal_pair = pair_runs(compiled, small_cal, large_cal, top_k=top_k, **cal_kw)
        test_pair = pair_runs(compiled, small_test, large_test, top_k=top_k, **kw)
        pairs[src] = (cal_pair, test_pair)
        for sig in SIGNALS:
            rows = sweep(test_pair, sig, points)
            gates[f"{src}/{sig}"] = {
                "source": src,
                "signal": sig,
                "area": curve_area(rows),
                "separation": separation(test_pair, sig),
                "sweep": rows,
            }
    # both stages under their own fitted calibration: the fair comparison where the raw
    # large model is badly calibrated (it is not a gate of its own: the small side is
    # the fitted gate's)
    large_fitted = fitted_calibration(compiled, large_cal)
    pairs["both"] = (
        pair_runs(
            compiled,
            small_cal,
            large_cal,
            top_k=top_k,
            small_calibration=crossed,
            large_calibration=cross_fit(compiled, large_cal, large_fitted, folds=folds),
        ),
        pair_runs(
            compiled,
            small_test,
            large_test,
            top_k=top_k,
            small_calibration=fitted,
            large_calibration=large_fitted,
        ),
    )
    best = max(gates, key=lambda g: (gates[g]["area"], g == "raw/probability"))
    src, sig = gates[best]["source"], gates[best]["signal"]
    cal_pair, test_pair = pairs[src]
    fits = {}
    runs = [
        ("max_escalation", max_escalation, "best", (src, sig), None),
        ("max_escalation", max_escalation, "raw/probability", ("raw", "probability"), None),
        # the budget held to a 90% upper confidence bound on the escalation rate
        ("max_escalation", max_escalation, "best/bound", (src, sig), 0.9),
        ("max_accuracy_loss", max_accuracy_loss, "best", (src, sig), None),
        ("max_accuracy_loss", max_accuracy_loss, "raw/probability", ("raw", "probability"), None),
        ("max_escalation", max_escalation, "both", ("both", "probability"), None),
        ("max_accuracy_loss", max_accuracy_loss, "both", ("both", "probability"), None),
        # held to a 90% lower confidence bound, for comparison
        (
            "max_accuracy_loss",
            max_accuracy_loss,
            "raw/probability/bound",
            ("raw", "probability"),
            0.9,
        ),
    ]
    for target, value, name, (s2, g2), level in runs:
        cp, tp = pairs[s2]
        fit = fit_pair(
            cp,
            signal=g2,
            source=s2,
            large_model=large.model_id,
            confidence_level=level,
            **{target: value},
        )
        held = evaluate_policy(tp, fit.thresholds)
        large_acc = evaluate_policy(tp, uniform(tp, g2, math.inf))["accuracy"]
        fits[f"{target}/{name}"] = {
            "target": target,
            "value": value,
            "gate": f"{s2}/{g2}",
            "confidence_level": level,
            "thresholds": fit.to_dict()["thresholds"],
            "calibration": fit.calibration,
            "held_out": held,
            "held_out_large_accuracy": large_acc,
            "met": (
                held["escalation"] <= value + 0.03
                if target == "max_escalation"
                else held["accuracy"] >= large_acc - value
            ),
        }
    test_raw = pairs["raw"][1]
    small_only = evaluate_policy(test_raw, uniform(test_raw, "probability", -math.inf))
    large_only = evaluate_policy(test_raw, uniform(test_raw, "probability", math.inf))
    test_both = pairs["both"][1]
    large_fitted_only = evaluate_policy(test_both, uniform(test_both, "probability", math.inf))
    return {
        "dataset": dataset,
        "schema": compiled.name,
        "small_model": small.model_id,
        "large_model": large.model_id,
        "n_items": n_items,
        "n_calibration": len(cal_ids),
        "n_held_out": len(test_ids),
        "calibration_ids": cal_ids,
        "held_out_ids": test_ids,
        "seed": seed,
        "top_k": top_k,
        "escalated_scoring": "all candidates" if top_k is None else f"top {top_k} (simulated)",
        "small_only": small_only,
        "large_only": large_only,
        "large_only_fitted": large_fitted_only,
        "fitted_calibration": {
            n: fitted.metrics.get(n, {}).get("method") for n in gated_fields(compiled)
        },
        "fitted_thresholds_on": f"{crossed.folds}-fold cross-fitted confidences",
        "gates": gates,
        "best_gate": best,
        "fits": fits,
    }
