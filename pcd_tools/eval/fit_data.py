"""The arrays a calibration is fitted on: each field's raw log scores and gold indices,
taken from decisions made on labelled examples (a multi-label field as one yes/no
question per label, named `field[label]`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..schema import Schema
from .datasets import DatasetError, label_index

if TYPE_CHECKING:
    from ..result import Decision

__all__ = ["field_arrays", "fitted_field"]


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
        given = lab[spec.name]
        if not isinstance(given, (list, tuple, set, frozenset)):
            raise DatasetError(
                f"field {spec.name!r} is multi-label: its label must be a list of labels "
                f"from {spec.labels}; got {given!r}."
            )
        golds.append({spec.choices[label_index(spec, g)].label for g in given})
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
