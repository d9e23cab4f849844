"""Schemas: Pydantic models or the seed's dict spec, compiled into a `Schema` of `FieldSpec`s.

Every field PCD scores is a closed set of candidates:

| annotation                 | kind    | candidates                         |
|----------------------------|---------|------------------------------------|
| `bool`                     | boolean | `true`, `false`                    |
| `Literal[...]` (str, int)  | enum    | the values                         |
| `Enum` subclass            | enum    | the member values                  |
| `Optional[X]` / `X | None` | as X    | plus `null` ("not stated")         |

Field descriptions are prompts: they come from `Field(description=...)` or from the
attribute's docstring, and per-choice descriptions from
`json_schema_extra={"choice_descriptions": {...}}`.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import inspect
import itertools
import json
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, create_model
from pydantic import Field as PydField

from .errors import (
    DuplicateChoiceError,
    EmptySchemaError,
    InvalidChoiceError,
    InvalidFieldNameError,
    SchemaError,
    TooFewChoicesError,
    TooManyChoicesError,
    UnsupportedFieldError,
)

__all__ = [
    "MAX_CHOICES",
    "Choice",
    "FieldDefinition",
    "FieldSpec",
    "Schema",
    "StructuredSchema",
    "compile_schema",
    "decision",
]

MAX_CHOICES = 255
MIN_CHOICES = 2
NOT_STATED = "not stated in the text"
_ACCEPTED = (
    "accepted: bool, Literal[...] of str or int values, an Enum subclass with str or int "
    "values, or Optional[...] of one of these"
)
_DICT_TYPES = ("enum", "boolean")


@dataclass(frozen=True)
class Choice:
    """One allowed answer of a field.

    Args:
        value: The native Python value the field takes (str, int, bool, Enum member or None).
        literal: Its JSON text as it appears in the answer, e.g. `"P0_CRITICAL"` or `true`.
        label: The JSON value used in responses (`str`/`int`/`bool`/`None`).
        description: Optional description shown to the model next to the value.
    """

    value: Any
    literal: str
    label: Any
    description: str | None = None


@dataclass(frozen=True)
class FieldSpec:
    """A compiled field.

    Args:
        name: The field name (a Python identifier), also the JSON key.
        kind: `"enum"` or `"boolean"`.
        description: The field's description (a prompt), possibly empty.
        choices: Candidates in declaration order; ties go to the first.
        optional: Whether a `null` ("not stated") candidate was added.
    """

    name: str
    kind: Literal["enum", "boolean"]
    description: str
    choices: tuple[Choice, ...]
    optional: bool = False

    @property
    def labels(self) -> list[Any]:
        """The JSON values of the candidates, in order."""
        return [c.label for c in self.choices]

    @property
    def cardinality(self) -> int:
        """Number of candidates."""
        return len(self.choices)


@dataclass(frozen=True)
class Schema:
    """A compiled PCD schema: instructions plus fields, with the Pydantic model to build.

    Args:
        name: Model or schema name, used in messages.
        instructions: Task instructions (the model docstring), possibly empty.
        fields: Compiled fields in declaration order.
        model: The Pydantic model whose instances results are validated into.
    """

    name: str
    instructions: str
    fields: tuple[FieldSpec, ...]
    model: type[BaseModel] = field(compare=False)

    def field(self, name: str) -> FieldSpec:
        """Returns the field called `name`.

        Raises:
            KeyError: naming the fields that exist.
        """
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(
            f"{self.name} has no field {name!r}; fields: {[f.name for f in self.fields]}"
        )

    @property
    def field_names(self) -> list[str]:
        """Field names in declaration order."""
        return [f.name for f in self.fields]

    def to_spec(self) -> dict[str, Any]:
        """The canonical, JSON-serialisable description of this schema."""
        return {
            "name": self.name,
            "instructions": self.instructions,
            "fields": [
                {
                    "name": f.name,
                    "kind": f.kind,
                    "description": f.description,
                    "optional": f.optional,
                    "choices": [[c.literal, c.description] for c in f.choices],
                }
                for f in self.fields
            ],
        }

    def fingerprint(self) -> str:
        """A stable SHA-256 of everything that reaches the prompt (16 hex digits)."""
        blob = json.dumps(self.to_spec(), sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def subset(
        self, names: Sequence[str], *, choices: Mapping[str, Sequence[Any]] | None = None
    ) -> Schema:
        """A schema with only `names`, optionally narrowing each field to some labels."""
        fields = []
        for n in names:
            f = self.field(n)
            keep = choices.get(n) if choices else None
            if keep is not None:
                wanted = list(keep)
                kept = tuple(c for c in f.choices if c.label in wanted)
                if len(kept) < 1 or len(kept) < len(set(map(_literal_text, wanted))):
                    raise SchemaError(
                        f"{_where(self.name, n)}: cannot narrow to {wanted!r}; accepted: a "
                        f"subset of {f.labels}.",
                        model=self.name,
                        field=n,
                    )
                f = FieldSpec(f.name, f.kind, f.description, kept, f.optional and None in wanted)
            fields.append(f)
        model = _narrowed_model(f"{self.model.__name__}Subset", self.instructions, fields)
        return Schema(self.name, self.instructions, tuple(fields), model)

    def build(self, values: Mapping[str, Any]) -> BaseModel:
        """Validates native field values into an instance of the schema's model."""
        return self.model.model_validate(dict(values))


# --- Pydantic models -----------------------------------------------------------------------


def _narrowed_model(name: str, doc: str, fields: Sequence[FieldSpec]) -> type[BaseModel]:
    """A Pydantic model accepting exactly the given fields' candidate values."""
    defs: dict[str, Any] = {}
    for f in fields:
        values = tuple(c.value for c in f.choices)
        tp: Any = Literal[values] if values else bool
        defs[f.name] = (tp, PydField(description=f.description or None))
    return create_model(name, __doc__=doc or None, **defs)


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


def _where(model: str, name: str) -> str:
    return f"{model}.{name}"


def _literal_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _enum_choices(model: str, name: str, raw: Sequence[Any], given: str) -> list[Choice]:
    """Validates raw choice values (str or int) and returns `Choice`s (no descriptions yet)."""
    out: list[Choice] = []
    seen: set[str] = set()
    for v in raw:
        member = v if isinstance(v, enum.Enum) else None
        label = v.value if member is not None else v
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            raise InvalidChoiceError(
                f"{_where(model, name)}: choice {label!r} of type {type(label).__name__} in {given} "
                "is not scoreable; accepted: non-empty str or int values (use `bool` for yes/no).",
                model=model,
                field=name,
            )
        if isinstance(label, str) and not label.strip():
            raise InvalidChoiceError(
                f"{_where(model, name)}: empty or whitespace-only choice {label!r} in {given}; "
                "accepted: non-empty strings.",
                model=model,
                field=name,
            )
        lit = _literal_text(label)
        if lit in seen:
            raise DuplicateChoiceError(
                f"{_where(model, name)}: choice {label!r} is declared twice in {given}; "
                "accepted: distinct values.",
                model=model,
                field=name,
            )
        seen.add(lit)
        out.append(Choice(value=v, literal=lit, label=label))
    n = len(out)
    if n > MAX_CHOICES:
        raise TooManyChoicesError(
            f"{_where(model, name)}: {n} choices given in {given}; accepted: "
            f"{MIN_CHOICES} to {MAX_CHOICES} choices per field. Split the field into a "
            "coarse field and a fine field, or use a cascade.",
            model=model,
            field=name,
        )
    if n < MIN_CHOICES:
        raise TooFewChoicesError(
            f"{_where(model, name)}: {n} choice(s) given in {given}; accepted: "
            f"{MIN_CHOICES} to {MAX_CHOICES} choices per field.",
            model=model,
            field=name,
        )
    return out


def _with_descriptions(
    model: str, name: str, choices: list[Choice], descs: Mapping[Any, Any] | None
) -> list[Choice]:
    if not descs:
        return choices
    if not isinstance(descs, Mapping):
        raise SchemaError(
            f"{_where(model, name)}: choice_descriptions must be a mapping of choice -> "
            f"description; got {type(descs).__name__}.",
            model=model,
            field=name,
        )
    by_key: dict[str, int] = {}
    for i, c in enumerate(choices):
        for key in (c.literal, str(c.label)):
            by_key.setdefault(key, i)
        if isinstance(c.value, enum.Enum):
            by_key.setdefault(c.value.name, i)
    out = list(choices)
    for k, d in descs.items():
        key = k.value if isinstance(k, enum.Enum) else k
        key_s = _literal_text(key) if isinstance(key, bool) else str(key)
        hit = by_key.get(key_s)
        if hit is None:
            raise SchemaError(
                f"{_where(model, name)}: choice_descriptions names {k!r}, which is not a choice; "
                f"accepted: {[c.label for c in choices]}.",
                model=model,
                field=name,
            )
        if not isinstance(d, str):
            raise SchemaError(
                f"{_where(model, name)}: the description of choice {k!r} must be a str, got "
                f"{type(d).__name__}.",
                model=model,
                field=name,
            )
        c = out[hit]
        out[hit] = Choice(c.value, c.literal, c.label, d.strip() or None)
    return out


def _bool_choices() -> list[Choice]:
    return [Choice(True, "true", True), Choice(False, "false", False)]


def _null_choice() -> Choice:
    return Choice(None, "null", None, NOT_STATED)


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


# --- the seed's dict form ------------------------------------------------------------------


@dataclass
class FieldDefinition:
    """One field of the seed's list form.

    Args:
        name: Field name (an identifier).
        field_type: `"enum"` or `"boolean"`.
        description: What the field means (a prompt).
        choices: Allowed values for an enum (2 to 255 str or int values).
        choice_descriptions: Optional description per choice.
        optional: Add a `null` ("not stated") candidate.
    """

    name: str
    field_type: str
    description: str = ""
    choices: list[Any] | None = None
    choice_descriptions: dict[Any, str] | None = None
    optional: bool = False


class StructuredSchema:
    """The seed-compatible schema: a dict of field specs or a list of `FieldDefinition`.

    Example:
        `StructuredSchema({"priority": {"type": "enum", "choices": ["HIGH", "LOW"],
        "description": "Urgency"}, "escalate": {"type": "boolean"}})`

    Args:
        fields: Mapping of name -> `{"type", "description", "choices", "choice_descriptions",
            "optional"}`, or a list of `FieldDefinition`.
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
        if _is_wrapper(fields):  # {"name": ..., "instructions": ..., "fields": {...}}
            wrapper: Mapping[str, Any] = fields  # type: ignore[assignment]
            name = name if name is not None else wrapper.get("name")
            instructions = instructions if instructions is not None else wrapper.get("instructions")
            fields = wrapper["fields"]
        name = name if isinstance(name, str) and name else "StructuredSchema"
        instructions = instructions or ""
        if not isinstance(instructions, str):
            raise SchemaError(
                f"{name}: instructions must be a str; got {type(instructions).__name__}.",
                model=name,
            )
        self.name = name
        self.instructions = instructions
        self.definitions = _normalise_definitions(name, fields)
        self._compiled = _from_definitions(name, instructions, self.definitions)

    @property
    def schema(self) -> Schema:
        """The compiled `Schema`."""
        return self._compiled

    @property
    def model(self) -> type[BaseModel]:
        """The Pydantic model results are validated into."""
        return self._compiled.model

    def __repr__(self) -> str:
        return f"StructuredSchema({[d.name for d in self.definitions]})"


_DICT_KEYS = {"type", "description", "choices", "choice_descriptions", "optional"}


def _is_wrapper(obj: Any) -> bool:
    """Whether `obj` is `{"fields": {...} | [...], "name"?: str, "instructions"?: str}`.

    A field that happens to be called `fields` has a spec dict with a `type` key, so it is
    never mistaken for the wrapper.
    """
    if not isinstance(obj, Mapping) or "fields" not in obj:
        return False
    if not set(obj) <= {"fields", "name", "instructions"}:
        return False
    inner = obj["fields"]
    if isinstance(inner, (list, tuple)):
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
            unknown = set(spec) - _DICT_KEYS
            if unknown:
                raise SchemaError(
                    f"{_where(name, fname)}: unknown key(s) {sorted(unknown)}; accepted: "
                    f"{sorted(_DICT_KEYS)}.",
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
        extra: dict[str, Any] | None = (
            {"choice_descriptions": dict(d.choice_descriptions)} if d.choice_descriptions else None
        )
        py_fields[d.name] = (
            tp,
            PydField(description=d.description or None, json_schema_extra=extra),
        )
    model_name = name if name.isidentifier() else "StructuredSchema"
    model = create_model(
        model_name, __config__=ConfigDict(extra="forbid"), __doc__=instructions or None, **py_fields
    )
    compiled = _from_model(model)
    return Schema(name, instructions, compiled.fields, model)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) < 80 else s[:77] + "..."


# --- entry points ------------------------------------------------------------------------------

_CACHE: dict[int, Schema] = {}


def compile_schema(obj: Any) -> Schema:
    """Compiles any accepted schema form into a `Schema`.

    Args:
        obj: A `Schema`, a Pydantic `BaseModel` subclass, a `StructuredSchema`, a dict spec
            or a list of `FieldDefinition`.

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
    if isinstance(obj, (Mapping, list, tuple)):
        return StructuredSchema(obj).schema
    raise SchemaError(
        f"cannot build a schema from {type(obj).__name__}; accepted: a Pydantic BaseModel "
        "subclass, a StructuredSchema, a dict of field specs or a list of FieldDefinition."
    )


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
        from .decider import default_decider

        return default_decider().decide(klass, context, **kwargs)

    cls.decide = classmethod(decide)  # type: ignore[attr-defined]
    return cls


def iter_labels(spec: FieldSpec) -> Iterable[Any]:
    """The JSON labels of a field's candidates."""
    return (c.label for c in spec.choices)
