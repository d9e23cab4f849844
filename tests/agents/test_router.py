"""PCDRouter and route_on: exact routing with a logit-biased tiny model."""

from __future__ import annotations

import asyncio
import json
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


# --- the whole decision in the record, and the fields each decision scores ----------------


class Ticket(BaseModel):
    """Route a support ticket to the right team."""

    team: Literal["billing", "technical", "sales"] = Field(description="Which team handles it")
    urgency: Literal["low", "high"] = Field(description="How urgent it is")
    summary: str = Field(description="A one-line summary of the ticket", max_length=60)


TICKET = "I was charged twice for my subscription this month, please refund me today!"
TEAMS = {"billing": "billing", "technical": "tech", "sales": "sales"}


class Spy:
    """Records the decisions a decider makes (its `decide`, patched on the instance)."""

    def __init__(self, decider):
        self.decider, self.made = decider, []

    def __enter__(self):
        real = self.decider.decide

        def decide(*a, **k):
            d = real(*a, **k)
            self.made.append(d)
            return d

        self.decider.decide = decide
        return self.made

    def __exit__(self, *exc):
        del self.decider.decide


@pytest.mark.integration
def test_route_decides_only_what_the_routed_field_needs_with_the_same_probabilities(real):
    every = route_on(real, Ticket, "team", TEAMS, fields="all")
    route = route_on(real, Ticket, "team", TEAMS)  # fields="route", the default
    with Spy(real) as made:
        full = every.node({"input": TICKET})["pcd_decision"]
        rec = route.node({"input": TICKET})["pcd_decision"]
    json.dumps(rec), json.dumps(full)  # JSON-safe records
    assert set(full["decision"]["fields"]) == {"team", "urgency", "summary"}
    assert isinstance(full["decision"]["value"]["summary"], str)
    # "route": the routed field only; nothing generated
    assert set(rec["decision"]["fields"]) == {"team"} and rec["decision"]["value"] == {
        "team": rec["value"]
    }
    want = full["decision"]["fields"]["team"]["distribution"]
    got = rec["decision"]["fields"]["team"]["distribution"]
    assert got == pytest.approx(want, abs=1e-6)
    assert rec["probability"] == pytest.approx(full["probability"], abs=1e-6)
    assert rec["route"] == full["route"] == TEAMS[rec["value"]]
    all_d, route_d = made
    assert route_d.generate_ms == 0 < all_d.generate_ms
    assert route_d.sequential_forward_passes < all_d.sequential_forward_passes
    # no threshold: "review" below DecisionTool's 0.8
    assert rec["decision"]["action"] == ("review" if rec["probability"] < 0.8 else "act")
    assert rec["confidence"] == rec["decision"]["confidence"] == rec["probability"]


@pytest.mark.integration
def test_a_langgraph_handler_reads_another_field_without_deciding_again(real):
    from langgraph.graph import END, START, StateGraph

    class TicketState(TypedDict, total=False):
        input: str
        reply: str
        pcd_decision: dict

    route = route_on(real, Ticket, "team", TEAMS, fields=["urgency"], threshold=0.05)

    def team(name):
        def handle(state):
            d = state["pcd_decision"]["decision"]
            return {"reply": f"{name}:{d['fields']['urgency']['value']}:{sorted(d['value'])}"}

        return handle

    b = StateGraph(TicketState)
    b.add_node("classify", route.node)
    for name in ("billing", "tech", "sales"):
        b.add_node(name, team(name))
        b.add_edge(name, END)
    b.add_edge(START, "classify")
    b.add_conditional_edges("classify", route)
    with Spy(real) as made:
        out = b.compile().invoke({"input": TICKET})
    assert len(made) == 1  # one decision: the node's; the edge and the handler reuse it
    d = made[0]
    rec = out["pcd_decision"]
    assert out["reply"] == f"{rec['route']}:{d.fields['urgency'].label}:['team', 'urgency']"
    assert rec["decision"]["action"] == "act"  # both fields above the router's threshold


def test_router_passes_the_whole_decision_in_metadata(to_poem):
    router = PCDRouter(to_poem, Route, "step", {"poem": _branch("P"), "jtxl": _branch("J")})
    _, _, meta = router.invoke("Write me a poem")
    d = meta["decision"]
    assert d["value"] == {"step": "poem"} and d["action"] == "act"
    assert d["fields"]["step"]["probability"] == meta["probability"]
    assert d["fields"]["step"]["distribution"] == meta["distribution"]
    assert router.last_decision["decision"] == d
    low = PCDRouter(
        to_poem,
        Route,
        "step",
        {"poem": _branch("P")},
        threshold=0.9,
        default=_branch("D"),
        temperature=1e6,
    )
    assert low.invoke("Write me a poem")[2]["decision"]["action"] == "review"
    small = biased_decider(forcing("p"), context_window=400)
    err = PCDRouter(small, Route, "step", {"poem": _branch("P")}, default=_branch("D"))
    meta = err.invoke("x" * 1000)[2]
    assert meta["reason"] == "error" and meta["decision"] is None and meta["confidence"] is None


def test_fields_must_name_fields_of_the_schema(to_poem):
    routes = {"poem": "poet", "jtxl": "joker"}
    with pytest.raises(InvalidArgumentError, match=r"names \['mood'\].*\['step'\]"):
        route_on(to_poem, Route, "step", routes, fields=["mood"])
    with pytest.raises(InvalidArgumentError, match=r"fields=\['step'\]"):
        PCDRouter(to_poem, Route, "step", {"poem": _branch("P")}, fields="step")
    with pytest.raises(InvalidArgumentError, match="is 'some'; accepted: 'route'"):
        route_on(to_poem, Route, "step", routes, fields="some")
    with pytest.raises(InvalidArgumentError, match="list of field names"):
        route_on(to_poem, Route, "step", routes, fields=3)
    assert route_on(to_poem, Route, "step", routes, fields=("step",)) is not None
