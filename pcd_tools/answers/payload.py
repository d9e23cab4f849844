"""A decision as plain JSON for agents: the shape MCP tools return and routers store.

`decision_payload(d, threshold)` gives

```json
{"value": {...the model's fields, as JSON...},
 "confidence": 0.91,
 "fields": {"team": {"value": "billing", "probability": 0.91,
                     "distribution": {"billing": 0.91, "technical": 0.06, ...}}, ...},
 "action": "act"}
```

- `value` is `Decision.value` dumped in JSON mode (Enums as their values, dates as ISO
  strings, nested models as objects);
- `confidence` is `Decision.confidence`: the lowest probability over the scored fields
  (None when every field is generated);
- each field's `value` is its JSON answer (`FieldResult.label`), `probability` its
  probability (None for a generated field) and `distribution` every candidate's
  probability keyed by its JSON text (`"true"`, `"3"`, `"null"` for non-strings; a
  multi-label field gives each label's probability of applying);
- `action` is `"review"` when any scored field's probability is below `threshold` (the rule
  of `Decider.as_tool` and `Cascade`: `Decision.low_confidence`), else `"act"`.

A field of more than `DISTRIBUTION_LIMIT` candidates (a label set beyond 255) gives the
`DISTRIBUTION_TOP` most probable in `distribution` and their count in `candidates`; a field
read by pruned search adds `certified`, `certified_top` (how many of its most probable
answers are certified, in order) and `search` (`{"read", "positions", "levels",
"fallback"}`), and a taxonomy its `path` (`[{"value", "probability"}, ...]`, each level's
probability given the levels above).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .result import Decision, FieldResult

__all__ = [
    "ACTIONS",
    "DISTRIBUTION_LIMIT",
    "DISTRIBUTION_TOP",
    "decision_payload",
    "field_payload",
    "label_key",
    "large_field_extras",
    "shown_distribution",
]

ACTIONS = ("act", "review")
# A larger field's JSON distribution holds its most probable candidates only.
DISTRIBUTION_LIMIT = 255
DISTRIBUTION_TOP = 20


def label_key(label: Any) -> str:
    """A candidate's key in a JSON `distribution`: a string as it is, anything else
    (`true`, `3`, `null`) as its JSON text."""
    return label if isinstance(label, str) else json.dumps(label)


def shown_distribution(f: FieldResult) -> dict[Any, float]:
    """The distribution a JSON answer shows: every candidate's, or for a field of more
    than `DISTRIBUTION_LIMIT` candidates the `DISTRIBUTION_TOP` most probable (ties:
    declared order) that have any probability."""
    if len(f.distribution) <= DISTRIBUTION_LIMIT:
        return f.distribution
    return {k: p for k, p in f.top_choices[:DISTRIBUTION_TOP] if p > 0.0}


def large_field_extras(f: FieldResult) -> dict[str, Any]:
    """What a JSON answer adds for a large, pruned or taxonomy field (see the module
    docstring); empty for any other field."""
    out: dict[str, Any] = {}
    if len(f.distribution) > DISTRIBUTION_LIMIT:
        out["candidates"] = len(f.distribution)
    if f.certified is not None:
        out["certified"] = bool(f.certified)
    if f.certified_top is not None:
        out["certified_top"] = int(f.certified_top)
    if f.search is not None:
        s = f.search
        out["search"] = {
            "read": s.read,
            "positions": s.positions,
            "levels": s.levels,
            "fallback": s.fallback,
        }
    if f.path is not None:
        out["path"] = [{"value": st.value, "probability": float(st.probability)} for st in f.path]
    return out


def field_payload(f: FieldResult) -> dict[str, Any]:
    """One field's answer: `{"value", "probability", "distribution"}` (JSON-safe), with
    `large_field_extras` where they apply."""
    return {
        "value": f.label,
        "probability": None if f.probability is None else float(f.probability),
        "distribution": {label_key(k): float(p) for k, p in shown_distribution(f).items()},
        **large_field_extras(f),
    }


def decision_payload(decision: Decision[Any], threshold: float) -> dict[str, Any]:
    """`decision` as `{"value", "confidence", "fields", "action"}` (see the module
    docstring); `threshold` is the probability below which a field asks for review."""
    value = decision.value
    dumped = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
    low = decision.low_confidence(threshold)
    conf = decision.confidence
    return {
        "value": dumped,
        "confidence": None if conf is None else float(conf),
        "fields": {n: field_payload(f) for n, f in decision.fields.items()},
        "action": "review" if low else "act",
    }
