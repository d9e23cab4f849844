"""with_structured_output on a model with generated fields (tiny model): reason, then route."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools.errors import GenerationLimitError, InvalidArgumentError

pytestmark = pytest.mark.langchain


class Routed(BaseModel):
    """Route a support message."""

    reason: str = Field(max_length=12, description="Why")
    route: Literal["billing", "technical", "sales"]


def test_reason_then_route_returns_the_instance_and_the_route_probability(tiny_agents):
    runnable = tiny_agents.with_structured_output(Routed, include_raw=True, max_new_tokens=24)
    out = runnable.invoke("I was charged twice.")
    parsed, raw = out["parsed"], out["raw"]
    assert isinstance(parsed, Routed) and out["parsing_error"] is None
    meta = raw.response_metadata
    p = meta["probabilities"]["route"]
    assert 0 < p <= 1 and p == max(meta["distributions"]["route"].values())
    assert meta["probabilities"]["reason"] is None and "reason" not in meta["distributions"]
    assert meta["confidence"] == p
    assert raw.usage_metadata["output_tokens"] == meta["pcd"]["field_telemetry"]["reason"]["tokens"]
    assert json.loads(raw.content) == parsed.model_dump()
    assert json.loads(meta["pcd"]["json_text"]) == parsed.model_dump()
    again = asyncio.run(tiny_agents.with_structured_output(Routed).ainvoke("I was charged twice."))
    assert again == parsed


def test_options_are_checked_when_the_runnable_is_built(tiny_agents):
    with pytest.raises(InvalidArgumentError, match="max_new_tokens must be an int >= 1"):
        tiny_agents.with_structured_output(Routed, max_new_tokens=0)
    with pytest.raises(GenerationLimitError):
        tiny_agents.with_structured_output(Routed, max_new_tokens=2).invoke("x")


def test_a_cascade_over_the_model_keeps_the_generated_reason_and_scores_the_route(tiny_agents):
    from pcd_tools.agents import Cascade

    res = Cascade(Routed, [tiny_agents], threshold=0.0).invoke("I was charged twice.")
    want = tiny_agents.decide(Routed, "I was charged twice.")
    assert res.value == want.value
    assert res.fields["reason"].probability is None
    assert res.fields["route"].probability == pytest.approx(want.fields["route"].probability)


def test_as_tool_returns_generated_values_without_probabilities(tiny_agents):
    from langchain_core.tools import ToolException

    tool = tiny_agents.as_tool(Routed, max_new_tokens=24)
    assert "reason (text, generated)" in tool.description
    assert "route (" in tool.description and "probability per scored field" in tool.description
    msg = tool.invoke(
        {
            "type": "tool_call",
            "id": "c1",
            "name": tool.name,
            "args": {"text": "I was charged twice."},
        }
    )
    content = json.loads(msg.content)
    want = tiny_agents.decide(Routed, "I was charged twice.", max_new_tokens=24)
    assert content["values"] == {n: f.label for n, f in want.fields.items()}
    assert content["probabilities"]["reason"] is None
    assert content["probabilities"]["route"] == round(want.fields["route"].probability, 4)
    assert "reason" not in content["low_confidence"]
    assert msg.artifact.fields["reason"].tokens == want.fields["reason"].tokens
    with pytest.raises(ToolException, match="GenerationLimitError"):
        tiny_agents.as_tool(Routed, max_new_tokens=2).invoke({"text": "x"})
    with pytest.raises(InvalidArgumentError, match="max_new_tokens must be an int >= 1"):
        tiny_agents.as_tool(Routed, max_new_tokens=0)
    with pytest.raises(InvalidArgumentError, match="orders=2"):
        tiny_agents.as_tool(Routed, orders=2)
