"""PCDRouter and route_on: exact routing with a logit-biased tiny model."""

from __future__ import annotations

import asyncio
from typing import Literal, TypedDict

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import RunnableLambda
from pydantic import BaseModel, Field

from pcd_tools.agents import PCDRouter, route_on
from pcd_tools.errors import InvalidArgumentError
from tests.agents.helpers import biased_decider, forcing

pytestmark = pytest.mark.langchain


class Route(BaseModel):
    """Route the request to the right writer."""

    # equal length, disjoint letters: a bias on the first letter decides exactly
    step: Literal["poem", "jtxl"] = Field(description="Which writer should answer")


@pytest.fixture(scope="module")
def to_poem():
    return biased_decider(forcing("p"))


def _branch(tag):
    return RunnableLambda(lambda x, config: (tag, x, config["metadata"].get("pcd_decision")))


class Events(BaseCallbackHandler):
    def __init__(self):
        self.events = []

    def on_custom_event(self, name, data, **kw):
        self.events.append((name, data))


def test_router_runs_the_chosen_branch_with_the_decision(to_poem):
    router = PCDRouter(
        to_poem, Route, field="step", routes={"poem": _branch("P"), "jtxl": _branch("J")}
    )
    spy = Events()
    tag, seen, meta = router.invoke("Write me a poem", config={"callbacks": [spy]})
    assert (tag, seen) == ("P", "Write me a poem")
    assert meta["value"] == "poem" and meta["reason"] == "decided" and meta["probability"] > 0.99
    assert [n for n, _ in spy.events] == ["pcd_decision"]
    assert spy.events[0][1]["value"] == "poem"
    assert router.last_decision["route"] == meta["route"]


def test_router_threshold_error_and_async(to_poem):
    routes = {"poem": _branch("P"), "jtxl": _branch("J")}
    low = PCDRouter(
        to_poem, Route, "step", routes, threshold=0.9, default=_branch("D"), temperature=1e6
    )
    tag, _, meta = low.invoke("Write me a poem")
    assert tag == "D" and meta["reason"] == "below_threshold" and meta["value"] == "poem"
    small = biased_decider(forcing("p"), context_window=400)
    err = PCDRouter(small, Route, "step", routes, default=_branch("D"))
    tag, _, meta = err.invoke("x" * 1000)
    assert tag == "D" and meta["reason"] == "error" and "ContextTooLongError" in meta["error"]
    no_default = PCDRouter(small, Route, "step", routes)
    with pytest.raises(Exception, match="context window"):
        no_default.invoke("x" * 1000)
    router = PCDRouter(to_poem, Route, "step", routes)
    assert asyncio.run(router.ainvoke({"input": "a poem please"}))[0] == "P"


def test_router_rejects_unknown_values(to_poem):
    with pytest.raises(InvalidArgumentError, match="not a value of step"):
        PCDRouter(to_poem, Route, "step", {"novel": _branch("N")})
    with pytest.raises(InvalidArgumentError, match="not in Route"):
        PCDRouter(to_poem, Route, "topic", {"poem": _branch("N")})


class State(TypedDict, total=False):
    input: str
    output: str
    pcd_decision: dict


def _graph(route, with_node):
    from langgraph.graph import END, START, StateGraph

    b = StateGraph(State)
    b.add_node("poet", lambda s: {"output": "poem"})
    b.add_node("joker", lambda s: {"output": "joke"})
    b.add_node("human", lambda s: {"output": "human"})
    for n in ("poet", "joker", "human"):
        b.add_edge(n, END)
    if with_node:
        b.add_node("classify", route.node)
        b.add_edge(START, "classify")
        b.add_conditional_edges("classify", route)
    else:
        b.add_conditional_edges(START, route)
    return b.compile()


def test_route_on_infers_the_path_map_from_its_literal(to_poem):
    route = route_on(
        to_poem, Route, field="step", routes={"poem": "poet", "jtxl": "joker"}, default="human"
    )
    assert route.__annotations__["return"] == Literal["poet", "joker", "human"]
    g = _graph(route, with_node=False)
    drawn = {(e.source, e.target) for e in g.get_graph().edges if e.source == "__start__"}
    assert drawn == {("__start__", "poet"), ("__start__", "joker"), ("__start__", "human")}
    assert g.invoke({"input": "Write me a poem"})["output"] == "poem"


def test_route_on_stores_the_decision_in_state_and_events(to_poem):
    route = route_on(
        to_poem,
        Route,
        field="step",
        routes={"poem": "poet", "jtxl": "joker"},
        default="human",
        threshold=0.5,
    )
    g = _graph(route, with_node=True)
    drawn = {e.target for e in g.get_graph().edges if e.source == "classify"}
    assert drawn == {"poet", "joker", "human"}
    calls = []
    real = to_poem.decide
    to_poem.decide = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        out = g.invoke({"input": "Write me a poem"})
    finally:
        del to_poem.decide
    assert out["output"] == "poem"
    rec = out["pcd_decision"]
    assert rec["field"] == "step" and rec["value"] == "poem" and rec["route"] == "poet"
    assert rec["probability"] > 0.99 and rec["threshold"] == 0.5
    assert len(calls) == 1  # the edge reused the stored decision

    async def events():
        return [e async for e in g.astream_events({"input": "Write me a poem"}, version="v2")]

    custom = [e for e in asyncio.run(events()) if e["event"] == "on_custom_event"]
    assert [e["name"] for e in custom] == ["pcd_decision"]
    assert custom[0]["data"]["route"] == "poet"


def test_route_on_below_threshold_goes_to_default(to_poem):
    route = route_on(
        to_poem,
        Route,
        "step",
        {"poem": "poet", "jtxl": "joker"},
        threshold=0.9,
        default="human",
        temperature=1e6,
    )
    assert _graph(route, with_node=False).invoke({"input": "Write me a poem"})["output"] == "human"
