"""The chat route does what the README's route table says (issue 34).

- Every JSON-schema kind the table lists as scored, generated or refused is compiled (or
  refused) that way by the route's own request parser, and the kinds the test knows are
  exactly the ones the table lists, so a row that drifts from the code fails here.
- Over HTTP: an empty conversation's 422 names what an HTTP client sends
  (`extra_body={"pcd": {"allow_empty": true}}`), not the Python argument; generated
  fields refuse `orders` > 1, contextual calibration and PMI; `logprobs` skips them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from pcd_tools.serve.app import create_app
from pcd_tools.serve.errors import ApiError
from pcd_tools.serve.openai_chat import parse_chat
from tests.conftest import ByteTokenizer

pytestmark = pytest.mark.serve

README = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text(encoding="utf-8")


def _row() -> str:
    (row,) = [ln for ln in README.splitlines() if ln.startswith('| `response_format: {"type"')]
    return row


def _items(row: str, label: str) -> list[str]:
    """The comma-separated items after `**label**` up to the sentence's end, commas
    inside parentheses kept."""
    m = re.search(
        r"\*\*" + label + r"\*\*(?: \([^)]*\))?[:,]? (?:a 422 [^:]*: )?(.*?)\.(?: |$)", row
    )
    assert m, f"the response_format row has no **{label}** list"
    out, depth, cur = [], 0, ""
    for ch in m.group(1):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def _obj(prop: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": prop}, "required": ["x"], **top}


class Inner(BaseModel):
    tier: Literal["gold", "free"]


class Nested(BaseModel):
    customer: Inner


class Cat(BaseModel):
    kind: Literal["cat"]
    indoor: bool


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]


ENUM = {"type": "string", "enum": ["a", "b"]}
SCORED = {
    "`enum`": [_obj(ENUM)],
    "`const`": [_obj({"oneOf": [{"const": "a", "description": "A"}, {"const": "b"}]})],
    "`boolean`": [_obj({"type": "boolean"})],
    "`integer` with `minimum`/`maximum`": [_obj({"type": "integer", "minimum": 1, "maximum": 5})],
    "`anyOf` with `null`": [_obj({"anyOf": [ENUM, {"type": "null"}]})],
    "`$defs`/`$ref` nested models": [Nested.model_json_schema()],
    "`oneOf` with a discriminator": [Pet.model_json_schema()],
    "`array` of `enum` items (multi-label)": [_obj({"type": "array", "items": ENUM})],
}
GENERATED = {
    "`string` (also with `minLength`/`maxLength`, `pattern`, `format: date`/`date-time`)": [
        _obj({"type": "string"}),
        _obj({"type": "string", "minLength": 2, "maxLength": 9}),
        _obj({"type": "string", "pattern": "^[A-Z]{3}$"}),
        _obj({"type": "string", "format": "date"}),
        _obj({"type": "string", "format": "date-time"}),
    ],
    "`number`": [_obj({"type": "number"}), _obj({"type": "number", "minimum": 0})],
    "`integer` without a range": [_obj({"type": "integer"})],
    "`array` of `string` items": [_obj({"type": "array", "items": {"type": "string"}})],
}
REFUSED = {
    "object maps": [_obj({"type": "object", "additionalProperties": {"type": "string"}})],
    "arrays of objects or numbers": [
        _obj({"type": "array", "items": {"type": "object", "properties": {"a": ENUM}}}),
        _obj({"type": "array", "items": {"type": "number"}}),
    ],
    "`not`": [_obj({"not": {"type": "string"}})],
    "other `format`s": [_obj({"type": "string", "format": "email"})],
}


def _parse(schema: dict[str, Any], text: str = "hello", **extra: Any):
    body = {
        "model": "pcd",
        "messages": [{"role": "user", "content": text}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
        **extra,
    }
    return parse_chat(body, ByteTokenizer())


def test_the_table_lists_exactly_the_kinds_tested_here():
    row = _row()
    assert "until generated fields land" not in row
    assert _items(row, "Scored") == list(SCORED)
    assert _items(row, "Generated") == list(GENERATED)
    assert _items(row, "Refused") == list(REFUSED)


@pytest.mark.parametrize("kind", list(SCORED))
def test_scored_kinds_compile_to_scored_fields(kind):
    for schema in SCORED[kind]:
        fields = _parse(schema).schema.fields
        assert fields and not any(f.generated for f in fields), (kind, schema)


@pytest.mark.parametrize("kind", list(GENERATED))
def test_generated_kinds_compile_to_generated_fields(kind):
    for schema in GENERATED[kind]:
        (field,) = _parse(schema).schema.fields
        assert field.generated, (kind, schema)


@pytest.mark.parametrize("kind", list(REFUSED))
def test_refused_kinds_are_a_422_naming_the_path(kind):
    for schema in REFUSED[kind]:
        with pytest.raises(ApiError) as e:
            _parse(schema)
        assert e.value.status == 422, (kind, e.value.message)
        assert "/properties/x" in e.value.message


def test_an_empty_conversation_is_refused_in_the_request_s_own_terms():
    with pytest.raises(ApiError) as e:
        _parse(_obj(ENUM), text="  \n ")
    assert e.value.status == 422 and e.value.field == "messages"
    assert 'extra_body={"pcd": {"allow_empty": true}}' in e.value.message
    assert "allow_empty=True" not in e.value.message
    assert _parse(_obj(ENUM), text="  ", pcd={"allow_empty": True}).context == "  "


# --- over HTTP ------------------------------------------------------------------------------


class Reply(BaseModel):
    """Answer the customer."""

    team: Literal["billing", "tech"]
    note: str = Field(max_length=4)


@pytest.fixture(scope="module")
def url(tiny, live):
    with live(create_app(tiny, max_questions=8)) as base:
        yield base + "/v1/chat/completions"


def _chat(url: str, text: str, **extra: Any) -> httpx.Response:
    body = {
        "model": "pcd",
        "messages": [{"role": "user", "content": text}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Reply", "schema": Reply.model_json_schema()},
        },
        **extra,
    }
    return httpx.post(url, json=body, timeout=300)


def test_http_empty_context_says_what_to_send(url):
    r = _chat(url, "   ")
    assert r.status_code == 422
    msg = r.json()["error"]["message"]
    assert 'extra_body={"pcd": {"allow_empty": true}}' in msg and "allow_empty=True" not in msg
    assert _chat(url, "   ", pcd={"allow_empty": True}).status_code == 200


@pytest.mark.parametrize("pcd", [{"orders": 2}, {"calibration": "contextual"}, {"scoring": "pmi"}])
def test_http_generated_fields_refuse_what_the_table_says(url, pcd):
    r = _chat(url, "refund me", pcd=pcd)
    assert r.status_code == 422, r.text
    assert "generated fields ['note']" in r.json()["error"]["message"]


def test_http_logprobs_skip_generated_fields(url):
    r = _chat(url, "refund me", logprobs=True)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    answer = json.loads(choice["message"]["content"])
    entries = choice["logprobs"]["content"]
    assert [json.loads(e["token"]) for e in entries] == [answer["team"]]
