"""`pcd_tools.mcp` in process: tool names and schemas, build-time errors, calibration per
schema, progress and cancellation of the batch path, and the `pcd mcp` command's checks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools.cli import main
from pcd_tools.errors import InvalidArgumentError, SchemaError
from pcd_tools.schema import compile_schema
from tests.mcp.schemas import ListingReview, SupportTicket

pytestmark = [pytest.mark.mcp]

ROOT = Path(__file__).resolve().parents[2]


class HTTPRouter(BaseModel):
    """Pick a backend."""

    backend: Literal["a", "b"] = Field(description="Backend")


class Classify(BaseModel):
    """Clashes with the generic tool's name."""

    label: Literal["x", "y"]


def _call(srv: Any, name: str, args: dict[str, Any]) -> Any:
    """The tool's CallToolResult, through the SDK's own call path (mcp 1.x in this venv)."""

    async def go() -> Any:
        return await srv._tool_manager.call_tool(
            name, args, context=srv.get_context(), convert_result=True
        )

    return asyncio.run(go())


@pytest.mark.unit
def test_tool_names_are_snake_case() -> None:
    from pcd_tools.mcp import tool_name

    assert tool_name(compile_schema(ListingReview)) == "listing_review"
    assert tool_name(compile_schema(HTTPRouter)) == "http_router"
    assert tool_name(compile_schema(SupportTicket)) == "support_ticket"


@pytest.mark.integration
def test_tools_listed_with_schemas_and_annotations(real: Any) -> None:
    from pcd_tools.mcp import server

    srv = server(real, [ListingReview, SupportTicket], threshold=0.7)
    tools = {t.name: t for t in asyncio.run(srv.list_tools())}
    assert list(tools) == [
        "listing_review",
        "listing_review_batch",
        "support_ticket",
        "support_ticket_batch",
        "classify",
        "tag",
        "yes_no",
    ]
    for t in tools.values():
        assert t.annotations.readOnlyHint is True and t.annotations.idempotentHint is True
        assert t.outputSchema["type"] == "object"
    out = tools["listing_review"].outputSchema
    assert set(out["required"]) == {"value", "confidence", "fields", "action"}
    assert out["properties"]["action"]["enum"] == ["act", "review"]
    fields = out["$defs"]["ListingReviewFields"]
    assert list(fields["properties"]) == ["category", "prohibited", "colour", "condition", "tags"]
    assert "below 0.7" in tools["listing_review"].description
    assert (
        "- title (generated text): A short title for the ticket"
        in tools["support_ticket"].description
    )
    assert tools["listing_review"].inputSchema["properties"] == {
        "text": {
            "description": "The text to decide on, verbatim.",
            "title": "Text",
            "type": "string",
        }
    }


@pytest.mark.integration
def test_result_is_structured_plus_value_text(real: Any) -> None:
    from pcd_tools.mcp import server

    srv = server(real, [ListingReview], threshold=0.99)
    text = "Selling a vintage red lamp, handmade, like new."
    r = _call(srv, "listing_review", {"text": text})
    d = real.decide(ListingReview, text)
    assert r.isError is False
    assert json.loads(r.content[0].text) == d.value.model_dump(mode="json")
    data = r.structuredContent
    assert data["value"] == d.value.model_dump(mode="json")
    assert data["confidence"] == pytest.approx(d.confidence, abs=1e-6)
    assert data["action"] == ("review" if d.low_confidence(0.99) else "act")
    assert data["fields"]["condition"]["distribution"] == {
        str(k): pytest.approx(v, abs=1e-6) for k, v in d.fields["condition"].distribution.items()
    }
    assert data["fields"]["colour"]["distribution"]["null"] == pytest.approx(
        d.fields["colour"].distribution[None], abs=1e-6
    )


@pytest.mark.integration
def test_tag_returns_the_ranked_labels_of_a_large_set(real: Any) -> None:
    from pcd_tools.mcp import server
    from pcd_tools.mcp._sdk import ToolError
    from pcd_tools.mcp.generic import tag_schema

    srv = server(real, [], threshold=0.5)
    labels = [f"topic {i:03d}" for i in range(300)] + ["refund", "shipping delay"]
    text = "My parcel is two weeks late and I want my money back."
    r = _call(srv, "tag", {"text": text, "labels": labels, "max_labels": 2})
    assert r.isError is False
    data = r.structuredContent
    f = real.decide(tag_schema(tuple(labels), None, 0.1, 2), text).fields["labels"]
    assert data["labels"] == f.label and len(data["labels"]) <= 2
    assert json.loads(r.content[0].text) == f.label
    assert data["probability"] == pytest.approx(f.probability, abs=1e-6)
    assert data["certified"] is True  # 302 labels: read by certified pruned search
    assert len(data["distribution"]) <= 20  # a large set shows its 20 most probable
    assert data["action"] == ("review" if f.probability < 0.5 else "act")
    with pytest.raises(ToolError, match="max_labels must be a whole number from 1 to the 302"):
        _call(srv, "tag", {"text": text, "labels": labels, "max_labels": 400})


@pytest.mark.integration
def test_build_errors(real: Any) -> None:
    from pcd_tools.mcp import server

    with pytest.raises(InvalidArgumentError, match=r"threshold is a probability in \[0, 1\]"):
        server(real, [ListingReview], threshold=1.5)
    with pytest.raises(InvalidArgumentError, match="two tools would be named 'classify'"):
        server(real, [Classify])
    server(real, [Classify], generic=False)  # no clash without the generic tools
    with pytest.raises(InvalidArgumentError, match="no tools to serve"):
        server(real, [], generic=False)
    with pytest.raises(InvalidArgumentError, match="max_text_chars must be an int >= 1"):
        server(real, [ListingReview], max_text_chars=0)
    with pytest.raises(SchemaError):
        server(real, [int])


def _calibration(decider: Any, schema: Any, temperature: float) -> Any:
    from pcd_tools.answers.calibration import Calibration

    s = compile_schema(schema)
    return Calibration(
        model_id=decider.model_id,
        schema_name=s.name,
        schema_fingerprint=s.fingerprint(),
        temperatures={f.name: temperature for f in s.fields if not f.generated},
    )


@pytest.mark.integration
def test_calibration_applies_to_its_schema_only(real: Any) -> None:
    from pcd_tools.answers.calibration import CalibrationMismatchError
    from pcd_tools.mcp import server

    cal = _calibration(real, ListingReview, 3.0)
    srv = server(real, [ListingReview, HTTPRouter], calibration=cal)
    text = "Brand new laptop, still sealed in its box."
    got = _call(srv, "listing_review", {"text": text}).structuredContent
    want = real.with_calibration(cal).decide(ListingReview, text)
    plain = real.decide(ListingReview, text)
    assert got["fields"]["category"]["probability"] == pytest.approx(
        want.fields["category"].probability, abs=1e-6
    )
    assert abs(want.fields["category"].probability - plain.fields["category"].probability) > 1e-3
    other = _call(srv, "http_router", {"text": text}).structuredContent
    assert other["fields"]["backend"]["probability"] == pytest.approx(
        real.decide(HTTPRouter, text).fields["backend"].probability, abs=1e-6
    )
    with pytest.raises(CalibrationMismatchError, match="none of the served schemas"):
        server(real, [HTTPRouter], calibration=cal)
    with pytest.raises(InvalidArgumentError, match="carries a fitted calibration"):
        server(real.with_calibration(cal), [ListingReview])


@pytest.mark.integration
def test_adecide_many_reports_progress_and_cancels_the_rest(real: Any) -> None:
    from pcd_tools.decide.aio import DecisionQueue, queue_for

    texts = [f"Listing number {i}: a used chair." for i in range(40)]
    seen: list[tuple[int, int]] = []

    async def complete() -> list[Any]:
        async def progress(done: int, total: int) -> None:
            seen.append((done, total))

        return await real.adecide_many(HTTPRouter, texts[:6], progress=progress)

    out = asyncio.run(complete())
    assert [s[0] for s in seen] == [1, 2, 3, 4, 5, 6] and {s[1] for s in seen} == {6}
    assert [d.value for d in out] == [d.value for d in real.decide_many(HTTPRouter, texts[:6])]

    queue = queue_for(real)
    saved = queue.max_batch
    queue.max_batch = 4  # ten batches of four
    try:
        before = queue.batches

        async def cancelled() -> None:
            task: asyncio.Task[Any]

            def progress(done: int, total: int) -> None:
                task.cancel()  # after the first decision

            task = asyncio.ensure_future(real.adecide_many(HTTPRouter, texts, progress=progress))
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0)

        asyncio.run(cancelled())
        real.decide(HTTPRouter, "drain")  # runs after whatever was still queued
        ran = queue.batches - before
        assert 1 <= ran <= 3, f"{ran} batches of 4 ran after cancelling a call of 40"
        assert isinstance(queue, DecisionQueue)
    finally:
        queue.max_batch = saved


@pytest.mark.unit
def test_pcd_mcp_option_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", "--schema", "nocolon"]) == 2
    assert "accepted: MODULE:CLASS" in capsys.readouterr().err
    assert main(["mcp", "--schema", "no_such_module_xyz:Route"]) == 2
    assert "cannot import module 'no_such_module_xyz'" in capsys.readouterr().err
    assert main(["mcp", "--schema", "tests.mcp.schemas:Nope"]) == 2
    assert "has no 'Nope'; it defines" in capsys.readouterr().err
    assert main(["mcp", "--threshold", "2"]) == 2
    assert "--threshold is a probability" in capsys.readouterr().err
    assert main(["mcp", "--http", "--host", "0.0.0.0"]) == 2
    assert "refusing to bind '0.0.0.0' without an API key" in capsys.readouterr().err
    assert main(["mcp", "--max-batch", "0"]) == 2
    assert "--max-batch must be >= 1" in capsys.readouterr().err


@pytest.mark.unit
def test_help_names_mcp_and_the_client_snippet() -> None:
    top = subprocess.run(
        [sys.executable, "-m", "pcd_tools", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert "mcp" in top.stdout and "MCP tools" in top.stdout
    sub = subprocess.run(
        [sys.executable, "-m", "pcd_tools", "mcp", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert '"mcpServers"' in sub.stdout and "--http" in sub.stdout and "--api-key" in sub.stdout
