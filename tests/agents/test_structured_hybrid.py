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


def test_a_cascade_refuses_generated_fields_by_name(tiny_agents):
    from pcd_tools.agents import Cascade

    with pytest.raises(InvalidArgumentError, match=r"generated fields yet \(\['reason'\]"):
        Cascade(Routed, [tiny_agents])
