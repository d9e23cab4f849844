"""Field results from candidate log scores: temperature, calibration, multi-label labels,
the choices allowed after a parent, and pruned fields' bounds (`pcd_tools.answers.bounds`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..prompt import Question
from ..schema import Schema
from .bounds import PartialScores, bounded, log_weights, prefix_floors
from .ranked import ranked_pruned, ranked_result
from .result import FieldResult
from .softmax import logsumexp, softmax
from .taxonomy import taxonomy_path, top_down, tree_index

__all__ = ["conditional_probs", "field_results"]


def field_results(
    schema: Schema,
    questions: Sequence[Question],
    log_scores: Sequence[np.ndarray],
    temperature: float,
    calibration: Any = None,
) -> dict[str, FieldResult]:
    """Each field's result from its questions' candidate log scores.

    A multi-label field's labels come as separate yes/no questions; a calibration may
    hold a temperature (and biases) per label, under `field[label]`. A ranked multi-label
    field is one question over its labels (`pcd_tools.answers.ranked`). A pruned field's
    scores are `PartialScores`: its unscored candidates get probability 0.0 and log score
    -inf, and the result says whether its answer is certified, and within what bounds.
    """

    def probs(name: str, z: np.ndarray) -> np.ndarray:
        if calibration is not None:
            return np.asarray(calibration.probabilities(name, z, temperature))
        return softmax(z, temperature)

    per_label: dict[str, list[tuple[float, float]]] = {}
    out: dict[str, FieldResult] = {}
    for q, z in zip(questions, log_scores):
        spec = schema.field(q.field)
        if spec.reading == "ranked":  # one question over all its labels
            out[spec.name] = (
                ranked_pruned(spec, z, temperature, calibration)
                if isinstance(z, PartialScores)
                else ranked_result(
                    spec, conditional_probs(spec.name, z, temperature, calibration), z
                )
            )
            continue
        if isinstance(z, PartialScores):  # a pruned field (`pcd_tools.engine.passes.prune`)
            out[spec.name] = _pruned(spec.name, spec, z, temperature, calibration)
            continue
        if q.label is None and q.choices is not None:  # only some allowed after a parent
            p_full, z_full = np.zeros(spec.cardinality), np.full(spec.cardinality, -np.inf)
            p_full[list(q.choices)] = conditional_probs(spec.name, z, temperature, calibration)
            z_full[list(q.choices)] = z
            out[spec.name] = FieldResult.from_probs(spec, p_full, z_full)
            continue
        if q.label is None:
            out[spec.name] = FieldResult.from_probs(spec, probs(spec.name, z), z)
            continue
        p = probs(f"{spec.name}[{spec.choices[q.label].label}]", z)
        per_label.setdefault(spec.name, []).append((float(p[0]), float(z[0] - z[1])))
    for name, items in per_label.items():
        spec = schema.field(name)
        res = FieldResult.from_labels(spec, np.array([p for p, _ in items]), [d for _, d in items])
        out[name] = res
    return {f.name: out[f.name] for f in schema.fields if f.name in out}


def conditional_probs(
    name: str, log_scores: np.ndarray, temperature: float, calibration: Any = None
) -> np.ndarray:
    """A field's distribution over some of its choices (those allowed after a parent's
    answer), or over a ranked multi-label field's labels (calibrated by a temperature
    alone): the field's calibrated temperature applies, its per-choice biases do not."""
    t = calibration.temperature(name) if calibration is not None else 1.0
    return softmax(np.asarray(log_scores, dtype=np.float64) / t, temperature)


def _pruned(
    name: str, spec: Any, scores: PartialScores, temperature: float, calibration: Any
) -> FieldResult:
    """A pruned field's result: the best scored candidate and its guarantees."""
    scale, bias = 1.0, None
    if calibration is not None:
        scale = 1.0 / calibration.temperature(name)
        b = calibration.biases.get(name)
        if b is not None:
            # the checks of `Calibration.probabilities` (bias count) apply here too
            calibration.probabilities(name, np.zeros(len(scores.z)), temperature)
            bias = np.asarray(b, dtype=np.float64)
    got = bounded(scores, temperature, scale=scale, bias=bias)
    z = np.where(np.isnan(scores.z), -np.inf, scores.z)
    best, certified, path = got.best, got.certified, None
    if spec.tree is not None:
        s, groups, _ = log_weights(scores, temperature, scale=scale, bias=bias)
        floors = prefix_floors(scores, temperature, scale=scale, bias=bias)
        if spec.tree.decide == "path":  # level by level, bounded
            bounds = [(g, f, m) for (g, m), f in zip(groups, floors)]
            best, certified, _ = top_down(tree_index(spec.tree), s, bounds)
            if not np.isfinite(s[best]):  # a leaf never read: the best read one, unsure
                best, certified = got.best, False
        # the path counts each unread prefix's floor too, spread over its members (exact
        # for a node that holds the whole prefix: its candidates' total is known)
        seen = np.isfinite(s)
        log_s = float(logsumexp(s[seen]))
        mass = got.probs.copy()
        for (_, members), f in zip(groups, floors):
            if np.isfinite(f):
                mass[members] += np.exp(f - log_s) / len(members)
        path = taxonomy_path(spec, mass, best)
    # each scored candidate at its upper bound: where the unread mass is known (constrained
    # scoring) that is its probability among all candidates, not its share of those read
    res = FieldResult.from_probs(spec, got.probs * got.upper_factor, z, best=best)
    return replace(
        res,
        path=path if path is not None else res.path,
        certified=certified,
        unscored_mass=got.unscored_mass,
        probability_bounds=got.bounds_of(best),
        search=scores.search,
        certified_top=got.certified_top,
    )
