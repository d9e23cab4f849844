"""Pydantic model -> Schema: kinds, choices, descriptions, docstrings and annotation errors."""

from __future__ import annotations

import enum
from typing import Literal, Optional

import pytest
from pydantic import BaseModel, ConfigDict, Field

from pcd_tools import SchemaError
from pcd_tools.errors import InvalidChoiceError, UnsupportedFieldError
from pcd_tools.schema import compile_schema
from pcd_tools.schema.spec import NOT_STATED

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


@pytest.mark.parametrize(
    ("annotation", "error", "fragment"),
    [
        # str, float, a free int and list[str] are generated now (schema/generated.py)
        (bytes, UnsupportedFieldError, "bytes"),
        (complex, UnsupportedFieldError, "complex"),
        (dict[str, int], UnsupportedFieldError, "dict"),
        (list[int], UnsupportedFieldError, "list"),
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


def test_optional_nested_model_field_is_unsupported():
    # a required nested model is flattened (tests/schema/test_nested.py)
    class Inner(BaseModel):
        x: bool

    class Outer(BaseModel):
        inner: Inner | None = None

    with pytest.raises(UnsupportedFieldError, match=r"Outer\.inner.*Inner"):
        compile_schema(Outer)
