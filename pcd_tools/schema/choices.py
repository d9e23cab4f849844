"""A field's candidates: validating choice values, the limits, and per-choice descriptions.

The checks here are shared by every schema form (Pydantic annotations and the dict spec),
so a bad choice gets the same typed error and message whichever way it was declared.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import (
    DuplicateChoiceError,
    InvalidChoiceError,
    SchemaError,
    TooFewChoicesError,
    TooManyChoicesError,
)
from .spec import MIN_CHOICES, NOT_STATED, Choice, _literal_text, _where


def _enum_choices(
    model: str, name: str, raw: Sequence[Any], given: str, *, limit: int | None = None
) -> list[Choice]:
    """Validates raw choice values (str or int) and returns `Choice`s (no descriptions yet).

    A single-choice field takes any number of values (its token trie scores them exactly;
    the only bound is memory, checked when the trie is built: `passes.trie`). `limit` caps
    the count where each value costs a question of its own (a multi-label field's labels).
    """
    out: list[Choice] = []
    seen: set[str] = set()
    for v in raw:
        member = v if isinstance(v, enum.Enum) else None
        label = v.value if member is not None else v
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            raise InvalidChoiceError(
                f"{_where(model, name)}: choice {label!r} of type {type(label).__name__} in {given} "
                "is not scoreable; accepted: non-empty str or int values (use `bool` for yes/no).",
                model=model,
                field=name,
            )
        if isinstance(label, str) and not label.strip():
            raise InvalidChoiceError(
                f"{_where(model, name)}: empty or whitespace-only choice {label!r} in {given}; "
                "accepted: non-empty strings.",
                model=model,
                field=name,
            )
        lit = _literal_text(label)
        if lit in seen:
            raise DuplicateChoiceError(
                f"{_where(model, name)}: choice {label!r} is declared twice in {given}; "
                "accepted: distinct values.",
                model=model,
                field=name,
            )
        seen.add(lit)
        out.append(Choice(value=v, literal=lit, label=label))
    n = len(out)
    if limit is not None and n > limit:
        raise TooManyChoicesError(
            _too_many_message(_where(model, name), [c.label for c in out], given, limit),
            model=model,
            field=name,
        )
    if n < MIN_CHOICES:
        raise TooFewChoicesError(
            f"{_where(model, name)}: {n} choice(s) given in {given}; accepted: at least "
            f"{MIN_CHOICES} choice"
            + (f" and at most {limit}" if limit is not None else "")
            + " per field.",
            model=model,
            field=name,
        )
    return out


_EXAMPLES = 5
_EXAMPLE_CHARS = 30


def _too_many_message(where: str, labels: Sequence[Any], given: str, limit: int) -> str:
    """The `TooManyChoicesError` message: count, limit and advice first, then a few values.

    `given` may be a long annotation (`Literal['a', 'b', ...]`); only its head is kept, so
    the message stays a few lines long whatever the number of choices.
    """
    source = given.split("[", 1)[0].rstrip()
    shown = []
    for v in labels[:_EXAMPLES]:
        r = repr(v)
        shown.append(r if len(r) <= _EXAMPLE_CHARS else r[: _EXAMPLE_CHARS - 3] + "...")
    rest = len(labels) - len(shown)
    return (
        f"{where}: {len(labels)} labels given in {source}; accepted: {MIN_CHOICES} to "
        f"{limit} labels in a multi-label field read 'each' (each label is a yes/no question "
        "of its own); reading 'ranked' (the default past 255) and a single-choice field "
        "(`Literal`, `Enum`) take any number of values. The values start: "
        f"{', '.join(shown)}{f' ... and {rest} more' if rest else ''}."
    )


def _with_descriptions(
    model: str, name: str, choices: list[Choice], descs: Mapping[Any, Any] | None
) -> list[Choice]:
    if not descs:
        return choices
    if not isinstance(descs, Mapping):
        raise SchemaError(
            f"{_where(model, name)}: choice_descriptions must be a mapping of choice -> "
            f"description; got {type(descs).__name__}.",
            model=model,
            field=name,
        )
    by_key: dict[str, int] = {}
    for i, c in enumerate(choices):
        for key in (c.literal, str(c.label)):
            by_key.setdefault(key, i)
        if isinstance(c.value, enum.Enum):
            by_key.setdefault(c.value.name, i)
    out = list(choices)
    for k, d in descs.items():
        key = k.value if isinstance(k, enum.Enum) else k
        key_s = _literal_text(key) if isinstance(key, bool) else str(key)
        hit = by_key.get(key_s)
        if hit is None:
            raise SchemaError(
                f"{_where(model, name)}: choice_descriptions names {k!r}, which is not a choice; "
                f"accepted: {[c.label for c in choices]}.",
                model=model,
                field=name,
            )
        if not isinstance(d, str):
            raise SchemaError(
                f"{_where(model, name)}: the description of choice {k!r} must be a str, got "
                f"{type(d).__name__}.",
                model=model,
                field=name,
            )
        c = out[hit]
        out[hit] = Choice(c.value, c.literal, c.label, d.strip() or None)
    return out


def _bool_choices() -> list[Choice]:
    return [Choice(True, "true", True), Choice(False, "false", False)]


def _null_choice() -> Choice:
    return Choice(None, "null", None, NOT_STATED)
