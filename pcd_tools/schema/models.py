"""Pydantic model -> `Schema`: annotations, `Optional`, descriptions and attribute docstrings.

`bool`, `Literal[...]` of str or int, an `Enum` subclass, a bounded `int` (`ranges`), or
`Optional[...]` of one of these compile to a scored field; `str`, `float`, a wide or
unbounded `int`, `list[str]` and dates to a generated one (`generated`); anything else is an
`UnsupportedFieldError` naming the model, the field and the annotation.
"""

from __future__ import annotations

import ast
import enum
import inspect
import itertools
import textwrap
import threading
import types
import typing
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, Union

from pydantic import BaseModel

from ..errors import (
    EmptySchemaError,
    InvalidFieldNameError,
    InvalidFieldOptionError,
    NestingTooDeepError,
    UnsupportedFieldError,
)
from .choices import _bool_choices, _enum_choices, _null_choice, _with_descriptions
from .conditional import resolve_choices_by, union_of
from .dependencies import parse_depends_on, resolve_dependencies, waves
from .examples import model_config_examples, with_examples
from .generated import check_layout, generation_for
from .labels import taxonomy_choices
from .multilabel import label_type, multilabel_field
from .nested import MAX_DEPTH, is_model
from .ranges import int_range_choices
from .spec import Choice, FieldSpec, Schema, _where
from .unions import is_model_union, union_fields

_ACCEPTED = (
    "accepted: bool, Literal[...] of str or int values, an Enum subclass with str or int "
    "values (any number), int with ge/le bounds (at most 255 values), list[...] or set[...] of Literal or "
    "Enum labels, a nested BaseModel, a discriminated Union of models (all scored); str, "
    "float, int, list[str], datetime.date or datetime.datetime (generated); or Optional[...] "
    "of one of these"
)


# CPython 3.11's AST builder keeps its recursion depth in state shared by threads, so two
# threads parsing at once can fail with "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905, fixed in 3.12); schemas compile on several threads
# (servers, stream workers), so their parses take turns.
_PARSE_LOCK = threading.Lock()


def _parse_class(klass: type) -> ast.Module:
    """The class's source, parsed; one retry where another thread's parse (outside this
    lock) tripped the 3.11 bug above."""
    with _PARSE_LOCK:
        src = textwrap.dedent(inspect.getsource(klass))
        try:
            return ast.parse(src)
        except SystemError:
            return ast.parse(src)


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """Docstrings written under class attributes (`x: int` followed by `\"\"\"doc\"\"\"`)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass in (object, BaseModel) or not issubclass(klass, BaseModel):
            continue
        try:
            tree = _parse_class(klass)
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


def _compile_annotation(
    model: str, name: str, tp: Any, metadata: Sequence[Any] = ()
) -> tuple[str, list[Choice], bool]:
    inner, optional = _split_optional(tp)
    given = f"annotation {_fmt_type(tp)}"
    if inner is bool:
        return "boolean", _bool_choices(), optional
    if inner is int:
        return "enum", int_range_choices(model, name, metadata, given), optional
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
    pending: dict[str, Any] = {}
    fields = resolve_dependencies(model, _model_fields(model, cls, "", (cls,), pending))
    if pending:
        fields = resolve_choices_by(model, fields, pending)
        waves(model, fields)
    check_layout(model, fields)
    doc = cls.__doc__ or ""
    if doc.startswith(f"{model}(") or doc == BaseModel.__doc__:
        doc = ""
    schema = Schema(model, inspect.cleandoc(doc), tuple(fields), cls)
    raw = model_config_examples(cls)
    if raw is not None:  # only the top model's: a nested model's would answer a part
        schema = with_examples(schema, raw, "model_config['json_schema_extra']['examples']")
    return schema


def _model_fields(
    model: str,
    cls: type[BaseModel],
    prefix: str,
    stack: tuple[type, ...],
    pending: dict[str, Any],
    skip: str | None = None,
) -> list[FieldSpec]:
    """The compiled fields of `cls` (less `skip`, a union branch's discriminator), nested
    models flattened with dotted names; each field's raw `choices_by` is put in
    `pending`, to resolve once every field exists."""
    docs = _attribute_docstrings(cls)
    fields: list[FieldSpec] = []
    for name, info in cls.model_fields.items():
        if name == skip:
            continue
        _check_name(model, name)
        path = prefix + name
        inner, optional = _split_optional(info.annotation)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        pruning = _pruning(model, path, extra)
        if pruning != "auto" and (
            is_model(inner)
            or is_model_union(info.annotation)
            or "choices_by" in extra
            or label_type(info.annotation) is not None
        ):
            raise InvalidFieldOptionError(
                f"{_where(model, path)}: pruning={pruning!r} on a field that is not a single "
                "choice; accepted: pruning on a Literal, Enum, bool or int-range field "
                "without choices_by (nested models, unions and multi-label fields are scored "
                "whole).",
                model=model,
                field=path,
            )
        if is_model(inner):
            fields.extend(_nested_fields(model, path, inner, optional, stack, pending))
            continue
        if is_model_union(info.annotation):
            if len(stack) > MAX_DEPTH:
                raise NestingTooDeepError(
                    f"{_where(model, path)}: nested models go deeper than {MAX_DEPTH} levels; "
                    f"accepted: at most {MAX_DEPTH} levels of nested models and unions.",
                    model=model,
                    field=path,
                )
            desc = (info.description or docs.get(name) or "").strip()
            fields.extend(
                union_fields(
                    model,
                    path,
                    info.annotation,
                    info.discriminator,
                    desc,
                    _model_fields,
                    stack,
                    pending,
                )
            )
            continue
        deps = parse_depends_on(model, path, extra)
        if "choices_by" in extra:
            pending[path] = extra["choices_by"]
        desc = (info.description or docs.get(name) or "").strip()
        gen = (
            None
            if "choices_by" in extra
            else generation_for(model, path, inner, info.metadata, extra)
        )
        if gen is not None:
            fields.append(
                FieldSpec(path, "generated", desc, (), optional, depends_on=deps, generation=gen)
            )
            continue
        if "max_new_tokens" in extra:
            raise InvalidFieldOptionError(
                f"{_where(model, path)}: max_new_tokens on a scored field (annotation "
                f"{_fmt_type(info.annotation)}); accepted: max_new_tokens on generated fields "
                "only (str, float, int without a small range, list[str], dates).",
                model=model,
                field=path,
            )
        if label_type(info.annotation) is not None:
            desc = (info.description or docs.get(name) or "").strip()
            ml = multilabel_field(model, path, info.annotation, info.metadata, extra, desc)
            fields.append(replace(ml, depends_on=deps))
            continue
        tp = info.annotation
        if inner is str and "choices_by" in extra:  # the choices are every value it names
            named: Any = Literal[tuple(union_of(extra["choices_by"]))]
            tp = named | None if optional else named
        kind, choices, optional = _compile_annotation(model, path, tp, info.metadata)
        choices = _with_descriptions(model, path, choices, extra.get("choice_descriptions"))  # type: ignore[arg-type]
        tree = None
        if "taxonomy" in extra:
            choices, tree = taxonomy_choices(model, path, choices, extra["taxonomy"])
        if optional:
            choices.append(_null_choice())
        desc = (info.description or docs.get(name) or "").strip()
        ordered = inner is int
        fields.append(
            FieldSpec(
                path,
                kind,  # type: ignore[arg-type]
                desc,
                tuple(choices),
                optional,
                ordered,
                depends_on=deps,
                pruning=pruning,  # type: ignore[arg-type]
                tree=tree,
            )
        )
    return fields


def _pruning(model: str, path: str, extra: dict[str, Any]) -> str:
    """A field's `json_schema_extra={"pruning": ...}`: `"auto"` unless set."""
    value = extra.get("pruning", "auto")
    if value not in ("auto", "on", "off"):
        raise InvalidFieldOptionError(
            f"{_where(model, path)}: pruning={value!r}; accepted: 'auto' (prune when the "
            "field's candidate trie is large), 'on' or 'off'.",
            model=model,
            field=path,
        )
    return str(value)


def _nested_fields(
    model: str,
    path: str,
    sub: type[BaseModel],
    optional: bool,
    stack: tuple[type, ...],
    pending: dict[str, Any],
) -> list[FieldSpec]:
    if optional:
        raise UnsupportedFieldError(
            f"{_where(model, path)}: an optional nested model ({sub.__name__} | None) is not "
            f"scoreable; accepted: a required nested model ({sub.__name__}), whose fields follow "
            "the same rules as the top model's.",
            model=model,
            field=path,
        )
    if sub in stack or len(stack) > MAX_DEPTH:
        chain = " -> ".join(t.__name__ for t in (*stack, sub))
        what = "recurse" if sub in stack else f"go deeper than {MAX_DEPTH} levels"
        raise NestingTooDeepError(
            f"{_where(model, path)}: nested models {what} ({chain}); accepted: at most "
            f"{MAX_DEPTH} levels of nested models, without recursion.",
            model=model,
            field=path,
        )
    if not sub.model_fields:
        raise EmptySchemaError(
            f"{_where(model, path)}: nested model {sub.__name__} declares no fields; "
            "accepted: at least one field.",
            model=model,
            field=path,
        )
    return _model_fields(model, sub, path + ".", (*stack, sub), pending)
