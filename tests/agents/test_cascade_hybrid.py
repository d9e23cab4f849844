"""A `Cascade` over a hybrid schema: the generated fields are answered once by the first
stage and never escalate; the scored fields escalate as usual, and the next stage sees the
generated text declared before them as already decided."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools.agents import Cascade, DeciderStage, HumanStage
from pcd_tools.errors import InvalidArgumentError
from tests.conftest import tiny_decider

pytestmark = [pytest.mark.langchain, pytest.mark.engine]

TEXT = "I was charged twice this month. Refund me!"


class Triage(BaseModel):
    """Triage a support ticket: say why, then route it, then draft a reply."""

    reason: str = Field(max_length=20, description="Why, in a few words")
    team: Literal["billing", "tech", "sales"] = Field(description="Team that should handle it")
    urgent: bool = Field(description="Does it need an answer today?")
    reply: str = Field(max_length=12, description="A short reply draft")


def test_generated_fields_come_from_the_first_stage_and_scored_ones_escalate(tiny):
    seen = []

    def ask(req):
        seen.append(req)
        return {"team": req.candidates["team"][-1]}

    cascade = Cascade(Triage, [tiny, HumanStage(ask)], per_field={"team": 1.0, "urgent": 0.0})
    res = cascade.invoke(TEXT)
    first = tiny.decide(Triage, TEXT)
    (req,) = seen
    assert req.fields == ["team"]  # never `reason` nor `reply`
    # the reasoning declared before `team` reaches the next stage as decided
    assert req.fixed == {"reason": first.fields["reason"].label}
    assert "Already decided (do not change): reason = " in (req.model.__doc__ or "")
    assert set(req.model.model_fields) == {"team"}
    for name in ("reason", "reply"):
        out = res.fields[name]
        assert out.stage == tiny.model_id and out.probability is None
        assert out.value == first.fields[name].value
    assert res.fields["team"].stage == "human" and res.value.team == req.candidates["team"][-1]
    assert res.fields["urgent"].probability == pytest.approx(first.fields["urgent"].probability)
    assert isinstance(res.value, Triage) and res.unresolved == []
    assert res.stages[0].answered == ["reason", "team", "urgent", "reply"]


def test_a_decider_stage_decides_the_escalated_field_given_the_generated_text(tiny):
    second = tiny_decider(1)
    cascade = Cascade(Triage, [tiny, DeciderStage(second)], per_field={"team": 1.0, "urgent": 0})
    res = cascade.invoke(TEXT)
    reason = tiny.decide(Triage, TEXT).fields["reason"].label
    (req_model,) = [r for r in res.stages if r.name == second.model_id]
    assert req_model.asked == ["team"]
    assert res.fields["team"].stage == second.model_id
    assert res.fields["team"].probability is not None
    assert res.fields["reason"].label == reason


def test_a_failed_first_stage_passes_the_generated_fields_on():
    def broken(req):
        raise RuntimeError("the model is down")

    got = []

    def human(req):
        got.append(req)
        return {"reason": "double charge", "team": "billing", "urgent": True, "reply": "Sorry!"}

    cascade = Cascade(Triage, [HumanStage(broken, name="first"), HumanStage(human)])
    res = cascade.invoke(TEXT)
    (req,) = got
    assert req.fields == ["reason", "team", "urgent", "reply"]
    props = req.model.model_json_schema()["properties"]
    assert props["reason"]["type"] == "string" and props["reason"]["maxLength"] == 20
    assert res.value == Triage(reason="double charge", team="billing", urgent=True, reply="Sorry!")
    assert res.stages[0].error.startswith("RuntimeError")


def test_a_generated_value_its_annotation_refuses_is_not_accepted():
    def human(req):
        return {"reason": "x" * 50, "team": "billing", "urgent": True, "reply": "ok"}

    cascade = Cascade(Triage, [HumanStage(human)])
    with pytest.raises(Exception, match=r"no stage answered \['reason'\]"):
        cascade.invoke(TEXT)


def test_a_threshold_on_a_generated_field_is_refused():
    with pytest.raises(InvalidArgumentError, match="'reason', a generated field"):
        Cascade(Triage, [HumanStage(lambda r: {})], per_field={"reason": 0.5})
