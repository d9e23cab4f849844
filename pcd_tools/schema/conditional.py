"""Conditional choices: a field whose allowed values depend on a parent field's value.

`json_schema_extra={"choices_by": {"category": {"billing": [...], "bug": [...]}}}` gives
the child's allowed values per parent value. While it fits a budget, the engine scores
the parent and every parent value's child candidates in the same pass (each with the
parent's answer written first), which gives the exact joint distribution; otherwise the
child is answered in a later wave, after the parent.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import ChoicesByError, UnsupportedFieldError
from .dependencies import resolve_parent
from .spec import Choice, FieldSpec, _literal_text, _where

__all__ = ["find_choice", "resolve_choices_by", "union_of"]


def union_of(raw: Any) -> list[Any]:
    """Every child value named in a raw `choices_by` mapping, in first-seen order."""
    out: list[Any] = []
    if isinstance(raw, Mapping):
        for per_parent in raw.values():
            if isinstance(per_parent, Mapping):
                for vals in per_parent.values():
                    if isinstance(vals, (list, tuple)):
                        out.extend(v for v in vals if v not in out)
    return out


def find_choice(choices: Sequence[Choice], key: Any) -> int | None:
    """The index of the choice a user wrote as `key` (its value, JSON text, label or Enum
    member name), or None."""
    k = key.value if isinstance(key, enum.Enum) else key
    for i, c in enumerate(choices):
        if k is None and c.label is None:
            return i
        if k is not None and (
            c.literal == _literal_text(k)
            or str(c.label) == str(k)
            or (isinstance(c.value, enum.Enum) and c.value.name == k)
        ):
            return i
    return None


def resolve_choices_by(
    model: str, fields: Sequence[FieldSpec], raw: Mapping[str, Any]
) -> list[FieldSpec]:
    """Resolves each field's raw `choices_by` into `(parent, allowed child indices per
    parent value)` and adds the parent to its `depends_on`.

    Raises:
        ChoicesByError: for a malformed mapping, keys that are not the parent's values,
            a parent value left out, or child values that are not the field's choices.
        UnknownParentError: for a parent that does not exist.
    """
    known = [f.name for f in fields]
    by_name = {f.name: f for f in fields}
    out = []
    for f in fields:
        spec = raw.get(f.name)
        if spec is None:
            out.append(f)
            continue
        where = _where(model, f.name)
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise ChoicesByError(
                f"{where}: choices_by={spec!r}; accepted: one parent field mapped to its values' "
                "allowed choices, e.g. {'category': {'billing': ['refund', 'invoice'], ...}}.",
                model=model,
                field=f.name,
            )
        ((pname, table),) = spec.items()
        parent = by_name[resolve_parent(model, f.name, str(pname), known)]
        if parent.kind == "multilabel" or f.kind == "multilabel":
            raise UnsupportedFieldError(
                f"{where}: choices_by between {parent.name!r} ({parent.kind}) and {f.name!r} "
                f"({f.kind}); accepted: an enum, int range or bool parent and child.",
                model=model,
                field=f.name,
            )
        out.append(_resolve(model, f, parent, table))
    return out


def _resolve(model: str, f: FieldSpec, parent: FieldSpec, table: Any) -> FieldSpec:
    where = _where(model, f.name)
    if not isinstance(table, Mapping):
        raise ChoicesByError(
            f"{where}: choices_by[{parent.name!r}] must map each of its values to a list of "
            f"choices; got {type(table).__name__}.",
            model=model,
            field=f.name,
        )
    allowed: list[tuple[int, ...] | None] = [None] * len(parent.choices)
    for key, vals in table.items():
        pi = find_choice(parent.choices, key)
        if pi is None:
            raise ChoicesByError(
                f"{where}: choices_by names {key!r}, which is not a value of {parent.name!r}; "
                f"accepted: {parent.labels}.",
                model=model,
                field=f.name,
            )
        if not isinstance(vals, (list, tuple)) or not vals:
            raise ChoicesByError(
                f"{where}: choices_by[{parent.name!r}][{key!r}] = {vals!r}; accepted: a "
                f"non-empty list of values of {f.name!r}: {f.labels}.",
                model=model,
                field=f.name,
            )
        idx = []
        for v in vals:
            ci = find_choice(f.choices, v)
            if ci is None:
                raise ChoicesByError(
                    f"{where}: choices_by[{parent.name!r}][{key!r}] holds {v!r}, which is not a "
                    f"value of {f.name!r}; accepted: {f.labels}.",
                    model=model,
                    field=f.name,
                )
            if ci not in idx:
                idx.append(ci)
        allowed[pi] = tuple(sorted(idx))
    missing = [parent.choices[i].label for i, a in enumerate(allowed) if a is None]
    if missing:
        raise ChoicesByError(
            f"{where}: choices_by[{parent.name!r}] gives no choices for {missing}; accepted: "
            f"a list for every value of {parent.name!r}: {parent.labels}.",
            model=model,
            field=f.name,
        )
    deps = tuple(dict.fromkeys((*f.depends_on, parent.name)))
    return replace(
        f, choices_by=(parent.name, tuple(a for a in allowed if a is not None)), depends_on=deps
    )
