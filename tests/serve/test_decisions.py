"""`POST /v1/decisions` through the real `openai` client (sync, async, batched) and
LangChain's `OpenAIDecisions`, on a live server with the embedded model: the answers equal
System One's and the Python API's on the same questions, and every error is an OpenAI
error object whose `param` is the JSON path at fault."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import threading
import time
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from pcd_tools.serve.app import create_app
from pcd_tools.serve.decisions import parse_decisions

pytestmark = [pytest.mark.serve, pytest.mark.integration]
openai = pytest.importorskip("openai")

KEY = "dec-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT = "I was charged twice for my March invoice. Please refund it today."
QUESTIONS = [
    {"type": "predicate", "name": "billing", "instructions": "Is this message about billing?"},
    {
        "type": "choice",
        "name": "tone",
        "instructions": "What is the tone?",
        "choices": [
            {"value": "calm", "description": "neutral or polite"},
            {"value": "angry", "description": "upset or hostile"},
        ],
    },
    {
        "type": "score",
        "name": "urgency",
        "instructions": "How urgent is it?",
        "levels": [
            {"label": "can wait"},
            {"label": "this week"},
            {"label": "today", "description": "must be handled today"},
        ],
    },
]
# The same questions as a System One request.
SYSTEMONE = {
    "billing": {"type": "noul", "instructions": "Is this message about billing?"},
    "tone": {
        "type": "choice",
        "instructions": "What is the tone?",
        "criteria": {"calm": "neutral or polite", "angry": "upset or hostile"},
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["can wait", "this week", "today: must be handled today"],
    },
}


@pytest.fixture(scope="module")
def server(real, live):
    app = create_app(real, api_key=KEY, max_questions=8)
    with live(app, timeout=300) as url:  # warm-up is slow on a busy machine
        yield url, app.state.pcd


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0)


def _post(url: str, body: dict, path: str = "/v1/decisions", **kw) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=AUTH, timeout=120, **kw)


def _body(questions=None, input=TEXT, **extra) -> dict:
    return {
        "model": "pcd",
        "input": input,
        "questions": QUESTIONS if questions is None else questions,
        **extra,
    }


# --- answers ----------------------------------------------------------------------------------


def test_answers_equal_system_one_and_the_python_api(client, server, real):
    url, _ = server
    r = client.decisions.create(model="anything", input=TEXT, questions=QUESTIONS)
    assert r.model == real.model_id
    assert [a.type for a in r.answers] == ["predicate", "choice", "score"]
    assert [a.name for a in r.answers] == ["billing", "tone", "urgency"]
    billing, tone, urgency = r.answers

    so = _post(url, {"state": TEXT, "questions": SYSTEMONE}, "/v1/systemone").json()["answers"]
    assert billing.probability == pytest.approx(so["billing"]["noul"], abs=1e-5)
    assert {p.value: p.probability for p in tone.probabilities} == pytest.approx(
        so["tone"]["probabilities"], abs=1e-5
    )
    assert tone.choice == so["tone"]["choice"]
    assert urgency.score == pytest.approx(so["urgency"]["score"], abs=1e-5)
    assert [p.probability for p in urgency.probabilities] == pytest.approx(
        [so["urgency"]["probabilities"][str(i)] for i in range(3)], abs=1e-5
    )

    # one engine path: the decisions request compiles to System One's schema
    from pcd_tools.serve.systemone import parse_request

    schema = parse_decisions(_body()).schema
    assert schema == parse_request({"state": TEXT, "questions": SYSTEMONE}).schema
    d = real.decide(schema, TEXT)
    assert billing.probability == pytest.approx(d.fields["billing"].distribution[True], abs=1e-4)
    assert urgency.score == pytest.approx(
        sum(i * p for i, p in d.fields["urgency"].distribution.items()), abs=1e-4
    )
    assert tone.choice == d.fields["tone"].label
    assert tone.confidence == pytest.approx(d.fields["tone"].probability, abs=1e-4)


def test_probabilities_sum_to_one_and_score_is_the_expected_level(client):
    r = client.decisions.create(model="pcd", input=TEXT, questions=QUESTIONS)
    _, tone, urgency = r.answers
    for a in (tone, urgency):
        probs = [p.probability for p in a.probabilities]
        assert sum(probs) == pytest.approx(1.0, abs=1e-6)
        assert a.confidence == max(probs)
    assert urgency.score == pytest.approx(
        sum(p.value * p.probability for p in urgency.probabilities), abs=1e-9
    )
    assert [(p.value, p.label) for p in urgency.probabilities] == [
        (0, "can wait"),
        (1, "this week"),
        (2, "today"),
    ]
    assert tone.choice == max(tone.probabilities, key=lambda p: p.probability).value


def test_typed_choice_values_come_back_with_their_own_json_type(server):
    url, _ = server
    q = {
        "type": "choice",
        "instructions": "Should we refund?",
        "choices": [{"value": True}, {"value": "true"}, {"value": False}, {"value": "later"}],
    }
    r = _post(url, _body([q]))
    assert r.status_code == 200
    (a,) = r.json()["answers"]
    assert a["name"] is None
    values = [p["value"] for p in a["probabilities"]]
    assert values == [True, "true", False, "later"]
    assert [type(v) for v in values] == [bool, str, bool, str]
    assert isinstance(a["choice"], (bool, str)) and a["choice"] in values
    # the model sees `true` and `"true"` as different JSON values
    f = parse_decisions(_body([q])).schema.fields[0]
    assert [c.literal for c in f.choices] == ["true", '"true"', "false", '"later"']
    assert sum(p["probability"] for p in a["probabilities"]) == pytest.approx(1.0, abs=1e-6)


def test_unnamed_questions_answer_in_order_and_an_image_question_is_refused(client):
    qs = [
        {"type": "predicate", "instructions": "Is it about money?"},
        {
            "type": "predicate",
            "name": "photo",
            "instructions": [
                {"type": "input_text", "text": "Does this photo show the invoice?"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
            ],
        },
        {
            "type": "score",
            "instructions": "Anger?",
            "levels": [{"label": "low"}, {"label": "high"}],
        },
    ]
    r = client.decisions.create(model="pcd", input=TEXT, questions=qs)
    assert [(a.type, a.name) for a in r.answers] == [
        ("predicate", None),
        ("refusal", "photo"),
        ("score", None),
    ]
    assert 0.0 < r.answers[0].probability < 1.0
    assert sum(p.probability for p in r.answers[2].probabilities) == pytest.approx(1.0, abs=1e-6)


def test_only_refused_questions_run_no_model(server):
    url, srv = server
    jobs0 = srv.batcher.jobs_run
    img = [{"type": "input_image", "image_url": "https://example.com/a.png"}]
    r = _post(url, _body([{"type": "predicate", "name": "p", "instructions": img}]))
    assert r.status_code == 200
    assert r.json()["answers"] == [{"type": "refusal", "name": "p"}]
    assert srv.batcher.jobs_run == jobs0
    assert r.json()["usage"]["input_tokens"] > 0


def test_usage_counts_cached_and_written_prefix_tokens(server, real):
    url, srv = server
    qs = [{"type": "predicate", "name": "usage_probe", "instructions": "Is it a question?"}]
    first = _post(url, _body(qs)).json()["usage"]
    again = _post(url, _body(qs, input="Another text entirely.")).json()["usage"]
    schema = parse_decisions(_body(qs)).schema
    head = srv.head_tokens(schema)
    assert head > 0
    assert first["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": head}
    assert again["input_tokens_details"] == {"cached_tokens": head, "cache_write_tokens": 0}
    assert first["input_tokens"] == real.decide(schema, TEXT).prompt_tokens
    for u in (first, again):
        assert u["output_tokens"] == 0
        assert u["total_tokens"] == u["input_tokens"]
        assert u["output_tokens_details"] == {"reasoning_tokens": 0}


def test_prompt_cache_key_keeps_a_callers_entries_apart(server):
    url, _ = server
    qs = [{"type": "predicate", "name": "cache_key_probe", "instructions": "Is it polite?"}]

    def usage(key):
        extra = {} if key is None else {"prompt_cache_key": key}
        r = _post(url, _body(qs, **extra)).json()
        return r["usage"]["input_tokens_details"], r["answers"][0]["probability"]

    shared, p0 = usage(None)
    assert shared["cache_write_tokens"] > 0
    assert usage(None)[0]["cached_tokens"] > 0  # the shared entry is there ...
    a1, pa = usage("tenant-a")  # ... but tenant a does not read it
    assert a1 == {"cached_tokens": 0, "cache_write_tokens": shared["cache_write_tokens"]}
    a2, _ = usage("tenant-a")
    assert a2 == {"cached_tokens": shared["cache_write_tokens"], "cache_write_tokens": 0}
    b1, pb = usage("tenant-b")
    assert b1["cached_tokens"] == 0
    assert pa == pytest.approx(p0, abs=1e-5) and pb == pytest.approx(p0, abs=1e-5)


def test_safety_identifier_is_accepted_and_logged(client, caplog):
    with caplog.at_level(logging.INFO, logger="pcd_tools.serve"):
        r = client.decisions.create(
            model="pcd", input=TEXT, questions=QUESTIONS[:1], safety_identifier="user-1234"
        )
    assert r.answers[0].type == "predicate"
    assert any("safety_identifier='user-1234'" in m for m in caplog.messages)


def test_an_agent_turn_with_tool_calls_is_decided(client):
    turn = [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "Refund invoice 42, I was charged twice."},
        {"type": "function_call", "call_id": "c1", "name": "refund", "arguments": '{"id": 42}'},
        {"type": "function_call_output", "call_id": "c1", "output": "refunded 20 EUR"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "note", "input": "refund done"},
        {
            "type": "custom_tool_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "saved"}],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "Done: refunded."}]},
    ]
    qs = [{"type": "predicate", "name": "resolved", "instructions": "Was the request resolved?"}]
    r = client.decisions.create(model="pcd", input=turn, questions=qs)
    assert 0.0 < r.answers[0].probability < 1.0


# --- a Pydantic schema ported with pcd_tools.schema.decisions_request --------------------------


class Team(enum.Enum):
    BILLING = "billing"
    TECH = "technical"


class Route(BaseModel):
    """Route an inbound support ticket to the team that handles it."""

    team: Team = Field(description="Which team handles the ticket")
    priority: Literal["low", "normal", "urgent"] = Field(
        description="How soon it needs an answer",
        json_schema_extra={"choice_descriptions": {"urgent": "the customer is blocked now"}},
    )
    refund: bool = Field(description="Whether the customer asks for money back")
    escalate: bool = Field(
        description="Whether a manager must see it",
        json_schema_extra={"choice_descriptions": {"true": "legal risk", "false": "routine"}},
    )
    anger: int = Field(
        ge=0,
        le=2,
        description="How angry the customer is",
        json_schema_extra={"choice_descriptions": {0: "calm", 1: "annoyed", 2: "furious"}},
    )


def _distributions(answers) -> dict:
    out = {}
    for a in answers:
        if a.type == "predicate":
            out[a.name] = {True: a.probability, False: 1 - a.probability}
        else:
            out[a.name] = {p.value: p.probability for p in a.probabilities}
    return out


def test_a_ported_schema_is_asked_as_decide_asks_it(client, real):
    from pcd_tools.schema import decisions_request

    request = decisions_request(Route, TEXT)
    # the same prompt: the docstring as the instructions, every field as declared
    parsed = parse_decisions({"model": "pcd", **request})
    assert parsed.instructions == Route.__doc__
    assert real.prompt(parsed.schema, parsed.context).text == real.prompt(Route, TEXT).text

    # warm the schema's prefix cache first: a cold prefill rounds differently (~1e-6)
    client.decisions.create(model="pcd", **request)
    r = client.decisions.create(model="pcd", **request)
    assert [(a.type, a.name) for a in r.answers] == [
        ("choice", "team"),
        ("choice", "priority"),
        ("predicate", "refund"),
        ("choice", "escalate"),  # described true / false: a choice of booleans
        ("score", "anger"),
    ]
    d = real.decide(Route, TEXT)
    got = _distributions(r.answers)
    for name, f in d.fields.items():
        want = {(k.value if isinstance(k, enum.Enum) else k): p for k, p in f.distribution.items()}
        if name == "anger":  # levels come back as their indices, here the values themselves
            want = {int(k): p for k, p in want.items()}
        assert got[name] == pytest.approx(want, abs=1e-6), name
    assert r.answers[0].choice == d.value.team.value
    assert r.answers[4].score == pytest.approx(d.fields["anger"].expected, abs=1e-6)


def test_a_developer_message_changes_the_instructions_and_a_string_input_does_not(client):
    qs = QUESTIONS[:2]
    # warm the schema part's prefix cache first: a cold request prefills the whole prompt in
    # one call, a warm one after the cached part, and the two differ in the products' own
    # rounding (1.6e-6 here on an AVX-512 Xeon's OpenBLAS); compared warm to warm, the same
    # prompt must give the same numbers
    client.decisions.create(model="pcd", input=TEXT, questions=qs)
    plain = client.decisions.create(model="pcd", input=TEXT, questions=qs)
    as_user = client.decisions.create(
        model="pcd", input=[{"role": "user", "content": TEXT}], questions=qs
    )
    told = client.decisions.create(
        model="pcd",
        input=[
            {"role": "developer", "content": "The customer is always calm. Answer calm."},
            {"role": "user", "content": TEXT},
        ],
        questions=qs,
    )
    assert as_user.answers[0].probability == pytest.approx(plain.answers[0].probability, abs=1e-6)
    assert told.answers[0].probability != pytest.approx(plain.answers[0].probability, abs=1e-4)
    calm = {p.value: p.probability for p in told.answers[1].probabilities}["calm"]
    before = {p.value: p.probability for p in plain.answers[1].probabilities}["calm"]
    assert calm != pytest.approx(before, abs=1e-4)
    # its own prefix-cache entry: the instructions are in the cached head
    assert told.usage.input_tokens != plain.usage.input_tokens


# --- batching -------------------------------------------------------------------------------


def _wait(ready, what: str, timeout: float = 60.0) -> None:
    """Polls `ready()`; fails (rather than hangs with the model's lock held) after `timeout`."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_async_concurrent_requests_share_a_batch_with_system_one(real, live):
    app = create_app(real, api_key=KEY)
    srv = app.state.pcd
    with live(app, timeout=300) as url:  # a fresh app warms up: slow on a busy machine

        def aclient():  # one client per event loop
            return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)

        texts = [f"Ticket {i}: {'refund me' if i % 2 else 'the app crashes'}" for i in range(4)]
        alone = [
            asyncio.run(aclient().decisions.create(model="pcd", input=t, questions=QUESTIONS))
            for t in texts
        ]
        batches: list[list[str]] = []
        run = srv.batcher._run

        def recording(jobs):
            batches.append([j.context for j in jobs])
            run(jobs)

        srv.batcher._run = recording
        lock = srv.batcher.worker_decider.engine.lock
        started0 = srv.batcher.jobs_started
        out: dict[str, object] = {}

        async def together():
            c = aclient()
            calls = [c.decisions.create(model="pcd", input=t, questions=QUESTIONS) for t in texts]
            return await asyncio.gather(*calls)

        lock.acquire()  # hold the model so that the requests queue up together
        try:
            first = threading.Thread(
                target=lambda: out.__setitem__("first", _post(url, _body(input="first")))
            )
            first.start()
            _wait(lambda: srv.batcher.jobs_started > started0, "the first request to start")
            t = threading.Thread(target=lambda: out.__setitem__("got", asyncio.run(together())))
            t.start()
            so = threading.Thread(
                target=lambda: out.__setitem__(
                    "so", _post(url, {"state": TEXT, "questions": SYSTEMONE}, "/v1/systemone")
                )
            )
            _wait(lambda: srv.batcher.depth >= len(texts), "the async requests to queue")
            so.start()
            _wait(lambda: srv.batcher.depth >= len(texts) + 1, "the System One request to queue")
        finally:
            lock.release()
        first.join(60)
        t.join(60)
        so.join(60)
    assert batches[0] == ["first"]
    assert len(batches) == 2 and sorted(batches[1]) == sorted([*texts, TEXT])
    for got, want in zip(out["got"], alone):
        assert got.answers[0].probability == pytest.approx(want.answers[0].probability, abs=1e-4)
        assert got.answers[2].score == pytest.approx(want.answers[2].score, abs=1e-4)
    assert out["so"].status_code == 200


# --- LangChain ------------------------------------------------------------------------------


@pytest.mark.langchain
def test_langchain_openai_decisions_invoke_and_batch(server, client):
    decisions_mod = pytest.importorskip("langchain_openai.decisions")
    Choice, Predicate, Score = decisions_mod.Choice, decisions_mod.Predicate, decisions_mod.Score
    lc = decisions_mod.OpenAIDecisions(
        model="pcd", base_url=server[0] + "/v1", api_key=KEY, max_retries=0
    )
    questions = {
        "billing": Predicate(instructions="Is this message about billing?"),
        "tone": Choice(
            instructions="What is the tone?",
            choices={"calm": "neutral or polite", "angry": "upset or hostile"},
        ),
        "urgency": Score(
            instructions="How urgent is it?", levels=["can wait", "this week", "today"]
        ),
    }
    res = lc.invoke({"input": TEXT, "questions": questions})
    want = client.decisions.create(
        model="pcd", input=TEXT, questions=[q._to_api(n) for n, q in questions.items()]
    )
    assert res.predicates["billing"].probability == pytest.approx(
        want.answers[0].probability, abs=1e-4
    )
    assert res.choices["tone"].choice == want.answers[1].choice
    assert res.scores["urgency"].legend == {0: "can wait", 1: "this week", 2: "today"}
    assert res.scores["urgency"].score == pytest.approx(want.answers[2].score, abs=1e-4)
    assert res.usage.input_tokens == want.usage.input_tokens
    assert res.usage.output_tokens == 0

    texts = ["Refund my order please.", "The app crashes when I log in."]
    many = lc.batch([{"input": t, "questions": questions} for t in texts])
    for t, got in zip(texts, many):
        one = lc.invoke({"input": t, "questions": questions})
        assert got.predicates["billing"].probability == pytest.approx(
            one.predicates["billing"].probability, abs=1e-4
        )


# --- errors ---------------------------------------------------------------------------------


def _err(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


CHOICE = {"type": "choice", "instructions": "Which?"}


def _choices(n):
    return [{"value": f"c{i}"} for i in range(n)]


@pytest.mark.parametrize(
    ("questions", "param", "code", "words"),
    [
        ([{**CHOICE, "choices": _choices(256)}], "questions[0].choices", "too_many_choices", "256"),
        (
            [{**CHOICE, "choices": _choices(1)}],
            "questions[0].choices",
            "too_few_choices",
            "2 to 255",
        ),
        (
            [QUESTIONS[0], {**CHOICE, "choices": [{"value": "a"}, {"value": "b"}, {"value": "a"}]}],
            "questions[1].choices[2].value",
            "duplicate_choice",
            "twice",
        ),
        (
            [
                QUESTIONS[0],
                QUESTIONS[1],
                {"type": "score", "instructions": "?", "levels": [{"label": "x"}]},
            ],
            "questions[2].levels",
            "too_few_levels",
            "2 to 10",
        ),
        (
            [
                {
                    "type": "score",
                    "instructions": "?",
                    "levels": [{"label": f"l{i}"} for i in range(11)],
                }
            ],
            "questions[0].levels",
            "too_many_levels",
            "11",
        ),
        (
            [{"type": "box", "instructions": "Where?"}],
            "questions[0].type",
            "unknown_question_type",
            "box",
        ),
        ([], "questions", "invalid_value", "1 to 400"),
        (
            [{"type": "predicate", "name": "a", "instructions": "?"}] * 2,
            "questions[1].name",
            "duplicate_name",
            "unique",
        ),
        (
            [{**CHOICE, "choices": [{"value": 1}, {"value": 2}]}],
            "questions[0].choices[0].value",
            "invalid_type",
            "boolean",
        ),
    ],
)
def test_question_errors(client, server, questions, param, code, words):
    err = _err(_post(server[0], _body(questions)), 400)
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error")
    assert words in err["message"]
    # the openai client raises its typed error with the same param
    with pytest.raises(openai.BadRequestError) as e:
        client.decisions.create(model="pcd", input=TEXT, questions=questions)
    assert e.value.param == param and e.value.code == code


def test_one_choice_is_the_apis_400_though_the_library_answers_it(client, server, real):
    """The SDK's `decision_create_params`: "Provide between 2 and 255 choices". The library
    answers one allowed value with p=1 (System One too); this route keeps the API's rule."""
    one = [{**CHOICE, "name": "only", "choices": [{"value": "refund"}]}]
    err = _err(_post(server[0], _body(one)), 400)
    assert (err["param"], err["code"]) == ("questions[0].choices", "too_few_choices")
    assert "has 1 choice(s)" in err["message"] and "2 to 255" in err["message"]
    assert "probability 1" in err["message"]
    err = _err(_post(server[0], _body([{**CHOICE, "choices": []}])), 400)
    assert (err["param"], err["code"]) == ("questions[0].choices", "too_few_choices")
    assert "has 0 choice(s)" in err["message"] and "something to choose from" in err["message"]
    # the same question on System One is answered, with probability 1
    so = {"only": {"type": "choice", "instructions": "Which?", "criteria": {"refund": None}}}
    r = _post(server[0], {"state": TEXT, "questions": so}, "/v1/systemone")
    assert r.status_code == 200, r.text
    assert r.json()["answers"]["only"]["probabilities"] == {"refund": 1.0}
    # langchain_openai's Choice lets one choice through; the server's 400 reaches the caller
    decisions_mod = pytest.importorskip("langchain_openai.decisions")
    lc = decisions_mod.OpenAIDecisions(
        model="pcd", base_url=server[0] + "/v1", api_key=KEY, max_retries=0
    )
    q = {"only": decisions_mod.Choice(instructions="Which?", choices={"refund": None})}
    with pytest.raises(openai.BadRequestError, match="2 to 255"):
        lc.invoke({"input": TEXT, "questions": q})


IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}


@pytest.mark.parametrize(
    ("input", "param", "code"),
    [
        ("", "input", "empty_input"),
        ("   \n", "input", "empty_input"),
        ([], "input", "empty_input"),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": "a"}, IMAGE]}],
            "input[0].content[1]",
            "unsupported_content",
        ),
        (
            [{"type": "function_call_output", "call_id": "c9", "output": "ok"}],
            "input[0].call_id",
            "tool_output_without_call",
        ),
        (
            [
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"},
            ],
            "input[1].call_id",
            "tool_output_without_call",
        ),
        (
            [{"role": "user", "content": "hi"}, {"type": "reasoning"}],
            "input[1].type",
            "invalid_type",
        ),
        ([{"role": "developer", "content": "Judge it."}], "input", "empty_input"),
    ],
)
def test_input_errors(server, input, param, code):
    err = _err(_post(server[0], _body(input=input)), 400)
    assert (err["param"], err["code"]) == (param, code)


def test_too_many_questions_is_413_over_the_server_limit_and_400_over_the_api(server):
    qs = [{"type": "predicate", "instructions": f"Q{i}?"} for i in range(9)]
    err = _err(_post(server[0], _body(qs)), 413)
    assert (err["param"], err["code"]) == ("questions", "too_many_questions")
    assert "--max-questions=8" in err["message"]
    qs = [{"type": "predicate", "instructions": f"Q{i}?"} for i in range(401)]
    err = _err(_post(server[0], _body(qs)), 400)
    assert "1 to 400" in err["message"]


def test_auth_body_size_context_and_queue_errors(server, client, real, live, monkeypatch):
    url, srv = server
    err = _err(httpx.post(url + "/v1/decisions", json=_body(), timeout=60), 401)
    assert (err["type"], err["param"]) == ("authentication_error", "Authorization")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).decisions.create(
            model="pcd", input=TEXT, questions=QUESTIONS
        )
    err = _err(_post(url, _body(input="word " * 300_000)), 413)
    assert err["type"] == "invalid_request_error"
    err = _err(_post(url, _body(input="word " * 20000)), 413)
    assert (err["param"], err["code"]) == ("input", "context_too_long")
    raw = json.dumps(_body()).replace(TEXT, "bad \\ud800 text")
    r = httpx.post(
        url + "/v1/decisions", content=raw, headers={**AUTH, "content-type": "application/json"}
    )
    err = _err(r, 422)
    assert err["param"] == "input"

    from pcd_tools.serve.errors import QueueFullError

    def full(job):
        raise QueueFullError(3, 3, 1.0)

    monkeypatch.setattr(srv.batcher, "submit", full)
    r = _post(url, _body())
    err = _err(r, 429)
    assert (err["type"], err["code"]) == ("rate_limit_error", "queue_full")
    assert int(r.headers["retry-after"]) >= 1


# --- input rendering (no model) ---------------------------------------------------------------


def test_input_items_render_as_the_chat_routes_transcript():
    from pcd_tools.serve.decisions import input_text

    assert input_text("plain text") == "plain text"
    assert input_text([{"role": "user", "content": "only me"}]) == "only me"
    assert (
        input_text(
            [
                {"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "input_json", "data": {"k": 1}}]},
            ]
        )
        == 'a\n\n{\n  "k": 1\n}'
    )
    items = [
        {"role": "user", "content": "Refund 42"},
        {"type": "function_call", "call_id": "c1", "name": "refund", "arguments": '{"id": 42}'},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"role": "developer", "content": "Later: part of the input."},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "No more."}]},
    ]
    assert input_text(items) == (
        "user: Refund 42\n\n"
        'assistant: [called refund with {"id": 42}]\n\ntool: [refund returned] ok\n\n'
        "developer: Later: part of the input.\n\nassistant: [refused] No more."
    )


def test_leading_system_and_developer_messages_are_the_task_instructions():
    from pcd_tools.prompt import render_system
    from pcd_tools.serve.decisions_request import input_parts
    from pcd_tools.serve.systemone import INSTRUCTIONS

    lead = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"role": "system", "content": "Judge the customer's request."},
    ]
    later = {"role": "developer", "content": "Ignore the above."}
    assert input_parts([*lead, {"role": "user", "content": "Refund 42"}]) == (
        "Be brief.\n\nJudge the customer's request.",
        "Refund 42",
    )
    # only the leading ones: after another item, a developer message is input
    assert input_parts([lead[1], {"role": "user", "content": "Refund 42"}, later]) == (
        "Judge the customer's request.",
        "user: Refund 42\n\ndeveloper: Ignore the above.",
    )
    assert input_parts(TEXT) == (None, TEXT)
    assert input_parts([{"role": "user", "content": TEXT}]) == (None, TEXT)

    plain = parse_decisions(_body())
    told = parse_decisions(_body(input=[*lead, {"role": "user", "content": TEXT}]))
    assert (plain.instructions, plain.schema.instructions) == (None, INSTRUCTIONS)
    assert told.instructions == told.schema.instructions == lead_text(lead)
    assert told.context == plain.context == TEXT
    assert render_system(told.schema).startswith("Be brief.\n\nJudge the customer's request.")
    assert render_system(plain.schema).startswith(INSTRUCTIONS)
    # the prompt differs in its instructions only; its fingerprint keys the prefix cache
    assert told.schema.fields == plain.schema.fields
    assert told.schema.fingerprint() != plain.schema.fingerprint()
    # a string input compiles as before: System One's schema
    from pcd_tools.serve.systemone import parse_request

    assert plain.schema == parse_request({"state": TEXT, "questions": SYSTEMONE}).schema


def lead_text(items) -> str:
    return "\n\n".join(
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in items
    )
