"""A `Cascade` over the second-stage kinds: a multi-label field escalates as a list of
labels; a `choices_by` child escalates with its parent's accepted answer fixed (and only
the values allowed with it); a union's untaken branches never escalate."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools.agents import Cascade, HumanStage
from pcd_tools.agents.stages import narrowed_model
from pcd_tools.schema import compile_schema

pytestmark = [pytest.mark.langchain, pytest.mark.engine]

TEXT = "I was charged twice this month and the login page keeps failing. Refund me!"
SUBS = {"billing": ["double_charge", "refund", "other"], "account": ["login", "deletion", "other"]}


class Intake(BaseModel):
    """Read a support message and fill in the intake form."""

    category: Literal["billing", "account"] = Field(description="Area of the message")
    subcategory: Literal["double_charge", "refund", "login", "deletion", "other"] = Field(
        description="The specific issue", json_schema_extra={"choices_by": {"category": SUBS}}
    )
    tags: list[Literal["angry", "vip", "money"]] = Field(
        description="Every flag that applies", max_length=2
    )


class Refund(BaseModel):
    kind: Literal["refund"]
    amount: Literal["small", "large"] = Field(description="Amount asked back")


class Bug(BaseModel):
    kind: Literal["bug"]
    platform: Literal["web", "ios"] = Field(description="Where it happens")


class Request(BaseModel):
    """Classify the request."""

    request: Annotated[Refund | Bug, Field(discriminator="kind")]


def _asker(answers):
    seen = []

    def ask(req):
        seen.append(req)
        return {n: answers[n] for n in req.fields}

    return ask, seen


def test_multilabel_escalates_as_a_list_of_labels(tiny):
    ask, seen = _asker({"tags": ["money", "angry"]})
    cascade = Cascade(
        Intake,
        [tiny, HumanStage(ask)],
        per_field={"category": 0.0, "subcategory": 0.0, "tags": 1.0},
    )
    res = cascade.invoke(TEXT)
    (req,) = seen
    assert req.fields == ["tags"]
    js = req.model.model_json_schema()["properties"]["tags"]
    assert js["type"] == "array" and js["maxItems"] == 2
    assert set(js["items"]["enum"]) == {"angry", "vip", "money"}
    assert res.value.tags == ["money", "angry"] and res.fields["tags"].stage == "human"


def test_a_label_outside_the_candidates_is_not_accepted(tiny):
    ask, _ = _asker({"tags": ["money", "refund"]})
    cascade = Cascade(
        Intake,
        [tiny, HumanStage(ask)],
        per_field={"category": 0.0, "subcategory": 0.0, "tags": 1.0},
    )
    res = cascade.invoke(TEXT)
    assert res.unresolved == ["tags"] and res.fields["tags"].stage == tiny.model_id


def test_a_child_escalates_with_its_parent_fixed(tiny):
    first = tiny.decide(Intake, TEXT)
    parent = first.fields["category"].label
    child = SUBS[parent][-1]
    ask, seen = _asker({"subcategory": child})
    cascade = Cascade(
        Intake,
        [tiny, HumanStage(ask)],
        per_field={"category": 0.0, "subcategory": 1.0, "tags": 0.0},
    )
    res = cascade.invoke(TEXT)
    (req,) = seen
    assert req.fixed == {"category": parent}
    assert sorted(req.candidates["subcategory"]) == sorted(SUBS[parent])
    assert f'category = "{parent}"' in req.model.__doc__
    assert res.value.category == parent and res.value.subcategory == child


def test_a_decider_stage_decides_the_child_given_the_parent(tiny):
    from pcd_tools.agents import DeciderStage

    cascade = Cascade(
        Intake,
        [tiny, DeciderStage(tiny, name="second")],
        per_field={"category": 0.0, "subcategory": 1.0, "tags": 0.0},
    )
    res = cascade.invoke(TEXT)
    parent = res.value.category
    assert res.fields["subcategory"].stage == "second"
    assert res.value.subcategory in SUBS[parent]
    # the second stage scored exactly the narrowed model with the parent stated
    keep = {
        "subcategory": [
            s for s in compile_schema(Intake).field("subcategory").labels if s in SUBS[parent]
        ]
    }
    want = tiny.decide(
        narrowed_model(compile_schema(Intake), ["subcategory"], keep, {"category": parent}), TEXT
    )
    assert res.fields["subcategory"].probability == pytest.approx(
        want.fields["subcategory"].probability, abs=1e-6
    )


def test_untaken_union_branches_do_not_escalate(tiny):
    schema = compile_schema(Request)
    first = tiny.decide(Request, TEXT)
    kind = first.fields["request.kind"].label
    taken = [
        f.name
        for f in schema.fields
        if f.branch is not None and schema.field(f.branch[0]).choices[f.branch[1]].label == kind
    ]
    per = {f.name: (0.0 if f.branch is None else 1.0) for f in schema.fields}
    seen = []

    def answer(req):
        seen.append(req)
        return {n: req.candidates[n][-1] for n in req.fields}

    res = Cascade(Request, [tiny, HumanStage(answer)], per_field=per).invoke(TEXT)
    (req,) = seen
    assert req.fields == taken and req.fixed == {"request.kind": kind}
    assert "only when" in req.model.model_json_schema()["properties"][taken[0]]["description"]
    assert res.value.request.kind == kind
