"""The `@decision` class decorator: validate a Pydantic model early and add `.decide()`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ..errors import SchemaError
from .models import _from_model

__all__ = ["decision"]


def decision(cls: type[BaseModel]) -> type[BaseModel]:
    """Class decorator: validates a Pydantic model as a PCD schema at decoration time.

    It adds `Model.decide(context, **kwargs)` (runs on the default `Decider`) and
    `Model.__pcd_schema__` (the compiled `Schema`).

    Raises:
        SchemaError: at decoration time if any field cannot be scored.
    """
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        raise SchemaError(
            f"@decision decorates Pydantic BaseModel subclasses; got {cls!r}.",
        )
    schema = _from_model(cls)
    cls.__pcd_schema__ = schema  # type: ignore[attr-defined]

    def decide(klass: type[BaseModel], context: str, **kwargs: Any) -> Any:
        from ..decider import default_decider

        return default_decider().decide(klass, context, **kwargs)

    cls.decide = classmethod(decide)  # type: ignore[attr-defined]
    return cls
