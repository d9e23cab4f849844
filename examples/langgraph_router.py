"""Route support tickets in a LangGraph graph with `route_on` (offline, embedded model).

    python examples/langgraph_router.py

A `classify` node scores the ticket once and stores the decision in the graph state;
the conditional edge then sends it to the team's node, or to a human when the model is
unsure. LangGraph infers the edges from `route_on`'s `Literal` return annotation.

With `fields="all"` the node decides every field of the schema, not only the one it
routes on, and keeps the whole decision as JSON under `state["pcd_decision"]["decision"]`:
each team's node reads the ticket's urgency from there, with no second decision. (The
default, `fields="route"`, decides the routed field alone, with the same probabilities.)
"""

from __future__ import annotations

from typing import Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, Field

from pcd_tools import Decider
from pcd_tools.agents import route_on


class TicketTopic(BaseModel):
    """Classify the support ticket by topic and urgency."""

    topic: Literal["payment", "bug", "login"] = Field(description="What the ticket is about")
    urgent: bool = Field(description="Whether the customer is blocked right now")


class State(TypedDict, total=False):
    input: str
    reply: str
    pcd_decision: dict


def team(name: str):
    def handle(state: State) -> dict:
        # the decision the classify node stored: every field, no second decision
        urgent = state["pcd_decision"]["decision"]["fields"]["urgent"]["value"]
        flag = "URGENT" if urgent else "normal"
        return {"reply": f"[{name}, {flag}] picked up: {state['input'][:40]}"}

    return handle


def build(decider: Decider, threshold: float = 0.75):
    route = route_on(
        decider,
        TicketTopic,
        field="topic",
        routes={"payment": "billing", "bug": "technical", "login": "account"},
        threshold=threshold,
        default="human",
        fields="all",  # also decide `urgent`, for the team's node
    )
    g = StateGraph(State)
    g.add_node("classify", route.node)  # decides once, stores state["pcd_decision"]
    for name in ("billing", "technical", "account", "human"):
        g.add_node(name, team(name))
        g.add_edge(name, END)
    g.add_edge(START, "classify")
    g.add_conditional_edges("classify", route)  # path map inferred from the Literal
    return g.compile()


TICKETS = [
    "I was charged twice for my subscription this month, please refund one payment.",
    "The app crashes with error 500 every time I open the dashboard.",
    "I forgot my password and cannot log in to my account.",
]


def main() -> None:
    decider = Decider.load()  # the embedded SmolLM2-135M-Instruct
    graph = build(decider)
    edges = sorted(e.target for e in graph.get_graph().edges if e.source == "classify")
    print(f"classify -> {edges}")
    for text in TICKETS:
        out = graph.invoke({"input": text})
        d = out["pcd_decision"]
        print(f"{d['value']:>9} p={d['probability']:.2f} ({d['reason']}) -> {out['reply']}")


if __name__ == "__main__":
    main()
