"""The `Calibration` a decider applies at decision time, and its JSON file.

A calibration holds per-field temperatures (and optional per-value biases) for one
(model, schema) pair: a field's calibrated distribution is `softmax((z / T + b) / t)` over
its raw log scores `z`. `Decider.with_calibration` applies it; `Calibration.save` and
`Calibration.load` write and read the file (format `FORMAT`).

When the scores had a label-free correction first (contextual calibration or
`scoring="pmi"`, `pcd_tools.decide.contextual`), `z` is the corrected score and the file's
`label_free` names the correction; a decision applies the calibration only after that
same correction.

Fitting a calibration on labelled data, choosing thresholds, reliability diagrams and the
order-bias measurement live in `pcd_tools.eval` (`pcd_tools.eval.calibration.calibrate`).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PcdToolsError
from ..schema import compile_schema
from .softmax import softmax

__all__ = ["Calibration", "CalibrationError", "CalibrationMismatchError"]

FORMAT = "pcd-tools.calibration/1"
# The fitting methods a calibration file may name (`pcd_tools.eval.calibration.fit_field`);
# `auto` records its per-field choice in `Calibration.metrics`.
METHODS = ("temperature", "temperature_bias", "auto")
# The label-free correction the raw scores had before fitting (`pcd_tools.decide.contextual`):
# none, contextual calibration, or domain-conditional PMI (`scoring="pmi"`).
LABEL_FREE = ("none", "contextual", "pmi")
# The conformal nonconformity scores a file may store (`pcd_tools.answers.conformal`):
# `lac` is `1 - p(true label)` under the fitted calibration.
CONFORMAL_SCORES = ("lac",)


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
        method: The method asked for: `temperature`, `temperature_bias` or `auto` (the
            default of `pcd_tools.eval.calibration.calibrate` and `pcd calibrate`; files
            written before it was added, or without the key, read as `temperature`).
            Per field, `metrics[field]["method"]` says which one was used: for `auto`,
            one of `identity` (no change: temperature 1, no bias), `temperature`,
            `temperature_bias`, `contextual`, `pmi`, `contextual_temperature` or
            `pmi_temperature` (`pcd_tools.eval.auto`). A label-free choice is stored as
            the field's biases (`b = -offset / T`, the content-free offset measured on
            the schema's prompt), so it applies to the raw scores of that field alone.
        fitted_on: What it was fitted on (dataset, split, n, seed, excluded sample, ids).
        metrics: Per field: n, NLL and ECE before and after, on the fitting data; for
            `auto` also `cv` (every candidate's cross-validated error, ECE, ECE floor,
            accuracy, top-label NLL and NLL), `why` (the reason for the choice) and, for
            a label-free choice, `label_free` and its `offset`.
        thresholds: Optional per-field confidence thresholds (see
            `pcd_tools.eval.thresholds.choose_threshold`).
        conformal: Per scored single-choice field, the split-conformal data that
            `FieldResult.prediction_set` reads (`pcd_tools.answers.conformal`):
            `{"score": "lac", "n": n, "scores": [...]}`, the calibration items'
            nonconformity scores `1 - p(true label)` under this calibration, ascending
            (with `"fitted"` saying how, when they were cross-fitted).
            Files written before it was added have none (prediction sets then need a refit).
        cascade: Optional per-field cascade thresholds fitted to a target
            (`pcd calibrate --cascade`, `pcd_tools.eval.cascade.CascadeFit.to_dict`):
            `{"signal", "target": {name: value}, "source", "thresholds": {field: [signal,
            threshold]}, "large_model", "n", "reached", "calibration"}`, read by
            `Cascade(..., threshold="fitted")`.
        scoring: The scoring mode the raw scores used.
        compute: The arithmetic of the model's matrix products the raw scores were
            computed with (`LoadedModel.compute`: `float32`, `int8`, `bf16`). int8 and
            float32 scores of the same file differ (up to 0.02 in probability on the 1.5B,
            0.29 on the 0.5B), so a decider computing another way refuses it
            (`check_compute`). None: unknown (files written before it was recorded).
        label_free: The label-free correction the scores were fitted on top of: `none`,
            `contextual` (`calibration="contextual"`) or `pmi` (`scoring="pmi"`). A
            decision applies the fitted temperatures and biases after that same
            correction, and refuses another one. Files without it are `none`.
        objective: The loss the temperatures minimise (see
            `pcd_tools.eval.calibration.fit_temperature`).
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
    label_free: str = "none"
    conformal: dict[str, dict[str, Any]] = field(default_factory=dict)
    cascade: dict[str, Any] = field(default_factory=dict)
    compute: str | None = None
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
        return softmax(z, float(temperature))

    def check_model(self, model_id: str) -> None:
        """Raises `CalibrationMismatchError` unless fitted for `model_id`."""
        if model_id != self.model_id:
            raise CalibrationMismatchError(
                f"calibration {self.path or ''!s} was fitted for model {self.model_id!r}, but the "
                f"decider runs {model_id!r}; fit a calibration for this model with `pcd calibrate`."
            )

    def check_compute(self, compute: str) -> None:
        """Raises `CalibrationMismatchError` unless fitted on scores computed with `compute`
        (`LoadedModel.compute`). One that records no compute mode is accepted: with a
        warning when it came from a file (written before the mode was recorded)."""
        where = f"calibration {self.path!r}" if self.path else "this calibration"
        if self.compute is None:
            if self.path is None:
                return
            warnings.warn(
                f"{where} records no compute mode (it was fitted before calibrations recorded "
                f"it); it is applied to this decider's {compute!r} scores as is, but int8 and "
                "float32 scores differ: refit it with `pcd calibrate` to record the mode.",
                stacklevel=3,
            )
            return
        if compute != self.compute:
            raise CalibrationMismatchError(
                f"{where} was fitted on scores computed in {self.compute!r}, but the decider "
                f"computes in {compute!r} (int8 and float32 scores of the same file differ); "
                f"load the model with `Decider.load(..., compute={self.compute!r})` (or "
                f"`PCD_COMPUTE={self.compute}`), or refit it under {compute!r} with "
                "`pcd calibrate`."
            )

    def check_schema(self, schema: Any) -> None:
        """Raises `CalibrationMismatchError` unless fitted for this schema's fingerprint
        (a part of a schema, `Schema.part`: its whole's, whose prompt it is asked under)."""
        compiled = compile_schema(schema).shown
        fp = compiled.fingerprint()
        if fp != self.schema_fingerprint:
            raise CalibrationMismatchError(
                f"calibration {self.path or ''!s} was fitted for schema {self.schema_name!r} "
                f"(fingerprint {self.schema_fingerprint}), but this decision uses "
                f"{compiled.name!r} (fingerprint {fp}); descriptions, choices, their order and the "
                "few-shot examples all reach the prompt, so refit with `pcd calibrate`."
            )

    def check_label_free(self, used: str) -> None:
        """Raises `CalibrationMismatchError` unless the decision's label-free correction
        (`none`, `contextual` or `pmi`) is the one this calibration was fitted on top of."""
        if used != self.label_free:
            raise CalibrationMismatchError(
                f"calibration {self.path or ''!s} was fitted on top of label-free correction "
                f"{self.label_free!r}, but this decision uses {used!r}; decide with "
                f"{_HOW[self.label_free]}, or fit a calibration for {used!r}."
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
        if raw.get("label_free", "none") not in LABEL_FREE:
            raise CalibrationError(
                f"{str(path)!r}: unknown label_free {raw.get('label_free')!r}; accepted: "
                f"{list(LABEL_FREE)}."
            )
        if not isinstance(raw.get("compute"), (str, type(None))):
            raise CalibrationError(
                f"{str(path)!r}: compute must be the mode's name (e.g. 'int8', 'float32'); got "
                f"{raw.get('compute')!r}."
            )
        _check_conformal(raw.get("conformal", {}), path)
        _check_cascade(raw.get("cascade", {}), path)
        known = {f for f in cls.__dataclass_fields__ if f != "path"}
        cal = cls(**{k: v for k, v in raw.items() if k in known})
        cal.path = str(path)
        return cal


def _check_cascade(cascade: Any, path: str | os.PathLike[str]) -> None:
    """Raises `CalibrationError` unless `cascade` is empty or a fitted cascade's entry."""
    if cascade == {}:
        return
    th = cascade.get("thresholds") if isinstance(cascade, dict) else None
    ok = isinstance(th, dict) and all(
        isinstance(v, list)
        and len(v) == 2
        and v[0] in ("probability", "margin", "entropy")
        and isinstance(v[1], (int, float))
        and math.isfinite(v[1])
        for v in th.values()
    )
    if not ok or not isinstance(cascade.get("target"), dict):
        raise CalibrationError(
            f"{str(path)!r}: cascade must hold 'target' and 'thresholds' mapping fields to "
            "[signal, threshold] (signal: probability, margin or entropy); write it with "
            "`pcd calibrate --cascade`."
        )


def _check_conformal(conformal: Any, path: str | os.PathLike[str]) -> None:
    """Raises `CalibrationError` unless `conformal` maps fields to ascending finite scores."""
    if not isinstance(conformal, dict):
        raise CalibrationError(
            f"{str(path)!r}: conformal must map fields to their scores; got "
            f"{type(conformal).__name__}."
        )
    for name, entry in conformal.items():
        scores = entry.get("scores") if isinstance(entry, dict) else None
        ok = (
            isinstance(entry, dict)
            and entry.get("score") in CONFORMAL_SCORES
            and isinstance(scores, list)
            and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                for x in scores
            )
            and all(a <= b for a, b in itertools.pairwise(scores))
            and entry.get("n") == len(scores)
        )
        if not ok:
            raise CalibrationError(
                f"{str(path)!r}: conformal[{name!r}] must be {{'score': one of "
                f"{list(CONFORMAL_SCORES)}, 'n': len(scores), 'scores': finite numbers in "
                "ascending order}; refit it with `pcd calibrate`."
            )


_HOW = {
    "none": "calibration='none' and scoring 'full' or 'constrained'",
    "contextual": "calibration='contextual'",
    "pmi": "scoring='pmi'",
}
