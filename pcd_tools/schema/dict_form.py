"""The seed's dict form: `StructuredSchema` over a dict of field specs or `FieldDefinition`s.

The dict form is turned into an equivalent Pydantic model and compiled like one, so both
forms give the same `Schema` (and the same fingerprint).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model
from pydantic import Field as PydField

from ..errors import EmptySchemaError, SchemaError, UnknownKeyError, UnsupportedFieldError
from .choices import _enum_choices
from .examples import with_wrapper_examples
from .json_schema import compile_json_schema, is_json_schema
from .models import _check_name, _from_model
from .spec import Schema, _where

__all__ = ["FieldDefinition", "StructuredSchema"]

_DICT_TYPES = ("enum", "boolean", "integer", "multilabel", "string", "number")


@dataclass
class FieldDefinition:
    """One field of the seed's list form.

    Args:
        name: Field name (an identifier).
        field_type: `"enum"`, `"boolean"`, `"integer"` (scored with `ge` and `le` spanning
            at most 255 values, else generated), `"multilabel"` (its `choices` are labels,
            each scored yes/no), `"string"` (generated text, with `min_length`,
            `max_length`, `pattern`) or `"number"` (a generated float, with `ge`, `le`).
        description: What the field means (a prompt).
        choices: Allowed values for an enum (str or int values, any number: the limit is
            memory, `LabelSetTooLargeError`), or the labels of a multi-label field (any
            number: up to 255 each is a yes/no question, past that they are ranked).
        choice_descriptions: Optional description per choice.
        optional: Add a `null` ("not stated") candidate.
        ge: An integer or number field's lowest value.
        le: An integer or number field's highest value.
        threshold: A multi-label field's cut-off probability (default 0.5; 0.1 for a
            ranked one: a label's share of the ranking).
        reading: A multi-label field's `"each"` (yes/no per label) or `"ranked"` (one
            question over all labels); None: `"each"` up to 255 labels, else `"ranked"`.
        min_length: The fewest labels of a multi-label answer, or characters of a string.
        max_length: The most labels of a multi-label answer, or characters of a string.
        depends_on: Fields answered first, whose answers this one sees.
        choices_by: `{parent: {parent value: [allowed values]}}`; an enum's `choices`
            may then be left out (they are every value named).
        pattern: A regular expression a string field's whole value matches.
        max_new_tokens: The most tokens a generated field's value may take.
        pruning: `"auto"`, `"on"` or `"off"`: whether a large enum is scored by certified
            pruned search (see `FieldSpec.pruning`); None for `"auto"`.
    """

    name: str
    field_type: str
    description: str = ""
    choices: list[Any] | None = None
    choice_descriptions: dict[Any, str] | None = None
    optional: bool = False
    ge: int | float | None = None
    le: int | float | None = None
    threshold: float | None = None
    reading: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    depends_on: list[str] | None = None
    choices_by: dict[str, Any] | None = None
    pattern: str | None = None
    max_new_tokens: int | None = None
    pruning: str | None = None


class StructuredSchema:
    """The seed-compatible schema: a dict of field specs or a list of `FieldDefinition`.

    Example:
        `StructuredSchema({"priority": {"type": "enum", "choices": ["HIGH", "LOW"],
        "description": "Urgency"}, "escalate": {"type": "boolean"}})`

    Args:
        fields: Mapping of name -> `{"type", "description", "choices", "choice_descriptions",
            "optional"}`, or a list of `FieldDefinition`, or a JSON schema (`{"type":
            "object", "properties": {...}}`, compiled by `compile_json_schema`; it has no
            `definitions`).
        name: A name for the schema, used in messages.
        instructions: Task instructions for the model.
    """

    def __init__(
        self,
        fields: Mapping[str, Mapping[str, Any]] | Sequence[FieldDefinition],
        *,
        name: str | None = None,
        instructions: str | None = None,
    ):
        if not is_json_schema(fields):
            _check_wrapper_keys(fields)
        wrapper: Mapping[str, Any] | None = None
        if _is_wrapper(fields):  # {"name": ..., "instructions": ..., "fields": {...}}
            given_wrapper: Mapping[str, Any] = fields  # type: ignore[assignment]
            wrapper = given_wrapper
            name = name if name is not None else given_wrapper.get("name")
            instructions = (
                instructions if instructions is not None else given_wrapper.get("instructions")
            )
            fields = given_wrapper["fields"]
        json_schema = None
        if is_json_schema(fields):  # {"type": "object", "properties": {...}, ...}
            given = name if isinstance(name, str) and name else None
            json_schema = compile_json_schema(fields, name=given)  # type: ignore[arg-type]
            name, instructions = json_schema.name, instructions or json_schema.instructions
        name = name if isinstance(name, str) and name else "StructuredSchema"
        instructions = instructions or ""
        if not isinstance(instructions, str):
            raise SchemaError(
                f"{name}: instructions must be a str; got {type(instructions).__name__}.",
                model=name,
            )
        self.name = name
        self.instructions = instructions
        if json_schema is not None:  # no `FieldDefinition`s: nested models, unions...
            self.definitions: list[FieldDefinition] = []
            compiled = replace(json_schema, instructions=instructions)
            self._compiled = with_wrapper_examples(compiled, wrapper)
            return
        self.definitions = _normalise_definitions(name, fields)
        compiled = _from_definitions(name, instructions, self.definitions)
        self._compiled = with_wrapper_examples(compiled, wrapper)

    @property
    def schema(self) -> Schema:
        """The compiled `Schema`."""
        return self._compiled

    @property
    def model(self) -> type[BaseModel]:
        """The Pydantic model results are validated into."""
        return self._compiled.model

    def __repr__(self) -> str:
        return f"StructuredSchema({self._compiled.field_names})"


_DICT_KEYS = {
    "type",
    "description",
    "choices",
    "choice_descriptions",
    "optional",
    "ge",
    "le",
    "threshold",
    "reading",
    "min_length",
    "max_length",
    "depends_on",
    "choices_by",
    "pattern",
    "max_new_tokens",
    "pruning",
}
_OPTIONS = (
    "ge",
    "le",
    "threshold",
    "reading",
    "min_length",
    "max_length",
    "depends_on",
    "choices_by",
    "pattern",
    "max_new_tokens",
    "pruning",
)
_WRAPPER_KEYS = ("examples", "fields", "instructions", "name")


def _closest(key: Any, accepted: Sequence[str]) -> str | None:
    """The accepted key closest to `key` (difflib), or None if none is close."""
    if not isinstance(key, str):
        return None
    hits = difflib.get_close_matches(key, list(accepted), n=1, cutoff=0.6)
    return hits[0] if hits else None


def _fields_like(v: Any) -> bool:
    """Whether `v` looks like the wrapper's `fields` value (a list, or a dict of spec dicts)."""
    if isinstance(v, (list, tuple)):
        return True
    return isinstance(v, Mapping) and all(isinstance(x, Mapping) for x in v.values())


def _check_wrapper_keys(obj: Any) -> None:
    """Raises `UnknownKeyError` for a wrapper with a misspelt key (`instrutions`, `feilds`).

    A mapping is taken as a wrapper when it holds a fields-like value under a key that is, or
    is close to, `fields`, or holds a fields-like value beside a str `name`/`instructions`.
    A plain dict of field specs never matches: a spec's values are not all dicts.
    """
    if not isinstance(obj, Mapping):
        return
    fields_key = any(
        (k == "fields" or _closest(k, ["fields"]) is not None) and _fields_like(v)
        for k, v in obj.items()
    )
    named = any(isinstance(obj.get(k), str) for k in ("name", "instructions"))
    if not (fields_key or (named and any(_fields_like(v) for v in obj.values()))):
        return
    unknown = [k for k in obj if k not in _WRAPPER_KEYS]
    if not unknown:
        return
    key = unknown[0]
    name = obj.get("name") if isinstance(obj.get("name"), str) and obj.get("name") else None
    where = name or "StructuredSchema"
    hint = _closest(key, _WRAPPER_KEYS)
    also = f"; also unknown: {unknown[1:]!r}" if len(unknown) > 1 else ""
    raise UnknownKeyError(
        f"{where}: unknown key {key!r} in the schema wrapper"
        f"{f' (did you mean {hint!r}?)' if hint else ''}{also}; accepted: "
        f"{sorted(_WRAPPER_KEYS)} (as in {{'name': ..., 'instructions': ..., 'fields': "
        "{...}}).",
        key=str(key),
        suggestion=hint,
        model=where,
    )


def _is_wrapper(obj: Any) -> bool:
    """Whether `obj` is `{"fields": {...} | [...], "name"?: str, "instructions"?: str,
    "examples"?: [...]}`.

    A field that happens to be called `fields` has a spec dict with a `type` key, so it is
    never mistaken for the wrapper. The inner `fields` may also be a JSON schema.
    """
    if not isinstance(obj, Mapping) or "fields" not in obj:
        return False
    if not set(obj) <= set(_WRAPPER_KEYS):
        return False
    inner = obj["fields"]
    if isinstance(inner, (list, tuple)) or is_json_schema(inner):
        return True
    return isinstance(inner, Mapping) and all(isinstance(v, Mapping) for v in inner.values())


def _normalise_definitions(name: str, fields: Any) -> list[FieldDefinition]:
    if isinstance(fields, Mapping):
        out = []
        for fname, spec in fields.items():
            _check_name(name, fname)
            if not isinstance(spec, Mapping):
                raise UnsupportedFieldError(
                    f"{_where(name, fname)}: spec must be a dict like {{'type': 'enum', 'choices': "
                    f"[...]}}; got {type(spec).__name__}.",
                    model=name,
                    field=fname,
                )
            unknown = sorted(set(spec) - _DICT_KEYS, key=str)
            if unknown:
                hint = _closest(unknown[0], sorted(_DICT_KEYS))
                raise UnknownKeyError(
                    f"{_where(name, fname)}: unknown key(s) {unknown}"
                    f"{f' (did you mean {hint!r}?)' if hint else ''}; accepted: "
                    f"{sorted(_DICT_KEYS)}.",
                    key=str(unknown[0]),
                    suggestion=hint,
                    model=name,
                    field=fname,
                )
            out.append(
                FieldDefinition(
                    name=fname,
                    field_type=spec.get("type"),  # type: ignore[arg-type]
                    description=spec.get("description", "") or "",
                    choices=spec.get("choices"),
                    choice_descriptions=spec.get("choice_descriptions"),
                    optional=bool(spec.get("optional", False)),
                    **{k: spec[k] for k in _OPTIONS if k in spec},
                )
            )
        return out
    if isinstance(fields, (list, tuple)):
        for f in fields:
            if not isinstance(f, FieldDefinition):
                raise SchemaError(
                    f"{name}: list items must be FieldDefinition; got {type(f).__name__}.",
                    model=name,
                )
        return list(fields)
    raise SchemaError(
        f"{name}: a StructuredSchema takes a dict of field specs or a list of FieldDefinition; "
        f"got {type(fields).__name__}.",
        model=name,
    )


def _from_definitions(name: str, instructions: str, defs: list[FieldDefinition]) -> Schema:
    if not defs:
        raise EmptySchemaError(
            f"{name} declares no fields; accepted: at least one field.", model=name
        )
    py_fields: dict[str, Any] = {}
    seen: set[str] = set()
    for d in defs:
        _check_name(name, d.name)
        if d.name in seen:
            raise SchemaError(
                f"{name}: field {d.name!r} is declared twice.", model=name, field=d.name
            )
        seen.add(d.name)
        if not isinstance(d.description, str):
            raise SchemaError(
                f"{_where(name, d.name)}: description must be a str, got {type(d.description).__name__}.",
                model=name,
                field=d.name,
            )
        tp: Any
        if d.field_type == "boolean":
            if d.choices is not None:
                raise SchemaError(
                    f"{_where(name, d.name)}: a boolean field takes no choices (they are true/false); "
                    f"got {d.choices!r}.",
                    model=name,
                    field=d.name,
                )
            tp = bool
        elif d.field_type == "integer":
            tp = int
        elif d.field_type in ("string", "number"):
            _no_choices(name, d)
            tp = str if d.field_type == "string" else float
        elif d.field_type == "multilabel":
            if not isinstance(d.choices, (list, tuple)):
                raise SchemaError(
                    f"{_where(name, d.name)}: a multilabel field needs a list of 'choices' (its "
                    f"labels); got {d.choices!r}.",
                    model=name,
                    field=d.name,
                )
            # checked here: `Literal` would drop a duplicate label silently
            _enum_choices(name, d.name, list(d.choices), f"choices {_short(d.choices)}")
            tp = list[Literal[tuple(d.choices)]]  # type: ignore[misc]
        elif d.field_type == "enum" and d.choices is None and d.choices_by:
            tp = str  # the choices are every value `choices_by` names
        elif d.field_type == "enum":
            if not isinstance(d.choices, (list, tuple)):
                raise SchemaError(
                    f"{_where(name, d.name)}: an enum field needs a list of 'choices'; got "
                    f"{d.choices!r}.",
                    model=name,
                    field=d.name,
                )
            _enum_choices(name, d.name, list(d.choices), f"choices {_short(d.choices)}")
            tp = Literal[tuple(d.choices)]
        else:
            raise UnsupportedFieldError(
                f"{_where(name, d.name)}: unknown field type {d.field_type!r}; accepted: "
                f"{list(_DICT_TYPES)}.",
                model=name,
                field=d.name,
            )
        if d.optional:
            tp = tp | None
        extra: dict[str, Any] = {
            k: v
            for k, v in (
                ("choice_descriptions", d.choice_descriptions),
                ("threshold", d.threshold),
                ("reading", d.reading),
                ("depends_on", d.depends_on),
                ("choices_by", d.choices_by),
                ("max_new_tokens", d.max_new_tokens),
                ("pruning", d.pruning),
            )
            if v is not None
        }
        bounds: dict[str, Any] = {
            k: v
            for k, v in (
                ("ge", d.ge),
                ("le", d.le),
                ("min_length", d.min_length),
                ("max_length", d.max_length),
                ("pattern", d.pattern),
            )
            if v is not None
        }
        py_fields[d.name] = (
            tp,
            PydField(description=d.description or None, json_schema_extra=extra or None, **bounds),
        )
    model_name = name if name.isidentifier() else "StructuredSchema"
    model = create_model(
        model_name, __config__=ConfigDict(extra="forbid"), __doc__=instructions or None, **py_fields
    )
    compiled = _from_model(model)
    return Schema(name, instructions, compiled.fields, model)


def _no_choices(name: str, d: FieldDefinition) -> None:
    """A generated field's spec must not list choices (they would be ignored)."""
    if d.choices is not None or d.choice_descriptions is not None:
        raise SchemaError(
            f"{_where(name, d.name)}: a {d.field_type!r} field is generated and takes no "
            f"choices; got choices={d.choices!r}. Accepted: min_length, max_length, pattern "
            "(string), ge, le (number) and max_new_tokens; or type 'enum' to score choices.",
            model=name,
            field=d.name,
        )


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) < 80 else s[:77] + "..."
