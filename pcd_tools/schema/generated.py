"""Generated fields: free text, numbers, lists of strings and dates, decoded under a grammar.

A field that is not a bounded decision is generated instead of scored:

| annotation                                   | `Generation.type` | value                    |
|----------------------------------------------|-------------------|--------------------------|
| `str` (`min_length`, `max_length`, `pattern`) | `string`          | a JSON string            |
| `float` (`ge`, `le`)                         | `number`          | a plain decimal          |
| `int` without both bounds or > 255 values    | `integer`         | an integer in `[ge, le]` |
| `list[str]` (`min_length`/`max_length` items) | `string_list`     | an array of strings      |
| `datetime.date` / `datetime.datetime`        | `date`/`datetime` | an ISO 8601 string       |

`Optional[...]` of one of these also allows `null`. A field's own token limit is
`json_schema_extra={"max_new_tokens": n}`. A `pattern` with `min_length`/`max_length` is
followed greedily: where the greedy path cannot meet both, decoding raises
`GenerationError` (write the length into the pattern instead, e.g. `[a-z]{1,20}`).

The answer is one JSON object written in declaration order, so a schema with generated
fields is answered in *segments* (`segments`): each run of consecutive scored fields is
one packed pass, each run of generated fields is decoded one field after the other, and
every segment sees everything declared before it written in the JSON. `check_layout`
refuses what that order cannot honour.
"""

from __future__ import annotations

import datetime
import math
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic.fields import FieldInfo

from ..errors import InvalidFieldOptionError, UnsupportedFieldError
from .ranges import int_bounds
from .spec import MAX_CHOICES, FieldSpec, Generation, Schema, _where

__all__ = ["Segment", "check_layout", "generation_for", "segments"]

# (kind, field names): one scored pass, or fields decoded one after the other.
Segment = tuple[Literal["scored", "generated"], tuple[str, ...]]


def _flat_metadata(items: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for m in items:
        if isinstance(m, FieldInfo):
            out.extend(_flat_metadata(m.metadata))
        else:
            out.append(m)
    return out


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """`Annotated[X, ...]` -> (X, its metadata); other types unchanged."""
    if typing.get_origin(tp) is Annotated:
        base, *meta = typing.get_args(tp)
        inner, more = _unwrap(base)
        return inner, [*_flat_metadata(meta), *more]
    return tp, []


def _attr(meta: Sequence[Any], name: str) -> Any:
    """The last value of constraint `name` in `meta` (None if none sets it)."""
    found = None
    for m in meta:
        v = getattr(m, name, None)
        if v is not None:
            found = v
    return found


def _lengths(model: str, path: str, meta: Sequence[Any], what: str) -> tuple[int | None, ...]:
    lo, hi = _attr(meta, "min_length"), _attr(meta, "max_length")
    for name, v in (("min_length", lo), ("max_length", hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise InvalidFieldOptionError(
                f"{_where(model, path)}: {name}={v!r} on {what}; accepted: an int >= 0.",
                model=model,
                field=path,
            )
    if lo is not None and hi is not None and lo > hi:
        raise InvalidFieldOptionError(
            f"{_where(model, path)}: min_length={lo} is above max_length={hi} on {what}; "
            "accepted: min_length <= max_length.",
            model=model,
            field=path,
        )
    return lo, hi


def _pattern(model: str, path: str, meta: Sequence[Any]) -> str | None:
    pattern = _attr(meta, "pattern")
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        pattern = getattr(pattern, "pattern", pattern)  # a compiled `re.Pattern`
    bad = next((t for t in ("(?=", "(?!", "(?<=", "(?<!") if t in str(pattern)), None)
    if bad is None and re.search(r"\\[1-9]", str(pattern)):
        bad = "a back-reference"
    if bad is not None:
        raise UnsupportedFieldError(
            f"{_where(model, path)}: pattern {pattern!r} uses {bad}, which a grammar cannot "
            "enforce token by token; accepted: a regular expression without look-arounds or "
            "back-references (classes, groups, alternation, repetition).",
            model=model,
            field=path,
        )
    try:
        re.compile(str(pattern))
    except re.error as e:
        raise InvalidFieldOptionError(
            f"{_where(model, path)}: pattern {pattern!r} is not a regular expression ({e}); "
            "accepted: a valid regular expression.",
            model=model,
            field=path,
        ) from None
    return str(pattern)


def _max_new_tokens(model: str, path: str, extra: Mapping[str, Any]) -> int | None:
    v = extra.get("max_new_tokens")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidFieldOptionError(
            f"{_where(model, path)}: max_new_tokens={v!r}; accepted: an int >= 1.",
            model=model,
            field=path,
        )
    return v


def _float_bounds(model: str, path: str, meta: Sequence[Any]) -> tuple[float | None, ...]:
    for name in ("gt", "lt", "multiple_of"):
        if _attr(meta, name) is not None:
            raise UnsupportedFieldError(
                f"{_where(model, path)}: {name}={_attr(meta, name)!r} on a generated float; "
                "accepted: ge and le (inclusive bounds, enforced by the grammar).",
                model=model,
                field=path,
            )
    out = []
    for name in ("ge", "le"):
        v = _attr(meta, name)
        if v is not None and (
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        ):
            raise InvalidFieldOptionError(
                f"{_where(model, path)}: {name}={v!r}; accepted: a finite number.",
                model=model,
                field=path,
            )
        out.append(float(v) if v is not None else None)
    if out[0] is not None and out[1] is not None and out[0] > out[1]:
        raise InvalidFieldOptionError(
            f"{_where(model, path)}: ge={out[0]} is above le={out[1]}; accepted: ge <= le.",
            model=model,
            field=path,
        )
    return tuple(out)


def small_int_range(metadata: Sequence[Any]) -> bool:
    """Whether an int's bounds make it a scored range (both bounds, at most 255 values);
    any other int is generated."""
    low, high, step = int_bounds(metadata)
    if low is None or high is None:
        return False
    return (high - low) // step + 1 <= MAX_CHOICES


def generation_for(
    model: str, path: str, tp: Any, metadata: Sequence[Any], extra: Mapping[str, Any]
) -> Generation | None:
    """The `Generation` of a field's (non-optional) annotation, or None when the
    annotation is not a generated kind (it may be a scored one).

    Raises:
        UnsupportedFieldError: for a constraint the grammar cannot enforce (`gt`/`lt` or
            `multiple_of` on a float, `multiple_of` on a wide int, a look-around pattern).
        InvalidFieldOptionError: for a bad length, bound, pattern or `max_new_tokens`.
    """
    inner, more = _unwrap(tp)
    meta = [*_flat_metadata(metadata), *more]
    limit = _max_new_tokens(model, path, extra)
    if inner is str:
        lo, hi = _lengths(model, path, meta, "a str")
        pattern = _pattern(model, path, meta)
        return Generation("string", lo, hi, pattern, max_new_tokens=limit)
    if inner is float:
        ge, le = _float_bounds(model, path, meta)
        return Generation("number", ge=ge, le=le, max_new_tokens=limit)
    if inner is int and not small_int_range(meta):
        low, high, step = int_bounds(meta)
        if step != 1:
            raise UnsupportedFieldError(
                f"{_where(model, path)}: multiple_of={step} on an int that is generated (no "
                f"small range); accepted: multiple_of on an int range of at most {MAX_CHOICES} "
                "values (scored), or a generated int with ge/le only.",
                model=model,
                field=path,
            )
        return Generation("integer", ge=low, le=high, max_new_tokens=limit)
    if typing.get_origin(inner) is list and typing.get_args(inner):
        item, item_meta = _unwrap(typing.get_args(inner)[0])
        if item is not str:
            return None
        lo, hi = _lengths(model, path, meta, "a list (its items)")
        ilo, ihi = _lengths(model, path, item_meta, "a list item")
        pattern = _pattern(model, path, item_meta)
        return Generation("string_list", lo, hi, pattern, None, None, ilo, ihi, limit)
    if inner is datetime.datetime:
        return Generation("datetime", max_new_tokens=limit)
    if inner is datetime.date:
        return Generation("date", max_new_tokens=limit)
    return None


def segments(schema: Schema) -> list[Segment]:
    """The schema's fields cut into runs of scored and generated fields, in order."""
    out: list[Segment] = []
    for f in schema.fields:
        kind: Literal["scored", "generated"] = "generated" if f.generated else "scored"
        if out and out[-1][0] == kind:
            out[-1] = (kind, (*out[-1][1], f.name))
        else:
            out.append((kind, (f.name,)))
    return out


def check_layout(model: str, fields: Sequence[FieldSpec]) -> None:
    """Refuses the ties that declaration order cannot honour once some field is generated.

    Raises:
        UnsupportedFieldError: for a generated field in a union branch, a `depends_on`
            naming or set on a generated field, a parent declared after a generated field
            that follows its child, or a `choices_by` pair split by a generated field.
    """
    if not any(f.generated for f in fields):
        return
    seg: dict[str, int] = {}
    k, prev = -1, None
    for f in fields:
        if f.generated != prev:
            k, prev = k + 1, f.generated
        seg[f.name] = k
    kinds = {f.name: f for f in fields}
    for f in fields:
        where = _where(model, f.name)
        if f.generated and f.branch is not None:
            raise UnsupportedFieldError(
                f"{where}: a generated field inside a discriminated union's branch; accepted: "
                "scored fields (bool, Literal, Enum, int range) in union branches.",
                model=model,
                field=f.name,
            )
        if f.generated and f.depends_on:
            raise UnsupportedFieldError(
                f"{where}: a generated field with depends_on={list(f.depends_on)}; accepted: "
                "no depends_on (a generated field already sees every field declared before it "
                "written in the JSON: declare it after them).",
                model=model,
                field=f.name,
            )
        for p in f.depends_on:
            if kinds[p].generated:
                raise UnsupportedFieldError(
                    f"{where}: depends on {p!r}, a generated field; accepted: a parent that is "
                    "scored (an enum, an int range, a bool or a multi-label field). A field declared after a generated one "
                    "already sees its text.",
                    model=model,
                    field=f.name,
                )
            if seg[p] > seg[f.name]:
                raise UnsupportedFieldError(
                    f"{where}: depends on {p!r}, declared after a generated field that follows "
                    f"{f.name!r}; accepted: a parent declared before the child, or in the same "
                    "run of scored fields.",
                    model=model,
                    field=f.name,
                )
        if f.choices_by is not None and seg[f.choices_by[0]] != seg[f.name]:
            raise UnsupportedFieldError(
                f"{where}: choices_by parent {f.choices_by[0]!r} is separated from it by a "
                "generated field; accepted: a choices_by parent and child with no generated "
                "field between them.",
                model=model,
                field=f.name,
            )
