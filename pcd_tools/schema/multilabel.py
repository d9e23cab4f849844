"""Multi-label fields: `list[Literal[...]]`, `set[...]`, `list[SomeEnum]`.

Two readings (`json_schema_extra={"reading": ...}`):

- `"each"` (the default up to 255 labels): each label is its own yes/no question,
  scored in the same packed pass as the other fields, so every label gets its own
  probability of applying. The answer holds the labels with `P(label) >= threshold` (0.5
  unless `json_schema_extra={"threshold": ...}`), adjusted to `min_length` /
  `max_length` by taking the most probable labels.
- `"ranked"` (the default, and the only reading, past 255 labels): one question over
  every label, scored like a single-choice field of any size (its token trie, certified
  pruned search when large): which label the list starts with. The answer is the top
  labels whose share of that ranking is at least `threshold` (0.1 unless set), most
  probable first, at most `max_length` and at least `min_length` of them. A yes/no
  question per label does not scale to thousands; the ranking costs about one field.
  Its labels must be strings (their closing quote ends each one in the list).
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..errors import InvalidFieldOptionError, UnsupportedFieldError
from .choices import _enum_choices, _with_descriptions
from .spec import MAX_CHOICES, FieldSpec, _where

__all__ = ["CONTAINERS", "RANKED_THRESHOLD", "label_type", "multilabel_field"]

CONTAINERS = (list, set, frozenset)
READINGS = ("each", "ranked")
# A ranked label's share of the ranking needed to be chosen, unless the field sets one:
# labels that share the model's first choice split its mass, so 0.5 would keep one.
RANKED_THRESHOLD = 0.1


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
    reading = _reading(model, path, extra.get("reading"), len(raw))
    limit = MAX_CHOICES if reading == "each" else None
    choices = _enum_choices(model, path, raw, given, limit=limit)
    choices = _with_descriptions(model, path, choices, extra.get("choice_descriptions"))
    if reading == "ranked":
        _ranked_labels(model, path, [c.label for c in choices])
    threshold = extra.get("threshold", 0.5 if reading == "each" else RANKED_THRESHOLD)
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
        reading=reading,
        min_labels=low,
        max_labels=high,
    )


def _reading(model: str, path: str, given: Any, count: int) -> Literal["each", "ranked"]:
    """The field's reading: as set, else `"each"` up to `MAX_CHOICES` labels and
    `"ranked"` past it (set `"each"` past it: `TooManyChoicesError`)."""
    if given is None:
        return "each" if count <= MAX_CHOICES else "ranked"
    if given not in READINGS:
        raise InvalidFieldOptionError(
            f"{_where(model, path)}: reading {given!r} in json_schema_extra; accepted: "
            f"{list(READINGS)}.",
            model=model,
            field=path,
        )
    return "each" if given == "each" else "ranked"  # "each" past 255: `_enum_choices` says why


def _ranked_labels(model: str, path: str, labels: Sequence[Any]) -> None:
    """A ranked field's labels are JSON strings: each one's closing quote ends it in the
    list, so no label's text starts another's."""
    bad = [lab for lab in labels if not isinstance(lab, str)]
    if bad:
        raise UnsupportedFieldError(
            f"{_where(model, path)}: a ranked multi-label field takes string labels (each is "
            f"scored as the list's first item, ended by its closing quote); got "
            f"{bad[:3]!r}{' ...' if len(bad) > 3 else ''}; accepted: str labels, or at most "
            f"{MAX_CHOICES} labels read 'each' (yes/no per label).",
            model=model,
            field=path,
        )
