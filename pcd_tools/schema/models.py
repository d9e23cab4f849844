"""Pydantic model -> `Schema`: annotations, `Optional`, descriptions and attribute docstrings.

`bool`, `Literal[...]` of str or int, an `Enum` subclass, or `Optional[...]` of one of
these compile to a field; anything else is an `UnsupportedFieldError` naming the model,
the field and the annotation.
"""

from __future__ import annotations

import ast
import enum
import inspect
import itertools
import textwrap
import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel

from ..errors import EmptySchemaError, InvalidFieldNameError, UnsupportedFieldError
from .choices import _bool_choices, _enum_choices, _null_choice, _with_descriptions
from .spec import Choice, FieldSpec, Schema, _where

_ACCEPTED = (
    "accepted: bool, Literal[...] of str or int values, an Enum subclass with str or int "
    "values, or Optional[...] of one of these"
)


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """Docstrings written under class attributes (`x: int` followed by `\"\"\"doc\"\"\"`)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass in (object, BaseModel) or not issubclass(klass, BaseModel):
            continue
        try:
            src = textwrap.dedent(inspect.getsource(klass))
            tree = ast.parse(src)
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for prev, node in itertools.pairwise(body):
            if (
                isinstance(prev, ast.AnnAssign)
                and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                out[prev.target.id] = inspect.cleandoc(node.value.value)
    return out


def _split_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            return rest[0], True
    return tp, False


def _compile_annotation(model: str, name: str, tp: Any) -> tuple[str, list[Choice], bool]:
    inner, optional = _split_optional(tp)
    given = f"annotation {_fmt_type(tp)}"
    if inner is bool:
        return "boolean", _bool_choices(), optional
    if typing.get_origin(inner) is Literal:
        vals = list(typing.get_args(inner))
        if None in vals:
            vals = [v for v in vals if v is not None]
            optional = True
        return "enum", _enum_choices(model, name, vals, given), optional
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return "enum", _enum_choices(model, name, list(inner), given), optional
    raise UnsupportedFieldError(
        f"{_where(model, name)}: unsupported {given}; {_ACCEPTED}.", model=model, field=name
    )


def _fmt_type(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return repr(tp).replace("typing.", "")


def _check_name(model: str, name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise InvalidFieldNameError(
            f"{model}: field name {name!r} is not a valid identifier; accepted: names like "
            "'priority' or 'requires_escalation' (letters, digits, underscores).",
            model=model,
            field=str(name),
        )


def _from_model(cls: type[BaseModel]) -> Schema:
    model = cls.__name__
    if not cls.model_fields:
        raise EmptySchemaError(
            f"{model} declares no fields; accepted: at least one field.", model=model
        )
    docs = _attribute_docstrings(cls)
    fields = []
    for name, info in cls.model_fields.items():
        _check_name(model, name)
        kind, choices, optional = _compile_annotation(model, name, info.annotation)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        choices = _with_descriptions(model, name, choices, extra.get("choice_descriptions"))  # type: ignore[arg-type]
        if optional:
            choices.append(_null_choice())
        desc = (info.description or docs.get(name) or "").strip()
        fields.append(FieldSpec(name, kind, desc, tuple(choices), optional))  # type: ignore[arg-type]
    doc = cls.__doc__ or ""
    if doc.startswith(f"{model}(") or doc == BaseModel.__doc__:
        doc = ""
    return Schema(model, inspect.cleandoc(doc), tuple(fields), cls)
