"""The dict form (also `/v1/decide`'s) of the second-stage kinds compiles like the models."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools import StructuredSchema
from pcd_tools.errors import ChoicesByError, SchemaError, TooManyChoicesError, UnknownKeyError
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit

SPEC = {
    "category": {"type": "enum", "choices": ["billing", "bug"]},
    "sub": {
        "type": "enum",
        "choices_by": {"category": {"billing": ["refund", "invoice"], "bug": ["crash"]}},
    },
    "severity": {"type": "integer", "ge": 1, "le": 5},
    "tags": {"type": "multilabel", "choices": ["a", "b", "c"], "threshold": 0.4, "max_length": 2},
    "team": {"type": "enum", "choices": ["t1", "t2"], "depends_on": ["sub"]},
}


class Same(BaseModel):
    category: Literal["billing", "bug"]
    sub: str = Field(json_schema_extra={"choices_by": SPEC["sub"]["choices_by"]})
    severity: int = Field(ge=1, le=5)
    tags: list[Literal["a", "b", "c"]] = Field(max_length=2, json_schema_extra={"threshold": 0.4})
    team: Literal["t1", "t2"] = Field(json_schema_extra={"depends_on": ["sub"]})


def test_every_new_kind_in_the_dict_form_equals_the_pydantic_form():
    s = StructuredSchema(SPEC, name="Same").schema
    assert s.to_spec()["fields"] == compile_schema(Same).to_spec()["fields"]
    sub, tags = s.field("sub"), s.field("tags")
    assert sub.choices_by == ("category", ((0, 1), (2,)))
    assert (tags.kind, tags.threshold, tags.max_labels) == ("multilabel", 0.4, 2)
    v = s.build({"category": "bug", "sub": "crash", "severity": 3, "tags": ["a"], "team": "t2"})
    assert v.model_dump() == {
        "category": "bug",
        "sub": "crash",
        "severity": 3,
        "tags": ["a"],
        "team": "t2",
    }


def test_dict_form_errors_are_the_typed_ones():
    with pytest.raises(TooManyChoicesError, match=r"X.m: 256 labels"):
        StructuredSchema(
            {
                "m": {
                    "type": "multilabel",
                    "choices": [f"l{i}" for i in range(256)],
                    "reading": "each",
                }
            },
            name="X",
        )
    with pytest.raises(ChoicesByError, match=r"X.s: choices_by names 'z'"):
        StructuredSchema(
            {
                "p": {"type": "enum", "choices": ["x", "y"]},
                "s": {"type": "enum", "choices_by": {"p": {"x": ["a"], "z": ["b"]}}},
            },
            name="X",
        )
    with pytest.raises(SchemaError, match=r"X.t: a multilabel field needs a list of 'choices'"):
        StructuredSchema({"t": {"type": "multilabel"}}, name="X")
    with pytest.raises(UnknownKeyError, match=r"did you mean 'threshold'"):
        StructuredSchema({"t": {"type": "multilabel", "choices": ["a", "b"], "treshold": 1}})
