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
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .result import Decision, FieldResult

__all__ = ["ACTIONS", "decision_payload", "field_payload", "label_key"]

ACTIONS = ("act", "review")


def label_key(label: Any) -> str:
    """A candidate's key in a JSON `distribution`: a string as it is, anything else
    (`true`, `3`, `null`) as its JSON text."""
    return label if isinstance(label, str) else json.dumps(label)


def field_payload(f: FieldResult) -> dict[str, Any]:
    """One field's answer: `{"value", "probability", "distribution"}` (JSON-safe)."""
    return {
        "value": f.label,
        "probability": None if f.probability is None else float(f.probability),
        "distribution": {label_key(k): float(p) for k, p in f.distribution.items()},
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
