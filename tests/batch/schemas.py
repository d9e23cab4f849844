"""A small schema for the subprocess tests (few candidates: fast on the embedded model)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Route(BaseModel):
    """Route an inbound support message."""

    billing: bool = Field(description="Whether the message is about money or invoices")
    urgency: Literal["low", "high"] = Field(description="How urgent the message is")
