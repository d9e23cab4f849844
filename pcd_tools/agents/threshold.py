"""The one check of every confidence threshold the wrappers take, run when they are built.

`Cascade(threshold=, per_field=)`, `DecisionTool(threshold=)` (`decider.as_tool`),
`with_structured_output(threshold=)` (the guard) and `PCDRouter` / `route_on(threshold=)`
all compare a field's probability (or margin) with a threshold, so a value outside [0, 1]
would escalate or refuse everything instead of failing where it was written.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["check_threshold"]


def check_threshold(value: Any, argument: str, *, score: str = "probability") -> float:
    """A threshold as a float: a probability in [0, 1], or for `score="entropy"` a number
    of nats >= 0.

    Args:
        value: The threshold given.
        argument: How the caller wrote it, named in the error, e.g.
            `"Cascade(threshold=)"` or `"Cascade(per_field={'team': ...})"`.
        score: What it is compared with: `"probability"` or `"margin"` (both in [0, 1]),
            or `"entropy"` (in nats, so any finite number >= 0).

    Returns:
        The threshold as a float.

    Raises:
        InvalidArgumentError: for a value that is not a real number (a bool included), not
            finite, or out of its range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(
            f"{argument}: a threshold is a number; got {type(value).__name__} {value!r}."
        )
    t = float(value)
    if score == "entropy":
        if not math.isfinite(t) or t < 0:
            raise InvalidArgumentError(
                f"{argument}: an entropy threshold is a number of nats >= 0; got {value!r}."
            )
        return t
    if not 0.0 <= t <= 1.0:  # NaN fails this too
        hint = f" (for {t:g}%, write {t / 100:g})" if 1.0 < t <= 100.0 else ""
        raise InvalidArgumentError(
            f"{argument}: a {score} threshold is a probability in [0, 1]; got {value!r}{hint}."
        )
    return t
