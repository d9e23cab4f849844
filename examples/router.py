"""A support-email router: the schema `pcd mcp --schema examples.router:Route` serves.

    python examples/router.py            # decides the sample emails on the embedded model
    pcd mcp --schema examples.router:Route          # the same schema as an MCP tool (stdio)

`Route` has three scored fields (team, urgency, needs_human) and one generated one
(summary). `EMAILS` holds twelve labelled sample emails (the team each belongs to), for
trying the router and comparing ways of calling it on the same model; the embedded
SmolLM2-135M gets 3 of them right, Qwen2.5-Coder-1.5B 10 (BENCHMARKS.md, "Agents").
"""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import BaseModel, Field


class Route(BaseModel):
    """Route an incoming customer-support email to the team that owns it, and say how
    urgent it is and whether a person must read it first."""

    team: Literal["billing", "technical", "account", "shipping", "sales"] = Field(
        description="The team that owns the email: billing (charges, refunds, invoices), "
        "technical (bugs, errors, outages), account (login, password, profile), shipping "
        "(deliveries, tracking, returns) or sales (pricing, plans, demos)",
    )
    urgency: Literal["low", "normal", "high"] = Field(
        description="How soon it needs an answer: high when the customer cannot work or "
        "is losing money"
    )
    needs_human: bool = Field(
        description="Whether a person must read it before any automatic reply (legal "
        "threats, angry customers, anything unusual)"
    )
    summary: str = Field(
        max_length=120, description="One short sentence saying what the customer wants"
    )


# (email, team): twelve labelled samples.
EMAILS: list[tuple[str, str]] = [
    ("I was charged twice for my March invoice, please refund the duplicate payment.", "billing"),
    ("Your app crashes with error 500 every time I open the reports page.", "technical"),
    ("I forgot my password and the reset email never arrives.", "account"),
    ("My order #4411 was supposed to arrive last week and tracking has not moved.", "shipping"),
    ("We are a team of 40, what would the enterprise plan cost us per year?", "sales"),
    ("The invoice you sent lists the wrong VAT number, can you reissue it?", "billing"),
    ("Since this morning's update the sync button does nothing on Android.", "technical"),
    ("Please change the email address on my profile to anna@example.com.", "account"),
    ("The parcel arrived damaged; how do I return it for a replacement?", "shipping"),
    ("Could someone give us a demo of the analytics add-on next Tuesday?", "sales"),
    ("You renewed my subscription after I cancelled it. I want my money back.", "billing"),
    ("I cannot log in: it says my account is locked after two-factor failed.", "account"),
]


def main() -> None:
    from pcd_tools import Decider

    decider = Decider.load(sys.argv[1] if len(sys.argv) > 1 else None)  # default: embedded
    right = 0
    for (text, team), d in zip(EMAILS, decider.decide_many(Route, [t for t, _ in EMAILS])):
        right += d.value.team == team
        print(f"{d.value.team:>9} p={d.fields['team'].probability:.2f} (label {team}): {text[:50]}")
    print(f"team right on {right}/{len(EMAILS)}")


if __name__ == "__main__":
    main()
