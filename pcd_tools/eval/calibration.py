"""Fitting a `Calibration` on labelled data: per-field temperatures and biases.

- `calibrate(schema, examples)` runs the model on labelled examples and fits one
  temperature per field by minimising the NLL of `softmax(z / T)` over the candidates'
  raw log scores `z` (`FieldResult.log_scores`). It returns a `Calibration` (core:
  `pcd_tools.calibration`), which `Decider.with_calibration` applies and `.save` writes
  as JSON (schema fingerprint, model id, temperatures and the data it was fitted on).
- `method="temperature_bias"` also fits one bias per allowed value (`softmax(z / T + b)`,
  Platt scaling for a boolean), which corrects a model's prior lean towards some answers
  and so can change the answer; `method="auto"` picks per field by cross-validated NLL.
- `calibration_from_decisions` and `calibration_from_scores` fit from decisions or raw
  scores already at hand, without running the model.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..calibration import METHODS, Calibration, CalibrationError, _softmax
from ..schema import compile_schema
from .fit_data import field_arrays, fitted_field
from .metrics import ece, nll
from .runner import run_pcd

if TYPE_CHECKING:
    from ..decider import Decider
    from ..result import Decision

__all__ = [
    "METHODS",
    "OBJECTIVES",
    "calibrate",
    "calibration_from_decisions",
    "calibration_from_scores",
    "field_arrays",
    "fit_field",
    "fit_temperature",
    "fit_temperature_bias",
]

T_MIN, T_MAX = 0.02, 50.0
# Candidate standard deviations (in nats) of the Gaussian prior on the biases; the fit
# picks one by cross-validated NLL on the calibration data.
BIAS_PRIOR_SDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
CV_FOLDS = 5


# --- temperature fitting ----------------------------------------------------------------


def _nll_at(z: np.ndarray, gold: np.ndarray, t: float) -> float:
    s = z / t
    m = s.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(s - m).sum(axis=1))) if len(s) else np.zeros(0)
    return float((lse - s[np.arange(len(gold)), gold]).mean())


def _top_label_nll_at(z: np.ndarray, gold: np.ndarray, t: float) -> float:
    """Binary NLL of "the answer is right" under the answer's probability."""
    p = _softmax(z, t).max(axis=1).clip(1e-12, 1 - 1e-12)
    ok = z.argmax(axis=1) == gold
    return float(-np.where(ok, np.log(p), np.log1p(-p)).mean())


OBJECTIVES = {"nll": _nll_at, "top_label_nll": _top_label_nll_at}


def fit_temperature(
    log_scores: Any,
    gold: Any,
    *,
    objective: str = "nll",
    bounds: tuple[float, float] = (T_MIN, T_MAX),
) -> float:
    """The temperature T minimising a likelihood loss of `softmax(log_scores / T)`.

    A 1-D search on log T: a 64-point grid over `bounds`, then golden-section refinement
    between the best point's neighbours (the losses are smooth and, in practice, unimodal).

    Args:
        log_scores: `(n, K)` raw candidate log scores.
        gold: `(n,)` index of the correct candidate.
        objective: `"nll"` (default: the NLL of the gold candidate, classic temperature
            scaling) or `"top_label_nll"` (the binary NLL of whether the answer is right,
            given its probability: it fits the confidence users threshold on, and is not
            dominated by gold candidates the model scores near zero).
        bounds: Smallest and largest temperature considered.

    Raises:
        CalibrationError: on empty or mis-shaped input, or an unknown objective.
    """
    z = np.asarray(log_scores, dtype=np.float64)
    g = np.asarray(gold, dtype=np.int64)
    if z.ndim != 2 or g.shape != (z.shape[0],) or not len(g):
        raise CalibrationError(
            f"need (n, K) log scores and (n,) gold indices with n > 0; got {z.shape} and {g.shape}."
        )
    if objective not in OBJECTIVES:
        raise CalibrationError(f"unknown objective {objective!r}; accepted: {sorted(OBJECTIVES)}.")
    loss = OBJECTIVES[objective]
    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    grid = np.linspace(lo, hi, 64)
    vals = [loss(z, g, math.exp(x)) for x in grid]
    j = int(np.argmin(vals))
    a, b = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    phi = (math.sqrt(5) - 1) / 2
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = loss(z, g, math.exp(c)), loss(z, g, math.exp(d))
    for _ in range(60):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = loss(z, g, math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = loss(z, g, math.exp(d))
    best = (a + b) / 2
    return float(math.exp(best if loss(z, g, math.exp(best)) <= vals[j] else grid[j]))


def _tb_loss_grad_hess(
    z: np.ndarray, y: np.ndarray, a: float, b: np.ndarray, lam: float, fixed_a: bool
) -> tuple[float, np.ndarray, np.ndarray]:
    """MAP loss of `softmax(a z + b)` with an L2 penalty `lam/2 |b|^2 / n`, its gradient
    and Hessian in `(a, b)` (or in `b` alone when `a` is fixed). The loss is convex."""
    n = len(z)
    p = _softmax(z, 1.0 / a, b)
    rows = np.arange(n)
    loss = float(-np.log(np.maximum(p[rows, y], 1e-300)).mean() + 0.5 * lam * (b @ b) / n)
    r = p.copy()
    r[rows, y] -= 1.0
    g_b = r.mean(axis=0) + lam * b / n
    h_bb = (np.diag(p.sum(axis=0)) - p.T @ p) / n + lam * np.eye(len(b)) / n
    if fixed_a:
        return loss, g_b, h_bb
    pz = (p * z).sum(axis=1)  # E_p[z] per item
    g_a = float((r * z).mean(axis=0).sum())
    h_aa = float(((p * z * z).sum(axis=1) - pz**2).mean())
    h_ab = (p * z - p * pz[:, None]).mean(axis=0)
    grad = np.concatenate([[g_a], g_b])
    hess = np.block([[np.array([[h_aa]]), h_ab[None, :]], [h_ab[:, None], h_bb]])
    return loss, grad, hess


def _newton(
    z: np.ndarray, y: np.ndarray, a: float, b: np.ndarray, lam: float, fixed_a: bool
) -> tuple[float, np.ndarray]:
    for _ in range(100):
        loss, grad, hess = _tb_loss_grad_hess(z, y, a, b, lam, fixed_a)
        if float(np.abs(grad).max()) < 1e-9:
            break
        step = np.linalg.solve(hess + 1e-10 * np.eye(len(grad)), grad)
        t = 1.0
        while t > 1e-6:
            na = a if fixed_a else a - t * step[0]
            nb = b - t * (step if fixed_a else step[1:])
            if _tb_loss_grad_hess(z, y, na, nb, lam, True)[0] <= loss + 1e-12:
                break
            t /= 2
        else:
            break
        a, b = na, nb
    return a, b


def fit_temperature_bias(
    log_scores: Any,
    gold: Any,
    *,
    prior_sd: float = 1.0,
    bounds: tuple[float, float] = (T_MIN, T_MAX),
) -> tuple[float, np.ndarray]:
    """The temperature T and per-candidate biases b minimising the NLL of `softmax(z/T + b)`.

    The biases have a Gaussian prior N(0, prior_sd^2) (a ridge penalty), so candidates
    seen rarely in the fitting data are not pushed far. The problem is convex in
    `(1/T, b)` and is solved by damped Newton steps; if `T` leaves `bounds` it is held at
    the nearer bound and the biases are refitted. For a boolean field this is Platt
    scaling of the log-odds. Biases are returned with mean zero.

    Args:
        log_scores: `(n, K)` raw candidate log scores.
        gold: `(n,)` index of the correct candidate.
        prior_sd: Standard deviation of the prior on each bias, in nats (> 0).
        bounds: Smallest and largest temperature allowed.

    Raises:
        CalibrationError: on empty or mis-shaped input or a bad `prior_sd`.
    """
    z = np.asarray(log_scores, dtype=np.float64)
    g = np.asarray(gold, dtype=np.int64)
    if z.ndim != 2 or g.shape != (z.shape[0],) or not len(g):
        raise CalibrationError(
            f"need (n, K) log scores and (n,) gold indices with n > 0; got {z.shape} and {g.shape}."
        )
    if isinstance(prior_sd, bool) or not isinstance(prior_sd, (int, float)) or not prior_sd > 0:
        raise CalibrationError(f"prior_sd must be a number > 0; got {prior_sd!r}.")
    z = z - z.max(axis=1, keepdims=True)  # softmax is shift-invariant per row
    lam = 1.0 / float(prior_sd) ** 2
    a0 = 1.0 / fit_temperature(z, g, bounds=bounds)
    a, b = _newton(z, g, a0, np.zeros(z.shape[1]), lam, fixed_a=False)
    lo, hi = 1.0 / bounds[1], 1.0 / bounds[0]
    if not lo <= a <= hi:
        a = min(max(a, lo), hi)
        a, b = _newton(z, g, a, np.zeros(z.shape[1]), lam, fixed_a=True)
    return float(1.0 / a), b - b.mean()


def _folds(n: int, k: int, seed: int = 0) -> list[np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    return [perm[i::k] for i in range(k)]


def _cv_nll(z: np.ndarray, g: np.ndarray, prior_sd: float | None) -> float:
    """Held-out NLL of a method over `CV_FOLDS` folds (`prior_sd=None`: temperature only)."""
    total = 0.0
    for test in _folds(len(g), CV_FOLDS):
        train = np.setdiff1d(np.arange(len(g)), test)
        if prior_sd is None:
            p = _softmax(z[test], fit_temperature(z[train], g[train]))
        else:
            t, b = fit_temperature_bias(z[train], g[train], prior_sd=prior_sd)
            p = _softmax(z[test], t, b)
        total += float(-np.log(np.maximum(p[np.arange(len(test)), g[test]], 1e-300)).sum())
    return total / len(g)


def fit_field(
    z: np.ndarray, g: np.ndarray, method: str, objective: str = "nll"
) -> tuple[float, np.ndarray | None, dict[str, Any]]:
    """Fits one field with `method`: `(T, biases or None, how it was chosen)`.

    `temperature_bias` picks the prior of the biases from `BIAS_PRIOR_SDS`, and `auto`
    also weighs temperature alone, by the NLL of `CV_FOLDS`-fold cross-validation.

    The biases are always fitted by NLL. With `objective="top_label_nll"` the final
    temperature is then refitted on that objective with the biases held: the fitted
    `softmax(z/T + b)` is rescaled to `softmax((z/T + b)/s)`, and `(T*s, b/s)` is returned.
    NLL over many candidates is dominated by gold answers the model scores near zero,
    which leaves the chosen answer underconfident; the refit corrects the confidence
    users threshold on without moving any answer (a positive rescale keeps the argmax).

    Args:
        z: `(n, K)` raw candidate log scores.
        g: `(n,)` index of the correct candidate.
        method: `"temperature"`, `"temperature_bias"` or `"auto"`.
        objective: `"nll"` or `"top_label_nll"` (see `fit_temperature`).

    Raises:
        CalibrationError: on an unknown method or objective.
    """
    if method not in METHODS:
        raise CalibrationError(f"unknown method {method!r}; accepted: {list(METHODS)}.")
    if objective not in OBJECTIVES:
        raise CalibrationError(f"unknown objective {objective!r}; accepted: {sorted(OBJECTIVES)}.")
    if method == "temperature":
        return fit_temperature(z, g, objective=objective), None, {"method": "temperature"}
    options: list[float | None] = list(BIAS_PRIOR_SDS)
    if method == "auto":
        options.insert(0, None)
    if len(g) < 2 * CV_FOLDS:  # too few items to cross-validate: the middle option
        choice = options[len(options) // 2]
        cv: dict[str, float] = {}
    else:
        cv = {str(o if o is not None else "temperature"): _cv_nll(z, g, o) for o in options}
        choice = min(options, key=lambda o: cv[str(o if o is not None else "temperature")])
    if choice is None:
        t = fit_temperature(z, g, objective=objective)
        return t, None, {"method": "temperature", "cv_nll": cv}
    t, b = fit_temperature_bias(z, g, prior_sd=choice)
    how: dict[str, Any] = {"method": "temperature_bias", "bias_prior_sd": choice, "cv_nll": cv}
    if objective != "nll":
        scale = fit_temperature(z / t + b, g, objective=objective)
        how["nll_temperature"] = t
        how["rescale"] = scale
        t, b = t * scale, b / scale
    return t, b, how


# --- fitting a Calibration ------------------------------------------------------------------


def calibration_from_decisions(
    schema: Any,
    decisions: Sequence[Decision[Any]],
    labels: Sequence[Mapping[str, Any]],
    *,
    fitted_on: Mapping[str, Any] | None = None,
    objective: str = "nll",
    method: str = "temperature",
) -> Calibration:
    """Fits per-field calibration from decisions already made on labelled examples.

    Args:
        schema: The decision schema the decisions were made with.
        decisions: One decision per example (their raw `log_scores` are used).
        labels: `{field: label}` per example; a missing field is skipped.
        fitted_on: Provenance recorded in the file.
        objective: `"nll"` or `"top_label_nll"` (see `fit_temperature`).
        method: `"temperature"`, `"temperature_bias"` or `"auto"` (see `calibrate`).
    """
    from ..contextual import label_free

    compiled = compile_schema(schema)
    if not decisions:
        raise CalibrationError("calibrate needs at least one labelled example.")
    used = {label_free(d.calibration_method, d.scoring) for d in decisions}
    if len(used) > 1:
        raise CalibrationError(
            f"the decisions were made with different label-free corrections {sorted(used)}; "
            "fit a calibration on decisions made one way."
        )
    return calibration_from_scores(
        compiled,
        field_arrays(compiled, decisions, labels),
        model_id=decisions[0].model_id,
        scoring=decisions[0].scoring,
        fitted_on={"n": len(decisions), **dict(fitted_on or {})},
        objective=objective,
        method=method,
        label_free=used.pop(),
    )


def calibration_from_scores(
    schema: Any,
    arrays: Mapping[str, tuple[Any, Any]],
    *,
    model_id: str,
    scoring: str = "full",
    fitted_on: Mapping[str, Any] | None = None,
    objective: str = "nll",
    method: str = "temperature",
    label_free: str = "none",
) -> Calibration:
    """Fits per-field calibration from raw log scores, without running the model.

    Args:
        schema: The decision schema the scores came from.
        arrays: Field name -> `(log_scores (n, K), gold indices (n,))`.
        model_id: The model that produced the scores.
        scoring: The scoring mode of the scores.
        fitted_on: Provenance recorded in the file.
        objective: `"nll"` or `"top_label_nll"` (for the biased methods it sets the
            final temperature; see `fit_field`).
        method: `"temperature"`, `"temperature_bias"` or `"auto"` (see `calibrate`).
        label_free: The label-free correction the scores already had (`"none"`,
            `"contextual"` or `"pmi"`); a decider applies the calibration after it.

    Raises:
        CalibrationError: on an unknown method or field, or mis-shaped scores.
    """
    compiled = compile_schema(schema)
    if method not in METHODS:
        raise CalibrationError(f"unknown method {method!r}; accepted: {list(METHODS)}.")
    temps: dict[str, float] = {}
    biases: dict[str, list[float]] = {}
    metrics: dict[str, dict[str, Any]] = {}
    for name, (zz, gg) in arrays.items():
        try:
            _, classes = fitted_field(compiled, name)
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
        t, b, how = fit_field(z, g, method, objective)
        before, after = _softmax(z, 1.0), _softmax(z, t, b)
        temps[name] = round(t, 6)
        if b is not None:
            biases[name] = [round(float(x), 6) for x in b]
        ok_before = before.argmax(axis=1) == g
        ok_after = after.argmax(axis=1) == g
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
    return Calibration(
        model_id=model_id,
        schema_name=compiled.name,
        schema_fingerprint=compiled.fingerprint(),
        temperatures=temps,
        fitted_on=info,
        metrics=metrics,
        scoring=scoring,
        objective=objective,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        biases=biases,
        method=method,
        label_free=label_free,
    )


def calibrate(
    schema: Any,
    examples: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    decider: Decider | None = None,
    batch_size: int = 8,
    fitted_on: Mapping[str, Any] | None = None,
    objective: str = "nll",
    method: str = "temperature",
    progress: bool = False,
) -> Calibration:
    """Fits a temperature per field on labelled examples (keep them apart from the eval data).

    Args:
        schema: The decision schema.
        examples: `(text, {field: label})` pairs; a field missing from a pair is skipped.
        decider: The decider (default: the embedded model).
        batch_size: Contexts scored per pass.
        fitted_on: Provenance recorded in the file (dataset, split, n, seed, ids...).
        objective: `"nll"` (classic temperature scaling) or `"top_label_nll"`.
        method: `"temperature"` (default: one temperature per field; never changes an
            answer), `"temperature_bias"` (a temperature plus one bias per allowed value,
            with a Gaussian prior whose width is chosen by cross-validation; it corrects a
            model that leans towards some answers, and so can change answers) or
            `"auto"` (per field, whichever of the two has the lower cross-validated NLL).
        progress: Show a progress bar on stderr.

    Returns:
        A `Calibration` with per-field NLL and ECE before and after on the fitting data.
    """
    from ..decider import default_decider

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
    return calibration_from_decisions(
        compiled,
        decisions,
        [lab for _, lab in items],
        fitted_on=fitted_on,
        objective=objective,
        method=method,
    )
