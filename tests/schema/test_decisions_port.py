"""`decisions_request`: a schema as the `input` and `questions` of an OpenAI Decisions
request (the server's side, and the probabilities, are tested in tests/serve)."""

from __future__ import annotations

import enum
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from pcd_tools.errors import SchemaError, UnportableFieldError
from pcd_tools.schema import decisions_request

pytestmark = pytest.mark.unit


class Team(enum.Enum):
    BILLING = "billing"
    TECH = "technical"


class Route(BaseModel):
    """Route the ticket."""

    team: Team = Field(description="Which team")
    priority: Literal["low", "urgent"] = Field(
        json_schema_extra={"choice_descriptions": {"urgent": "blocked now"}}
    )
    refund: bool = Field(description="Money back?")
    escalate: bool = Field(
        description="Manager?",
        json_schema_extra={"choice_descriptions": {"true": "legal risk", "false": "routine"}},
    )
    anger: int = Field(
        ge=0, le=1, description="Anger", json_schema_extra={"choice_descriptions": {0: "calm"}}
    )


def test_each_field_becomes_one_question_and_the_docstring_the_developer_message():
    class Calm(Route):
        """Route the ticket."""

        anger: int = Field(
            ge=0,
            le=2,
            description="Anger",
            json_schema_extra={"choice_descriptions": {0: "calm", 1: "cross", 2: "furious"}},
        )

    req = decisions_request(Calm, "Refund me.")
    assert req["input"] == [
        {"role": "developer", "content": "Route the ticket."},
        {"role": "user", "content": "Refund me."},
    ]
    assert req["questions"] == [
        {
            "type": "choice",
            "name": "team",
            "instructions": "Which team",
            "choices": [{"value": "billing"}, {"value": "technical"}],
        },
        {  # no description: the name, as the prompt shows it
            "type": "choice",
            "name": "priority",
            "instructions": "priority",
            "choices": [{"value": "low"}, {"value": "urgent", "description": "blocked now"}],
        },
        {"type": "predicate", "name": "refund", "instructions": "Money back?"},
        {
            "type": "choice",
            "name": "escalate",
            "instructions": "Manager?",
            "choices": [
                {"value": True, "description": "legal risk"},
                {"value": False, "description": "routine"},
            ],
        },
        {
            "type": "score",
            "name": "anger",
            "instructions": "Anger",
            "levels": [{"label": "calm"}, {"label": "cross"}, {"label": "furious"}],
        },
    ]


def test_a_schema_without_a_docstring_sends_an_empty_developer_message():
    spec = {"ok": {"type": "boolean", "description": "Is it fine?"}}
    assert decisions_request(spec, "x")["input"][0] == {"role": "developer", "content": ""}


class Maybe(BaseModel):
    maybe: Literal["a", "b"] | None = None


class Generated(BaseModel):
    summary: str


class Multi(BaseModel):
    tags: list[Literal["a", "b"]]


class Inner(BaseModel):
    tier: Literal["gold", "free"]


class Nested(BaseModel):
    customer: Inner


class Tied(BaseModel):
    a: Literal["x", "y"]
    b: Literal["p", "q"] = Field(json_schema_extra={"depends_on": ["a"]})


class Shifted(BaseModel):
    stars: int = Field(
        ge=1, le=3, json_schema_extra={"choice_descriptions": {1: "a", 2: "b", 3: "c"}}
    )


class Wide(BaseModel):
    level: int = Field(ge=0, le=10)


class Examples(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"input": "x", "output": {"a": "x"}}]}
    )
    a: Literal["x", "y"]


@pytest.mark.parametrize(
    ("schema", "field", "words"),
    [
        (Maybe, "maybe", "Optional"),
        (Generated, "summary", "generated"),
        (Multi, "tags", "multi-label"),
        (Nested, "customer.tier", "nested"),
        (Tied, "b", "depends on"),
        (Route, "anger", "without a description"),
        (Shifted, "stars", "levels 0..n-1"),
        (Wide, "level", "levels 0..n-1"),
        (Examples, None, "example"),
        ({"only": {"type": "enum", "choices": ["one"]}}, "only", "2 to 255"),
    ],
)
def test_what_a_decisions_request_cannot_carry_is_refused_by_name(schema, field, words):
    with pytest.raises(UnportableFieldError, match=words) as e:
        decisions_request(schema, "x")
    assert isinstance(e.value, SchemaError) and isinstance(e.value, TypeError)
    assert e.value.field == field
    if field is not None:
        assert f".{field} " in str(e.value) and "accepted:" in str(e.value)


def test_a_part_of_a_schema_is_refused():
    from pcd_tools.schema import compile_schema

    with pytest.raises(UnportableFieldError, match="whole"):
        decisions_request(compile_schema(Route).part(["team"]), "x")
