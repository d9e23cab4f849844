"""Hybrid schemas over the wire: `/v1/decide` (dict form and JSON schema) and chat
completions answer generated fields beside scored ones, equal to the library's decision;
token limits are typed 422s that carry the partial text's field."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from pcd_tools.serve.app import create_app

pytestmark = pytest.mark.serve
openai = pytest.importorskip("openai")

KEY = "hybrid-key"
TEXT = "I was charged twice for my subscription this month. Please refund me."
AUTH = {"Authorization": f"Bearer {KEY}"}


class Triage(BaseModel):
    """Triage a support ticket: say why, then route it, then draft a reply."""

    reason: str = Field(max_length=24, description="Why, in a few words")
    team: Literal["billing", "tech"] = Field(description="Team that should handle it")
    amount: float = Field(ge=0, le=999, description="Amount at stake, in dollars")
    reply: str = Field(max_length=16, description="A short reply draft")


@pytest.fixture(scope="module")
def server(tiny, live):
    app = create_app(tiny, api_key=KEY, max_questions=8)
    with live(app) as url:
        yield url + "/v1"


def _same(parsed: dict, decision) -> None:
    for name, f in decision.fields.items():
        want = round(f.probability, 6) if f.probability is not None else None
        assert parsed[name] == {"value": f.label, "prob": want}, name


def test_v1_decide_answers_a_hybrid_json_schema_like_the_library(server, tiny):
    body = {"schema": Triage.model_json_schema(), "context": TEXT}
    r = httpx.post(server + "/decide", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    got = r.json()
    want = tiny.decide(Triage, TEXT)
    _same(got["parsed_json"], want)
    assert got["parsed_json"]["reason"]["prob"] is None
    assert 0 < got["parsed_json"]["team"]["prob"] <= 1
    assert json.loads(got["json_text"]) == {n: f.label for n, f in want.fields.items()}
    assert got["generate_ms"] > 0
    Triage.model_validate_json(got["json_text"])  # valid by construction


def test_v1_decide_dict_form_with_string_and_number_fields(server, tiny):
    fields = {
        "why": {"type": "string", "max_length": 20, "description": "Why"},
        "team": {"type": "enum", "choices": ["billing", "tech"], "description": "Team"},
        "amount": {"type": "number", "ge": 0, "le": 100, "description": "Amount"},
    }
    body = {"schema": {"name": "T", "fields": fields}, "context": TEXT}
    r = httpx.post(server + "/decide", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    parsed = r.json()["parsed_json"]
    assert isinstance(parsed["why"]["value"], str) and len(parsed["why"]["value"]) <= 20
    assert 0 <= parsed["amount"]["value"] <= 100 and parsed["amount"]["prob"] is None
    assert parsed["team"]["value"] in ("billing", "tech")


def test_a_token_limit_is_a_typed_422_naming_the_field(server):
    free = {
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": 200}},
        "required": ["story"],
    }
    body = {"schema": free, "context": TEXT, "max_new_tokens": 3}
    r = httpx.post(server + "/decide", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "generation_limit" and err["field"] == "story"
    assert "max_new_tokens=3" in err["message"] and "generated so far" in err["message"]
    for bad in (0, -1, "8", True):
        r = httpx.post(
            server + "/decide", json={**body, "max_new_tokens": bad}, headers=AUTH, timeout=30
        )
        assert r.status_code == 422 and r.json()["error"]["field"] == "max_new_tokens", bad


def test_chat_completions_return_the_hybrid_object_with_scored_logprobs(server, tiny):
    client = openai.OpenAI(base_url=server, api_key=KEY, max_retries=0)
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": TEXT}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "Triage", "schema": Triage.model_json_schema()},
        },
        logprobs=True,
    )
    content = r.choices[0].message.content
    parsed = Triage.model_validate_json(content)
    want = tiny.decide(Triage, TEXT)
    assert parsed.model_dump() == want.value.model_dump()
    pcd = r.choices[0].model_extra["pcd"]
    assert pcd["fields"]["reason"]["probability"] is None
    assert pcd["fields"]["team"]["probability"] == pytest.approx(
        want.fields["team"].probability, abs=1e-6
    )
    # one logprobs entry per scored field (the team); generated values have none
    entries = r.choices[0].logprobs.content
    assert [e.token for e in entries] == [json.dumps(want.fields["team"].label)]
    # a max_tokens below the answer's JSON is a 400 (never cut), or the field's limit
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": TEXT}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "Triage", "schema": Triage.model_json_schema()},
            },
            max_tokens=2,
        )
    assert e.value.status_code in (400, 422)
