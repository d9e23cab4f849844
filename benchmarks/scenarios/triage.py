"""Enterprise support triage: 28 routing fields decided from one long support ticket.

Booleans and enums are mixed, and several enums have multi-token values that share
prefixes (`BILLING`, `BILLING_DISPUTE`, `BILLING_REFUND`; `API`, `API_GATEWAY`;
`TIER1_SUPPORT`, `TIER2_SUPPORT`), which PCD scores over a token trie.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from pcd_tools import decision

NAME = "triage"
TITLE = "enterprise support triage"
REFERENCE = {"fields": 28, "autoregressive_ms": 1894, "pcd_ms": 268, "speedup": 7.0, "tokens": 312}


@decision
class SupportTriage(BaseModel):
    """Triage an inbound enterprise support ticket for a B2B SaaS analytics platform."""

    priority: Literal["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"] = Field(
        description="Urgency tier based on the customer's business impact"
    )
    category: Literal[
        "BILLING",
        "BILLING_DISPUTE",
        "BILLING_REFUND",
        "TECHNICAL",
        "TECHNICAL_OUTAGE",
        "ACCOUNT_ACCESS",
        "ACCOUNT_SETTINGS",
        "FEATURE_REQUEST",
        "SECURITY",
        "COMPLIANCE",
    ] = Field(description="Main topic of the ticket")
    product_area: Literal[
        "API",
        "API_GATEWAY",
        "DASHBOARD",
        "DATA_EXPORT",
        "DATA_PIPELINE",
        "INTEGRATIONS",
        "MOBILE_APP",
        "SSO",
    ] = Field(description="Part of the product the problem is in")
    requires_escalation: bool = Field(description="Whether an on-call engineer must be paged")
    customer_tier: Literal["ENTERPRISE", "ENTERPRISE_PLUS", "BUSINESS", "STARTER", "TRIAL"] = Field(
        description="The customer's subscription plan"
    )
    sentiment: Literal["VERY_NEGATIVE", "NEGATIVE", "NEUTRAL", "POSITIVE"] = Field(
        description="Tone of the customer's message"
    )
    churn_risk: Literal["LOW", "MEDIUM", "HIGH"] = Field(
        description="How likely the customer is to cancel over this"
    )
    sla_breach_risk: bool = Field(description="Whether the contractual SLA is at risk")
    outage_reported: bool = Field(description="Whether the customer reports a service outage")
    data_loss_reported: bool = Field(description="Whether the customer reports lost data")
    security_incident: bool = Field(description="Whether a security incident is suspected")
    affected_users: Literal[
        "ONE", "TEAM", "DEPARTMENT", "WHOLE_ORGANISATION", "MULTIPLE_ORGANISATIONS"
    ] = Field(description="How many of the customer's users are affected")
    business_impact: Literal["NONE", "DEGRADED", "BLOCKED", "REVENUE_LOSS"] = Field(
        description="Effect on the customer's business"
    )
    assigned_team: Literal[
        "TIER1_SUPPORT",
        "TIER2_SUPPORT",
        "SRE_ONCALL",
        "BILLING_OPS",
        "SECURITY_TEAM",
        "ACCOUNT_MANAGEMENT",
        "PRODUCT_TEAM",
    ] = Field(description="Team that should own the ticket")
    response_channel: Literal["EMAIL", "PHONE", "CHAT", "SLACK_CONNECT", "VIDEO_CALL"] = Field(
        description="Channel to answer on"
    )
    language: Literal["EN", "DE", "FR", "ES", "JA"] = Field(
        description="Language the customer writes in"
    )
    needs_engineering: bool = Field(description="Whether engineering must change code or infra")
    known_issue: bool = Field(
        description="Whether it matches an incident already on the status page"
    )
    workaround_available: bool = Field(description="Whether support can offer a workaround now")
    refund_requested: bool = Field(
        description="Whether the customer asks for money back or credits"
    )
    contract_renewal_soon: bool = Field(
        description="Whether the customer's contract renews within 90 days"
    )
    legal_threat: bool = Field(description="Whether the customer mentions lawyers or legal action")
    executive_involved: bool = Field(description="Whether a C-level or VP is copied or writing")
    follow_up_within: Literal["ONE_HOUR", "FOUR_HOURS", "ONE_DAY", "THREE_DAYS", "ONE_WEEK"] = (
        Field(description="When support must next update the customer")
    )
    root_cause_guess: Literal[
        "CONFIGURATION", "CODE_REGRESSION", "CAPACITY", "THIRD_PARTY", "USER_ERROR", "UNKNOWN"
    ] = Field(description="Most likely root cause from the ticket's details")
    region: Literal["US_EAST", "US_WEST", "EU_CENTRAL", "EU_WEST", "APAC"] = Field(
        description="Data region of the affected workspace"
    )
    duplicate_ticket: bool = Field(description="Whether the customer says they already filed this")
    auto_close_eligible: bool = Field(
        description="Whether the ticket can be closed automatically with a help-center article"
    )


SCHEMA = SupportTriage

CONTEXT = """\
Subject: URGENT - all scheduled exports failing since this morning's release, board meeting at 3pm

From: Dr. Helena Vogt, VP Data & Analytics, Nordwind Logistik AG (Enterprise Plus, workspace nordwind-prod, region eu-central-1)
Cc: Markus Brandt (CFO), our account manager Julia Reyes

Hello,

Since about 07:40 CET today every scheduled export in our production workspace has been
failing. We run 214 scheduled exports that push the previous day's shipment and invoicing
data into our Snowflake warehouse and into the S3 bucket our finance team reads from. All
of them now end in status "FAILED" with the error "403 Forbidden: token audience mismatch
(gateway)". Manual exports from the dashboard still work, and so does the REST API when we
call it directly with a personal token, so it looks like something in your API gateway
changed with the release you announced in last night's maintenance email (v24.18).

This is blocking our whole organisation: the finance department cannot close the month,
the operations planners in three countries are working from yesterday's numbers, and our
CFO needs the revenue report for a board meeting at 15:00 today. Every hour of delay
costs us real money because our carriers bill us penalties when our dispatch plans are late.

We already opened ticket #88213 through the chat widget two hours ago and only got a link to
a help-center article about rotating API keys, which we did, and it changed nothing. Please
do not send that article again.

Our contract is up for renewal at the end of next month and frankly this is the third
export incident this quarter. I need a phone call with an engineer who can see the gateway
logs within the hour, a written root-cause analysis, and I expect service credits for today.
If the SLA in our master agreement is breached again we will have to involve our legal
department.

Regards,
Helena Vogt
"""

CONTEXTS = (
    CONTEXT,
    """\
Subject: Question about adding two more seats

Hi team, we're a small design studio on the Starter plan (workspace pixelhaus, us-west).
Two new colleagues join next Monday. Can I add them myself from the billing page or do I
need to contact you? Also, will the price change in the middle of the month? No rush at
all, thanks for the great product! - Tom""",
    """\
Subject: Double charge on invoice INV-2024-0917

Bonjour, nous avons été débités deux fois pour la facture INV-2024-0917 (Business plan,
workspace atelier-lumiere, eu-west). Le montant de 1 840 EUR apparaît deux fois sur notre
relevé bancaire du 3 octobre. Merci de rembourser le doublon dès que possible; notre
comptable a besoin de la note de crédit avant la fin de la semaine. Cordialement,
Camille Martin, responsable administrative""",
    """\
Subject: Suspicious logins to our admin account

Our security team noticed 14 successful logins to the admin account of workspace
kobe-robotics (Enterprise, APAC) from IP addresses in countries where we have no staff,
all within the last 3 hours, and an API key named "backup" was created that nobody here
recognises. SSO via Okta is enabled but the logins did not go through Okta. We have
disabled the key. Please investigate urgently and tell us what data was accessed.
Kenji Watanabe, CISO""",
)
