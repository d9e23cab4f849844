"""The small model's calibration for a cascade's gate, and its cross-fitted twin.

A cascade whose gate reads calibrated confidences needs two things fitted on labelled
items: the calibration and the thresholds. Fitted on the same items, the thresholds see
the calibration's in-sample confidences, which are surer than it will be on new items
(banking77, 77 labels, the 0.5B fitted on 150 items: 47.3% right in-sample against 34.0%
held-out), so a threshold fitted to lose at most one point escalates too little.
`cross_fit` gives every item the probabilities of the same calibration refitted without
it (k folds); the thresholds are fitted on those, and the calibration a decider loads is
the one fitted on every item. `refit.out_of_fold` does the same for one field's arrays, for
the selective thresholds of `pcd calibrate --target-risk / --target-coverage` and the
optional cross-fitted conformal scores (`calibration_from_scores(conformal_folds=K)`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..schema import Schema, compile_schema
from .cascade_data import CascadeEvalError, CrossFitted, ModelRun, gated_fields
from .datasets import label_index
from .refit import fold_assignment, refit

__all__ = ["cross_fit", "fitted_calibration", "run_arrays"]


def run_arrays(schema: Schema, run: ModelRun) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per gated field, `(log scores (n, K), gold indices (n,))` of `run`'s labelled items,
    as `calibration_from_scores` takes them."""
    arrays = {}
    for n in gated_fields(schema):
        spec = schema.field(n)
        rows = [(z[n], g[n]) for z, g in zip(run.log_scores, run.gold) if g.get(n) is not None]
        arrays[n] = (
            np.array([z for z, _ in rows], np.float64).reshape(len(rows), spec.cardinality),
            np.array([label_index(spec, g) for _, g in rows], np.int64),
        )
    return arrays


def fitted_calibration(schema: Schema, run: ModelRun) -> Any:
    """The small model's `auto` calibration fitted on `run`'s items (no content-free
    offsets offline, so no label-free candidate): the `fitted` gate's source, and what a
    real run of a fit on it loads (`Decider.with_calibration`)."""
    from .calibration import calibration_from_scores

    return calibration_from_scores(
        schema,
        run_arrays(schema, run),
        model_id=run.model_id,
        compute=run.compute,
        method="auto",
        label_free=run.label_free if run.label_free in ("contextual", "pmi") else "none",
    )


def cross_fit(
    schema: Any,
    run: ModelRun,
    calibration: Any,
    *,
    folds: int = 5,
    seed: int = 0,
) -> CrossFitted:
    """Out-of-fold twins of `calibration`, which was fitted on `run`'s items.

    The items are shuffled (seeded) into `folds` folds. For each fold, every gated field's
    calibration is refitted on the other folds' items with the choice `calibration` made
    for it (`refit`), and that copy scores the fold's items. Refitting the choice rather
    than choosing again matters: on banking77 `auto` chose temperature and biases on 150
    items but temperature alone on most 120-item folds, whose confidences then say
    nothing of the chosen calibration's.

    Args:
        schema: The decision schema.
        run: The small model's results on the items `calibration` was fitted on.
        calibration: The small model's `Calibration` (from `calibration_from_scores`,
            `calibrate` or `pcd calibrate`).
        folds: The number of folds, from 2 to the number of items.
        seed: The seed of the shuffle.

    Returns:
        A `CrossFitted`, which `pair_runs(small_calibration=...)` and
        `fit_cascade(calibration=...)` take.

    Raises:
        InvalidArgumentError: for `folds` that is not an int in [2, items].
        CascadeEvalError: for fewer than 2 items or repeated ids.
        CalibrationError: for a field whose calibration method cannot be refitted.
    """
    compiled = compile_schema(schema)
    if len(run.ids) < 2:
        raise CascadeEvalError(f"cross-fitting needs at least 2 items; got {len(run.ids)}.")
    fold_of = fold_assignment(len(run.ids), folds, seed)
    if len(set(run.ids)) != len(run.ids):
        raise CascadeEvalError("cross-fitting needs distinct item ids; the run repeats some.")
    by_id: dict[str, Any] = {}
    for k in range(folds):
        train = run.subset([i for i, f in zip(run.ids, fold_of) if f != k])
        copy = refit(calibration, run_arrays(compiled, train))
        by_id.update({i: copy for i, f in zip(run.ids, fold_of) if f == k})
    return CrossFitted(by_id, folds)
