"""Every threshold is checked when its object is built, by one check, naming the argument.

Out-of-range values used to be accepted and then escalate everything (`Cascade`), or
raise `LowConfidenceError: decision confidence 0.5484 below 1.5` at the first call (the
guard), issue 34.
"""

from __future__ import annotations

import math
from typing import Literal

import pytest
from pydantic import BaseModel

from pcd_tools.agents import Cascade, DecisionTool, PCDRouter, route_on
from pcd_tools.agents.threshold import check_threshold
from pcd_tools.errors import InvalidArgumentError

pytestmark = pytest.mark.langchain

BAD = [1.5, -0.1, 80, math.nan, math.inf, True, "0.8", None]


class Ticket(BaseModel):
    """Route a support ticket."""

    team: Literal["billing", "tech"]
    urgent: bool


def _msg(value) -> str:
    """The part of the message that depends on the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "a threshold is a number"
    return "a probability threshold is a probability in \\[0, 1\\]"


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 1, 1.0])
def test_probabilities_in_the_closed_interval_are_accepted(value):
    assert check_threshold(value, "x(threshold=)") == float(value)


@pytest.mark.parametrize("value", BAD)
def test_the_shared_check_refuses_and_names_the_argument(value):
    with pytest.raises(InvalidArgumentError, match=r"^f\(threshold=\): " + _msg(value)):
        check_threshold(value, "f(threshold=)")


def test_a_percentage_gets_a_hint():
    with pytest.raises(InvalidArgumentError, match=r"got 80 \(for 80%, write 0\.8\)"):
        check_threshold(80, "Cascade(threshold=)")


def test_entropy_thresholds_are_nats():
    assert check_threshold(2.5, "t", score="entropy") == 2.5
    assert check_threshold(0, "t", score="entropy") == 0.0
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(InvalidArgumentError, match=r"entropy threshold is a number of nats"):
            check_threshold(bad, "t", score="entropy")


@pytest.mark.parametrize("value", [1.5, -0.1, 80, math.nan, True])
def test_cascade_threshold(tiny_agents, value):
    with pytest.raises(InvalidArgumentError, match=r"Cascade\(threshold=\): " + _msg(value)):
        Cascade(Ticket, [tiny_agents], threshold=value)


def test_cascade_per_field(tiny_agents):
    with pytest.raises(InvalidArgumentError, match=r"Cascade\(per_field=\{'team': 80\}\): "):
        Cascade(Ticket, [tiny_agents], per_field={"team": 80})
    with pytest.raises(InvalidArgumentError, match=r"'urgent': \('margin', 1\.5\)"):
        Cascade(Ticket, [tiny_agents], per_field={"urgent": ("margin", 1.5)})
    with pytest.raises(InvalidArgumentError, match=r"entropy threshold"):
        Cascade(Ticket, [tiny_agents], per_field={"urgent": ("entropy", -1)})
    # an entropy in nats may exceed 1; probabilities at the ends of [0, 1] are fine
    c = Cascade(
        Ticket, [tiny_agents], threshold=1, per_field={"team": 0, "urgent": ("entropy", 1.2)}
    )
    assert c.thresholds == {"team": ("probability", 0.0), "urgent": ("entropy", 1.2)}
    with pytest.raises(InvalidArgumentError, match=r"entropy threshold"):
        Cascade(Ticket, [tiny_agents], threshold=-2, score="entropy")


@pytest.mark.parametrize("value", [2, -0.1, math.nan, "high"])
def test_as_tool_threshold(tiny_agents, value):
    with pytest.raises(InvalidArgumentError, match=r"DecisionTool\(threshold=\): " + _msg(value)):
        tiny_agents.as_tool(Ticket, threshold=value)
    with pytest.raises(InvalidArgumentError, match=r"DecisionTool\(threshold=\)"):
        DecisionTool(decider=tiny_agents, schema=Ticket, name="t", description="d", threshold=value)
    assert tiny_agents.as_tool(Ticket, threshold=0.3).threshold == 0.3


@pytest.mark.parametrize("value", [1.5, -0.1, math.nan])
def test_the_guard_threshold(tiny_agents, value):
    with pytest.raises(
        InvalidArgumentError, match=r"with_structured_output\(threshold=\): " + _msg(value)
    ):
        tiny_agents.with_structured_output(Ticket, threshold=value)


@pytest.mark.parametrize("value", [1.5, -0.1, math.nan, True])
def test_router_thresholds(tiny_agents, value):
    routes = {"billing": lambda x: x, "tech": lambda x: x}
    with pytest.raises(InvalidArgumentError, match=r"^route_on\(threshold=\): " + _msg(value)):
        route_on(tiny_agents, Ticket, "team", {"billing": "b", "tech": "t"}, threshold=value)
    with pytest.raises(InvalidArgumentError, match=r"^PCDRouter\(threshold=\): " + _msg(value)):
        PCDRouter(tiny_agents, Ticket, "team", routes, threshold=value)
