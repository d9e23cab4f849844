"""The `@decision` class decorator: validate a Pydantic model early and add `.decide()`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar, overload

from pydantic import BaseModel

from ..errors import SchemaError
from ..schema.examples import parse_examples
from ..schema.models import _from_model

__all__ = ["decision"]

M = TypeVar("M", bound=type[BaseModel])


@overload
def decision(cls: M, *, examples: Sequence[Any] | None = None) -> M: ...
@overload
def decision(cls: None = None, *, examples: Sequence[Any] | None = None) -> Callable[[M], M]: ...


def decision(cls: Any = None, *, examples: Sequence[Any] | None = None) -> Any:
    """Class decorator: validates a Pydantic model as a PCD schema at decoration time.

    It adds `Model.decide(context, **kwargs)` (runs on the default `Decider`) and
    `Model.__pcd_schema__` (the compiled `Schema`). Use it bare (`@decision`), with
    examples (`@decision(examples=[...])`), or as a call on a defined class
    (`decision(Model, examples=[(text, Model(...))])`, where the examples can be
    instances of the model itself).

    Args:
        cls: The model class (given when used bare or called on a class).
        examples: Few-shot examples held in the cached schema part of the prompt: each
            `(text, Model(...))`, `(text, {field: value})` or `{"input": text,
            "output": {...}}` (see `pcd_tools.schema.examples`). They come after those of
            `model_config["json_schema_extra"]["examples"]`, if any.

    Raises:
        SchemaError: at decoration time if any field cannot be scored.
        InvalidExampleError: if an example does not fit the model, naming its index and
            field.
    """
    if cls is None:
        return lambda klass: decision(klass, examples=examples)
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        raise SchemaError(
            f"@decision decorates Pydantic BaseModel subclasses; got {cls!r}.",
        )
    schema = _from_model(cls)
    if examples is not None:
        added = parse_examples(schema, examples, "@decision(examples=...)")
        schema = replace(schema, examples=schema.examples + added)
    target: Any = cls  # the added attributes are not on BaseModel's type
    target.__pcd_schema__ = schema

    def decide(klass: type[BaseModel], context: str, **kwargs: Any) -> Any:
        from .decider import default_decider

        return default_decider().decide(klass, context, **kwargs)

    target.decide = classmethod(decide)
    return cls
