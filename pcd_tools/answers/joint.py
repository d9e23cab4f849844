"""Joint answers of `choices_by` fields: `P(parent, child) = P(parent) P(child | parent)`.

In the first pass, every parent value's child candidates were scored with that value
written first. This module turns those conditionals and the parent's own distribution
into the joint table, each field's marginals, and the joint best answer, which can
differ from answering the parent first. A discriminated union's branch is chosen the
same way: the value of `kind` that, with its branch's best answers, is most probable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np

from ..prompt import Question
from ..schema import Schema
from .bounds import PartialScores
from .conformal import field_conformal, pruned_conformal
from .field_scores import conditional_probs, field_results
from .result import FieldResult

__all__ = ["Joint", "answers"]

# (parent, child) -> {(parent value, child value): probability}
Joint = dict[tuple[str, str], dict[tuple[Any, Any], float]]


def answers(
    schema: Schema,
    questions: Sequence[Question],
    log_scores: Sequence[np.ndarray],
    temperature: float,
    calibration: Any = None,
) -> tuple[dict[str, FieldResult], Joint]:
    """Each field's result, and the joint tables of the fields scored jointly.

    A joint child's questions are one per parent value (each `given` that value); every
    other question goes to `field_results`. A single-choice field scored whole over all
    its candidates gets what `FieldResult.prediction_set` needs when the calibration has
    conformal scores for it.
    """
    per_field: dict[str, int] = {}
    for q in questions:
        if q.label is None:
            per_field[q.field] = per_field.get(q.field, 0) + 1
    joint_q: dict[str, list[tuple[Question, np.ndarray]]] = {}
    simple_q, simple_z = [], []
    for q, z in zip(questions, log_scores):
        if q.label is None and per_field[q.field] > 1:
            joint_q.setdefault(q.field, []).append((q, z))
        else:
            simple_q.append(q)
            simple_z.append(z)
    fields = field_results(schema, simple_q, simple_z, temperature, calibration)
    if getattr(calibration, "conformal", None):
        for q, z in zip(simple_q, simple_z):
            single = (
                q.label is None and q.choices is None and schema.field(q.field).reading != "ranked"
            )
            conf = (
                None
                if not single
                else pruned_conformal(calibration, q.field, z)
                if isinstance(z, PartialScores)
                else field_conformal(calibration, q.field, z)
            )
            if conf is not None:
                fields[q.field] = replace(fields[q.field], conformal=conf)
    tables: Joint = {}
    for child, items in joint_q.items():
        parent = items[0][0].given[-1][0]
        fields[parent], fields[child], table = _joint(
            schema, fields[parent], child, items, temperature, calibration
        )
        tables[(parent, child)] = table
    for kind in dict.fromkeys(f.branch[0] for f in schema.fields if f.branch is not None):
        if kind in fields:
            fields[kind] = _branch(schema, fields, kind)
    return {f.name: fields[f.name] for f in schema.fields if f.name in fields}, tables


def _branch(schema: Schema, fields: dict[str, FieldResult], kind: str) -> FieldResult:
    """A union's answer: the branch value `t` with the highest `P(t) * prod(P(best | t))`
    over the branch's scored fields (each scored after `t` was written)."""
    res = fields[kind]
    best, best_score = 0, -1.0
    for t, p in enumerate(res.distribution.values()):
        score = p
        for f in schema.fields:
            if f.branch == (kind, t) and f.name in fields and f.kind != "multilabel":
                score *= max(fields[f.name].distribution.values())
        if score > best_score:
            best, best_score = t, score
    choice = res.spec.choices[best]
    return replace(
        res,
        value=choice.value,
        label=choice.label,
        probability=float(list(res.distribution.values())[best]),
    )


def _joint(
    schema: Schema,
    parent: FieldResult,
    child: str,
    items: list[tuple[Question, np.ndarray]],
    temperature: float,
    calibration: Any,
) -> tuple[FieldResult, FieldResult, dict[tuple[Any, Any], float]]:
    spec = schema.field(child)
    p_parent = np.array(list(parent.distribution.values()))
    table: dict[tuple[Any, Any], float] = {}
    pairs: list[tuple[int, int, float]] = []  # (parent index, child index, P), in order
    marginal = np.zeros(spec.cardinality)
    for q, z in sorted(items, key=lambda it: cast(int, it[0].given[-1][1])):
        v = cast(int, q.given[-1][1])  # a joint parent is never multi-label: an index
        idx = q.choices if q.choices is not None else tuple(range(spec.cardinality))
        cond = conditional_probs(child, z, temperature, calibration)
        for c, pc in zip(idx, cond):
            p = float(p_parent[v] * pc)
            pairs.append((v, c, p))
            marginal[c] += p
            table[(parent.spec.choices[v].label, spec.choices[c].label)] = p
    best_v, best_c, _ = max(pairs, key=lambda t: t[2])  # max keeps the first of ties
    with np.errstate(divide="ignore"):
        logm = np.log(marginal)
    choice = parent.spec.choices[best_v]
    new_parent = replace(
        parent,
        value=choice.value,
        label=choice.label,
        probability=float(p_parent[best_v]),
    )
    return new_parent, FieldResult.from_probs(spec, marginal, logm, best=best_c), table
