"""Support intake: every second-stage schema kind in one decision.

`category` (8) -> `subcategory` (6 per category, `choices_by`, scored jointly with the
category in the first pass) -> `team` (`depends_on`, a second wave that sees both
answers written), `tags` as a multi-label field (10 labels, one yes/no each), `severity`
as an integer range 1-5, and a discriminated union of request kinds. `FLAT_SCHEMA` has
the same fields without the structure (every subcategory and team value allowed, the
union's fields side by side), for the cost of the joint pass against a flat one.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from pcd_tools import decision

NAME = "intake"
TITLE = "support intake (joint, waves, multi-label, range, union)"
REFERENCE: dict[str, object] = {}

SUBCATEGORIES = {
    "billing": ["double_charge", "refund_status", "invoice_error", "plan_change", "tax", "other"],
    "technical": ["outage", "performance", "data_loss", "integration", "mobile_app", "other"],
    "account": ["login", "password_reset", "two_factor", "deletion", "ownership", "other"],
    "security": ["phishing", "breach", "suspicious_login", "vulnerability", "abuse", "other"],
    "shipping": ["late", "damaged", "lost", "wrong_address", "customs", "other"],
    "product": ["feature_request", "bug_report", "documentation", "pricing", "feedback", "other"],
    "legal": ["gdpr_request", "contract", "subpoena", "copyright", "complaint", "other"],
    "sales": ["quote", "demo", "upgrade", "discount", "partnership", "other"],
}
TEAMS = [
    "billing_ops",
    "sre_oncall",
    "identity",
    "security_ir",
    "logistics",
    "product",
    "legal",
    "sales",
]
TAGS = [
    "angry_customer",
    "vip",
    "churn_risk",
    "repeat_contact",
    "money_involved",
    "data_privacy",
    "outage_related",
    "needs_callback",
    "mentions_competitor",
    "legal_threat",
]


class Refund(BaseModel):
    kind: Literal["refund"]
    amount_band: Literal["under_50", "50_to_500", "over_500"] = Field(
        description="How much money the refund is about"
    )


class BugReport(BaseModel):
    kind: Literal["bug_report"]
    reproducible: bool = Field(description="Whether the customer gives steps that reproduce it")
    platform: Literal["web", "ios", "android", "api"] = Field(description="Where it happens")


class AccessRequest(BaseModel):
    kind: Literal["access_request"]
    role: Literal["viewer", "editor", "admin"] = Field(description="The access level asked for")


class Question(BaseModel):
    kind: Literal["question"]
    answered_in_docs: bool = Field(description="Whether the public documentation answers it")


@decision
class SupportIntake(BaseModel):
    """Read an inbound support message and fill in the intake form for routing."""

    category: Literal[
        "billing", "technical", "account", "security", "shipping", "product", "legal", "sales"
    ] = Field(description="The area the message is about")
    subcategory: str = Field(
        description="The specific issue within the category",
        json_schema_extra={"choices_by": {"category": SUBCATEGORIES}},
    )
    team: Literal[tuple(TEAMS)] = Field(  # type: ignore[valid-type]
        description="The team that should own the ticket",
        json_schema_extra={"depends_on": ["category", "subcategory"]},
    )
    tags: list[Literal[tuple(TAGS)]] = Field(  # type: ignore[valid-type]
        description="Every flag that applies to the message"
    )
    severity: int = Field(ge=1, le=5, description="Severity from 1 (cosmetic) to 5 (business down)")
    request: Annotated[
        Refund | BugReport | AccessRequest | Question, Field(discriminator="kind")
    ] = Field(description="What the customer is asking for")


ALL_SUBS = list(dict.fromkeys(s for subs in SUBCATEGORIES.values() for s in subs))


class FlatIntake(BaseModel):
    """Read an inbound support message and fill in the intake form for routing."""

    category: Literal[
        "billing", "technical", "account", "security", "shipping", "product", "legal", "sales"
    ] = Field(description="The area the message is about")
    subcategory: Literal[tuple(ALL_SUBS)] = Field(  # type: ignore[valid-type]
        description="The specific issue within the category"
    )
    team: Literal[tuple(TEAMS)] = Field(  # type: ignore[valid-type]
        description="The team that should own the ticket"
    )
    tags: list[Literal[tuple(TAGS)]] = Field(  # type: ignore[valid-type]
        description="Every flag that applies to the message"
    )
    severity: int = Field(ge=1, le=5, description="Severity from 1 (cosmetic) to 5 (business down)")
    request_kind: Literal["refund", "bug_report", "access_request", "question"] = Field(
        description="What the customer is asking for"
    )
    amount_band: Literal["under_50", "50_to_500", "over_500"]
    reproducible: bool
    platform: Literal["web", "ios", "android", "api"]
    role: Literal["viewer", "editor", "admin"]
    answered_in_docs: bool


SCHEMA = SupportIntake
FLAT_SCHEMA = FlatIntake

CONTEXT = """\
Subject: charged twice AGAIN - third time I'm writing about this

Hi, this is Marta Keller, finance lead at Brightline Logistics (Enterprise plan, account
#88213). Our card was charged twice for the March invoice (2 x EUR 1,249.00) and nobody
has answered my last two emails. I need the duplicate EUR 1,249.00 refunded this week or
we will move to your competitor, who already offered us a quote. Please call me back on
+49 30 5557 1290 today. I also noticed the invoice PDF lists the wrong VAT number.
"""

CONTEXTS = (
    CONTEXT,
    """\
Our dashboards have been returning HTTP 502 for every user since 09:10 UTC. The iOS app
shows a blank screen too. This is blocking our whole operations team; we are a paying
Enterprise customer. Steps: open any dashboard -> spinner -> 502 after 30 s.""",
    """\
Hello, I'd like admin access to our workspace "northwind-analytics". Our previous admin
left the company last week and nobody can add new users. I'm the new IT manager; my
manager can confirm by email.""",
    """\
Quick question: does the Pro plan include SSO with Okta, or is that Enterprise only? I
couldn't find it on the pricing page.""",
)
