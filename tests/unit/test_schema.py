"""Schema compilation: every accepted form, and a typed error for every invalid one."""

from __future__ import annotations

import enum
from typing import Literal, Optional

import pytest
from pydantic import BaseModel, ConfigDict, Field

from pcd_tools import FieldDefinition, SchemaError, StructuredSchema, decision
from pcd_tools.errors import (
    DuplicateChoiceError,
    EmptySchemaError,
    InvalidChoiceError,
    InvalidFieldNameError,
    TooFewChoicesError,
    TooManyChoicesError,
    UnsupportedFieldError,
)
from pcd_tools.schema import NOT_STATED, compile_schema

pytestmark = pytest.mark.unit


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def test_pydantic_fields_compile_with_kinds_choices_and_descriptions():
    class M(BaseModel):
        """Route a message."""

        a: Literal["x", "y"] = Field(description="An enum")
        b: bool = Field(description="A flag")
        c: Color
        """Colour from a docstring."""
        d: Optional[Literal["p", "q"]] = None  # noqa: UP045 - the typing.Optional spelling
        e: Level | None = None
        f: Literal[1, 2, 3] = Field(
            description="Ints", json_schema_extra={"choice_descriptions": {1: "one", "3": "three"}}
        )

    s = compile_schema(M)
    assert s.name == "M"
    assert s.instructions == "Route a message."
    kinds = {f.name: (f.kind, f.labels, f.optional) for f in s.fields}
    assert kinds == {
        "a": ("enum", ["x", "y"], False),
        "b": ("boolean", [True, False], False),
        "c": ("enum", ["red", "green"], False),
        "d": ("enum", ["p", "q", None], True),
        "e": ("enum", [1, 2, None], True),
        "f": ("enum", [1, 2, 3], False),
    }
    assert s.field("a").description == "An enum"
    assert s.field("c").description == "Colour from a docstring."
    assert [c.literal for c in s.field("b").choices] == ["true", "false"]
    assert [c.literal for c in s.field("d").choices] == ['"p"', '"q"', "null"]
    assert s.field("d").choices[-1].description == NOT_STATED
    assert [c.description for c in s.field("f").choices] == ["one", None, "three"]
    # native values: Enum members and None
    assert s.field("c").choices[0].value is Color.RED
    assert s.field("e").choices[1].value is Level.HIGH
    built = s.build({"a": "x", "b": True, "c": Color.GREEN, "d": None, "e": Level.LOW, "f": 3})
    assert isinstance(built, M) and built.c is Color.GREEN and built.b is True


def test_use_attribute_docstrings_config_is_honoured():
    class M(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)
        flag: bool
        """Is it urgent?"""

    assert compile_schema(M).field("flag").description == "Is it urgent?"


def test_dict_and_field_definition_forms_are_identical():
    spec = {
        "priority": {"type": "enum", "choices": ["HIGH", "LOW"], "description": "Urgency"},
        "escalate": {"type": "boolean", "description": "Page on-call"},
    }
    a = StructuredSchema(spec).schema
    b = StructuredSchema(
        [
            FieldDefinition(
                name="priority", field_type="enum", description="Urgency", choices=["HIGH", "LOW"]
            ),
            FieldDefinition(name="escalate", field_type="boolean", description="Page on-call"),
        ]
    ).schema
    assert a.to_spec() == b.to_spec()
    assert a.fingerprint() == b.fingerprint() == compile_schema(spec).fingerprint()
    inst = a.build({"priority": "HIGH", "escalate": False})
    assert inst.model_dump() == {"priority": "HIGH", "escalate": False}


def test_fingerprint_changes_with_anything_that_reaches_the_prompt():
    base = {"p": {"type": "enum", "choices": ["A", "B"], "description": "x"}}
    fp = compile_schema(base).fingerprint()
    assert (
        compile_schema(
            {"p": {"type": "enum", "choices": ["A", "C"], "description": "x"}}
        ).fingerprint()
        != fp
    )
    assert (
        compile_schema(
            {"p": {"type": "enum", "choices": ["A", "B"], "description": "y"}}
        ).fingerprint()
        != fp
    )
    assert (
        compile_schema(
            {"p": {"type": "enum", "choices": ["B", "A"], "description": "x"}}
        ).fingerprint()
        != fp
    )


def test_255_choices_accepted_256_refused():
    ok = StructuredSchema({"c": {"type": "enum", "choices": [f"c{i}" for i in range(255)]}})
    assert ok.schema.field("c").cardinality == 255
    with pytest.raises(TooManyChoicesError) as e:
        StructuredSchema({"c": {"type": "enum", "choices": [f"c{i}" for i in range(256)]}})
    msg = str(e.value)
    assert "StructuredSchema.c" in msg and "256 choices" in msg and "2 to 255" in msg


def test_decorator_validates_at_decoration_time_and_adds_decide():
    with pytest.raises(UnsupportedFieldError) as e:

        @decision
        class Bad(BaseModel):
            ok: bool
            amount: float = Field(description="money")

    msg = str(e.value)
    assert "Bad.amount" in msg and "float" in msg and "accepted" in msg
    assert e.value.model == "Bad" and e.value.field == "amount"

    @decision
    class Good(BaseModel):
        ok: bool

    assert callable(Good.decide)
    assert Good.__pcd_schema__.field_names == ["ok"]


@pytest.mark.parametrize(
    ("annotation", "error", "fragment"),
    [
        (str, UnsupportedFieldError, "str"),
        (int, UnsupportedFieldError, "int"),
        (float, UnsupportedFieldError, "float"),
        (list[str], UnsupportedFieldError, "list"),
        (Literal["only"], TooFewChoicesError, "1 choice(s)"),
        (Literal["a", ""], InvalidChoiceError, "empty"),
        (Literal["a", 1.5], InvalidChoiceError, "float"),
        (Literal["a", True], InvalidChoiceError, "bool"),
    ],
)
def test_invalid_annotations_raise_typed_errors(annotation, error, fragment):
    model = type("Spec", (BaseModel,), {"__annotations__": {"field_x": annotation}})
    with pytest.raises(error) as e:
        compile_schema(model)
    msg = str(e.value)
    assert "Spec.field_x" in msg and fragment in msg and "accepted" in msg
    assert isinstance(e.value, SchemaError)


def test_nested_model_field_is_unsupported():
    class Inner(BaseModel):
        x: bool

    class Outer(BaseModel):
        inner: Inner

    with pytest.raises(UnsupportedFieldError, match=r"Outer\.inner.*Inner"):
        compile_schema(Outer)


@pytest.mark.parametrize(
    ("spec", "error", "fragment"),
    [
        ({}, EmptySchemaError, "no fields"),
        ({"p": {"type": "text"}}, UnsupportedFieldError, "unknown field type 'text'"),
        ({"p": {"type": "enum"}}, SchemaError, "needs a list of 'choices'"),
        ({"p": {"type": "enum", "choices": ["A", "A"]}}, DuplicateChoiceError, "declared twice"),
        ({"p": {"type": "enum", "choices": ["A", "  "]}}, InvalidChoiceError, "whitespace"),
        ({"p": {"type": "enum", "choices": ["A", None]}}, InvalidChoiceError, "NoneType"),
        ({"p": {"type": "boolean", "choices": ["y", "n"]}}, SchemaError, "takes no choices"),
        ({"not valid": {"type": "boolean"}}, InvalidFieldNameError, "not a valid identifier"),
        ({"p": {"type": "boolean", "colour": 1}}, SchemaError, "unknown key(s) ['colour']"),
        ({"p": "boolean"}, UnsupportedFieldError, "spec must be a dict"),
        (
            {"p": {"type": "enum", "choices": ["A", "B"], "choice_descriptions": {"C": "x"}}},
            SchemaError,
            "names 'C', which is not a choice",
        ),
    ],
)
def test_invalid_dict_specs_raise_typed_errors(spec, error, fragment):
    with pytest.raises(error) as e:
        StructuredSchema(spec)
    assert fragment in str(e.value)


def test_schema_errors_are_also_builtin_errors():
    with pytest.raises(ValueError):
        StructuredSchema({})
    with pytest.raises(TypeError):
        StructuredSchema({"p": {"type": "text"}})


def test_compile_schema_rejects_other_objects():
    with pytest.raises(SchemaError, match="accepted: a Pydantic BaseModel subclass"):
        compile_schema(42)


def test_subset_narrows_fields_and_choices():
    s = StructuredSchema(
        {"a": {"type": "enum", "choices": ["x", "y", "z"]}, "b": {"type": "boolean"}}
    ).schema
    sub = s.subset(["a"], choices={"a": ["z", "x"]})
    assert sub.field_names == ["a"]
    assert sub.field("a").labels == ["x", "z"]


def test_wrapper_form_and_a_field_called_fields():
    wrapped = StructuredSchema(
        {
            "name": "Routing",
            "instructions": "Route it.",
            "fields": {"team": {"type": "enum", "choices": ["a", "b"]}},
        }
    )
    assert (wrapped.name, wrapped.instructions) == ("Routing", "Route it.")
    assert wrapped.schema.field_names == ["team"]
    # a field whose name is "fields" is a field, not the wrapper
    plain = StructuredSchema({"fields": {"type": "boolean", "description": "Has fields?"}})
    assert plain.schema.field_names == ["fields"]
    assert plain.schema.field("fields").kind == "boolean"
