"""Schemas the MCP tests serve: every kind of field a tool result carries."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field


class Colour(str, Enum):
    RED = "red"
    GREEN = "green"


class ListingReview(BaseModel):
    """Review a marketplace listing before it goes live."""

    category: Literal["electronics", "clothing", "furniture"] = Field(description="What is sold")
    prohibited: bool = Field(description="Whether the item is prohibited")
    colour: Colour | None = Field(description="The item's colour, if stated")
    condition: int = Field(ge=1, le=5, description="Condition from 1 (broken) to 5 (new)")
    tags: list[Literal["vintage", "handmade", "bundle"]] = Field(
        description="Every tag that applies"
    )


class SupportTicket(BaseModel):
    """Triage a support ticket."""

    urgent: bool = Field(description="Whether the customer cannot work")
    title: str = Field(max_length=40, description="A short title for the ticket")
