"""Nested models: a `BaseModel` field is flattened into its leaf fields with dotted names.

`customer: CustomerInfo` with `CustomerInfo.tier` becomes the field `customer.tier`, scored
like any other field; `unflatten` turns the flat answers back into the nested dict that
validates into the real nested instance.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["MAX_DEPTH", "is_model", "unflatten"]

# Nesting levels accepted below the top model; deeper (or recursive) models are refused.
MAX_DEPTH = 4


def is_model(tp: Any) -> bool:
    """Whether an annotation is a Pydantic model class."""
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def unflatten(values: Mapping[str, Any]) -> dict[str, Any]:
    """`{"customer.tier": "gold", "ok": True}` -> `{"customer": {"tier": "gold"}, "ok": True}`."""
    out: dict[str, Any] = {}
    for key, v in values.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out
