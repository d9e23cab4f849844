"""Call `pcd mcp` as an MCP client would (offline, embedded model).

    python examples/mcp_client.py

Starts `pcd mcp --schema examples.router:Route` over stdio with the official SDK's client,
lists its tools, decides one email with the `route` tool, sends a batch with progress, and
asks the generic `classify` and `yes_no` tools a question formed at run time. Claude
Desktop, Cursor, the OpenAI Agents SDK or a LangGraph agent (langchain-mcp-adapters) start
and call the server the same way.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = Path(__file__).resolve().parents[1]


def wire(result: Any) -> dict[str, Any]:
    """A tool result as the JSON on the wire: `structuredContent`, `isError`, `content`
    (mcp 1.x names the attributes so, 2.x `structured_content` and `is_error`)."""
    return result.model_dump(by_alias=True, mode="json")


EMAIL = "I was charged twice for my March invoice, please refund the duplicate payment."


async def main() -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "pcd_tools", "mcp", "--schema", "examples.router:Route"],
        cwd=str(ROOT),  # MODULE:CLASS is imported from the server's working directory
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = (await session.list_tools()).tools
        print("tools:", ", ".join(t.name for t in tools))

        result = wire(await session.call_tool("route", {"text": EMAIL}))["structuredContent"]
        team = result["fields"]["team"]
        print(f"route: team={team['value']} p={team['probability']:.2f} action={result['action']}")

        async def progress(done: float, total: float | None, message: str | None) -> None:
            print(f"  progress {done:.0f}/{total:.0f}")

        batch = await session.call_tool(
            "route_batch",
            {"texts": [EMAIL, "The app crashes when I open the reports page."]},
            progress_callback=progress,
        )
        results = wire(batch)["structuredContent"]["results"]
        print("route_batch:", [r["value"]["team"] for r in results])

        labels = {"text": EMAIL, "labels": ["refund", "complaint", "question"]}
        c = wire(await session.call_tool("classify", labels))["structuredContent"]
        print(f"classify: {c['label']} p={c['probability']:.2f}")
        q = {"text": EMAIL, "question": "Does the customer want money back?"}
        y = wire(await session.call_tool("yes_no", q))["structuredContent"]
        print(f"yes_no: {y['answer']} p={y['probability']:.2f}")

        bad = wire(await session.call_tool("classify", {"text": EMAIL, "labels": ["only one"]}))
        print("bad input:", bad["isError"], bad["content"][0]["text"])


if __name__ == "__main__":
    asyncio.run(main())
