"""Split conformal prediction sets for scored single-choice fields.

On a calibration split (`pcd calibrate`, `pcd_tools.eval.calibration.calibrate`), each
item's nonconformity score is `s = 1 - p(true label)` under the same scores, label-free
correction and fitted calibration the decider applies (at temperature 1). The calibration
file stores the sorted scores per field (`Calibration.conformal`). For a new item and a
coverage `1 - alpha`, the threshold is the `k`-th smallest calibration score with
`k = ceil((n + 1)(1 - alpha))`, and the prediction set holds every answer whose score is
at most that threshold (`p(answer) >= 1 - q`). For exchangeable calibration and test items
the set holds the true answer with probability at least `1 - alpha`, marginally (Vovk et
al. 2005; Lei et al. 2018). This score, "LAC" (least ambiguous set-valued classifier,
Sadinle et al. 2019), gives the smallest expected sets among sets built from the same
probabilities; APS (Romano et al. 2020) trades larger sets for better coverage per class.

The set always keeps the most probable answer: a set with that added can only cover more,
so the guarantee holds, and a set is never empty (an empty set would mean "none of the
allowed answers", which a bounded decision cannot return).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from .calibration import CONFORMAL_SCORES, CalibrationError

__all__ = [
    "SCORES",
    "ConformalScores",
    "CoverageError",
    "NoConformalScoresError",
    "PredictionSetError",
    "TooFewCalibrationItemsError",
    "check_coverage",
    "conformal_entry",
    "conformal_quantile",
    "field_conformal",
    "nonconformity",
    "prediction_set_indices",
    "pruned_conformal",
]

# The nonconformity scores a calibration file may name: `lac` is `1 - p(true label)`.
SCORES = CONFORMAL_SCORES
# Scores within this of the threshold count as at most it (they were stored as JSON).
_TIE = 1e-9


class PredictionSetError(CalibrationError):
    """A prediction set cannot be built as asked."""


class NoConformalScoresError(PredictionSetError):
    """The decider has no conformal calibration scores for the field."""


class CoverageError(PredictionSetError, InvalidArgumentError):
    """The coverage asked for is not a probability in (0, 1)."""


class TooFewCalibrationItemsError(PredictionSetError):
    """The calibration split is too small for the coverage asked for."""


def check_coverage(coverage: Any, argument: str = "coverage") -> float:
    """The coverage as a float in (0, 1).

    Args:
        coverage: The coverage given, `1 - alpha`.
        argument: How the caller wrote it, named in the error.

    Raises:
        CoverageError: unless a real number strictly between 0 and 1 (a bool is refused).
    """
    if isinstance(coverage, bool) or not isinstance(coverage, (int, float)):
        raise CoverageError(
            f"{argument}: a coverage is a probability in (0, 1); got "
            f"{type(coverage).__name__} {coverage!r}."
        )
    c = float(coverage)
    if not 0.0 < c < 1.0:  # NaN fails this too
        hint = f" (for {c:g}%, write {c / 100:g})" if 1.0 < c < 100.0 else ""
        raise CoverageError(
            f"{argument}: a coverage is a probability strictly between 0 and 1; got "
            f"{coverage!r}{hint}."
        )
    return c


def conformal_quantile(sorted_scores: Sequence[float], coverage: float, field: str = "") -> float:
    """The split-conformal threshold: the `ceil((n + 1) * coverage)`-th smallest score.

    Args:
        sorted_scores: The calibration items' nonconformity scores, ascending.
        coverage: `1 - alpha`, in (0, 1).
        field: The field, named in errors.

    Raises:
        CoverageError: for a coverage outside (0, 1).
        TooFewCalibrationItemsError: when `coverage > n / (n + 1)`: `n` items cannot
            certify it (the threshold would be infinite, every answer in the set).
    """
    c = check_coverage(coverage)
    n = len(sorted_scores)
    # the float product can land a hair above an integer ((n+1) * 0.9 for n = 9 is 9.000...02)
    k = math.ceil((n + 1) * c - 1e-9)
    if k > n:
        need = math.ceil(c / (1.0 - c) - 1e-9)
        what = f"field {field!r}: " if field else ""
        raise TooFewCalibrationItemsError(
            f"{what}coverage {c:g} needs at least {need} calibration items "
            f"(coverage <= n / (n + 1)); the calibration has n = {n}. Ask for a coverage "
            f"<= {n / (n + 1):.4g}, or refit with more labelled items (`pcd calibrate --n`)."
        )
    return float(sorted_scores[k - 1])


def nonconformity(probs: Any, gold: Any) -> np.ndarray:
    """`1 - p(gold)` per item, from `(n, K)` probabilities and `(n,)` gold indices."""
    p = np.asarray(probs, dtype=np.float64)
    g = np.asarray(gold, dtype=np.int64)
    return 1.0 - p[np.arange(len(g)), g]


def prediction_set_indices(probs: Any, threshold: float) -> list[int]:
    """Indices of the answers with `1 - p <= threshold`, most probable first (ties:
    declared order), the most probable answer always included."""
    p = np.asarray(probs, dtype=np.float64)
    order = sorted(range(len(p)), key=lambda i: (-float(p[i]), i))
    keep = [i for i in order if 1.0 - float(p[i]) <= threshold + _TIE]
    return keep if keep and keep[0] == order[0] else [order[0], *keep]


@dataclass(frozen=True)
class ConformalScores:
    """One field's calibration nonconformity scores, and the probabilities they apply to.

    Args:
        field: The field.
        scores: The calibration items' scores `1 - p(true label)`, ascending.
        probs: For a decided item: the field's calibrated probabilities at temperature 1,
            in declared order (what the scores were measured on); empty in a calibration.
        score: The score's name (`lac`).
    """

    field: str
    scores: tuple[float, ...]
    probs: tuple[float, ...] = ()
    score: str = "lac"

    @property
    def n(self) -> int:
        """Calibration items."""
        return len(self.scores)

    def quantile(self, coverage: float) -> float:
        """The threshold for `coverage` (see `conformal_quantile`)."""
        return conformal_quantile(self.scores, coverage, self.field)

    def indices(self, coverage: float) -> list[int]:
        """The prediction set at `coverage`, as declared-order indices, most probable first."""
        return prediction_set_indices(self.probs, self.quantile(coverage))


def conformal_entry(probs: Any, gold: Any) -> dict[str, Any]:
    """A field's entry in `Calibration.conformal` from its calibrated `(n, K)`
    probabilities (temperature 1) on the calibration items and their `(n,)` gold indices."""
    s = np.sort(nonconformity(probs, gold))
    return {"score": "lac", "n": len(s), "scores": [round(float(x), 9) for x in s]}


def pruned_conformal(calibration: Any, name: str, scores: Any) -> ConformalScores | None:
    """`field_conformal` for a field read by pruned search (`bounds.PartialScores`): each
    candidate's probability is its upper bound (a scored one's share of the scored mass and
    of the unread mass known to lie elsewhere, exact under constrained scoring; an unscored
    one's, the most its prefix lets it hold beside the scored mass), so the set
    holds every answer the exhaustive pass's set holds, and perhaps a few more: its
    coverage is at least the exhaustive set's."""
    entry = (getattr(calibration, "conformal", None) or {}).get(name)
    if entry is None:
        return None
    from .bounds import log_weights, prefix_floors  # bounds imports nothing of this module's

    a = 1.0 / calibration.temperature(name)
    bias = calibration.biases.get(name)
    bias = None if bias is None else np.asarray(bias, dtype=np.float64)
    s, _, _ = log_weights(scores, 1.0, scale=a, bias=bias)
    seen = np.isfinite(s)
    top = float(s[seen].max())
    scored = float(np.exp(s[seen] - top).sum())
    # the unread prefixes' known totals (`prefix_floors`: exact under constrained scoring)
    # are mass a scored candidate shares too: its upper bound counts them
    floors = np.array(prefix_floors(scores, 1.0, scale=a, bias=bias))
    known = float(np.exp(floors[np.isfinite(floors)] - top).sum()) if len(floors) else 0.0
    upper = np.where(seen, np.exp(s - top) / (scored + known), 0.0)
    b = np.zeros(len(s)) if bias is None else bias
    for u, members in zip(scores.frontier_logp, scores.frontier_members):
        if len(members):  # one unscored candidate holds at most exp(a u + b) of the weight
            x = np.exp(a * float(u) + b[members] - top)
            upper[members] = x / (scored + x)
    return ConformalScores(
        name, tuple(entry["scores"]), tuple(float(x) for x in upper), entry["score"]
    )


def field_conformal(calibration: Any, name: str, log_scores: Any) -> ConformalScores | None:
    """What `FieldResult.prediction_set` needs for one decided field: the calibration's
    scores for `name` and the field's calibrated probabilities at temperature 1 from its
    `log_scores`; None when the calibration has no conformal data for `name`."""
    entry = (getattr(calibration, "conformal", None) or {}).get(name)
    if entry is None:
        return None
    probs = calibration.probabilities(name, log_scores, 1.0)
    return ConformalScores(
        name, tuple(entry["scores"]), tuple(float(x) for x in probs), entry["score"]
    )
