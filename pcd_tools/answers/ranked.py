"""A ranked multi-label field's answer: the top labels whose share clears the threshold.

A multi-label field read `"ranked"` (`pcd_tools.schema.multilabel`; every multi-label
field of more than 255 labels) asks one question over all its labels: which one the
answer's list starts with. Its distribution `p` is that question's, scored like a
single-choice field (whole, or by certified pruned search when its trie is large). The
answer is, most probable first (ties: declared order):

    the labels with p >= threshold, at most `max_labels` of them, and at least the
    `min_labels` most probable whatever their share.

Its `probability` is the chosen labels' total share: how much of the model's ranking the
answer covers (0.0 for an empty answer).

A pruned field's answer is certified when the exhaustive pass would choose the same
labels in the same order (`RankedGoal.certified`): the chosen ones are certified in
order (`certified_top`), each chosen for its share provably clears the threshold, and
where the threshold ended the list, no other label (scored, or under an unread prefix
at its best possible score) can reach it. The search reads until then
(`RankedGoal.cut` tells it which prefixes may still matter, `RankedGoal.certified` when
it may stop), or falls back to the exhaustive pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .bounds import PartialScores, bounded
from .result import FieldResult

__all__ = ["RankedGoal", "rank_labels", "ranked_pruned", "ranked_result"]


def rank_labels(
    p: np.ndarray, threshold: float, min_labels: int = 0, max_labels: int | None = None
) -> list[int]:
    """Indices of the chosen labels, most probable first (ties: declared order): those
    with `p >= threshold`, at most `max_labels`, at least the `min_labels` most probable."""
    p = np.asarray(p, dtype=np.float64)
    order = np.argsort(-p, kind="stable")
    over = int((p >= threshold).sum())
    n = over if max_labels is None else min(over, max_labels)
    return [int(i) for i in order[: max(n, min_labels)]]


@dataclass(frozen=True)
class RankedGoal:
    """What a ranked field's pruned search must settle, and how its answer is read.

    Args:
        threshold: The share a label needs (`FieldSpec.threshold`).
        min_labels: The fewest labels in the answer.
        max_labels: The most (None: as many as clear the threshold).
        scale: 1 / the field's calibrated temperature (1.0 without a calibration).
        temperature: The decision's temperature.
    """

    threshold: float
    min_labels: int = 0
    max_labels: int | None = None
    scale: float = 1.0
    temperature: float = 1.0

    @classmethod
    def of(cls, spec: Any, temperature: float, calibration: Any = None) -> RankedGoal:
        """The goal of a ranked field under a decision's temperature and calibration."""
        scale = 1.0 if calibration is None else 1.0 / calibration.temperature(spec.name)
        return cls(spec.threshold, spec.min_labels, spec.max_labels, scale, temperature)

    @property
    def slope(self) -> float:
        """`a` of the field's distribution `softmax(a z)`."""
        return self.scale / self.temperature

    def cut(self, z_scored: np.ndarray, normalised: bool) -> float:
        """The log score below which an unread prefix cannot change the answer: none of
        its labels can clear the threshold (its share is at most `exp(a (z - z_top))`,
        and under constrained scoring with `a <= 1` at most `exp(a z)`) nor rank among
        the `max_labels` best scored, and none can be among the `min_labels` most
        probable. `-inf` while nothing is scored.

        Args:
            z_scored: The scored labels' log scores.
            normalised: Whether the log scores are log-probabilities over the labels
                (constrained scoring).
        """
        if not len(z_scored):
            return -math.inf
        z = np.sort(np.asarray(z_scored, dtype=np.float64))[::-1]
        a, log_t = self.slope, math.log(self.threshold)
        cut = float(z[0]) + log_t / a
        if normalised and a <= 1.0:
            cut = max(cut, log_t / a)
        if self.max_labels is not None and len(z) >= self.max_labels:
            cut = max(cut, float(z[self.max_labels - 1]))
        if self.min_labels:
            cut = min(
                cut, float(z[self.min_labels - 1]) if len(z) >= self.min_labels else -math.inf
            )
        return cut

    def certified(self, scores: PartialScores) -> bool:
        """Whether the exhaustive pass would choose the same labels, in the same order."""
        return _read(scores, self)[1]


def _read(scores: PartialScores, goal: RankedGoal) -> tuple[list[int], bool, Any]:
    """The chosen labels, whether they are certified, and the field's `Bounded`."""
    got = bounded(scores, goal.temperature, scale=goal.scale)
    rule = (goal.threshold, goal.min_labels, goal.max_labels)
    chosen = rank_labels(got.probs * got.upper_factor, *rule)
    if len(chosen) > got.certified_top:
        return chosen, False, got
    for rank, i in enumerate(chosen):  # chosen for its share: provably over the threshold
        if rank >= goal.min_labels and got.bounds_of(i)[0] < goal.threshold:
            return chosen, False, got
    by_threshold = len(chosen) >= goal.min_labels and (
        goal.max_labels is None or len(chosen) < goal.max_labels
    )
    if by_threshold:  # the list ended at the threshold: nothing else can reach it
        rest = np.ones(len(got.probs), dtype=bool)
        rest[chosen] = False  # an unscored label's entry is 0.0: `unscored_top` bounds it
        best_rest = float(got.probs[rest].max(initial=0.0)) * got.upper_factor
        if max(best_rest, got.unscored_top) >= goal.threshold:
            return chosen, False, got
    return chosen, True, got


def _chosen_result(spec: Any, probs: np.ndarray, z: np.ndarray, chosen: list[int]) -> FieldResult:
    """The ranked answer over `probs` (every label's share) with `chosen` labels."""
    return FieldResult(
        name=spec.name,
        value=[spec.choices[i].value for i in chosen],
        label=[spec.choices[i].label for i in chosen],
        probability=float(sum(probs[i] for i in chosen)),
        distribution={c.label: float(q) for c, q in zip(spec.choices, probs)},
        log_scores=tuple(float(v) for v in z),
        spec=spec,
    )


def ranked_result(spec: Any, probs: np.ndarray, log_scores: Any) -> FieldResult:
    """A ranked field scored whole: `probs` is its distribution over the labels."""
    p = np.asarray(probs, dtype=np.float64)
    chosen = rank_labels(p, spec.threshold, spec.min_labels, spec.max_labels)
    return _chosen_result(spec, p, np.asarray(log_scores, dtype=np.float64), chosen)


def ranked_pruned(
    spec: Any, scores: PartialScores, temperature: float, calibration: Any = None
) -> FieldResult:
    """A ranked field read by pruned search: the labels chosen over the scored ones (each
    at its upper bound, as a pruned single-choice field's), whether the exhaustive pass
    would choose the same, and the chosen total's bounds."""
    goal = RankedGoal.of(spec, temperature, calibration)
    chosen, certified, got = _read(scores, goal)
    z = np.where(np.isnan(scores.z), -np.inf, scores.z)
    res = _chosen_result(spec, got.probs * got.upper_factor, z, chosen)
    low = sum(got.bounds_of(i)[0] for i in chosen)
    high = sum(got.bounds_of(i)[1] for i in chosen)
    return replace(
        res,
        certified=certified,
        unscored_mass=got.unscored_mass,
        probability_bounds=(float(low), float(high)),
        search=scores.search,
        certified_top=got.certified_top,
    )
