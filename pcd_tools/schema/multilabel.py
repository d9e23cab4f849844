"""Multi-label fields: `list[Literal[...]]`, `set[...]`, `list[SomeEnum]`.

Each label is its own yes/no question, scored in the same packed pass as the other
fields, so every label gets a probability. The answer holds the labels with
`P(label) >= threshold` (0.5 unless `json_schema_extra={"threshold": ...}`), adjusted to
`min_length` / `max_length` by taking the most probable labels.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..errors import InvalidFieldOptionError, UnsupportedFieldError
from .choices import _enum_choices, _with_descriptions
from .spec import MAX_CHOICES, FieldSpec, _where

__all__ = ["CONTAINERS", "label_type", "multilabel_field"]

CONTAINERS = (list, set, frozenset)


def label_type(tp: Any) -> Any | None:
    """The item annotation of `list[X]` / `set[X]` / `frozenset[X]`, else None."""
    if typing.get_origin(tp) in CONTAINERS:
        args = typing.get_args(tp)
        return args[0] if len(args) == 1 else None
    return None


def multilabel_field(
    model: str,
    path: str,
    tp: Any,
    metadata: Sequence[Any],
    extra: Mapping[str, Any],
    description: str,
) -> FieldSpec:
    """Compiles a multi-label annotation into a `FieldSpec` of kind `"multilabel"`.

    Raises:
        UnsupportedFieldError: if the items are not a `Literal` or an `Enum`.
        InvalidFieldOptionError: for a threshold outside (0, 1) or length bounds that no
            set of the labels can meet.
    """
    item = label_type(tp)
    given = f"annotation {repr(tp).replace('typing.', '')}"
    if typing.get_origin(item) is Literal:
        raw: list[Any] = list(typing.get_args(item))
    elif isinstance(item, type) and issubclass(item, enum.Enum):
        raw = list(item)
    else:
        raise UnsupportedFieldError(
            f"{_where(model, path)}: unsupported {given}; accepted: list[Literal[...]], "
            "set[Literal[...]] or list[SomeEnum] (each label is scored yes/no).",
            model=model,
            field=path,
        )
    choices = _enum_choices(model, path, raw, given, limit=MAX_CHOICES)
    choices = _with_descriptions(model, path, choices, extra.get("choice_descriptions"))
    threshold = extra.get("threshold", 0.5)
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not (0.0 < float(threshold) < 1.0)
    ):
        raise InvalidFieldOptionError(
            f"{_where(model, path)}: threshold {threshold!r} in json_schema_extra; accepted: a "
            "number strictly between 0 and 1 (the probability a label needs to be chosen).",
            model=model,
            field=path,
        )
    low, high = 0, None
    for m in metadata:
        low = max(low, int(getattr(m, "min_length", None) or 0))
        if getattr(m, "max_length", None) is not None:
            high = int(m.max_length)
    if (high is not None and (high < max(low, 1))) or low > len(choices):
        raise InvalidFieldOptionError(
            f"{_where(model, path)}: min_length={low}, max_length={high} with {len(choices)} "
            f"labels; accepted: 0 <= min_length <= max_length, max_length >= 1 and "
            f"min_length <= {len(choices)}.",
            model=model,
            field=path,
        )
    return FieldSpec(
        path,
        "multilabel",
        description,
        tuple(choices),
        threshold=float(threshold),
        min_labels=low,
        max_labels=high,
    )
