"""A field of hundreds of labels through the server's `/v1/decide` and MCP tools (the
embedded model): certified, its JSON answer short, the same answer as `decide`."""

from __future__ import annotations

import asyncio
import json
import zoneinfo
from typing import Any, Literal

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from pcd_tools.answers.payload import DISTRIBUTION_TOP
from pcd_tools.serve.app import create_app
from tests.serve.live import live_server

pytestmark = pytest.mark.integration

ZONES = tuple(sorted(zoneinfo.available_timezones()))
TEXT = "Can we talk at 9am my time? I'm in Lisbon this week."


class Meeting(BaseModel):
    """Read a scheduling message."""

    zone: Literal[ZONES] = Field(description="The sender's IANA time zone")  # type: ignore[valid-type]


def test_v1_decide_takes_hundreds_of_values_and_answers_as_decide(real: Any) -> None:
    want = real.decide(Meeting, TEXT).fields["zone"]
    schema = {
        "zone": {
            "type": "enum",
            "choices": list(ZONES),
            "description": "The sender's IANA time zone",
        }
    }
    app = create_app(real, api_key="k")
    with live_server(app) as url:
        r = httpx.post(
            url + "/v1/decide",
            json={"schema": schema, "context": TEXT},
            headers={"Authorization": "Bearer k"},
            timeout=120,
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["parsed_json"]["zone"]["value"] == want.label
    tele = body["field_telemetry"]["zone"]
    assert tele["cardinality"] == len(ZONES)


def _call(srv: Any, name: str, args: dict[str, Any]) -> Any:
    async def go() -> Any:
        return await srv._tool_manager.call_tool(
            name, args, context=srv.get_context(), convert_result=True
        )

    return asyncio.run(go())


@pytest.mark.mcp
def test_an_mcp_tool_of_a_large_field_returns_a_short_certified_answer(real: Any) -> None:
    from pcd_tools.mcp import server

    srv = server(real, [Meeting], threshold=0.5)
    r = _call(srv, "meeting", {"text": TEXT})
    assert r.isError is False
    tool = next(t for t in asyncio.run(srv.list_tools()) if t.name == "meeting")
    jsonschema.validate(r.structuredContent, tool.outputSchema)
    zone = r.structuredContent["fields"]["zone"]
    want = real.decide(Meeting, TEXT).fields["zone"]
    assert zone["value"] == want.label and zone["candidates"] == len(ZONES)
    assert zone["certified"] is True and 1 <= len(zone["distribution"]) <= DISTRIBUTION_TOP
    assert zone["search"]["read"] < zone["search"]["positions"]
    assert len(json.dumps(r.structuredContent)) < 4000
    # the generic tool takes hundreds of labels too
    c = _call(srv, "classify", {"text": TEXT, "labels": list(ZONES[:300])})
    assert c.isError is False and c.structuredContent["label"] in ZONES[:300]
