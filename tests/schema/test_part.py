"""`Schema.needs` and `Schema.part`: a few fields, asked under the whole schema's prompt."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from pcd_tools.answers.calibration import Calibration
from pcd_tools.prompt import build_prompt, questions, render_system, terminator_for
from pcd_tools.schema import compile_schema, with_examples
from tests.conftest import ByteTokenizer
from tests.engine.test_exactness_kinds import Request, Routed, Triage

pytestmark = pytest.mark.unit


class Ticket(BaseModel):
    """Route a support ticket."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"input": "refund me", "output": {"team": "billing", "urgency": "high"}}]
        }
    )
    team: Literal["billing", "technical"] = Field(description="Which team")
    urgency: Literal["low", "high"] = Field(description="How urgent")


class Hybrid(BaseModel):
    """Scored, generated, scored."""

    a: Literal["x", "y"]
    note: str = Field(max_length=20)
    more: str = Field(max_length=20)
    b: bool
    c: Literal["p", "q"]


@pytest.mark.parametrize(
    ("schema", "name", "needed"),
    [
        (Routed, "urgent", ["urgent"]),
        (Routed, "team", ["category", "sub", "team"]),  # depends_on, transitively
        (Triage, "category", ["category", "subcategory"]),  # the choices_by child picks it
        (Triage, "subcategory", ["category", "subcategory"]),
        (Request, "urgent", ["urgent"]),
        # the discriminator's branches pick its answer, and a branch field needs it
        (
            Request,
            "request[bug].area",
            [
                "request.kind",
                "request[refund].reason",
                "request[bug].area",
                "request[bug].blocking",
            ],
        ),
        (Hybrid, "a", ["a"]),  # before every generated field
        (Hybrid, "more", ["a", "note", "more"]),  # a generated field sees all before it
        (Hybrid, "c", ["a", "note", "more", "c"]),  # not `b`: its own run is one pass
    ],
)
def test_needs_closes_over_what_an_answer_depends_on(schema, name, needed):
    assert compile_schema(schema).needs([name]) == needed


def test_a_part_keeps_the_whole_prompt_and_its_own_fields():
    whole = compile_schema(Ticket)
    part = whole.part(["team"])
    assert part.field_names == ["team"] and part.whole is whole and part.shown is whole
    assert list(part.model.model_fields) == ["team"]
    assert part.fingerprint() != whole.fingerprint()
    assert part.to_spec()["part_of"] == whole.fingerprint()
    # the prompt: the whole's system turn, examples and terminator
    assert render_system(part) == render_system(whole)
    tok = ByteTokenizer()
    assert build_prompt(tok, part) == build_prompt(tok, whole)
    assert terminator_for(part) == terminator_for(whole) == ","
    assert terminator_for(whole.subset(["team"])) == "\n}"  # a subset is its own prompt
    mine = {q.key: q.texts for q in questions(whole)}
    assert [(q.key, q.texts) for q in questions(part)] == [("team", mine["team"])]
    # examples: the whole's, answering the kept fields
    assert [dict(e.answers) for e in part.examples] == [{"team": 0}]


def test_a_part_of_everything_is_the_whole_and_a_part_of_a_part_is_of_the_whole():
    whole = compile_schema(Triage)
    assert whole.part(["subcategory", "urgent"]) is whole
    routed = compile_schema(Routed)
    sub = routed.part(["sub"])
    assert sub.part(["category"]).whole is routed
    assert sub.part(["category"]) == routed.part(["category"])
    with pytest.raises(KeyError, match="fields"):
        routed.part(["nope"])


def test_examples_and_a_calibration_of_the_whole_apply_to_its_part():
    whole = compile_schema(Ticket)
    part = with_examples(whole.part(["urgency"]), [("x", {"team": "technical", "urgency": "low"})])
    assert part.whole is not None and part.field_names == ["urgency"]
    assert [e.input for e in part.whole.examples] == ["x"]
    cal = Calibration("m", whole.name, whole.fingerprint(), {"team": 2.0})
    cal.check_schema(whole.part(["team"]))  # no mismatch: the same prompt


def test_a_union_part_builds_with_the_untaken_branch_left_none():
    whole = compile_schema(Request)
    part = whole.part(["request.kind"])
    assert "urgent" not in part.field_names
    kinds = whole.field("request.kind").choices
    value = part.build(
        {
            "request.kind": kinds[1].value,
            "request[refund].reason": "late",
            "request[bug].area": "ui",
            "request[bug].blocking": True,
        }
    )
    assert value.model_dump()["request[refund].reason"] is None
    assert value.model_dump()["request[bug].area"] == "ui"
