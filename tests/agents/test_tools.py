"""DecisionTool: a LangChain tool with content_and_artifact output, sync and async."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import ToolException
from langchain_tests.unit_tests import ToolsUnitTests
from pydantic import BaseModel, Field

from pcd_tools.agents import DecisionTool
from pcd_tools.answers.result import Decision
from tests.agents.helpers import biased_decider
from tests.conftest import tiny_decider
from tests.schemas import Ticket

pytestmark = pytest.mark.langchain

_TOOL_DECIDER = tiny_decider(0)


class TestDecisionToolStandard(ToolsUnitTests):
    @property
    def tool_constructor(self):
        return _TOOL_DECIDER.as_tool(Ticket)

    @property
    def tool_invoke_params_example(self):
        return {"text": "The checkout page returns 500 for every customer."}


def test_as_tool_defaults(tiny_agents):
    tool = tiny_agents.as_tool(Ticket)
    assert isinstance(tool, DecisionTool)
    assert tool.name == "classify_ticket"
    assert tool.description.startswith("Triage an inbound customer support ticket.")
    assert '"P0_CRITICAL"' in tool.description
    assert tool.response_format == "content_and_artifact"
    assert list(tool.args) == ["text"]


def test_name_and_description(tiny_agents):
    tool = tiny_agents.as_tool(Ticket, name="triage", description="Triage a ticket.")
    assert (tool.name, tool.description) == ("triage", "Triage a ticket.")


def test_content_and_artifact(tiny_agents):
    tool = tiny_agents.as_tool(Ticket, threshold=0.99999999)
    msg = tool.invoke(
        {"type": "tool_call", "id": "call_1", "name": tool.name, "args": {"text": "Server down"}}
    )
    assert isinstance(msg, ToolMessage)
    assert isinstance(msg.artifact, Decision)
    d = msg.artifact
    content = json.loads(msg.content)
    assert content["values"] == {n: f.label for n, f in d.fields.items()}
    assert content["probabilities"] == {n: round(f.probability, 4) for n, f in d.fields.items()}
    assert content["low_confidence"] == d.low_confidence(0.99999999)
    assert msg.content == json.dumps(content, separators=(",", ":"))  # compact
    # a plain invoke returns the content only
    assert json.loads(tool.invoke({"text": "Server down"})) == content


class Complaint(BaseModel):
    customer: str = Field(description="Customer name")
    body: str = Field(description="The complaint")


def test_custom_args_schema_is_serialised(tiny_agents):
    tool = tiny_agents.as_tool(Ticket, args_schema=Complaint)
    assert set(tool.args) == {"customer", "body"}
    args = {"customer": "ACME", "body": "Invoice wrong"}
    msg = tool.invoke({"type": "tool_call", "id": "c", "name": tool.name, "args": args})
    expected = tiny_agents.decide(Ticket, json.dumps(args, sort_keys=True))
    assert msg.artifact.value == expected.value


def test_recoverable_error_raises_tool_exception():
    small = biased_decider({}, context_window=600)
    tool = small.as_tool(Ticket)
    with pytest.raises(ToolException, match="ContextTooLongError"):
        tool.invoke({"text": "x" * 2000})
    handled = small.as_tool(Ticket, handle_tool_error=True)
    msg = handled.invoke(
        {"type": "tool_call", "id": "c", "name": "t", "args": {"text": "x" * 2000}}
    )
    assert msg.status == "error"


def test_concurrent_ainvoke_matches_sequential_and_never_interleaves():
    decider = tiny_decider(0)
    tool = decider.as_tool(Ticket)
    texts = [f"Ticket {i}: the {'billing' if i % 2 else 'login'} page fails" for i in range(8)]
    expected = [decider.decide(Ticket, t) for t in texts]

    engine = decider.engine
    real_score = engine.score
    active, peak, threads = [0], [0], set()
    guard = threading.Lock()

    def spy(*a, **k):
        with guard:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            threads.add(threading.get_ident())
        try:
            time.sleep(0.01)  # widen the window in which interleaving would show
            return real_score(*a, **k)
        finally:
            with guard:
                active[0] -= 1

    engine.score = spy
    ticks = []

    async def ticker(stop):
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.005)

    async def main():
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        calls = [
            tool.ainvoke(
                {"type": "tool_call", "id": str(i), "name": tool.name, "args": {"text": t}}
            )
            for i, t in enumerate(texts)
        ]
        out = await asyncio.gather(*calls)
        stop.set()
        await tick
        return out

    try:
        results = asyncio.run(main())
    finally:
        del engine.score
    assert peak[0] == 1
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert len(ticks) >= 8  # the event loop kept running while the model worked
    for msg, exp in zip(results, expected):
        assert msg.artifact.value == exp.value
        for name, f in exp.fields.items():
            assert msg.artifact.fields[name].probability == pytest.approx(f.probability, rel=1e-4)
