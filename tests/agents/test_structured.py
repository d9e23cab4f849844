"""decider.with_structured_output: a drop-in for a chat model's structured runnable."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from pydantic import BaseModel, Field

from pcd_tools.agents import LowConfidenceError
from pcd_tools.errors import InvalidArgumentError
from tests.agents.helpers import biased_decider, forcing

pytestmark = pytest.mark.langchain


class Route(BaseModel):
    # LangChain's routing recipe (docs: LangGraph workflows, "Routing"), verbatim
    step: Literal["poem", "story", "joke"] = Field(
        None, description="The next step in the routing process"
    )


@pytest.fixture(scope="module")
def to_joke():
    # every byte but "j" costs ~400 nats: "joke" pays for 3 letters, "poem" 4, "story" 5
    return biased_decider(forcing("j"))


def test_routing_recipe_one_word_change(to_joke):
    decider = to_joke
    router = decider.with_structured_output(Route)  # was: llm.with_structured_output(Route)
    decision = router.invoke(
        [
            SystemMessage(
                content="Route the input to story, joke, or poem based on the user's request."
            ),
            HumanMessage(content="Tell me a joke about cats"),
        ]
    )
    assert isinstance(decision, Route)
    assert decision.step == "joke"


def test_accepts_string_messages_and_prompt_values(to_joke):
    r = to_joke.with_structured_output(Route)
    prompt = ChatPromptTemplate.from_messages([("system", "Route it."), ("human", "{q}")])
    outs = [
        r.invoke("Tell me a joke"),
        r.invoke([("human", "Tell me a joke")]),
        r.invoke(prompt.invoke({"q": "Tell me a joke"})),
        (prompt | r).invoke({"q": "Tell me a joke"}),
        asyncio.run(r.ainvoke("Tell me a joke")),
    ]
    assert [o.step for o in outs] == ["joke"] * 5


def test_system_messages_become_instructions(tiny_agents):
    r = tiny_agents.with_structured_output(Route, include_raw=True)
    with_sys = r.invoke([SystemMessage("Pick the best writer."), HumanMessage("hi")])
    from pcd_tools.agents.structured import with_instructions
    from pcd_tools.schema import compile_schema

    schema = with_instructions(compile_schema(Route), "Pick the best writer.")
    assert schema.instructions == "Pick the best writer."
    direct = tiny_agents.decide(schema, "hi")
    assert with_sys["parsed"] == direct.value


def test_include_raw(tiny_agents):
    out = tiny_agents.with_structured_output(Route, include_raw=True).invoke("hello")
    assert set(out) == {"raw", "parsed", "parsing_error"}
    assert out["parsing_error"] is None
    raw = out["raw"]
    assert isinstance(raw, AIMessage)
    dist = raw.response_metadata["distributions"]["step"]
    assert set(dist) == {"poem", "story", "joke"}
    assert sum(dist.values()) == pytest.approx(1.0)
    assert raw.tool_calls[0]["args"] == {"step": out["parsed"].step}
    assert raw.response_metadata["pcd"]["parsed_json"]["step"]["value"] == out["parsed"].step


def test_dict_schema_returns_dict(tiny_agents):
    spec = {"urgent": {"type": "boolean", "description": "Is it urgent?"}}
    out = tiny_agents.with_structured_output(spec).invoke("Server down")
    assert set(out) == {"urgent"} and isinstance(out["urgent"], bool)


def test_unknown_option(tiny_agents):
    with pytest.raises(InvalidArgumentError, match="unknown option"):
        tiny_agents.with_structured_output(Route, temprature=2.0)


def test_low_confidence_error_drives_with_fallbacks(to_joke):
    sure = to_joke.with_structured_output(Route, threshold=0.5)
    unsure = to_joke.with_structured_output(Route, threshold=0.5, temperature=1e6)
    with pytest.raises(LowConfidenceError) as info:
        unsure.invoke("Tell me a joke")
    err = info.value
    assert err.decision.fields["step"].label == "joke"
    assert err.fields == ["step"] and err.threshold == 0.5
    fallback = RunnableLambda(lambda _: Route(step="story"))
    chain = unsure.with_fallbacks([fallback], exceptions_to_handle=(LowConfidenceError,))
    assert chain.invoke("Tell me a joke").step == "story"
    chain = sure.with_fallbacks([fallback], exceptions_to_handle=(LowConfidenceError,))
    assert chain.invoke("Tell me a joke").step == "joke"


def test_examples_and_contextual_calibration_pass_through(tiny_agents):
    from pcd_tools.errors import InvalidExampleError

    examples = [("Tell me a joke", {"step": "joke"})]
    text = "Please route this message."
    runnable = tiny_agents.with_structured_output(
        Route, include_raw=True, examples=examples, calibration="contextual"
    )
    out = runnable.invoke(text)
    want = tiny_agents.decide(Route, text, examples=examples, calibration="contextual")
    assert out["parsed"] == want.value
    assert want.examples == 1 and want.calibration_method == "contextual"
    with pytest.raises(InvalidExampleError, match="step"):
        tiny_agents.with_structured_output(Route, examples=[("x", {"step": "song"})])
