"""`orders=k` on every agents wrapper: passed through to `decide`, checked at construction."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.decisions import Choice

from pcd_tools.agents import (
    Cascade,
    DeciderStage,
    DecisionTool,
    PCDDecisionModel,
    PCDRouter,
    route_on,
)
from pcd_tools.agents.structured import structured_runnable
from pcd_tools.errors import InvalidArgumentError
from tests.schemas import Ticket

pytestmark = pytest.mark.langchain

TEXT = "I was charged twice and nobody answers my emails."
K = 3
ROUTES = {"P0_CRITICAL": "page", "P1_HIGH": "queue", "P2_NORMAL": "queue", "P3_LOW": "queue"}


class Spy:
    """Records the keyword arguments of every `decide` call, then decides with `inner`."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.model_id = inner.model_id
        self.calls: list[dict[str, Any]] = []

    def decide(self, schema: Any, context: str, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return self.inner.decide(schema, context, **kwargs)


def _close(got: dict[Any, float], want: dict[Any, float]) -> None:
    assert list(got) == list(want)
    for k, p in want.items():
        assert got[k] == pytest.approx(p, abs=1e-6)


@pytest.fixture(scope="module")
def want(tiny_agents):
    """The library's averaged decision, and a check that averaging changes it."""
    d = tiny_agents.decide(Ticket, TEXT, orders=K)
    one = tiny_agents.decide(Ticket, TEXT)
    assert d.orders == K and d.flip_rate is not None
    p1 = one.fields["priority"].distribution
    assert any(abs(p - p1[c]) > 1e-3 for c, p in d.fields["priority"].distribution.items())
    return d


def test_tool_passes_orders_and_reports_flip_rate(tiny_agents, want):
    spy = Spy(tiny_agents)
    tool = DecisionTool.from_decider(spy, Ticket, orders=K)
    msg = tool.invoke({"type": "tool_call", "id": "1", "name": tool.name, "args": {"text": TEXT}})
    assert spy.calls == [{"temperature": 1.0, "orders": K}]
    _close(msg.artifact.fields["priority"].distribution, want.fields["priority"].distribution)
    content = json.loads(msg.content)
    assert content["flip_rate"] == round(want.flip_rate, 4)
    plain = json.loads(tiny_agents.as_tool(Ticket).invoke({"text": TEXT}))
    assert set(plain) == {"values", "probabilities", "low_confidence"}


def test_structured_output_passes_orders(tiny_agents, want):
    spy = Spy(tiny_agents)
    res = structured_runnable(spy, Ticket, include_raw=True, orders=K).invoke(TEXT)
    assert spy.calls == [{"orders": K}]
    meta = res["raw"].response_metadata
    _close(meta["distributions"]["priority"], want.fields["priority"].distribution)
    assert meta["flip_rate"] == want.flip_rate
    assert meta["pcd"]["orders"] == K
    assert tiny_agents.with_structured_output(Ticket, orders=K).invoke(TEXT) == want.value
    plain = tiny_agents.with_structured_output(Ticket, include_raw=True).invoke(TEXT)
    assert "flip_rate" not in plain["raw"].response_metadata


def test_router_passes_orders_and_records_flip_rate(tiny_agents, want):
    spy = Spy(tiny_agents)
    router = PCDRouter(
        spy,
        Ticket,
        "priority",
        {"P0_CRITICAL": lambda x: "page"},
        orders=K,
        default=lambda x: "queue",
    )
    router.invoke(TEXT)
    assert spy.calls == [{"temperature": 1.0, "orders": K}]
    rec = router.last_decision
    assert rec is not None
    _close(rec["distribution"], want.fields["priority"].distribution)
    assert rec["flip_rate"] == want.fields["priority"].flip_rate


def test_route_on_passes_orders_and_stores_flip_rate(tiny_agents, want):
    spy = Spy(tiny_agents)
    route = route_on(spy, Ticket, "priority", ROUTES, orders=K)
    rec = route.node({"input": TEXT})["pcd_decision"]
    assert spy.calls == [{"temperature": 1.0, "orders": K}]
    _close(rec["distribution"], want.fields["priority"].distribution)
    assert rec["flip_rate"] == want.fields["priority"].flip_rate
    plain = route_on(tiny_agents, Ticket, "priority", ROUTES).node({"input": TEXT})
    assert "flip_rate" not in plain["pcd_decision"]


def test_decision_model_passes_orders(tiny_agents):
    spy = Spy(tiny_agents)
    model = PCDDecisionModel(decider=spy, orders=K)
    questions = {"team": Choice(instructions="Which team?", criteria=dict.fromkeys("abcd"))}
    ans = model.invoke({"state": TEXT, "questions": questions}).answers["team"]
    assert spy.calls == [{"temperature": 1.0, "orders": K}]
    schema, names = model._schema_for(questions)
    d = tiny_agents.decide(schema, TEXT, orders=K)
    _close(ans.probabilities, {str(c): p for c, p in d.fields[names["team"]].distribution.items()})


def test_cascade_decider_stage_passes_orders(tiny_agents, want):
    spy = Spy(tiny_agents)
    res = Cascade(Ticket, stages=[DeciderStage(spy, orders=K)], threshold=0.0).invoke(TEXT)
    assert spy.calls == [{"temperature": 1.0, "orders": K}]
    _close(res.decision.fields["priority"].distribution, want.fields["priority"].distribution)
    assert res.decision.orders == K


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "2", None])
def test_bad_orders_fail_at_construction(tiny_agents, bad):
    msg = f"orders must be an int >= 1 .*got {bad!r}"
    builders = [
        lambda: tiny_agents.as_tool(Ticket, orders=bad),
        lambda: tiny_agents.with_structured_output(Ticket, orders=bad),
        lambda: PCDRouter(
            tiny_agents, Ticket, "priority", {"P0_CRITICAL": lambda x: x}, orders=bad
        ),
        lambda: route_on(tiny_agents, Ticket, "priority", ROUTES, orders=bad),
        lambda: PCDDecisionModel(decider=tiny_agents, orders=bad),
        lambda: DeciderStage(tiny_agents, orders=bad),
    ]
    for build in builders:
        with pytest.raises(InvalidArgumentError, match=msg):
            build()
