"""Conditional choices (`choices_by`): compiled tables, typed errors, joint questions."""

from __future__ import annotations

import enum
from typing import Literal

import pytest
from pydantic import BaseModel, Field, create_model

from pcd_tools import prompt
from pcd_tools.errors import ChoicesByError, UnknownParentError, UnsupportedFieldError
from pcd_tools.prompt import questions
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit

SUBS = {"billing": ["refund", "invoice"], "bug": ["crash", "slow", "other"], "account": ["other"]}


class Cat(enum.Enum):
    BILLING = "billing"
    BUG = "bug"
    ACCOUNT = "account"


class Intake(BaseModel):
    """Route a ticket."""

    category: Cat
    subcategory: str = Field(json_schema_extra={"choices_by": {"category": SUBS}})
    urgent: bool


def test_choices_by_compiles_to_allowed_indices_and_a_dependency():
    s = compile_schema(Intake)
    sub = s.field("subcategory")
    assert sub.labels == ["refund", "invoice", "crash", "slow", "other"]  # first-seen order
    assert sub.choices_by == ("category", ((0, 1), (2, 3, 4), (4,)))
    assert sub.depends_on == ("category",)
    assert (
        s.build({"category": Cat.BUG, "subcategory": "slow", "urgent": True}).subcategory == "slow"
    )


def test_the_first_pass_asks_the_child_once_per_parent_value_after_it():
    s = compile_schema(Intake)
    qs = questions(s)
    assert [q.key for q in qs] == [
        "category",
        "subcategory|category=0",
        "subcategory|category=1",
        "subcategory|category=2",
        "urgent",
    ]
    assert qs[1].texts == (
        '\n  "category": "billing",\n  "subcategory": "refund",',
        '\n  "category": "billing",\n  "subcategory": "invoice",',
    )
    assert qs[3].texts == ('\n  "category": "account",\n  "subcategory": "other",',)
    assert (qs[2].choices, qs[3].choices) == ((2, 3, 4), (4,))


def test_over_the_budget_the_child_waits_for_a_later_wave(monkeypatch):
    monkeypatch.setattr(prompt, "JOINT_BUDGET", 10)
    s = compile_schema(Intake)
    assert [q.field for q in questions(s)] == ["category", "urgent"]
    (q,) = prompt.field_questions(s, s.field("subcategory"), [("category", 1)])
    assert q.choices == (2, 3, 4)
    assert q.texts[0] == '\n  "category": "bug",\n  "subcategory": "crash",'


def _model(choices_by, child=Literal["a", "b", "c"]):
    return create_model(
        "M",
        parent=(Literal["x", "y"], Field()),
        child=(child, Field(json_schema_extra={"choices_by": choices_by})),
    )


@pytest.mark.parametrize(
    ("choices_by", "error", "message"),
    [
        (
            {"parent": {"x": ["a"], "z": ["b"]}},
            ChoicesByError,
            "M.child: choices_by names 'z', which is not a value of 'parent'; accepted: ['x', 'y'].",
        ),
        (
            {"parent": {"x": ["a"]}},
            ChoicesByError,
            "M.child: choices_by['parent'] gives no choices for ['y']; accepted: a list for every "
            "value of 'parent': ['x', 'y'].",
        ),
        (
            {"parent": {"x": ["a"], "y": ["q"]}},
            ChoicesByError,
            "M.child: choices_by['parent']['y'] holds 'q', which is not a value of 'child'; "
            "accepted: ['a', 'b', 'c'].",
        ),
        (
            {"parent": {"x": ["a"], "y": []}},
            ChoicesByError,
            "M.child: choices_by['parent']['y'] = []; accepted: a non-empty list of values of "
            "'child': ['a', 'b', 'c'].",
        ),
        (
            {"nope": {"x": ["a"]}},
            UnknownParentError,
            "M.child: depends on 'nope', which is not another field of M; accepted: one of "
            "['parent'].",
        ),
        (["x"], ChoicesByError, "M.child: choices_by=['x']; accepted: one parent field"),
    ],
)
def test_bad_tables_are_typed_errors_naming_what_is_accepted(choices_by, error, message):
    with pytest.raises(error) as e:
        compile_schema(_model(choices_by))
    assert str(e.value).startswith(message)
    assert (e.value.model, e.value.field) == ("M", "child")


def test_a_multilabel_child_is_refused():
    with pytest.raises(UnsupportedFieldError, match=r"M.child: choices_by between 'parent'"):
        compile_schema(_model({"parent": {"x": ["a"], "y": ["b"]}}, list[Literal["a", "b"]]))
