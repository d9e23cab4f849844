"""`langchain-mcp-adapters` loads `pcd mcp`'s tools into a LangGraph agent's `ToolNode`,
which calls them: the agent gets the value as text and the whole result as the artifact."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.mcp, pytest.mark.langchain, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def _agent(tools: list[Any], calls: list[dict[str, Any]]) -> Any:
    """A graph: a scripted 'model' asks for `calls`, the ToolNode runs them, then it ends."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    g.add_edge(START, "model")
    g.add_edge("model", "tools")
    g.add_edge("tools", END)
    return g.compile()


def test_tool_node_calls_pcd_tools(real: Any) -> None:
    asyncio.run(_tool_node_calls_pcd_tools(real))


async def _tool_node_calls_pcd_tools(decider: Any) -> None:
    from langchain_mcp_adapters.client import MultiServerMCPClient

    from pcd_tools.mcp.generic import classify_schema
    from tests.mcp.schemas import ListingReview

    client = MultiServerMCPClient(
        {
            "pcd": {
                "command": sys.executable,
                "args": ["-m", "pcd_tools", "mcp", "--schema", "tests.mcp.schemas:ListingReview"],
                "transport": "stdio",
                "cwd": str(ROOT),
                "env": dict(os.environ),
            }
        }
    )
    tools = await client.get_tools()
    assert sorted(t.name for t in tools) == [
        "classify",
        "listing_review",
        "listing_review_batch",
        "tag",
        "yes_no",
    ]
    text = "Brand new laptop, still sealed in its box."
    calls = [
        {"name": "listing_review", "args": {"text": text}, "id": "c1", "type": "tool_call"},
        {
            "name": "classify",
            "args": {"text": text, "labels": ["computer", "food"]},
            "id": "c2",
            "type": "tool_call",
        },
        {
            "name": "classify",
            "args": {"text": text, "labels": ["x"]},
            "id": "c3",
            "type": "tool_call",
        },
    ]
    out = await _agent(tools, calls).ainvoke({"messages": [("user", "review this")]})
    msgs = {m.tool_call_id: m for m in out["messages"] if m.type == "tool"}
    review = msgs["c1"]
    d = decider.decide(ListingReview, text)
    content = review.content[0]["text"] if isinstance(review.content, list) else review.content
    assert json.loads(content) == d.value.model_dump(mode="json")
    result = review.artifact["structured_content"]
    for name, f in d.fields.items():
        assert result["fields"][name]["value"] == f.label
        assert abs(result["fields"][name]["probability"] - f.probability) <= 1e-6
    cls = msgs["c2"].artifact["structured_content"]
    ref = decider.decide(classify_schema(("computer", "food"), None), text).fields["label"]
    assert cls["label"] == ref.label and abs(cls["probability"] - ref.probability) <= 1e-6
    assert msgs["c3"].status == "error" and "accepted: 2 or more labels" in str(msgs["c3"].content)
