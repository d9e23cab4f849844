"""Schemas shared by tests."""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, Field

from pcd_tools import decision


class Department(enum.Enum):
    BILLING = "BILLING"
    BILLING_DISPUTE = "BILLING_DISPUTE"
    TECHNICAL = "TECHNICAL"
    ACCOUNT = "ACCOUNT"


@decision
class Ticket(BaseModel):
    """Triage an inbound customer support ticket."""

    priority: Literal["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"] = Field(
        description="Urgency tier based on customer business impact"
    )
    requires_escalation: bool = Field(description="Whether an on-call engineer must be notified")
    department: Department = Field(description="Team that should own the ticket")


class Sentiment(BaseModel):
    positive: bool
    """Whether the text expresses a positive opinion."""

    topic: Literal["food", "service", "price"] | None = Field(
        default=None, description="What it is about"
    )


def hs_codes(n: int = 255) -> list[str]:
    """n distinct 6-digit codes sharing prefixes (multi-token under digit splitting)."""
    out = []
    chapter = 1
    while len(out) < n:
        for heading in range(1, 6):
            for sub in (10, 20, 90):
                out.append(f"{chapter:02d}{heading:02d}{sub:02d}")
        chapter += 1
    return out[:n]


def wide_schema_dict(n_fields: int = 28) -> dict:
    """A 28-field dict schema of mixed booleans and enums, with shared-prefix choices."""
    enums = [
        ["BILLING", "BILLING_DISPUTE", "TECHNICAL", "ACCOUNT_ACCESS", "ACCOUNT"],
        ["P0", "P1", "P2", "P3"],
        ["low", "medium", "high"],
        ["email", "phone", "chat", "social_media", "in_person"],
        ["yes", "no", "unclear"],
    ]
    spec = {}
    for i in range(n_fields):
        if i % 3 == 0:
            spec[f"flag_{i}"] = {"type": "boolean", "description": f"Whether condition {i} holds"}
        else:
            spec[f"enum_{i}"] = {
                "type": "enum",
                "choices": enums[i % len(enums)],
                "description": f"Category {i} of the ticket",
            }
    return spec
