"""The seed's dict form: StructuredSchema, FieldDefinition, the wrapper, and spec errors."""

from __future__ import annotations

import pytest

from pcd_tools import FieldDefinition, SchemaError, StructuredSchema
from pcd_tools.errors import (
    DuplicateChoiceError,
    EmptySchemaError,
    InvalidChoiceError,
    InvalidFieldNameError,
    UnsupportedFieldError,
)
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit


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


@pytest.mark.parametrize(
    ("spec", "typo", "suggestion"),
    [
        (
            {"name": "R", "instrutions": "Route it.", "fields": {"team": {"type": "boolean"}}},
            "instrutions",
            "instructions",
        ),
        (
            {"name": "R", "instructions": "Route it.", "feilds": {"team": {"type": "boolean"}}},
            "feilds",
            "fields",
        ),
        ({"feilds": {"team": {"type": "boolean"}}}, "feilds", "fields"),
        ({"nmae": "R", "fields": [FieldDefinition("team", "boolean")]}, "nmae", "name"),
    ],
)
def test_wrapper_key_typo_names_the_key_and_suggests_the_closest(spec, typo, suggestion):
    from pcd_tools.errors import UnknownKeyError

    with pytest.raises(UnknownKeyError) as e:
        StructuredSchema(spec)
    msg = str(e.value)
    assert isinstance(e.value, SchemaError)
    assert f"unknown key {typo!r}" in msg
    assert f"did you mean {suggestion!r}?" in msg
    assert "accepted: ['examples', 'fields', 'instructions', 'name']" in msg
    # the message blames the typo, not a correctly spelled neighbour
    assert "spec must be a dict" not in msg


def test_field_spec_key_typo_suggests_the_closest_key():
    with pytest.raises(SchemaError) as e:
        StructuredSchema({"p": {"type": "enum", "choises": ["A", "B"]}})
    assert "unknown key(s) ['choises']" in str(e.value)
    assert "did you mean 'choices'?" in str(e.value)
