"""Discriminated unions: `Annotated[Union[A, B], Field(discriminator="kind")]`.

The union compiles to a choice of `kind` (`request.kind`, one value per branch) plus each
branch's fields, named `request[<kind>].<field>` and conditioned on their branch: the
first pass scores each of them after its branch's `kind` is written, and the answer
takes the branch with the highest `P(kind) * prod(P(best value | kind))`. In the JSON the
model sees, a branch field's key is `request.<field>`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal, Union

from ..errors import SchemaError, UnsupportedUnionError
from .choices import _enum_choices
from .nested import is_model
from .spec import FieldSpec, _where

__all__ = ["is_model_union", "union_fields"]

# (model, class, prefix, stack, pending, skip) -> the class's compiled fields
CompileFields = Callable[..., list[FieldSpec]]


def is_model_union(tp: Any) -> bool:
    """Whether an annotation is a Union of two or more Pydantic models."""
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return False
    args = typing.get_args(tp)
    return len(args) > 1 and all(is_model(a) for a in args)


def union_fields(
    model: str,
    path: str,
    tp: Any,
    discriminator: Any,
    description: str,
    compile_fields: CompileFields,
    stack: tuple[type, ...],
    pending: dict[str, Any],
) -> list[FieldSpec]:
    """The discriminator field and every branch's fields, each tied to its branch.

    Raises:
        UnsupportedUnionError: for a union without a (str) discriminator, a branch whose
            discriminator is not one `Literal` value, or a branch with unsupported fields.
    """
    where = _where(model, path)
    branches = list(typing.get_args(tp))
    names = [b.__name__ for b in branches]
    if not isinstance(discriminator, str):
        raise UnsupportedUnionError(
            f"{where}: Union[{', '.join(names)}] has no discriminator; accepted: "
            "Annotated[Union[A, B], Field(discriminator='kind')], each branch with "
            "`kind: Literal['a']` naming it.",
            model=model,
            field=path,
        )
    tags: list[Any] = []
    for b in branches:
        info = b.model_fields.get(discriminator)
        vals = typing.get_args(info.annotation) if info is not None else ()
        if info is None or typing.get_origin(info.annotation) is not Literal or len(vals) != 1:
            raise UnsupportedUnionError(
                f"{where}: branch {b.__name__} of the union needs `{discriminator}: "
                f"Literal[<one value>]`; accepted: one Literal value per branch.",
                model=model,
                field=path,
            )
        tags.append(vals[0])
    kind_name = f"{path}.{discriminator}"
    choices = _enum_choices(model, kind_name, tags, f"the {discriminator!r} values of {names}")
    desc = description or f"which kind of {path.rsplit('.', 1)[-1]} it is"
    kind = FieldSpec(kind_name, "enum", desc, tuple(choices))
    out = [kind]
    for ti, (b, tag) in enumerate(zip(branches, tags)):
        prefix = f"{path}[{tag}]."
        try:
            sub = compile_fields(model, b, prefix, (*stack, b), pending, discriminator)
        except SchemaError as e:
            raise UnsupportedUnionError(
                f"{where}: branch {b.__name__} ({discriminator}={tag!r}) holds a field PCD "
                f"cannot score: {e} Accepted: branches whose fields are all scoreable.",
                model=model,
                field=path,
            ) from e
        gen = next((f for f in sub if f.generated), None)
        if gen is not None and gen.generation is not None:
            raise UnsupportedUnionError(
                f"{where}: branch {b.__name__} ({discriminator}={tag!r}) holds a field PCD "
                f"cannot score: {model}.{gen.name} is generated ({gen.generation.type}), and "
                "a union branch takes scored fields only. Accepted: branches whose fields are "
                "all scoreable (bool, Literal, Enum, int range, multi-label).",
                model=model,
                field=path,
            )
        for f in sub:
            deps = tuple(dict.fromkeys((*f.depends_on, kind_name)))
            out.append(replace(f, branch=(kind_name, ti), depends_on=deps))
    return out
