"""Fitting a `Calibration` on labelled data: per-field temperatures and biases.

- `calibrate(schema, examples)` runs the model on labelled examples and fits each field
  on the candidates' raw log scores `z` (`FieldResult.log_scores`). It returns a
  `Calibration` (core: `pcd_tools.answers.calibration`), which `Decider.with_calibration`
  applies and `.save` writes as JSON (schema fingerprint, model id, temperatures, biases
  and the data it was fitted on).
- The default `method="auto"` chooses per field (per label of a multi-label field), by
  cross-validation on the calibration items only, among no change, a temperature, a
  temperature with biases and, from the decider's content-free scores, the label-free
  corrections (contextual calibration, PMI) with or without a temperature. It never
  picks one whose cross-validated error of the top-label confidence is worse than no
  change (`pcd_tools.eval.auto`). Before this release the default was `temperature`.
- `method="temperature"` fits one temperature per field (it never changes an answer);
  `method="temperature_bias"` also fits one bias per allowed value (`softmax(z / T + b)`,
  Platt scaling for a boolean), which corrects a model's lean towards some answers.
- `calibration_from_decisions` and `calibration_from_scores` fit from decisions or raw
  scores already at hand, without running the model.
- Every fit also stores, per scored single-choice field, the calibration items'
  nonconformity scores `1 - p(true label)` under the fitted calibration
  (`Calibration.conformal`), from which `FieldResult.prediction_set(coverage)` builds split
  conformal prediction sets (`pcd_tools.answers.conformal`). The scores are measured on
  the same items the temperatures and biases were fitted on; a fit of a few parameters
  moves them little (EVAL.md "Prediction sets" measures the held-out coverage).

The fits themselves are in `pcd_tools.eval.fitting` (re-exported here).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..answers.calibration import METHODS, Calibration, CalibrationError
from ..answers.conformal import conformal_entry
from ..answers.softmax import softmax
from ..schema import compile_schema
from .auto import choose
from .fit_data import content_free_offsets, field_arrays, fitted_field
from .fitting import (
    BIAS_PRIOR_SDS,
    CV_FOLDS,
    OBJECTIVES,
    T_MAX,
    T_MIN,
    check_objective,
    fit_biased,
    fit_temperature,
    fit_temperature_bias,
)
from .metrics import ece, nll
from .runner import run_pcd

if TYPE_CHECKING:
    from ..answers.result import Decision
    from ..decide.decider import Decider

__all__ = [
    "BIAS_PRIOR_SDS",
    "CV_FOLDS",
    "METHODS",
    "OBJECTIVES",
    "T_MAX",
    "T_MIN",
    "calibrate",
    "calibration_from_decisions",
    "calibration_from_scores",
    "content_free_offsets",
    "field_arrays",
    "fit_field",
    "fit_temperature",
    "fit_temperature_bias",
    "resolve_objective",
]


def fit_field(
    z: np.ndarray,
    g: np.ndarray,
    method: str,
    objective: str | None = None,
    *,
    offsets: Mapping[str, Any] | None = None,
) -> tuple[float, np.ndarray | None, dict[str, Any]]:
    """Fits one field with `method`: `(T, biases or None, how it was chosen)`.

    - `temperature`: one temperature, by `objective`.
    - `temperature_bias`: a temperature and a bias per allowed value (`fitting.fit_biased`:
      the biases' prior chosen from `BIAS_PRIOR_SDS` by cross-validated NLL, the biases
      fitted by NLL, and with `objective="top_label_nll"` the temperature refitted on
      that objective, which keeps every answer and moves only the confidence).
    - `auto`: per field, no change, temperature, temperature and biases, or (given
      `offsets`) a label-free correction with or without a temperature, whichever has the
      lowest cross-validated error of the top-label confidence, and never one that does
      worse than no change (`pcd_tools.eval.auto`).

    Args:
        z: `(n, K)` raw candidate log scores.
        g: `(n,)` index of the correct candidate.
        method: `"temperature"`, `"temperature_bias"` or `"auto"`.
        objective: `"nll"` or `"top_label_nll"` (see `fit_temperature`); None for the
            method's default: `top_label_nll` for `auto` (its criterion is the top-label
            confidence), `nll` otherwise.
        offsets: For `auto`: label-free method -> the field's `(K,)` content-free offset
            (`fit_data.content_free_offsets`).

    Raises:
        CalibrationError: on an unknown method or objective.
    """
    if method not in METHODS:
        raise CalibrationError(f"unknown method {method!r}; accepted: {list(METHODS)}.")
    objective = resolve_objective(method, objective)
    if method == "auto":
        return choose(z, g, objective=objective, offsets=offsets)
    if method == "temperature":
        return fit_temperature(z, g, objective=objective), None, {"method": "temperature"}
    t, b, how = fit_biased(z, g, objective)
    return t, b, {"method": "temperature_bias", **how}


def resolve_objective(method: str, objective: str | None) -> str:
    """The objective a fit uses: the one given, else `top_label_nll` for `auto` and
    `nll` for the other methods.

    Raises:
        CalibrationError: on an unknown objective.
    """
    resolved = objective or ("top_label_nll" if method == "auto" else "nll")
    check_objective(resolved)
    return resolved


# --- fitting a Calibration ------------------------------------------------------------------


def calibration_from_decisions(
    schema: Any,
    decisions: Sequence[Decision[Any]],
    labels: Sequence[Mapping[str, Any]],
    *,
    fitted_on: Mapping[str, Any] | None = None,
    objective: str | None = None,
    method: str = "auto",
    offsets: Mapping[str, Mapping[str, Any]] | None = None,
) -> Calibration:
    """Fits per-field calibration from decisions already made on labelled examples.

    Args:
        schema: The decision schema the decisions were made with (with its examples).
        decisions: One decision per example (their raw `log_scores` are used).
        labels: `{field: label}` per example; a missing field is skipped.
        fitted_on: Provenance recorded in the file.
        objective: `"nll"` or `"top_label_nll"`; None for the method's default (see
            `fit_field`).
        method: `"auto"` (default), `"temperature"` or `"temperature_bias"` (see
            `calibrate`).
        offsets: For `auto`, the content-free offsets of the label-free corrections
            (`content_free_offsets`); used only when the decisions had no label-free
            correction themselves.
    """
    from ..decide.methods import label_free_of

    compiled = compile_schema(schema)
    if not decisions:
        raise CalibrationError("calibrate needs at least one labelled example.")
    used = {label_free_of(d.calibration_method, d.scoring) for d in decisions}
    if len(used) > 1:
        raise CalibrationError(
            f"the decisions were made with different label-free corrections {sorted(used)}; "
            "fit a calibration on decisions made one way."
        )
    base = used.pop()
    return calibration_from_scores(
        compiled,
        field_arrays(compiled, decisions, labels),
        model_id=decisions[0].model_id,
        scoring=decisions[0].scoring,
        compute=decisions[0].compute,
        fitted_on={"n": len(decisions), **dict(fitted_on or {})},
        objective=objective,
        method=method,
        label_free=base,
        offsets=offsets if base == "none" else None,
    )


def _field_offsets(
    offsets: Mapping[str, Mapping[str, Any]] | None, name: str, classes: int
) -> dict[str, np.ndarray]:
    """The content-free offsets of one fitted key, checked against its number of classes."""
    out = {}
    for method, per_field in (offsets or {}).items():
        if name not in per_field:
            continue
        o = np.asarray(per_field[name], dtype=np.float64)
        if o.shape != (classes,) or not np.isfinite(o).all():
            raise CalibrationError(
                f"field {name!r}: the {method} offset must be {classes} finite numbers "
                f"(one per allowed value); got shape {o.shape}."
            )
        out[method] = o
    return out


def calibration_from_scores(
    schema: Any,
    arrays: Mapping[str, tuple[Any, Any]],
    *,
    model_id: str,
    scoring: str = "full",
    compute: str | None = None,
    fitted_on: Mapping[str, Any] | None = None,
    objective: str | None = None,
    method: str = "auto",
    label_free: str = "none",
    offsets: Mapping[str, Mapping[str, Any]] | None = None,
    conformal_folds: int | None = None,
) -> Calibration:
    """Fits per-field calibration from raw log scores, without running the model.

    Args:
        schema: The decision schema the scores came from (with its examples).
        arrays: Field name -> `(log_scores (n, K), gold indices (n,))`.
        model_id: The model that produced the scores.
        scoring: The scoring mode of the scores.
        compute: The matrix arithmetic the scores were computed with
            (`Decision.compute`, `LoadedModel.compute`); a decider computing another way
            refuses the calibration (`Calibration.check_compute`). None: unknown.
        fitted_on: Provenance recorded in the file.
        objective: `"nll"` or `"top_label_nll"`; None for the method's default (see
            `fit_field`).
        method: `"auto"` (default), `"temperature"` or `"temperature_bias"` (see
            `calibrate`).
        label_free: The label-free correction the scores already had (`"none"`,
            `"contextual"` or `"pmi"`); a decider applies the calibration after it.
        offsets: For `auto`: label-free method (`"contextual"`, `"pmi"`) -> field name ->
            that field's content-free offset `(K,)` (`content_free_offsets`). A field
            without one is offered no label-free candidate.
        conformal_folds: None: the conformal scores are the items' `1 - p(true)` under the
            calibration fitted on them (in-sample); k: under the same calibration refitted
            without each item's fold (`refit.out_of_fold`, k folds), as a new item
            sees it. Fields with fewer than 2k labelled items keep in-sample scores.

    Returns:
        The calibration, with `conformal` scores for every single-choice field fitted
        (not multi-label labels, not `choices_by` children).

    Raises:
        CalibrationError: on an unknown method, objective or field, or mis-shaped scores
            or offsets.
    """
    compiled = compile_schema(schema)
    if method not in METHODS:
        raise CalibrationError(f"unknown method {method!r}; accepted: {list(METHODS)}.")
    k = conformal_folds
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 2):
        raise CalibrationError(f"conformal_folds must be an int >= 2 or None; got {k!r}.")
    objective = resolve_objective(method, objective)
    temps: dict[str, float] = {}
    biases: dict[str, list[float]] = {}
    metrics: dict[str, dict[str, Any]] = {}
    conformal: dict[str, dict[str, Any]] = {}
    for name, (zz, gg) in arrays.items():
        try:
            base, classes = fitted_field(compiled, name)
        except KeyError as e:
            raise CalibrationError(
                f"{name!r} is not a field of {compiled.name} (nor `field[label]` of a "
                f"multi-label field); fields: {compiled.field_names}."
            ) from e
        z, g = np.asarray(zz, dtype=np.float64), np.asarray(gg, dtype=np.int64)
        if z.ndim != 2 or z.shape[1] != classes or g.shape != (len(z),):
            raise CalibrationError(
                f"field {name!r}: need ({len(g)}, {classes}) log scores and "
                f"({len(g)},) gold indices; got {z.shape} and {g.shape}."
            )
        offs = _field_offsets(offsets, name, classes)
        ranked = base == name and compiled.field(name).reading == "ranked"
        # a ranked multi-label field is calibrated by its temperature alone
        t, b, how = fit_field(z, g, "temperature" if ranked else method, objective, offsets=offs)
        before, after = softmax(z, 1.0), softmax(z, t, b)
        temps[name] = round(t, 6)
        if b is not None:
            biases[name] = [round(float(x), 6) for x in b]
        ok_before = before.argmax(axis=1) == g
        ok_after = after.argmax(axis=1) == g
        if base == name and compiled.field(name).choices_by is None and not ranked:
            # split conformal: the items' 1 - p(true) under this calibration as stored
            bias = np.asarray(biases[name]) if name in biases else None
            conformal[name] = conformal_entry(softmax(z, temps[name], bias), g)
        metrics[name] = {
            "n": len(g),
            **how,
            "nll_before": nll(before, g),
            "nll_after": nll(after, g),
            "ece_before": ece(before.max(axis=1), ok_before),
            "ece_after": ece(after.max(axis=1), ok_after),
            "accuracy_before": float(ok_before.mean()),
            "accuracy_after": float(ok_after.mean()),
        }
    info = dict(fitted_on or {})
    if offsets:
        info.setdefault("label_free_candidates", sorted(offsets))
    cal = Calibration(
        model_id=model_id,
        schema_name=compiled.name,
        schema_fingerprint=compiled.fingerprint(),
        temperatures=temps,
        fitted_on=info,
        metrics=metrics,
        scoring=scoring,
        compute=compute,
        objective=objective,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        biases=biases,
        method=method,
        label_free=label_free,
        conformal=conformal,
    )
    if conformal_folds is not None:
        _cross_fit_conformal(cal, arrays, conformal_folds)
    return cal


def _cross_fit_conformal(
    cal: Calibration, arrays: Mapping[str, tuple[Any, Any]], folds: int
) -> None:
    """Replaces `cal`'s in-sample conformal scores by cross-fitted ones (see
    `calibration_from_scores`), recording how each was made."""
    from .refit import out_of_fold

    for name in list(cal.conformal):
        z = np.asarray(arrays[name][0], dtype=np.float64)
        g = np.asarray(arrays[name][1], dtype=np.int64)
        if len(g) < 2 * folds:
            cal.conformal[name]["fitted"] = "in-sample (too few items to cross-fit)"
            continue
        probs = out_of_fold(cal, name, z, g, folds=folds)
        cal.conformal[name] = {**conformal_entry(probs, g), "fitted": f"{folds}-fold cross-fitted"}


def calibrate(
    schema: Any,
    examples: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    decider: Decider | None = None,
    batch_size: int = 8,
    fitted_on: Mapping[str, Any] | None = None,
    objective: str | None = None,
    method: str = "auto",
    progress: bool = False,
) -> Calibration:
    """Fits a calibration per field on labelled examples (keep them apart from the eval data).

    Args:
        schema: The decision schema (with its few-shot examples, if any: they are part of
            the prompt and of the fingerprint the calibration is checked against).
        examples: `(text, {field: label})` pairs; a field missing from a pair is skipped.
        decider: The decider (default: the embedded model). Its label-free setting is
            the one the calibration is fitted on top of.
        batch_size: Contexts scored per pass.
        fitted_on: Provenance recorded in the file (dataset, split, n, seed, ids...).
        objective: `"nll"` or `"top_label_nll"`; None for the method's default
            (`top_label_nll` for `auto`, `nll` otherwise).
        method: `"auto"` (the default since this release; before, `"temperature"`): per
            field, whichever of no change, temperature, temperature and biases, and the
            label-free corrections (contextual, PMI; measured on the decider's
            content-free inputs when its decisions have no label-free correction) with or
            without a temperature has the lowest cross-validated error of the top-label
            confidence, never one worse than no change (`pcd_tools.eval.auto`).
            `"temperature"`: one temperature per field; never changes an answer.
            `"temperature_bias"`: a temperature plus one bias per allowed value, with a
            Gaussian prior whose width is chosen by cross-validation; it corrects a model
            that leans towards some answers, and so can change answers.
        progress: Show a progress bar on stderr.

    Returns:
        A `Calibration` with per-field NLL and ECE before and after on the fitting data,
        and for `auto` each field's choice, the candidates' cross-validated figures and
        the reason (`metrics[field]`).
    """
    from ..decide.decider import default_decider

    compiled = compile_schema(schema)
    d = decider or default_decider()
    items = list(examples)
    if not items:
        raise CalibrationError("calibrate needs at least one labelled example.")
    decisions, _ = run_pcd(
        d,
        compiled,
        [t for t, _ in items],
        batch_size=batch_size,
        progress=progress,
        label="calibrating",
    )
    first = decisions[0]
    offsets = None
    if method == "auto" and first.calibration_method == "none" and first.scoring != "pmi":
        offsets = content_free_offsets(d, compiled, first.scoring)
    return calibration_from_decisions(
        compiled,
        decisions,
        [lab for _, lab in items],
        fitted_on=fitted_on,
        objective=objective,
        method=method,
        offsets=offsets,
    )
