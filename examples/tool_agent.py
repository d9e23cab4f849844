"""A tool-calling agent that uses a `DecisionTool` (offline, embedded model).

    python examples/tool_agent.py

The tool scores a ticket on the embedded SmolLM2-135M and answers with compact JSON
(values, probabilities, low-confidence fields) for the agent, plus the full `Decision`
as the ToolMessage artifact for your code. Offline there is no chat LLM to drive the
agent, so `ScriptedPlanner` stands in for one: it calls the tool, then writes a reply
from the tool's JSON. Swap in any tool-calling chat model, e.g.
`create_agent("openai:gpt-5-mini", tools=[tool])`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import BaseModel, Field

from pcd_tools import Decider


class Triage(BaseModel):
    """Triage an inbound customer support ticket."""

    priority: Literal["urgent", "normal", "low"] = Field(description="How fast to respond")
    requires_escalation: bool = Field(description="Whether an on-call engineer must be paged")


class ScriptedPlanner(BaseChatModel):
    """A stand-in for a tool-calling LLM: call the tool once, then summarise its JSON."""

    tool_name: str

    @property
    def _llm_type(self) -> str:
        return "scripted-planner"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedPlanner:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, **kw: Any) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            result = json.loads(last.content)
            v, p = result["values"], result["probabilities"]
            text = (
                f"Priority {v['priority']} (p={p['priority']:.2f}); "
                f"{'page on-call' if v['requires_escalation'] else 'no page'} "
                f"(p={p['requires_escalation']:.2f})."
            )
            if result["low_confidence"]:
                text += f" Low confidence on {result['low_confidence']}: a human should check."
            msg = AIMessage(text)
        else:
            ticket = next(m for m in reversed(messages) if isinstance(m, HumanMessage)).text
            call = {"name": self.tool_name, "args": {"text": ticket}, "id": "call_1"}
            msg = AIMessage("", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=msg)])


def main() -> None:
    decider = Decider.load()
    tool = decider.as_tool(Triage, threshold=0.7)  # a DecisionTool
    agent = create_agent(ScriptedPlanner(tool_name=tool.name), tools=[tool])
    ticket = "Production is down for all customers since 9am and checkout fails!"
    out = agent.invoke({"messages": [HumanMessage(ticket)]})
    tool_msg = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    print("tool content :", tool_msg.content)
    decision = tool_msg.artifact  # the full pcd_tools Decision
    print("distributions:", {n: f.distribution for n, f in decision.fields.items()})
    print("agent reply  :", out["messages"][-1].content)


if __name__ == "__main__":
    main()
