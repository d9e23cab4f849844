"""Argument checks shared by every decision call (`decide`, `decide_many`, async).

Bad input gets a typed error naming what was given and what is accepted; nothing is
silently defaulted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from ..errors import InvalidArgumentError, InvalidContextError

__all__ = [
    "LabelFree",
    "Scoring",
    "check_batch_size",
    "check_calibration",
    "check_context",
    "check_contexts",
    "check_max_new_tokens",
    "check_pruning",
    "check_scoring",
    "check_temperature",
    "check_threshold",
]

Scoring = Literal["auto", "full", "constrained", "pmi"]
SCORINGS = ("auto", "full", "constrained", "pmi")
# A decision call's label-free calibration: the decider's own (None), or one for the call
# ("auto": chosen by leave-one-out over the examples, `pcd_tools.decide.loo`).
LabelFree = Literal["none", "contextual", "auto"]
LABEL_FREE = ("none", "contextual", "auto")


def check_temperature(temperature: Any) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise InvalidArgumentError(
            f"temperature must be a number > 0; got {type(temperature).__name__} {temperature!r}."
        )
    t = float(temperature)
    if not math.isfinite(t) or t <= 0:
        raise InvalidArgumentError(f"temperature must be finite and > 0; got {temperature!r}.")
    return t


def check_scoring(scoring: Any) -> Scoring:
    if not isinstance(scoring, str) or scoring not in SCORINGS:
        raise InvalidArgumentError(
            f"unknown scoring {scoring!r}; accepted: 'auto', 'full', 'constrained', 'pmi'."
        )
    return scoring  # type: ignore[return-value]


def check_calibration(
    calibration: Any, scoring: str = "auto", pruning: str = "auto"
) -> LabelFree | None:
    """Validates a decision call's `calibration=` (the label-free method).

    Raises:
        InvalidArgumentError: unless it is None (the decider's own), `"contextual"`,
            `"none"` or `"auto"`; for `"auto"` with a scoring other than `"auto"` or
            `"full"` (it chooses PMI, a scoring, itself) or with `pruning="on"` (PMI and
            contextual calibration need every candidate's score).
    """
    if calibration is None:
        return None
    if not isinstance(calibration, str) or calibration not in LABEL_FREE:
        raise InvalidArgumentError(
            f"unknown calibration {calibration!r} for a decision call; accepted: None (the "
            "decider's own), 'contextual' (content-free calibration), 'none', or 'auto' "
            "(raw, PMI or contextual, chosen by leave-one-out over the examples). A fitted "
            "calibration file goes on the decider: Decider.with_calibration(path)."
        )
    if calibration == "auto" and scoring not in ("auto", "full"):
        raise InvalidArgumentError(
            f"calibration='auto' with scoring={scoring!r}: 'auto' chooses between raw, PMI "
            "and contextual calibration itself; accepted: scoring 'auto' or 'full' with it."
        )
    if calibration == "auto" and pruning == "on":
        raise InvalidArgumentError(
            "calibration='auto' with pruning='on': PMI and contextual calibration, which "
            "it may choose, need every candidate's score; accepted: pruning 'auto' or "
            "'off' with it."
        )
    return calibration  # type: ignore[return-value]


def check_context(context: Any, index: int | None = None, allow_empty: bool = False) -> str:
    where = f" #{index}" if index is not None else ""
    if not isinstance(context, str):
        several = ""
        if index is None and isinstance(context, (list, tuple)):
            several = (
                " To decide several contexts, pass the list to decide_many(schema, contexts)"
                " (adecide_many in async code)."
            )
        raise InvalidContextError(
            f"context{where} must be a str; got {type(context).__name__}. Serialise structured "
            f"input (e.g. json.dumps) before deciding.{several}"
        )
    if not allow_empty and not context.strip():
        raise InvalidContextError(
            f"context{where} is empty or only whitespace ({context!r}): there is nothing to "
            "decide on. Pass allow_empty=True to decide on no text anyway (the model then "
            "answers from the schema alone)."
        )
    return context


def check_contexts(contexts: Any, allow_empty: bool) -> list[str]:
    if isinstance(contexts, str) or not isinstance(contexts, Sequence):
        raise InvalidContextError(f"contexts must be a list of str; got {type(contexts).__name__}.")
    many = len(contexts) > 1
    return [check_context(c, i if many else None, allow_empty) for i, c in enumerate(contexts)]


def check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be an int >= 1; got {batch_size!r}.")
    return batch_size


def check_pruning(pruning: Any, orders: int = 1, scoring: str = "full") -> str:
    """A decision's `pruning`: `"auto"`, `"on"` or `"off"`.

    Raises:
        InvalidArgumentError: for another value, or `"on"` with `orders > 1` (averaged
            distributions need every candidate) or `scoring="pmi"` (its empty-context
            scores need every candidate).
    """
    if pruning not in ("auto", "on", "off"):
        raise InvalidArgumentError(
            f"pruning={pruning!r}; accepted: 'auto' (prune fields with large candidate "
            "tries), 'on' (prune every field that can be) or 'off' (score every field whole)."
        )
    if pruning == "on" and (orders > 1 or scoring == "pmi"):
        why = f"orders={orders}" if orders > 1 else "scoring='pmi'"
        raise InvalidArgumentError(
            f"pruning='on' cannot be combined with {why}, which needs every candidate's "
            "score; accepted: pruning='auto' or 'off' with it."
        )
    return str(pruning)


def check_max_new_tokens(value: Any) -> int | None:
    """A request's `max_new_tokens`: None (each field's own, else 256) or an int >= 1.

    Raises:
        InvalidArgumentError: for anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(
            f"max_new_tokens must be an int >= 1 or None; got {value!r}. It limits the tokens "
            "of each generated field that sets no max_new_tokens of its own."
        )
    return value


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
