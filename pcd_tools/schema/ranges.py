"""Integer ranges: `int` with `ge`/`le` (or `gt`/`lt`) bounds -> an ordered field of integers.

`rating: int = Field(ge=1, le=5)`, `Annotated[int, Field(ge=1, le=5)]` and
`conint(ge=1, le=5)` all reach here as `int` with annotated-types bounds in the field's
metadata. Each integer is one candidate, listed in increasing order, so the field is a
bounded decision like an enum, and its result also has an `expected` value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..errors import TooFewChoicesError, TooManyChoicesError, UnsupportedFieldError
from .spec import MAX_CHOICES, MIN_CHOICES, Choice, _where

__all__ = ["int_bounds", "int_range_choices"]

# (constraint, its inclusive integer bound, whether it is a lower bound)
_BOUNDS = (
    ("ge", lambda v: math.ceil(v), True),
    ("gt", lambda v: math.floor(v) + 1, True),
    ("le", lambda v: math.floor(v), False),
    ("lt", lambda v: math.ceil(v) - 1, False),
)


def int_bounds(metadata: Iterable[Any]) -> tuple[int | None, int | None, int]:
    """The inclusive `(low, high, step)` an int's constraints allow; `None` where unbounded."""
    low: int | None = None
    high: int | None = None
    step = 1
    for m in metadata:
        if m is None:
            continue
        for attr, to_int, is_low in _BOUNDS:
            v = getattr(m, attr, None)
            if v is None or isinstance(v, bool):
                continue
            b = to_int(v)
            if is_low:
                low = b if low is None else max(low, b)
            else:
                high = b if high is None else min(high, b)
        mult = getattr(m, "multiple_of", None)
        if isinstance(mult, int) and not isinstance(mult, bool) and mult > 0:
            step = mult
    return low, high, step


def int_range_choices(model: str, name: str, metadata: Iterable[Any], given: str) -> list[Choice]:
    """The candidates of a bounded int field, in increasing order.

    Raises:
        UnsupportedFieldError: if a bound is missing (a free int is generated, not scored).
        TooManyChoicesError: if the range holds more than 255 integers, naming the range.
        TooFewChoicesError: if it holds no integer.
    """
    low, high, step = int_bounds(metadata)
    where = _where(model, name)
    if low is None or high is None:
        missing = " or ".join(b for b, v in (("lower", low), ("upper", high)) if v is None)
        raise UnsupportedFieldError(
            f"{where}: {given} has no {missing} bound (a free int is not a bounded "
            "decision); accepted: an int with both bounds, e.g. "
            f"Field(ge=1, le=5), Annotated[int, Field(ge=0, le=10)] or conint(ge=1, le=5), "
            f"spanning {MIN_CHOICES} to {MAX_CHOICES} values.",
            model=model,
            field=name,
        )
    first = low if low % step == 0 else low + (step - low % step)
    values = list(range(first, high + 1, step))
    span = f"the int range {low}..{high}" + (f" (multiple_of={step})" if step > 1 else "")
    if len(values) > MAX_CHOICES:
        raise TooManyChoicesError(
            f"{where}: {span} in {given} has {len(values)} values; accepted: {MIN_CHOICES} to "
            f"{MAX_CHOICES} values per scored field. Narrow the range, bucket it (e.g. an "
            "enum of bands), or split it into a coarse and a fine field.",
            model=model,
            field=name,
        )
    if len(values) < MIN_CHOICES:
        raise TooFewChoicesError(
            f"{where}: {span} in {given} has {len(values)} value(s); accepted: {MIN_CHOICES} to "
            f"{MAX_CHOICES} values per scored field.",
            model=model,
            field=name,
        )
    return [Choice(value=v, literal=str(v), label=v) for v in values]
