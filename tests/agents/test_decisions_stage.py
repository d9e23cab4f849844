"""`DecisionsStage`: a cascade escalates to `langchain_openai`'s `OpenAIDecisions` pointed at a
live `pcd serve` on the embedded model. The stage's probabilities are the server's for the
questions it sent (and so the Python API's on the schema they compile to), and they drive
the next escalation like a `Decider` stage's."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools.agents import Cascade, DeciderStage, DecisionsStage
from pcd_tools.agents.cascade import as_stage
from pcd_tools.agents.stages import EscalationRequest, narrowed_model
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import compile_schema
from tests.schemas import Ticket
from tests.serve.live import live_server

pytestmark = [pytest.mark.langchain, pytest.mark.serve, pytest.mark.integration]
decisions_mod = pytest.importorskip("langchain_openai.decisions")

KEY = "stage-key"
TEXT = "The invoice charged us twice and nobody answers the phone."
T_FLAT = 1e4  # a near-uniform first stage: 4-way fields ~0.25, the boolean ~0.5


@pytest.fixture(scope="module")
def server(real):
    from pcd_tools.serve.app import create_app

    app = create_app(real, api_key=KEY)
    with live_server(app, timeout=300) as url:  # warm-up is slow on a busy machine
        yield url, app.state.pcd


@pytest.fixture(scope="module")
def remote(server):
    return decisions_mod.OpenAIDecisions(
        model="pcd", base_url=server[0] + "/v1", api_key=KEY, max_retries=0
    )


def _recording(stage: DecisionsStage) -> list[EscalationRequest]:
    seen: list[EscalationRequest] = []
    ask = stage.questions

    def questions(request):
        seen.append(request)
        return ask(request)

    stage.questions = questions  # type: ignore[method-assign]
    return seen


def _payload(stage: DecisionsStage, request: EscalationRequest) -> dict:
    qs = DecisionsStage.questions(stage, request)
    return {
        "model": "pcd",
        "input": request.text,
        "questions": [q._to_api(n) for n, q in qs.items()],
    }


def test_low_confidence_fields_escalate_to_a_remote_pcd_server(real, remote, server):
    from pcd_tools.serve.decisions import parse_decisions

    stage = as_stage(remote)
    assert isinstance(stage, DecisionsStage) and stage.name == "decisions:pcd"
    seen = _recording(stage)
    jobs0 = server[1].batcher.jobs_run
    small = DeciderStage(real, name="small", temperature=T_FLAT)
    res = Cascade(Ticket, stages=[small, stage], threshold=0.4).invoke(TEXT)

    # the boolean (~0.5) is kept; both 4-way enums (~0.25) go to the server, in one request
    assert res.decided_by == {
        "priority": "decisions:pcd",
        "requires_escalation": "small",
        "department": "decisions:pcd",
    }
    assert [(s.name, s.kind) for s in res.stages] == [
        ("small", "decider"),
        ("decisions:pcd", "openai_decisions"),
    ]
    assert server[1].batcher.jobs_run == jobs0 + 1
    (request,) = seen
    assert request.fields == ["priority", "department"]
    payload = _payload(stage, request)
    assert [(q["type"], q["name"]) for q in payload["questions"]] == [
        ("choice", "priority"),
        ("choice", "department"),
    ]
    # declaration order, not the first stage's ranking
    assert [c["value"] for c in payload["questions"][0]["choices"]] == [
        "P0_CRITICAL",
        "P1_HIGH",
        "P2_NORMAL",
        "P3_LOW",
    ]
    assert "Triage an inbound customer support ticket." in payload["questions"][0]["instructions"]

    # the stage's probabilities are the server's, i.e. the Python API's on the same questions
    want = real.decide(parse_decisions(payload).schema, TEXT)
    for n in ("priority", "department"):
        got = res.fields[n]
        assert got.probability == pytest.approx(want.fields[n].probability, abs=1e-4)
        assert got.label == want.fields[n].label
    assert res.value.priority == res.fields["priority"].value


def test_the_servers_probabilities_drive_the_next_escalation(real, remote):
    stage = DecisionsStage(remote, top_k=2)
    seen = _recording(stage)
    asked: list[EscalationRequest] = []

    def human(request):
        asked.append(request)
        return {n: request.candidates[n][0] for n in request.fields}

    small = DeciderStage(real, name="small", temperature=T_FLAT)
    res = Cascade(Ticket, stages=[small, stage, human], threshold=0.99).invoke(TEXT)
    (request,) = seen
    assert request.fields == ["priority", "requires_escalation", "department"]
    # top_k=2: each field's two most probable candidates so far, sent in declaration order
    payload = _payload(stage, request)
    assert [q["type"] for q in payload["questions"]] == ["choice", "predicate", "choice"]
    for q in (payload["questions"][0], payload["questions"][2]):
        values = [c["value"] for c in q["choices"]]
        assert sorted(values) == sorted(request.candidates[q["name"]])
        labels = compile_schema(Ticket).field(q["name"]).labels
        assert values == [x for x in labels if x in values]
    remote_record = res.stages[1]
    assert remote_record.answered == request.fields
    # the 135M model is below 0.99 on some of them: they reach the human, ranked by the
    # server's probabilities, which it passes on
    low = [n for n in request.fields if n in remote_record.escalated]
    assert low
    (h,) = asked
    assert h.fields == low
    for n in low:
        assert sum(h.previous[n].values()) == pytest.approx(1.0, abs=1e-6)
        assert max(h.previous[n].values()) < 0.99
        assert h.candidates[n][0] == max(h.previous[n], key=h.previous[n].get)
        assert res.decided_by[n] == "human"


class Review(BaseModel):
    """Review a customer message."""

    topics: list[Literal["billing", "delivery", "quality"]] = Field(
        description="Every topic the message raises"
    )
    refund: bool = Field(description="Does the customer ask for a refund?")
    mood: Literal["calm", "upset"] | None = Field(description="The customer's mood, if stated")


def test_what_the_api_cannot_ask_goes_on_to_the_next_stage(real, remote):
    stage = DecisionsStage(remote)
    seen = _recording(stage)
    asked: list[EscalationRequest] = []

    def human(request):
        asked.append(request)
        return {"topics": ["billing"]}

    res = Cascade(Review, stages=[stage, human], threshold=0.0).invoke(TEXT)
    payload = _payload(stage, seen[0])
    # a bool is a predicate; an Optional literal is a choice with `null` sent as its JSON text
    assert [(q["type"], q["name"]) for q in payload["questions"]] == [
        ("predicate", "refund"),
        ("choice", "mood"),
    ]
    assert [c["value"] for c in payload["questions"][1]["choices"]] == ["calm", "upset", "null"]
    assert res.stages[0].escalated == ["topics"]  # multi-label: no Decisions question for it
    assert [r.fields for r in asked] == [["topics"]]
    assert res.decided_by == {"topics": "human", "refund": "decisions:pcd", "mood": "decisions:pcd"}
    assert res.fields["mood"].label in ("calm", "upset", None)
    p = res.fields["refund"].probability
    assert 0.5 <= p <= 1.0


def test_one_allowed_candidate_is_answered_with_probability_one_without_a_request(remote, server):
    stage = DecisionsStage(remote)
    schema = compile_schema(Ticket)
    cands = {"priority": ["P1_HIGH"]}
    request = EscalationRequest(
        TEXT, schema, ["priority"], cands, narrowed_model(schema, ["priority"], cands), {}
    )
    assert stage.questions(request) == {}  # the API needs 2 to 255 choices
    jobs0 = server[1].batcher.jobs_run
    ans = stage.answer(request)
    assert server[1].batcher.jobs_run == jobs0
    assert ans.labels == {"priority": "P1_HIGH"}
    assert ans.probabilities == {"priority": 1.0}
    assert ans.results["priority"].distribution == {"P1_HIGH": 1.0}


def test_only_an_openai_decisions_is_accepted():
    with pytest.raises(InvalidArgumentError, match="OpenAIDecisions; got str"):
        DecisionsStage("http://127.0.0.1:8000/v1")
    with pytest.raises(InvalidArgumentError, match="OpenAIDecisions"):
        as_stage(42)
