"""Cascade: per-field escalation to a chat model, another Decider, or a human."""

from __future__ import annotations

import logging
import typing
from typing import Literal

import numpy as np
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field, ValidationError

from pcd_tools.agents import (
    Cascade,
    CascadeError,
    ChatModelStage,
    DeciderStage,
    HumanStage,
    LowConfidenceError,
)
from pcd_tools.agents.cascade import narrowed_model
from pcd_tools.agents.stages import StageAnswer
from pcd_tools.answers.result import FieldResult
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import compile_schema
from tests.agents.helpers import StructuredFakeChatModel, _allowed
from tests.conftest import tiny_decider
from tests.schemas import Department, Ticket

pytestmark = pytest.mark.langchain

TEXT = "The invoice charged us twice and nobody answers the phone."
T_FLAT = 1e4  # a near-uniform first stage: 4-way fields ~0.25, the boolean ~0.5


@pytest.fixture(scope="module")
def small():
    return tiny_decider(0)


def _flat_stage(small):
    return DeciderStage(small, name="small", temperature=T_FLAT)


def test_low_confidence_fields_escalate_to_a_chat_model_narrowed_to_top_k(small):
    big = StructuredFakeChatModel()
    cascade = Cascade(Ticket, stages=[_flat_stage(small), big], threshold=0.4)
    res = cascade.invoke(TEXT)

    first = small.decide(Ticket, TEXT, temperature=T_FLAT)
    # the boolean (~0.5) is kept; both 4-way enums (~0.25) escalate
    assert first.fields["requires_escalation"].probability >= 0.4
    assert res.decided_by == {
        "priority": "fake-big-model",
        "requires_escalation": "small",
        "department": "fake-big-model",
    }
    assert [s.name for s in res.stages] == ["small", "fake-big-model"]
    assert res.stages[0].escalated == ["priority", "department"]
    assert res.stages[1].asked == ["priority", "department"]
    assert res.unresolved == []

    # what the bigger model received: only those fields, each narrowed to our top 3,
    # most probable first
    ((schema, messages),) = big.received
    assert list(schema.model_fields) == ["priority", "department"]
    for name in ("priority", "department"):
        top3 = [label for label, _ in first.fields[name].top_choices[:3]]
        assert _allowed(schema.model_fields[name].annotation) == top3
        assert res.stages[1].candidates[name] == top3
    assert schema.__doc__ == "Triage an inbound customer support ticket."
    assert isinstance(messages[0], SystemMessage) and "department" in messages[0].content
    assert messages[1] == HumanMessage(TEXT)

    # merged result: the fake answers the last allowed value; the boolean is ours
    allowed = {n: _allowed(schema.model_fields[n].annotation) for n in schema.model_fields}
    assert res.value.priority == allowed["priority"][-1]
    assert res.value.department == Department(allowed["department"][-1])
    assert res.value.requires_escalation == first.fields["requires_escalation"].value
    assert res.probabilities["requires_escalation"] == pytest.approx(
        first.fields["requires_escalation"].probability
    )
    assert res.probabilities["priority"] is None
    assert set(res.latency_ms) == {"small", "fake-big-model"}
    assert all(ms >= 0 for ms in res.latency_ms.values())
    assert res.decision.fields["priority"].probability == pytest.approx(
        first.fields["priority"].probability
    )


def test_confident_fields_never_escalate(small):
    big = StructuredFakeChatModel()
    res = Cascade(Ticket, stages=[small, big], threshold=0.5).invoke(TEXT)
    direct = small.decide(Ticket, TEXT)
    assert direct.confidence >= 0.5
    assert set(res.decided_by.values()) == {"tiny-llama-0"}
    assert big.received == [] and len(res.stages) == 1
    assert res.value == direct.value


def test_per_field_thresholds_and_scores(small):
    big = StructuredFakeChatModel()
    cascade = Cascade(
        Ticket,
        stages=[_flat_stage(small), big],
        threshold=0.0,
        per_field={"department": ("entropy", 0.1)},
    )
    res = cascade.invoke(TEXT)
    assert res.decided_by["department"] == "fake-big-model"
    assert res.decided_by["priority"] == "small"
    margin = Cascade(
        Ticket,
        stages=[_flat_stage(small), big],
        threshold=0.0,
        per_field={"priority": ("margin", 0.5)},
    )
    assert margin.invoke(TEXT).stages[0].escalated == ["priority"]


def test_errors_escalate_and_humans_answer(small):
    broken = StructuredFakeChatModel(fail=True)
    asked = []

    def human(request):
        asked.append(request)
        return {n: request.candidates[n][0] for n in request.fields}

    res = Cascade(Ticket, stages=[_flat_stage(small), broken, human], threshold=0.4).invoke(TEXT)
    assert res.stages[1].error == "RuntimeError: provider unavailable"
    assert res.stages[1].answered == [] and res.stages[1].escalated == ["priority", "department"]
    assert res.decided_by["priority"] == "human" and res.decided_by["department"] == "human"
    (req,) = asked
    assert req.fields == ["priority", "department"] and req.text == TEXT
    assert set(req.previous["priority"]) == set(compile_schema(Ticket).field("priority").labels)
    assert res.value.priority == req.candidates["priority"][0]


def test_second_decider_stage_and_unresolved(small):
    other = tiny_decider(1)
    stage2 = DeciderStage(other, name="big", top_k=2, temperature=T_FLAT)
    res = Cascade(Ticket, stages=[_flat_stage(small), stage2], threshold=0.4).invoke(TEXT)
    assert res.stages[1].asked == ["priority", "department"]
    assert all(len(c) == 2 for c in res.stages[1].candidates.values())
    assert res.decided_by["priority"] == "big"
    p = res.probabilities["priority"]
    assert p is not None and 0.4 <= p <= 1.0  # two candidates at T=1e4: about 0.5
    assert res.unresolved == []


def test_all_stages_fail_raises_cascade_error():
    broken = StructuredFakeChatModel(fail=True)
    with pytest.raises(CascadeError, match="no stage answered"):
        Cascade(Ticket, stages=[broken]).invoke(TEXT)


def test_stage_answer_outside_the_candidates_escalates(small):
    res = Cascade(
        Ticket,
        stages=[
            _flat_stage(small),
            lambda r: {"priority": "NOT_A_LEVEL"},
            lambda r: {n: r.candidates[n][0] for n in r.fields},
        ],
        threshold=0.4,
    ).invoke(TEXT)
    assert res.stages[1].answered == []
    assert res.decided_by["priority"] == "human#2"


def test_human_through_langgraph_interrupt(small):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, StateGraph
    from langgraph.types import Command
    from typing_extensions import TypedDict

    class S(TypedDict, total=False):
        text: str
        result: dict

    cascade = Cascade(Ticket, stages=[_flat_stage(small), "human"], threshold=0.4)

    def decide(state):
        res = cascade.invoke(state["text"])
        return {"result": {"value": res.value.model_dump(mode="json"), "by": res.decided_by}}

    b = StateGraph(S)
    b.add_node("decide", decide)
    b.add_edge(START, "decide")
    g = b.compile(checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "t1"}}
    first = g.invoke({"text": TEXT}, cfg)
    (intr,) = first["__interrupt__"]
    assert set(intr.value["fields"]) == {"priority", "department"}
    assert intr.response_schema["properties"].keys() == {"priority", "department"}
    out = g.invoke(Command(resume={"priority": "P1_HIGH", "department": "BILLING"}), cfg)
    assert out["result"]["value"]["priority"] == "P1_HIGH"
    assert out["result"]["by"] == {
        "priority": "human",
        "requires_escalation": "small",
        "department": "human",
    }


def test_narrowed_model_keeps_descriptions_and_optional():
    from tests.schemas import Sentiment

    m = narrowed_model(compile_schema(Sentiment), ["topic"], {"topic": ["food", None]})
    ann = m.model_fields["topic"].annotation
    assert typing.get_args(ann)[0] == Literal["food"] and type(None) in typing.get_args(ann)
    assert m.model_fields["topic"].description == "What it is about"
    m2 = narrowed_model(compile_schema(Ticket), ["requires_escalation"])
    assert m2.model_fields["requires_escalation"].annotation is bool


def test_low_confidence_error_carries_the_decision(small):
    d = small.decide(Ticket, TEXT, temperature=T_FLAT)
    err = LowConfidenceError(d, threshold=0.4)
    assert err.decision is d and err.fields == ["priority", "department"]
    assert "priority" in str(err)


def test_bad_arguments(small):
    with pytest.raises(InvalidArgumentError, match="not a field of Ticket"):
        Cascade(Ticket, stages=[small], per_field={"urgency": 0.9})
    with pytest.raises(InvalidArgumentError, match="unknown score"):
        Cascade(Ticket, stages=[small], per_field={"priority": ("logit", 0.9)})
    with pytest.raises(InvalidArgumentError, match="top_k"):
        ChatModelStage(StructuredFakeChatModel(), top_k=1)
    with pytest.raises(InvalidArgumentError, match="cascade stage"):
        Cascade(Ticket, stages=[42])
    with pytest.raises(InvalidArgumentError, match="at least one stage"):
        Cascade(Ticket, stages=[])
    assert isinstance(Cascade(Ticket, stages=[small, "human"]).stages[1], HumanStage)


# --- ranked candidates, visible failures, the fake chat model -----------------------------------


class Topic(BaseModel):
    """Triage an inbound customer support ticket."""

    topic: Literal["payment", "bug", "login"] = Field(description="What the ticket is about")
    urgent: bool = Field(description="Whether customers are blocked right now")


class _Scripted:
    """A first stage with fixed distributions, given in declaration order."""

    kind = "scripted"
    name = "model"

    def __init__(self, probs: dict[str, list[float]]):
        self.probs = probs

    def answer(self, request):
        results = {}
        for n in request.fields:
            p = np.array(self.probs[n])
            results[n] = FieldResult.from_probs(request.schema.field(n), p, np.log(p))
        return StageAnswer(
            labels={n: r.label for n, r in results.items()},
            probabilities={n: r.probability for n, r in results.items()},
            results=results,
        )


@pytest.mark.parametrize("top_k", [None, 2])
def test_escalated_candidates_are_ranked_by_the_previous_stage(top_k):
    first = _Scripted({"topic": [0.15, 0.20, 0.65], "urgent": [0.3, 0.7]})
    asked = []

    def ask_human(request):  # the README's stub
        asked.append(request)
        return {name: request.candidates[name][0] for name in request.fields}

    cascade = Cascade(Topic, stages=[first, HumanStage(ask_human, top_k=top_k)], threshold=0.8)
    res = cascade.invoke("I cannot log in since this morning")

    (req,) = asked
    topic = [("login", 0.65), ("bug", 0.20), ("payment", 0.15)][: top_k or 3]
    assert req.candidates == {"topic": [v for v, _ in topic], "urgent": [False, True]}
    assert req.ranked == {
        "topic": [(v, pytest.approx(p)) for v, p in topic],
        "urgent": [(False, pytest.approx(0.7)), (True, pytest.approx(0.3))],
    }
    assert _allowed(req.model.model_fields["topic"].annotation) == [v for v, _ in topic]
    assert res.stages[1].candidates == req.candidates
    # the stub keeps the model's top answer instead of the first declared one
    assert res.value == Topic(topic="login", urgent=False)
    assert res.decided_by == {"topic": "human", "urgent": "human"}


def test_a_failing_stage_is_logged_and_can_be_raised(small, caplog):
    broken = StructuredFakeChatModel(fail=True)

    def human(request):
        return {n: request.candidates[n][0] for n in request.fields}

    stages = [_flat_stage(small), broken, human]
    with caplog.at_level(logging.WARNING, logger="pcd_tools.agents"):
        res = Cascade(Ticket, stages=stages, threshold=0.4).invoke(TEXT)
    (rec,) = [r for r in caplog.records if r.name.startswith("pcd_tools.agents")]
    assert rec.levelno == logging.WARNING
    msg = rec.getMessage()
    assert "stages[1] 'fake-big-model' (chat_model)" in msg
    assert "RuntimeError: provider unavailable" in msg
    assert "['priority', 'department']" in msg
    assert res.errors == {"fake-big-model": "RuntimeError: provider unavailable"}
    assert res.decided_by["priority"] == "human"

    strict = Cascade(Ticket, stages=stages, threshold=0.4, on_stage_error="raise")
    with pytest.raises(RuntimeError) as info:
        strict.invoke(TEXT)
    assert str(info.value) == "provider unavailable"
    with pytest.raises(InvalidArgumentError, match=r"on_stage_error='ignore'.*'skip', 'raise'"):
        Cascade(Ticket, stages=[small], on_stage_error="ignore")


def test_fake_structured_chat_model_answers_the_narrowed_fields(small):
    from pcd_tools.agents.testing import FakeStructuredChatModel

    def top(messages, schema):  # the first (most probable) candidate of each field
        return {n: _allowed(f.annotation)[0] for n, f in schema.model_fields.items()}

    fake = FakeStructuredChatModel(responses=top, model_name="fake-gpt")
    res = Cascade(Ticket, stages=[_flat_stage(small), fake], threshold=0.4).invoke(TEXT)
    first = small.decide(Ticket, TEXT, temperature=T_FLAT)
    ((schema, messages),) = fake.calls
    assert list(schema.model_fields) == ["priority", "department"]
    assert isinstance(messages[0], SystemMessage) and messages[1] == HumanMessage(TEXT)
    assert res.decided_by == {
        "priority": "fake-gpt",
        "requires_escalation": "small",
        "department": "fake-gpt",
    }
    assert res.value.priority == first.fields["priority"].top_choices[0][0]
    assert res.value.department == Department(first.fields["department"].top_choices[0][0])
    assert res.errors == {}


def test_fake_structured_chat_model_scripts_validates_and_raises(small, caplog):
    from pcd_tools.agents.testing import FakeStructuredChatModel

    # scripted answers in turn, validated against the (un-narrowed) sub-schema
    fake = FakeStructuredChatModel(
        responses=[
            {"priority": "P3_LOW", "department": "ACCOUNT"},
            {"priority": "URGENT", "department": "ACCOUNT"},
        ]
    )
    cascade = Cascade(
        Ticket,
        stages=[_flat_stage(small), ChatModelStage(fake, top_k=None), "human"],
        threshold=0.4,
    )
    res = cascade.invoke(TEXT)
    assert res.value.priority == "P3_LOW" and res.value.department == Department.ACCOUNT
    assert res.decided_by["priority"] == "fake-structured-chat-model"
    strict = Cascade(
        Ticket,
        stages=[_flat_stage(small), ChatModelStage(fake, top_k=None)],
        threshold=0.4,
        on_stage_error="raise",
    )
    with (
        caplog.at_level(logging.WARNING, logger="pcd_tools.agents"),
        pytest.raises(ValidationError, match="priority"),
    ):
        strict.invoke(TEXT)
    assert "ValidationError" in caplog.records[-1].getMessage()

    # told to raise: the original exception comes back with on_stage_error="raise";
    # with "skip" the next stage gets the fields unranked, with no probabilities
    boom = PermissionError("invalid API key")
    failing = FakeStructuredChatModel(responses=[boom])
    with pytest.raises(PermissionError) as info:
        Cascade(Ticket, stages=[failing], on_stage_error="raise").invoke(TEXT)
    assert info.value is boom
    asked = []

    def human(request):
        asked.append(request)
        return {n: request.candidates[n][-1] for n in request.fields}

    res = Cascade(Topic, stages=[FakeStructuredChatModel(error=boom), human]).invoke(TEXT)
    assert res.errors == {"fake-structured-chat-model": "PermissionError: invalid API key"}
    (req,) = asked
    assert req.candidates == {"topic": ["payment", "bug", "login"], "urgent": [True, False]}
    assert req.ranked["topic"] == [("payment", None), ("bug", None), ("login", None)]
    assert res.value == Topic(topic="login", urgent=False)


def test_fake_structured_chat_model_on_its_own():
    from pcd_tools.agents.testing import FakeStructuredChatModel

    fake = FakeStructuredChatModel()  # no script: the first allowed value of each field
    assert fake.with_structured_output(Topic).invoke("hi") == Topic(topic="payment", urgent=True)
    raw = fake.with_structured_output(Topic, include_raw=True).invoke("hi")
    assert raw["parsed"] == Topic(topic="payment", urgent=True) and raw["parsing_error"] is None
    assert raw["raw"].content == '{"topic": "payment", "urgent": true}'

    scripted = FakeStructuredChatModel(responses=[Topic(topic="bug", urgent=False), {"x": 1}])
    assert scripted.with_structured_output(Topic).invoke("a") == Topic(topic="bug", urgent=False)
    bad = scripted.with_structured_output(Topic, include_raw=True).invoke("b")
    assert bad["parsed"] is None and isinstance(bad["parsing_error"], ValidationError)
    with pytest.raises(IndexError, match="2 scripted answers"):
        scripted.with_structured_output(Topic).invoke("c")
    assert len(scripted.calls) == 3

    as_json = FakeStructuredChatModel(responses=[{"topic": "bug"}, {"topic": "nope"}])
    js = {"title": "T", "type": "object", "properties": {"topic": {"enum": ["bug", "login"]}}}
    assert as_json.with_structured_output(js).invoke("a") == {"topic": "bug"}
    with pytest.raises(ValueError, match=r"topic.*'nope'"):
        as_json.with_structured_output(js).invoke("b")
