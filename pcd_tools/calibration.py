"""Calibration: per-field temperatures fitted on labelled data, thresholds and order bias.

- `calibrate(schema, examples)` fits one temperature per field by minimising the NLL of
  `softmax(z / T)` over the candidates' raw log scores `z` (`FieldResult.log_scores`), and
  returns a `Calibration` that `Decider.with_calibration` applies and `.save` writes as JSON
  (schema fingerprint, model id, temperatures and the data it was fitted on).
  `method="temperature_bias"` also fits one bias per allowed value (`softmax(z / T + b)`,
  Platt scaling for a boolean), which corrects a model's prior lean towards some answers
  and so can change the answer; `method="auto"` picks per field by cross-validated NLL.
- `choose_threshold` picks a confidence threshold for a target risk or coverage.
- `reliability_diagram` draws reliability diagrams (matplotlib, imported lazily).
- `order_bias` measures how often answers flip when the allowed values are listed in
  reverse, and `decide_orderings` averages over k listing orders to reduce it.

`pcd calibrate` (the `add_arguments` / `run` pair) wraps `calibrate` for a dataset.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import PcdToolsError
from .metrics import ece, nll, risk_coverage
from .schema import Schema, compile_schema

if TYPE_CHECKING:
    from .decider import Decider
    from .result import Decision

__all__ = [
    "Calibration",
    "CalibrationError",
    "CalibrationMismatchError",
    "OrderBiasReport",
    "ThresholdChoice",
    "calibrate",
    "calibration_from_decisions",
    "calibration_from_scores",
    "choose_threshold",
    "decide_orderings",
    "fit_temperature",
    "fit_temperature_bias",
    "order_bias",
    "reliability_diagram",
]

FORMAT = "pcd-tools.calibration/1"
T_MIN, T_MAX = 0.02, 50.0
METHODS = ("temperature", "temperature_bias", "auto")
# Candidate standard deviations (in nats) of the Gaussian prior on the biases; the fit
# picks one by cross-validated NLL on the calibration data.
BIAS_PRIOR_SDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
CV_FOLDS = 5


class CalibrationError(PcdToolsError, ValueError):
    """A calibration file or fit cannot be used."""


class CalibrationMismatchError(CalibrationError):
    """A calibration was fitted for another model or another schema."""


def read_json(
    path: str | os.PathLike[str], what: str, error: type[PcdToolsError] = CalibrationError
) -> Any:
    """The parsed JSON file at `path`; `error` names `what` it is when it cannot be read."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise error(f"cannot read {what} {str(path)!r}: {e}") from e
    except json.JSONDecodeError as e:
        raise error(f"{what} {str(path)!r} is not JSON: {e}") from e


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


def _softmax(z: np.ndarray, t: float, bias: np.ndarray | None = None) -> np.ndarray:
    s = z / t if bias is None else z / t + bias
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


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


# --- the Calibration object -------------------------------------------------------------


@dataclass
class Calibration:
    """Per-field temperatures (and optional biases) for one (model, schema) pair.

    A field's calibrated distribution is `softmax((z / T + b) / t)` over its raw log
    scores `z`, with `b = 0` unless biases were fitted and `t` the caller's temperature.

    Args:
        model_id: The model the scores came from.
        schema_name: Name of the schema.
        schema_fingerprint: `Schema.fingerprint()` of the schema it was fitted on.
        temperatures: Field name -> temperature (multiplies the caller's temperature).
        biases: Field name -> one bias per allowed value, in declared order (fields
            fitted with `temperature_bias`; a bias can change the answer).
        method: The method asked for: `temperature`, `temperature_bias` or `auto`
            (per field, `metrics[field]["method"]` says which one was used).
        fitted_on: What it was fitted on (dataset, split, n, seed, excluded sample, ids).
        metrics: Per field: n, NLL and ECE before and after, on the fitting data.
        thresholds: Optional per-field confidence thresholds (see `choose_threshold`).
        scoring: The scoring mode the raw scores used.
        objective: The loss the temperatures minimise (see `fit_temperature`).
        created: ISO timestamp.
        path: The file it was loaded from or saved to, if any.
    """

    model_id: str
    schema_name: str
    schema_fingerprint: str
    temperatures: dict[str, float]
    fitted_on: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)
    scoring: str = "full"
    objective: str = "nll"
    created: str = ""
    biases: dict[str, list[float]] = field(default_factory=dict)
    method: str = "temperature"
    path: str | None = None

    def temperature(self, field_name: str) -> float:
        """The fitted temperature of a field; 1.0 for fields not fitted."""
        return float(self.temperatures.get(field_name, 1.0))

    def probabilities(self, field_name: str, log_scores: Any, temperature: float = 1.0) -> Any:
        """The calibrated distribution `softmax((z / T + b) / temperature)`.

        Args:
            field_name: The field.
            log_scores: Raw log scores, `(K,)` or `(n, K)` in declared choice order.
            temperature: The caller's temperature, applied after calibration.

        Raises:
            CalibrationMismatchError: if the field's biases do not match `K`.
        """
        z = np.asarray(log_scores, dtype=np.float64) / self.temperature(field_name)
        b = self.biases.get(field_name)
        if b is not None:
            if len(b) != z.shape[-1]:
                raise CalibrationMismatchError(
                    f"calibration {self.path or ''!s} has {len(b)} biases for field "
                    f"{field_name!r}, which has {z.shape[-1]} allowed values; refit it."
                )
            z = z + np.asarray(b, dtype=np.float64)
        return _softmax(z, float(temperature))

    def check_model(self, model_id: str) -> None:
        """Raises `CalibrationMismatchError` unless fitted for `model_id`."""
        if model_id != self.model_id:
            raise CalibrationMismatchError(
                f"calibration {self.path or ''!s} was fitted for model {self.model_id!r}, but the "
                f"decider runs {model_id!r}; fit a calibration for this model with `pcd calibrate`."
            )

    def check_schema(self, schema: Any) -> None:
        """Raises `CalibrationMismatchError` unless fitted for this schema's fingerprint."""
        compiled = compile_schema(schema)
        fp = compiled.fingerprint()
        if fp != self.schema_fingerprint:
            raise CalibrationMismatchError(
                f"calibration {self.path or ''!s} was fitted for schema {self.schema_name!r} "
                f"(fingerprint {self.schema_fingerprint}), but this decision uses "
                f"{compiled.name!r} (fingerprint {fp}); descriptions, choices and their order all "
                "reach the prompt, so refit with `pcd calibrate`."
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written by `save`."""
        d = asdict(self)
        d.pop("path")
        return {"format": FORMAT, **d}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes the calibration as JSON and remembers the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        self.path = str(p)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        """Reads a calibration JSON file.

        Raises:
            CalibrationError: if the file is missing, not JSON or not a calibration.
        """
        raw = read_json(path, "calibration file")
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise CalibrationError(
                f"{str(path)!r} is not a pcd-tools calibration file; expected format {FORMAT!r}, "
                f"got {raw.get('format') if isinstance(raw, dict) else type(raw).__name__!r}."
            )
        need = ("model_id", "schema_name", "schema_fingerprint", "temperatures")
        missing = [k for k in need if k not in raw]
        if missing:
            raise CalibrationError(f"calibration file {str(path)!r} lacks {missing}.")
        temps = raw["temperatures"]
        bad = {k: v for k, v in temps.items() if not isinstance(v, (int, float)) or not v > 0}
        if bad:
            raise CalibrationError(f"{str(path)!r}: temperatures must be numbers > 0; got {bad}.")
        biases = raw.get("biases", {})
        bad_b = [
            k
            for k, v in (biases.items() if isinstance(biases, dict) else [("biases", biases)])
            if not isinstance(v, list)
            or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)
        ]
        if bad_b:
            raise CalibrationError(
                f"{str(path)!r}: biases must map fields to lists of finite numbers; bad: {bad_b}."
            )
        if raw.get("method", "temperature") not in METHODS:
            raise CalibrationError(
                f"{str(path)!r}: unknown method {raw.get('method')!r}; accepted: {list(METHODS)}."
            )
        known = {f for f in cls.__dataclass_fields__ if f != "path"}
        cal = cls(**{k: v for k, v in raw.items() if k in known})
        cal.path = str(path)
        return cal


def _field_arrays(
    schema: Schema, decisions: Sequence[Decision[Any]], labels: Sequence[Mapping[str, Any]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per field: raw log scores `(m, K)` and gold indices of the labelled items."""
    from .datasets import label_index

    out = {}
    for spec in schema.fields:
        rows = [
            (d.fields[spec.name].log_scores, label_index(spec, lab[spec.name]))
            for d, lab in zip(decisions, labels)
            if spec.name in lab
        ]
        if rows:
            out[spec.name] = (
                np.array([r[0] for r in rows], dtype=np.float64),
                np.array([r[1] for r in rows], dtype=np.int64),
            )
    return out


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
    compiled = compile_schema(schema)
    if not decisions:
        raise CalibrationError("calibrate needs at least one labelled example.")
    return calibration_from_scores(
        compiled,
        _field_arrays(compiled, decisions, labels),
        model_id=decisions[0].model_id,
        scoring=decisions[0].scoring,
        fitted_on={"n": len(decisions), **dict(fitted_on or {})},
        objective=objective,
        method=method,
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
        spec = compiled.field(name)
        z, g = np.asarray(zz, dtype=np.float64), np.asarray(gg, dtype=np.int64)
        if z.ndim != 2 or z.shape[1] != spec.cardinality or g.shape != (len(z),):
            raise CalibrationError(
                f"field {name!r}: need ({len(g)}, {spec.cardinality}) log scores and "
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
    from .decider import default_decider
    from .evaluate import run_pcd

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


# --- thresholds ---------------------------------------------------------------------------


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


# --- reliability diagrams -------------------------------------------------------------------


def reliability_diagram(
    panels: Mapping[str, tuple[Any, Any]],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    n_bins: int = 15,
) -> Path:
    """Draws one reliability diagram per panel side by side and saves a PNG.

    Args:
        panels: Panel title -> `(confidence, correct)` arrays.
        path: The PNG to write.
        title: Figure title.
        n_bins: Equal-width confidence bins.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from .metrics import reliability_bins

    k = max(1, len(panels))
    fig, axes = plt.subplots(1, k, figsize=(3.6 * k, 3.8), squeeze=False)
    for ax, (name, (conf, ok)) in zip(axes[0], panels.items()):
        b = reliability_bins(conf, ok, n_bins)
        centers = (b["edges"][:-1] + b["edges"][1:]) / 2
        filled = b["count"] > 0
        width = 1.0 / n_bins
        ax.bar(
            centers[filled],
            b["accuracy"][filled],
            width=width,
            edgecolor="black",
            color="#4C72B0",
            label="accuracy",
        )
        ax.bar(
            centers[filled],
            b["confidence"][filled] - b["accuracy"][filled],
            bottom=b["accuracy"][filled],
            width=width,
            color="#DD8452",
            alpha=0.5,
            edgecolor="#DD8452",
            label="gap",
        )
        ax.plot([0, 1], [0, 1], "k--", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
        ax.set_title(
            f"{name}\nECE={ece(conf, ok, n_bins):.3f}  n={len(np.asarray(conf))}", fontsize=9
        )
        ax.legend(loc="upper left", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=90)
    plt.close(fig)
    return p


# --- order bias -----------------------------------------------------------------------------


DESIGNS = ("rotations", "random")


def _orderings(
    schema: Schema, k: int, seed: int, first: str, design: str = "rotations"
) -> list[dict[str, list[int]]]:
    """k listing orders per field, starting from `first` ("identity" or "reverse").

    - `rotations`: the first order rotated by `j * K // k` places for j < k, so
      every allowed value sits at k evenly spread positions and its mean position is
      close to the middle of the list, whatever the first order was.
    - `random`: the first order, then k - 1 seeded random permutations.
    """
    if design not in DESIGNS:
        raise CalibrationError(f"unknown order design {design!r}; accepted: {list(DESIGNS)}.")
    head = {f.name: list(range(f.cardinality)) for f in schema.fields}
    if first == "reverse":
        head = {n: o[::-1] for n, o in head.items()}
    if design == "rotations":
        out = []
        for j in range(k):
            order = {}
            for name, base in head.items():
                r = j * len(base) // k
                order[name] = base[r:] + base[:r]
            out.append(order)
        return out
    rng = np.random.default_rng(seed)
    out = [head]
    for _ in range(k - 1):
        out.append(
            {f.name: [int(i) for i in rng.permutation(f.cardinality)] for f in schema.fields}
        )
    return out


def _average(schema: Schema, runs: Sequence[Sequence[Decision[Any]]]) -> list[Decision[Any]]:
    """Per context, the mean distribution over the runs (one run per listing order)."""
    from .result import Decision, FieldResult

    out = []
    for per in zip(*runs):
        fields, native = {}, {}
        for spec in schema.fields:
            p = np.mean(
                [[d.fields[spec.name].distribution[c.label] for c in spec.choices] for d in per],
                axis=0,
            )
            res = FieldResult.from_probs(spec, p, np.log(np.maximum(p, 1e-300)))
            fields[spec.name] = res
            native[spec.name] = res.value
        first = per[0]
        out.append(
            Decision(
                value=schema.build(native),
                fields=fields,
                prefill_ms=sum(d.prefill_ms for d in per),
                suffix_eval_ms=sum(d.suffix_eval_ms for d in per),
                elapsed_ms=sum(d.elapsed_ms for d in per),
                sequential_forward_passes=sum(d.sequential_forward_passes for d in per),
                prompt_tokens=first.prompt_tokens,
                prefix_cache_hit=all(d.prefix_cache_hit for d in per),
                model_id=first.model_id,
                device=first.device,
                temperature=first.temperature,
                scoring=first.scoring,
                mode=first.mode,
                calibrated=first.calibrated,
                calibration_file=first.calibration_file,
            )
        )
    return out


def _runs(
    decider: Decider,
    schema: Schema,
    contexts: list[str],
    orderings: Sequence[Mapping[str, Sequence[int]]],
    temperature: float,
    batch_size: int,
) -> tuple[list[list[Decision[Any]]], list[float]]:
    """One `decide_many` per listing order, and the wall seconds of each."""
    runs, secs = [], []
    for o in orderings:
        t0 = time.perf_counter()
        runs.append(
            decider.decide_many(
                schema,
                contexts,
                temperature=temperature,
                choice_order=dict(o),
                batch_size=batch_size,
            )
        )
        secs.append(time.perf_counter() - t0)
    return runs, secs


def decide_orderings(
    decider: Decider,
    schema: Any,
    contexts: Sequence[str],
    *,
    k: int = 4,
    seed: int = 0,
    orderings: Sequence[Mapping[str, Sequence[int]]] | None = None,
    temperature: float = 1.0,
    batch_size: int = 8,
    design: str = "rotations",
) -> list[Decision[Any]]:
    """Decides each context under k listing orders of the allowed values and averages.

    Each field's distribution is the mean of its distributions under the orders: by
    default the declared order rotated by evenly spaced offsets, so every allowed value
    is listed at k spread-out positions (`design="random"`: the declared order and k - 1
    seeded random permutations; `orderings` gives them explicitly). Every order has its own system prompt, so this costs k prefills and k field
    passes per batch: the returned decisions' `sequential_forward_passes`, `prefill_ms`,
    `suffix_eval_ms` and `elapsed_ms` are sums over the orders. `log_scores` hold the log
    of the averaged probabilities.

    Args:
        decider: The decider (its calibration, if any, applies under each order).
        schema: The decision schema.
        contexts: The texts.
        k: Number of orders (ignored when `orderings` is given).
        seed: Seed of the random orders.
        orderings: Explicit per-field listing orders (indices into each field's choices).
        temperature: Softmax temperature.
        batch_size: Contexts per pass.
        design: `"rotations"` (default) or `"random"`.
    """
    compiled = compile_schema(schema)
    if orderings is None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise CalibrationError(f"k must be an int >= 1; got {k!r}.")
        orderings = _orderings(compiled, k, seed, "identity", design)
    runs, _ = _runs(decider, compiled, list(contexts), orderings, temperature, batch_size)
    return _average(compiled, runs)


@dataclass
class OrderBiasReport:
    """How often answers flip when the allowed values are listed in another order.

    Args:
        n: Contexts measured.
        k: Orders averaged over in the averaging option (0 if not run).
        flip_rate: Per field: the fraction whose answer differs between the declared and
            the reversed listing.
        flip_rate_averaged: Per field: the fraction whose averaged answer differs between
            the k orders built from the declared listing and the k built from its reverse.
        ms_per_item: Wall time per context: `"single"` (one order) and `"averaged"` (k).
        passes_per_call: Sequential forward passes of one call over a batch of contexts,
            for `"single"` and `"averaged"`.
        design: How the k orders were built: `"rotations"` or `"random"`.
    """

    n: int
    k: int
    flip_rate: dict[str, float]
    flip_rate_averaged: dict[str, float] = field(default_factory=dict)
    ms_per_item: dict[str, float] = field(default_factory=dict)
    passes_per_call: dict[str, float] = field(default_factory=dict)
    design: str = "rotations"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)


def _flips(
    a: Sequence[Decision[Any]], b: Sequence[Decision[Any]], names: list[str]
) -> dict[str, float]:
    return {
        n: float(np.mean([x.fields[n].label != y.fields[n].label for x, y in zip(a, b)]))
        for n in names
    }


def order_bias(
    schema: Any,
    contexts: Sequence[str],
    *,
    decider: Decider | None = None,
    k: int = 0,
    seed: int = 0,
    temperature: float = 1.0,
    batch_size: int = 8,
    design: str = "rotations",
) -> OrderBiasReport:
    """Measures the order-flip rate, and with `k >= 2` that of the k-order average.

    The raw flip rate compares the declared listing with its reverse. The averaged one
    compares the average over k orders built from the declared listing with the average
    over k orders built from the reversed listing:

    - `rotations` (default, what `decide_orderings` uses): each listing rotated by k
      evenly spaced offsets. The two sets share no order when a field has more than two
      values; for a boolean with k = 2 they are the same two orders, so its averaged
      answer cannot depend on the order at all.
    - `random`: each listing plus k - 1 independently drawn random permutations.

    Args:
        schema: The decision schema.
        contexts: The texts.
        decider: The decider (default: the embedded model).
        k: Orders for the averaging option; 0 or 1 measures the raw flip rate only.
        seed: Seed of the random orders.
        temperature: Softmax temperature.
        batch_size: Contexts per pass.
        design: `"rotations"` or `"random"`.
    """
    from .decider import default_decider

    d = decider or default_decider()
    compiled = compile_schema(schema)
    names = compiled.field_names
    ctx = list(contexts)
    n = max(1, len(ctx))
    kk = k if k >= 2 else 1
    ra, sa = _runs(
        d,
        compiled,
        ctx,
        _orderings(compiled, kk, seed, "identity", design),
        temperature,
        batch_size,
    )
    rb, sb = _runs(
        d,
        compiled,
        ctx,
        _orderings(compiled, kk, seed + 1, "reverse", design),
        temperature,
        batch_size,
    )
    single_passes = [x.sequential_forward_passes for x in ra[0] + rb[0]]
    report = OrderBiasReport(
        n=len(ctx),
        k=0,
        flip_rate=_flips(ra[0], rb[0], names),
        ms_per_item={"single": (sa[0] + sb[0]) * 1e3 / (2 * n)},
        passes_per_call={"single": float(np.mean(single_passes))},
        design=design,
    )
    if k >= 2:
        a_k, b_k = _average(compiled, ra), _average(compiled, rb)
        report.k = k
        report.flip_rate_averaged = _flips(a_k, b_k, names)
        report.ms_per_item["averaged"] = (sum(sa) + sum(sb)) * 1e3 / (2 * n)
        report.passes_per_call["averaged"] = float(
            np.mean([x.sequential_forward_passes for x in a_k + b_k])
        )
    return report


# --- `pcd calibrate` ----------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `pcd calibrate` (`--model` and `--json` are added by the CLI)."""
    from .datasets import add_data_arguments

    add_data_arguments(parser)
    parser.add_argument("--n", type=int, default=300, help="calibration sample size (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the calibration sample")
    parser.add_argument(
        "--eval-n",
        type=int,
        default=300,
        help="size of the evaluation sample to keep out (default 300)",
    )
    parser.add_argument("--eval-seed", type=int, default=0, help="seed of that evaluation sample")
    parser.add_argument(
        "--out", default=None, help="output JSON (default calibration-<dataset>.json)"
    )
    parser.add_argument("--diagrams", default=None, help="folder for before/after reliability PNGs")
    parser.add_argument(
        "--target-risk",
        type=float,
        default=None,
        help="also choose per-field thresholds for this error rate",
    )
    parser.add_argument(
        "--target-coverage",
        type=float,
        default=None,
        help="also choose per-field thresholds for this coverage",
    )
    parser.add_argument(
        "--objective",
        choices=sorted(OBJECTIVES),
        default="nll",
        help="loss the temperature minimises (default nll); with biases, top_label_nll "
        "refits the temperature on the answer's correctness after the biases",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="temperature",
        help="temperature per field (default), temperature_bias (plus a bias per allowed "
        "value; can change answers) or auto (per field, by cross-validated NLL)",
    )
    parser.add_argument(
        "--scores", default=None, help="also write the raw log scores and gold labels (JSON)"
    )
    parser.add_argument(
        "--from-scores",
        default=None,
        metavar="SCORES",
        help="refit from a --scores file of an earlier run instead of running the model",
    )
    parser.add_argument("--batch-size", type=int, default=8)


def _read_scores(path: str) -> dict[str, Any]:
    """A `--scores` file of an earlier `pcd calibrate` run."""
    raw = read_json(path, "scores file")
    need = ("model_id", "schema_fingerprint", "fields")
    missing = [k for k in need if not isinstance(raw, dict) or k not in raw]
    if missing:
        raise CalibrationError(
            f"scores file {path!r} lacks {missing}; write it with `pcd calibrate --scores`."
        )
    return raw


def run(args: argparse.Namespace) -> int:
    """Runs `pcd calibrate`: fit, save, and optionally draw diagrams and choose thresholds."""
    from rich.console import Console

    from .datasets import dataset_from_args
    from .decider import Decider
    from .evaluate import run_pcd

    console = Console(stderr=True)
    ds = dataset_from_args(args)
    compiled = compile_schema(ds.schema)
    t0 = time.perf_counter()
    if args.from_scores:
        saved = _read_scores(args.from_scores)
        if saved["schema_fingerprint"] != compiled.fingerprint():
            raise CalibrationMismatchError(
                f"scores file {args.from_scores!r} was written for schema fingerprint "
                f"{saved['schema_fingerprint']}, but {ds.name}'s schema is "
                f"{compiled.fingerprint()}; rerun `pcd calibrate --scores`."
            )
        arrays = {
            n: (np.asarray(f["log_scores"], np.float64), np.asarray(f["gold"], np.int64))
            for n, f in saved["fields"].items()
        }
        model_id, scoring = saved["model_id"], saved.get("scoring", "full")
        fitted_on = dict(saved.get("fitted_on") or {"ids": saved.get("ids")})
        fitted_on["from_scores"] = str(args.from_scores)
    else:
        split = ds.calibration_sample(
            args.n, args.seed, eval_n=args.eval_n, eval_seed=args.eval_seed
        )
        shared_pool = ds.calibration_split is ds.eval_split
        with console.status("Loading model..."):
            decider = Decider.load(args.model)
        labels = [lab for _, lab in split.examples]
        decisions, _ = run_pcd(
            decider,
            compiled,
            [t for t, _ in split.examples],
            batch_size=args.batch_size,
            progress=True,
            label="calibrating",
        )
        if not decisions:
            raise CalibrationError("calibrate needs at least one labelled example.")
        fitted_on = {
            "dataset": ds.name,
            "source": ds.source,
            "split": split.name,
            "n": len(split),
            "seed": args.seed,
            "excluded_eval_sample": {"n": args.eval_n, "seed": args.eval_seed}
            if shared_pool
            else None,
            "ids": split.ids,
        }
        arrays = _field_arrays(compiled, decisions, labels)
        model_id, scoring = decisions[0].model_id, decisions[0].scoring
        if args.scores:
            Path(args.scores).write_text(
                json.dumps(
                    {
                        "model_id": model_id,
                        "schema_fingerprint": compiled.fingerprint(),
                        "scoring": scoring,
                        "fitted_on": fitted_on,
                        "ids": split.ids,
                        "fields": {
                            n: {"log_scores": z.round(5).tolist(), "gold": g.tolist()}
                            for n, (z, g) in arrays.items()
                        },
                    }
                )
            )
    cal = calibration_from_scores(
        compiled,
        arrays,
        model_id=model_id,
        scoring=scoring,
        fitted_on=fitted_on,
        objective=args.objective,
        method=args.method,
    )
    for name, (z, g) in arrays.items():
        before, after = _softmax(z, 1.0), cal.probabilities(name, z)
        conf, ok = after.max(axis=1), after.argmax(axis=1) == g
        if args.target_risk is not None or args.target_coverage is not None:
            cal.thresholds[name] = choose_threshold(
                conf, ok, target_risk=args.target_risk, target_coverage=args.target_coverage
            ).to_dict()
        if args.diagrams:
            how = f"T={cal.temperature(name):.2f}" + (" + bias" if name in cal.biases else "")
            reliability_diagram(
                {
                    "before (T=1)": (before.max(axis=1), before.argmax(axis=1) == g),
                    f"after ({how})": (conf, ok),
                },
                Path(args.diagrams) / f"{ds.name}_{name}_calibration_split.png",
                title=f"{ds.name}.{name}: calibration split (in-sample)",
            )
    out = cal.save(args.out or f"calibration-{ds.name}.json")
    elapsed = time.perf_counter() - t0
    if args.json:
        print(
            json.dumps(
                {**cal.to_dict(), "path": str(out), "elapsed_s": round(elapsed, 1)}, indent=2
            )
        )
        return 0
    from rich.table import Table

    table = Table(
        title=f"Calibration of {ds.name} on {cal.fitted_on.get('n', '?')} items "
        f"({cal.fitted_on.get('split', '?')}, seed {cal.fitted_on.get('seed', '?')})"
    )
    cols = ("field", "method", "T", "NLL before", "NLL after", "ECE before", "ECE after")
    for col in (*cols, "threshold"):
        table.add_column(col)
    for name, t in cal.temperatures.items():
        m = cal.metrics[name]
        th = cal.thresholds.get(name)
        table.add_row(
            name,
            str(m.get("method", cal.method)),
            f"{t:.3f}",
            f"{m['nll_before']:.3f}",
            f"{m['nll_after']:.3f}",
            f"{m['ece_before']:.3f}",
            f"{m['ece_after']:.3f}",
            f"{th['threshold']:.3f} (coverage {th['coverage']:.2f}, risk {th['risk']:.2f})"
            if th
            else "-",
        )
    out_console = Console(width=150)
    out_console.print(table)
    out_console.print(f"saved {out}  ({elapsed:.1f} s)")
    return 0
