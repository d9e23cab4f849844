"""A calibration refitted on other items with the choices it made (`refit`), and the
out-of-fold distributions that gives the items it was fitted on (`out_of_fold`).

A calibration fitted on some items is surer on them than on new ones; a threshold or a
conformal score computed on those items should see them as a new item would. Each fold is
scored by the calibration refitted without it, keeping what `auto` chose per field and
refitting only the parameters (`pcd_tools.eval.crossfit` does the same per item of a
cascade's runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..answers.calibration import CalibrationError
from ..errors import InvalidArgumentError
from .auto import CANDIDATES, fit_candidate

__all__ = ["fold_assignment", "out_of_fold", "refit"]


def refit(calibration: Any, arrays: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> Any:
    """A copy of `calibration` with each field of `arrays` refitted on those items, with
    the choice `calibration` made for it (its method, bias prior width, label-free offset
    and objective: what `auto` chose is kept, only the parameters are refitted).

    Raises:
        CalibrationError: for a field whose calibration method cannot be refitted.
    """
    temps, biases = dict(calibration.temperatures), dict(calibration.biases)
    for name, (z, g) in arrays.items():
        how = calibration.metrics.get(name)
        if not how or name not in calibration.temperatures:
            continue  # a field the calibration leaves as it is
        method = str(how.get("method", ""))
        if method not in CANDIDATES:
            raise CalibrationError(
                f"field {name!r}: the calibration's method {method!r} cannot be refitted "
                f"per fold; refittable: {list(CANDIDATES)}."
            )
        t, b = 1.0, None
        if len(g):
            t, b = fit_candidate(
                method, z, g, how.get("offset"), calibration.objective, how.get("bias_prior_sd")
            )
        temps[name] = float(t)
        biases.pop(name, None)
        if b is not None:
            biases[name] = [float(x) for x in b]
    return dataclasses.replace(calibration, temperatures=temps, biases=biases)


def fold_assignment(n: int, folds: int, seed: int) -> np.ndarray:
    """Each of `n` items' fold, shuffled (seeded), the folds' sizes within one."""
    if isinstance(folds, bool) or not isinstance(folds, int) or not 2 <= folds <= n:
        raise InvalidArgumentError(
            f"folds must be an int from 2 to the number of items ({n}); got {folds!r}."
        )
    fold_of = np.empty(n, dtype=np.int64)
    fold_of[np.random.default_rng(seed).permutation(n)] = np.arange(n) % folds
    return fold_of


def out_of_fold(
    calibration: Any,
    name: str,
    z: np.ndarray,
    g: np.ndarray,
    *,
    folds: int = 5,
    seed: int = 0,
) -> np.ndarray:
    """Field `name`'s calibrated distributions of the items `calibration` was fitted on,
    each from the calibration refitted without its fold (`refit`): what a threshold
    fitted on these items should see (`pcd calibrate --target-risk`).

    Args:
        calibration: The calibration fitted on `(z, g)`.
        name: The field (or `field[label]` of a multi-label field).
        z: `(n, K)` raw log scores.
        g: `(n,)` gold indices.
        folds: The number of folds, from 2 to n.
        seed: The seed of the shuffle.

    Returns:
        `(n, K)` probabilities.

    Raises:
        InvalidArgumentError: for `folds` that is not an int in [2, n].
        CalibrationError: for a method that cannot be refitted.
    """
    z, g = np.asarray(z, np.float64), np.asarray(g, np.int64)
    fold_of = fold_assignment(len(g), folds, seed)
    out = np.empty_like(z)
    for k in range(folds):
        test = fold_of == k
        copy = refit(calibration, {name: (z[~test], g[~test])})
        out[test] = np.stack([copy.probabilities(name, r) for r in z[test]])
    return out
