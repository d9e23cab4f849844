"""`compile_schema`: any accepted schema form -> `Schema`, cached per Pydantic model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from ..errors import SchemaError
from .dict_form import StructuredSchema
from .json_schema import compile_json_schema, is_json_schema
from .models import _from_model
from .spec import Schema

__all__ = ["compile_schema"]

_CACHE: dict[int, Schema] = {}


def compile_schema(obj: Any) -> Schema:
    """Compiles any accepted schema form into a `Schema`.

    Args:
        obj: A `Schema`, a Pydantic `BaseModel` subclass, a `StructuredSchema`, a dict spec,
            a list of `FieldDefinition`, or a JSON schema (`{"type": "object",
            "properties": {...}}`, e.g. `Model.model_json_schema()`: `compile_json_schema`).

    Raises:
        SchemaError: (or a subclass) naming the model, the field, what was given and what
            is accepted.
    """
    if isinstance(obj, Schema):
        return obj
    if isinstance(obj, StructuredSchema):
        return obj.schema
    if isinstance(obj, type) and issubclass(obj, BaseModel):
        cached = getattr(obj, "__pcd_schema__", None)
        if isinstance(cached, Schema) and cached.model is obj:
            return cached
        key = id(obj)
        hit = _CACHE.get(key)
        if hit is None or hit.model is not obj:
            hit = _from_model(obj)
            _CACHE[key] = hit
        return hit
    if is_json_schema(obj):
        return compile_json_schema(obj)
    if isinstance(obj, (Mapping, list, tuple)):
        return StructuredSchema(obj).schema
    raise SchemaError(
        f"cannot build a schema from {type(obj).__name__}; accepted: a Pydantic BaseModel "
        "subclass, a StructuredSchema, a dict of field specs, a list of FieldDefinition or "
        "a JSON schema."
    )
