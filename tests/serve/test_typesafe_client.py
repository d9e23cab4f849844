"""The official `typesafe-sdk` client against a live `pcd serve` app on the embedded model."""

from __future__ import annotations

import pytest

from pcd_tools.serve.app import create_app

pytestmark = [pytest.mark.serve, pytest.mark.integration]

typesafe_sdk = pytest.importorskip("typesafe_sdk")

KEY = "sdk-key"
STATE = "I was charged twice for my March invoice. Please refund the duplicate payment today."


@pytest.fixture(scope="module")
def url(real, live):
    with live(create_app(real, api_key=KEY)) as u:
        yield u


@pytest.fixture
def client(url):
    from typesafe_sdk import RetryPolicy, TypeSafeClient

    with TypeSafeClient(
        base_url=url, api_key=KEY, retry=RetryPolicy(max_retries=0), timeout=120
    ) as c:
        yield c


def _questions():
    from typesafe_sdk import Choice, Noul, Score

    return {
        "billing": Noul(
            instructions="Is this message about billing?",
            criteria={"true": "money, invoices, charges or refunds"},
        ),
        "tone": Choice(
            instructions="What is the tone?",
            criteria={"calm": "neutral or polite", "angry": "upset or hostile"},
        ),
        "urgency": Score(
            instructions="How urgent is it?",
            criteria=["can wait", "needs attention this week", "needs attention today"],
        ),
    }


def test_system_one_with_question_objects_matches_the_library(client, real):
    res = client.system_one(state=STATE, questions=_questions())
    assert res.model == real.model_id
    assert set(res.answers) == {"billing", "tone", "urgency"}
    assert res.request_id  # the x-typesafe-request-id header
    assert res.usage.output_tokens == 0 and res.usage.input_tokens > 20

    from pcd_tools.serve.systemone import parse_request

    body = {"state": STATE, "questions": {k: q.model_dump() for k, q in _questions().items()}}
    d = real.decide(parse_request(body).schema, STATE)
    assert res.nouls["billing"].noul == pytest.approx(
        d.fields["billing"].distribution[True], abs=2e-4
    )
    tone = res.choices["tone"]
    assert tone.choice == d.fields["tone"].label
    assert tone.probabilities == pytest.approx(d.fields["tone"].distribution, abs=2e-4)
    assert tone.confidence == pytest.approx(max(tone.probabilities.values()))
    urg = res.scores["urgency"]
    assert set(urg.legend) == {0, 1, 2} and urg.legend[2] == "needs attention today"
    assert sum(urg.probabilities.values()) == pytest.approx(1.0, abs=1e-5)
    assert urg.score == pytest.approx(sum(k * p for k, p in urg.probabilities.items()), abs=1e-5)
    assert urg.score == pytest.approx(
        sum(k * p for k, p in d.fields["urgency"].distribution.items()), abs=2e-4
    )


def test_system_one_dict_questions_and_response_model(client):
    from pydantic import BaseModel
    from typesafe_sdk import ChoiceAnswer, NoulAnswer

    class Answers(BaseModel):
        billing: NoulAnswer
        tone: ChoiceAnswer

    class MyResponse(BaseModel):
        model: str
        answers: Answers

    res = client.system_one(
        state={"subject": "Duplicate charge", "message": STATE},
        questions={
            "billing": {"type": "noul", "instructions": "Is this message about billing?"},
            "tone": {
                "type": "choice",
                "instructions": "What is the tone?",
                "criteria": {"calm": None, "angry": None},
            },
        },
        response_model=MyResponse,
    )
    assert isinstance(res, MyResponse)
    assert 0.0 <= res.answers.billing.noul <= 1.0
    assert res.answers.tone.choice in {"calm", "angry"}
    assert sum(res.answers.tone.probabilities.values()) == pytest.approx(1.0, abs=1e-5)


def test_models_list(client, real):
    models = client.models.list()
    assert [m.name for m in models.models] == [real.model_id]


def test_errors_map_to_the_sdk_exceptions(url):
    from typesafe_sdk import (
        Noul,
        RetryPolicy,
        TypeSafeAuthenticationError,
        TypeSafeClient,
        TypeSafeUnprocessableEntityError,
    )

    with (
        TypeSafeClient(base_url=url, api_key="wrong", retry=RetryPolicy(max_retries=0)) as c,
        pytest.raises(TypeSafeAuthenticationError, match="Authorization: Bearer"),
    ):
        c.system_one(state="x", questions={"q": Noul(instructions="?")})
    with (
        TypeSafeClient(base_url=url, api_key=KEY, retry=RetryPolicy(max_retries=0)) as c,
        pytest.raises(TypeSafeUnprocessableEntityError, match="'essay'"),
    ):
        c.system_one(state="x", questions={"q": {"type": "essay", "instructions": "?"}})
