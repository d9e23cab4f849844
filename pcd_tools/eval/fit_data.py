"""The arrays a calibration is fitted on: each field's raw log scores and gold indices,
taken from decisions made on labelled examples (a multi-label field as one yes/no
question per label, named `field[label]`), and the content-free offsets of the
label-free corrections for the same fields (`content_free_offsets`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..schema import Schema
from .datasets import DatasetError, label_index

if TYPE_CHECKING:
    from ..answers.result import Decision
    from ..decide.decider import Decider

__all__ = ["content_free_offsets", "field_arrays", "fitted_field", "label_free_scores"]


def field_arrays(
    schema: Schema, decisions: Sequence[Decision[Any]], labels: Sequence[Mapping[str, Any]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per field: raw log scores `(m, K)` and gold indices of the labelled items.

    Args:
        schema: The compiled schema the decisions were made with.
        decisions: One decision per example.
        labels: `{field: label}` per example; a field missing from an example is skipped.

    Raises:
        DatasetError: if a label is not one of its field's choices.
    """
    out = {}
    for spec in schema.fields:
        if spec.reading == "ranked":
            out.update(_ranked_arrays(spec, decisions, labels))
            continue
        if spec.kind == "multilabel":
            out.update(_label_arrays(spec, decisions, labels))
            continue
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


def _gold_labels(spec: Any, given: Any) -> list[int]:
    """A multi-label field's gold labels (a list of them), as choice indices."""
    if not isinstance(given, (list, tuple, set, frozenset)):
        raise DatasetError(
            f"field {spec.name!r} is multi-label: its label must be a list of labels "
            f"from {_shown(spec.labels)}; got {given!r}."
        )
    return [label_index(spec, g) for g in given]


def _shown(labels: Sequence[Any]) -> str:
    return f"{list(labels[:10])} ... ({len(labels)} labels)" if len(labels) > 10 else str(labels)


def _ranked_arrays(
    spec: Any, decisions: Sequence[Decision[Any]], labels: Sequence[Mapping[str, Any]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A ranked multi-label field as one single-choice field: a row per gold label of each
    item, its target that label (fitting a temperature to them spreads the ranking's
    mass over the labels that apply, as the threshold reads it). An item without gold
    labels teaches nothing about the ranking and is left out."""
    rows: list[tuple[Any, int]] = []
    for d, lab in zip(decisions, labels):
        if spec.name not in lab:
            continue
        z = np.asarray(d.fields[spec.name].log_scores, dtype=np.float64)
        for g in _gold_labels(spec, lab[spec.name]):
            if not np.isfinite(z[g]):
                raise DatasetError(
                    f"field {spec.name!r}: the gold label {spec.choices[g].label!r} was not "
                    "scored (the decision read the field by pruned search); decide the "
                    "calibration items with pruning='off'."
                )
            rows.append((z, g))
    if not rows:
        return {}
    return {
        spec.name: (
            np.array([z for z, _ in rows], dtype=np.float64),
            np.array([g for _, g in rows], dtype=np.int64),
        )
    }


def _label_arrays(
    spec: Any, decisions: Sequence[Decision[Any]], labels: Sequence[Mapping[str, Any]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A multi-label field as one yes/no field per label, named `field[label]`: log
    scores `(m, 2)` as `[log-odds, 0]` and gold index 0 where the label applies."""
    golds = []
    kept = []
    for d, lab in zip(decisions, labels):
        if spec.name not in lab:
            continue
        golds.append({spec.choices[i].label for i in _gold_labels(spec, lab[spec.name])})
        kept.append(d.fields[spec.name].log_scores)
    if not kept:
        return {}
    odds = np.array(kept, dtype=np.float64)  # (m, labels): log P(yes) - log P(no)
    out = {}
    for i, c in enumerate(spec.choices):
        z = np.stack([odds[:, i], np.zeros(len(odds))], axis=1)
        g = np.array([0 if c.label in gold else 1 for gold in golds], dtype=np.int64)
        out[f"{spec.name}[{c.label}]"] = (z, g)
    return out


def fitted_field(schema: Schema, name: str) -> tuple[str, int]:
    """The field a calibration key names, and the number of classes its scores have:
    a field's cardinality, or 2 for one label `field[label]` of a multi-label field."""
    if name.endswith("]") and "[" in name:
        base, _, label = name[:-1].partition("[")
        spec = schema.field(base)
        if spec.kind == "multilabel" and label in [str(c.label) for c in spec.choices]:
            return base, 2
    return name, schema.field(name).cardinality


def content_free_offsets(
    decider: Decider, schema: Schema, scoring: str = "full"
) -> dict[str, dict[str, np.ndarray]]:
    """What each label-free correction subtracts from each field's raw log scores.

    From the decider's content-free scores of the schema's prompt (declared listing
    order; run once and cached on the decider, `pcd_tools.decide.contextual`): `"contextual"`
    (the decider's content-free inputs, on `scoring`'s side) and, for `scoring="full"`,
    `"pmi"` (the empty context). A field's corrected scores are `z - offset`, exactly as
    `decide(..., calibration="contextual")` or `scoring="pmi"` compute them, for every
    field scored as one question in the first pass; a multi-label field's labels are
    keyed `field[label]` with offset `[o_yes - o_no, 0]`, as `field_arrays` writes their
    scores. Fields scored jointly (`choices_by`), in a union branch or in a later wave
    are left out: their offsets depend on earlier answers.

    Args:
        decider: The decider whose model and content-free inputs are used.
        schema: The compiled schema, with its examples.
        scoring: The scoring of the raw scores: `"full"` or `"constrained"`.

    Returns:
        Method -> field key -> offset.
    """
    from ..decide.contextual import Correction
    from ..decide.methods import CONTEXTUAL, PMI

    questions = decider.engine.plan(schema, None).questions
    per_field: dict[str, int] = {}
    for q in questions:
        per_field[q.field] = per_field.get(q.field, 0) + 1
    out: dict[str, dict[str, np.ndarray]] = {}
    for kind in (CONTEXTUAL, PMI):
        if scoring not in kind.sides:  # PMI subtracts full scores only
            continue
        corr = Correction(decider.content_free, schema, None, kind, scoring == "constrained")
        got: dict[str, np.ndarray] = {}
        for q, o in zip(questions, corr.offsets(questions)):
            spec = schema.field(q.field)
            if q.given or q.choices is not None:
                continue
            if q.label is None and per_field[q.field] == 1 and spec.kind != "multilabel":
                got[q.field] = np.asarray(o, dtype=np.float64)
            elif q.label is not None:
                got[f"{q.field}[{spec.choices[q.label].label}]"] = np.array([o[0] - o[1], 0.0])
        out[kind.name] = got
    return out


def label_free_scores(
    arrays: dict[str, tuple[np.ndarray, np.ndarray]], offsets: dict[str, np.ndarray]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The arrays of `field_arrays` with one label-free correction applied: `z - offset`
    for every field that has an offset (the others are left out).

    Args:
        arrays: Field key -> `(raw log scores (n, K), gold (n,))`.
        offsets: Field key -> offset, one method's part of `content_free_offsets`.
    """
    return {k: (z - offsets[k], g) for k, (z, g) in arrays.items() if k in offsets}
