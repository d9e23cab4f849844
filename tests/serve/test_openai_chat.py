"""`POST /v1/chat/completions` through the real `openai` client (sync, async, streaming,
forced tool calls) on a live loopback server with the tiny model; its answers equal the
library's decisions on the same schema and text."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel, Field, create_model

from pcd_tools.serve.app import create_app

pytestmark = pytest.mark.serve
openai = pytest.importorskip("openai")

KEY = "chat-key"
TEXT = "I was charged twice for my subscription this month. Please refund me."


class Route(BaseModel):
    """Route a support ticket to the team that should answer it."""

    team: Literal["billing", "tech", "sales"] = Field(description="Team that should handle it")
    urgent: bool = Field(description="Does it need an answer today?")


class Tagged(BaseModel):
    """Tag a support ticket."""

    tags: list[Literal["refund", "login", "outage", "invoice"]] = Field(
        description="Every tag that applies"
    )
    severity: int = Field(ge=1, le=5, description="1 = trivial, 5 = critical")
    region: Literal["eu", "us"] | None = Field(description="Customer region, if stated")


@pytest.fixture(scope="module")
def server(tiny, live):
    app = create_app(tiny, api_key=KEY, max_questions=8)
    with live(app) as url:
        yield url + "/v1", app.state.pcd


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0], api_key=KEY, max_retries=0)


def _fmt(model: type[BaseModel]) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": model.__name__, "schema": model.model_json_schema()},
    }


def _user(text: str = TEXT) -> list[dict]:
    return [{"role": "user", "content": text}]


def _same_as_library(pcd: dict, decision) -> None:
    for name, f in decision.fields.items():
        got = pcd["fields"][name]
        assert got["value"] == f.label
        for label, p in f.distribution.items():
            key = label if isinstance(label, str) else json.dumps(label)
            # separate passes (float32) and the wire's 6 decimals: to the project's 1e-4
            assert got["distribution"][key] == pytest.approx(p, abs=1e-4)


def test_json_schema_answer_equals_the_library(client, tiny):
    r = client.chat.completions.create(
        model="anything", messages=_user(), response_format=_fmt(Route)
    )
    want = tiny.decide(Route, TEXT)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert json.loads(choice.message.content) == want.value.model_dump(mode="json")
    assert r.model == tiny.model_id and r.object == "chat.completion" and r.id
    assert r.usage.prompt_tokens == want.prompt_tokens
    assert r.usage.completion_tokens == len(choice.message.content.encode())  # byte tokenizer
    _same_as_library(choice.model_extra["pcd"], want)


def test_parse_returns_the_pydantic_instance(client, tiny):
    r = client.chat.completions.parse(model="m", messages=_user(), response_format=Route)
    assert r.choices[0].message.parsed == tiny.decide(Route, TEXT).value


def test_every_kind_through_the_strict_schema(client, tiny):
    r = client.chat.completions.parse(model="m", messages=_user(), response_format=Tagged)
    want = tiny.decide(Tagged, TEXT)
    assert r.choices[0].message.parsed == want.value
    pcd = r.choices[0].model_extra["pcd"]
    assert pcd["fields"]["tags"]["labels"].keys() == {"refund", "login", "outage", "invoice"}
    assert pcd["fields"]["severity"]["expected"] == pytest.approx(
        want.fields["severity"].expected, abs=1e-5
    )
    _same_as_library(pcd, want)


def test_forced_tool_call(client, tiny):
    tool = openai.pydantic_function_tool(Route)
    r = client.chat.completions.create(
        model="m",
        messages=_user(),
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "Route"}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "Route" and call.id.startswith("call_")
    assert Route.model_validate_json(call.function.arguments) == tiny.decide(Route, TEXT).value
    # "required" with one tool is the same request
    r2 = client.chat.completions.create(
        model="m", messages=_user(), tools=[tool], tool_choice="required"
    )
    assert r2.choices[0].message.tool_calls[0].function.arguments == call.function.arguments


def test_async_client(server, tiny):
    async def go():
        c = openai.AsyncOpenAI(base_url=server[0], api_key=KEY, max_retries=0)
        texts = [TEXT, "The app crashes on login since the update.", "Do you sell team plans?"]
        rs = await asyncio.gather(
            *(
                c.chat.completions.parse(model="m", messages=_user(t), response_format=Route)
                for t in texts
            )
        )
        await c.close()
        return texts, rs

    texts, rs = asyncio.run(go())
    for t, r in zip(texts, rs):
        assert r.choices[0].message.parsed == tiny.decide(Route, t).value


def test_streaming_gives_the_same_answer(client):
    whole = client.chat.completions.create(model="m", messages=_user(), response_format=_fmt(Route))
    stream = client.chat.completions.create(
        model="m",
        messages=_user(),
        response_format=_fmt(Route),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["stop"]
    assert finals[0].choices[0].model_extra["pcd"]["fields"].keys() == {"team", "urgent"}
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # the client's own stream helper parses it into the model
    with client.chat.completions.stream(model="m", messages=_user(), response_format=Route) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.parsed == Route.model_validate_json(text)


def test_streamed_tool_call(client):
    tool = openai.pydantic_function_tool(Route)
    args = ""
    for c in client.chat.completions.create(
        model="m", messages=_user(), tools=[tool], tool_choice="required", stream=True
    ):
        for call in c.choices[0].delta.tool_calls or []:
            args += call.function.arguments or ""
    Route.model_validate_json(args)


def test_logprobs_are_the_pcd_probabilities(client):
    r = client.chat.completions.create(
        model="m", messages=_user(), response_format=_fmt(Route), logprobs=True, top_logprobs=3
    )
    pcd = r.choices[0].model_extra["pcd"]["fields"]
    team, urgent = r.choices[0].logprobs.content
    assert team.token == json.dumps(pcd["team"]["value"])
    assert team.logprob == pytest.approx(math.log(pcd["team"]["probability"]), abs=1e-5)
    assert [t.token for t in team.top_logprobs][:1] == [team.token]
    assert len(team.top_logprobs) == 3 and len(urgent.top_logprobs) == 2


def test_temperature_is_pcds(client, tiny):
    hot = client.chat.completions.create(
        model="m", messages=_user(), response_format=_fmt(Route), temperature=2.0
    )
    want = tiny.decide(Route, TEXT, temperature=2.0)
    _same_as_library(hot.choices[0].model_extra["pcd"], want)
    cold = client.chat.completions.create(
        model="m", messages=_user(), response_format=_fmt(Route), temperature=0
    )
    fields = cold.choices[0].model_extra["pcd"]["fields"]
    assert fields["team"]["probability"] == 1.0
    assert fields["team"]["value"] == want.fields["team"].label


def test_system_message_joins_the_instructions(client, tiny):
    system = "You triage tickets for ACME Cloud."
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": system}, *_user()],
        response_format=_fmt(Route),
    )
    import dataclasses

    from pcd_tools.schema import compile_schema

    base = compile_schema(Route)
    schema = dataclasses.replace(base, instructions=f"{system}\n\n{base.instructions}")
    _same_as_library(r.choices[0].model_extra["pcd"], tiny.decide(schema, TEXT))


def test_models_list_in_both_shapes(client, server, tiny):
    assert [m.id for m in client.models.list()] == [tiny.model_id]
    body = httpx.get(server[0] + "/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert body["models"][0]["name"] == tiny.model_id


def _post(server, body, key=KEY):
    return httpx.post(
        server[0] + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )


def _err(r, status):
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_plain_chat_is_a_400_that_says_how_to_ask(server):
    err = _err(_post(server, {"model": "m", "messages": _user()}), 400)
    assert "response_format" in err["message"] and "tool_choice" in err["message"]
    err = _err(
        _post(
            server, {"model": "m", "messages": _user(), "response_format": {"type": "json_object"}}
        ),
        400,
    )
    assert "json_object" in err["message"]


def test_bad_requests(server):
    fmt = _fmt(Route)
    err = _err(
        _post(server, {"model": "m", "messages": _user(), "response_format": fmt, "n": 2}), 400
    )
    assert err["param"] == "n"
    err = _err(
        _post(server, {"model": "m", "messages": _user(), "response_format": fmt, "best_of": 2}),
        400,
    )
    assert "best_of" in err["message"]
    err = _err(_post(server, {"model": "m", "messages": [], "response_format": fmt}), 400)
    assert err["param"] == "messages"
    img = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    err = _err(_post(server, {"model": "m", "messages": img, "response_format": fmt}), 400)
    assert "text parts" in err["message"]
    err = _err(
        _post(server, {"model": "m", "messages": _user(), "response_format": fmt, "max_tokens": 3}),
        400,
    )
    assert "max_tokens=3" in err["message"]


def test_pcd_pruning_through_extra_body(client, server, tiny):
    codes = tuple(f"{a}{b}x" for a in "0123456789" for b in "abcdef")
    coded = create_model("Coded", code=(Literal[codes], ...))  # type: ignore[call-overload]
    r = client.chat.completions.create(
        model="m",
        messages=_user(),
        response_format=_fmt(coded),
        extra_body={"pcd": {"pruning": "on"}},
    )
    fields = r.choices[0].model_extra["pcd"]["fields"]
    want = tiny.decide(coded, TEXT, pruning="on").fields["code"]
    assert fields["code"]["certified"] is want.certified is True
    bad = {"pcd": {"pruning": "always"}}
    err = _err(
        _post(server, {"model": "m", "messages": _user(), "response_format": _fmt(coded), **bad}),
        400,
    )
    assert err["param"] == "pcd.pruning" and "accepted: 'auto'" in err["message"]


def test_unsupported_keyword_is_a_422_naming_keyword_and_path(server):
    schema = {
        "type": "object",
        "properties": {
            "team": {"enum": ["billing", "tech"]},
            "customer": {
                "type": "object",
                "properties": {"email": {"type": "string", "format": "email"}},
                "required": ["email"],
            },
        },
        "required": ["team", "customer"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "T", "schema": schema}}
    err = _err(_post(server, {"model": "m", "messages": _user(), "response_format": fmt}), 422)
    assert "'email'" in err["message"] and "customer" in err["message"]
    assert err["param"] == "/properties/customer/properties/email"


def test_schema_over_the_limits_is_a_413(server):
    props = {f"f{i}": {"type": "boolean"} for i in range(9)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    fmt = {"type": "json_schema", "json_schema": {"name": "Big", "schema": schema}}
    _err(_post(server, {"model": "m", "messages": _user(), "response_format": fmt}), 413)


def test_wrong_key_is_a_401(server):
    c = openai.OpenAI(base_url=server[0], api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        c.chat.completions.create(model="m", messages=_user(), response_format=_fmt(Route))


def test_metrics_count_the_route(server, client):
    client.chat.completions.create(model="m", messages=_user(), response_format=_fmt(Route))
    text = httpx.get(
        server[0].removesuffix("/v1") + "/metrics", headers={"Authorization": f"Bearer {KEY}"}
    ).text
    assert 'endpoint="/v1/chat/completions"' in text


def test_v1_decide_accepts_a_json_schema(server, tiny):
    url = server[0]
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"schema": Route.model_json_schema(), "context": TEXT}
    r = httpx.post(url + "/decide", json=body, headers=auth)
    assert r.status_code == 200, r.text
    want = tiny.decide(Route, TEXT)
    for name, f in want.fields.items():
        assert r.json()["parsed_json"][name] == {"value": f.label, "prob": round(f.probability, 6)}
    props = {f"f{i}": {"type": "boolean"} for i in range(9)}
    big = {"type": "object", "properties": props, "required": list(props)}
    r = httpx.post(url + "/decide", json={"schema": big, "context": TEXT}, headers=auth)
    assert r.status_code == 413, r.text
    uri = {"type": "string", "format": "uri"}
    bad = {"type": "object", "properties": {"link": uri}, "required": ["link"]}
    r = httpx.post(url + "/decide", json={"schema": bad, "context": TEXT}, headers=auth)
    assert r.status_code == 422 and r.json()["error"]["field"] == "schema/properties/link"


def test_v1_decide_takes_examples_calibration_and_pmi(server, tiny):
    url = server[0]
    auth = {"Authorization": f"Bearer {KEY}"}
    fields = {"team": {"type": "enum", "choices": ["billing", "tech"], "description": "Team"}}
    examples = [{"input": "My invoice is wrong.", "output": {"team": "billing"}}]
    body = {
        "schema": {"name": "R", "fields": fields},
        "context": TEXT,
        "examples": examples,
        "calibration": "contextual",
    }
    r = httpx.post(url + "/decide", json=body, headers=auth)
    assert r.status_code == 200, r.text
    from pcd_tools.schema import StructuredSchema

    schema = StructuredSchema(fields, name="R").schema
    want = tiny.decide(schema, TEXT, examples=examples, calibration="contextual")
    assert r.json()["parsed_json"]["team"]["prob"] == round(want.fields["team"].probability, 6)
    pmi = httpx.post(
        url + "/decide", json={**body, "calibration": "none", "scoring": "pmi"}, headers=auth
    )
    want = tiny.decide(schema, TEXT, examples=examples, scoring="pmi")
    assert pmi.json()["parsed_json"]["team"]["prob"] == round(want.fields["team"].probability, 6)
    bad = {**body, "examples": [{"input": "x", "output": {"team": "sales"}}]}
    r = httpx.post(url + "/decide", json=bad, headers=auth)
    assert r.status_code == 422 and "team" in r.json()["error"]["message"]
    r = httpx.post(url + "/decide", json={**body, "calibration": "cal.json"}, headers=auth)
    assert r.status_code == 422 and r.json()["error"]["field"] == "calibration"


def test_pcd_options_through_extra_body(client, tiny):
    examples = [{"input": "My invoice is wrong.", "output": {"team": "billing", "urgent": False}}]
    r = client.chat.completions.create(
        model="m",
        messages=_user(),
        response_format=_fmt(Route),
        extra_body={"pcd": {"examples": examples, "calibration": "contextual", "orders": 2}},
    )
    want = tiny.decide(Route, TEXT, examples=examples, calibration="contextual", orders=2)
    pcd = r.choices[0].model_extra["pcd"]
    assert pcd["orders"] == 2
    _same_as_library(pcd, want)
    with pytest.raises(openai.UnprocessableEntityError, match="team"):
        client.chat.completions.create(
            model="m",
            messages=_user(),
            response_format=_fmt(Route),
            extra_body={"pcd": {"examples": [{"input": "x", "output": {"team": "hr"}}]}},
        )


def test_without_pcd_scoring_the_chat_route_scores_as_the_python_apis_auto(client, tiny):
    # issue 52: the server's default scoring was "full" where `decide`'s is "auto"
    codes = tuple(f"{a}{b}x" for a in "0123456789" for b in "abcdef")
    coded = create_model("Coded", code=(Literal[codes], ...))  # type: ignore[call-overload]
    r = client.chat.completions.create(model="m", messages=_user(), response_format=_fmt(coded))
    want = tiny.decide(coded, TEXT, scoring="auto")
    assert want.fields["code"].scoring == "constrained"  # "auto" differs from "full" here
    _same_as_library(r.choices[0].model_extra["pcd"], want)
