"""LangChain's `ChatOpenAI` pointed at `pcd serve`: `with_structured_output` by JSON schema
and by function calling (with `include_raw=True`), and inside a LangGraph node."""

from __future__ import annotations

from typing import Literal, TypedDict

import pytest
from pydantic import BaseModel, Field

from pcd_tools.serve.app import create_app

pytestmark = [pytest.mark.serve, pytest.mark.langchain]
langchain_openai = pytest.importorskip("langchain_openai")

KEY = "lc-key"
TEXT = "The checkout page returns a 500 error for every customer in the EU."


class Route(BaseModel):
    """Route a support ticket to the team that should answer it."""

    team: Literal["billing", "tech", "sales"] = Field(description="Team that should handle it")
    urgent: bool = Field(description="Does it need an answer today?")


@pytest.fixture(scope="module")
def llm(tiny, live):
    app = create_app(tiny, api_key=KEY)
    with live(app) as url:
        yield langchain_openai.ChatOpenAI(
            base_url=url + "/v1", api_key=KEY, model="pcd", max_retries=0
        )


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(llm, tiny, method):
    want = tiny.decide(Route, TEXT)
    got = llm.with_structured_output(Route, method=method).invoke(TEXT)
    assert got == want.value
    raw = llm.with_structured_output(Route, method=method, include_raw=True).invoke(TEXT)
    assert raw["parsed"] == want.value and raw["parsing_error"] is None
    meta = raw["raw"].response_metadata
    assert meta["finish_reason"] == ("stop" if method == "json_schema" else "tool_calls")
    assert raw["raw"].usage_metadata["input_tokens"] == want.prompt_tokens


def test_in_a_langgraph_node(llm, tiny):
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        text: str
        team: str
        urgent: bool

    router = llm.with_structured_output(Route)

    def route(state: State) -> State:
        r = router.invoke(state["text"])
        return {"team": r.team, "urgent": r.urgent}

    g = StateGraph(State)
    g.add_node("route", route)
    g.add_edge(START, "route")
    g.add_edge("route", END)
    out = g.compile().invoke({"text": TEXT})
    want = tiny.decide(Route, TEXT).value
    assert (out["team"], out["urgent"]) == (want.team, want.urgent)


def test_plain_invoke_is_refused_with_the_how_to(llm):
    import openai

    with pytest.raises(openai.BadRequestError, match="with_structured_output"):
        llm.invoke("hello")
