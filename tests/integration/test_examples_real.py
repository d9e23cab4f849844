"""Few-shot examples and contextual calibration end to end on the real embedded model."""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools import decision
from pcd_tools.decide.contextual import CONTENT_FREE
from tests.oracle import oracle_log_scores, softmax

pytestmark = pytest.mark.integration


class Support(BaseModel):
    """Triage an inbound customer support ticket."""

    priority: Literal["urgent", "normal", "low"] = Field(description="How fast to answer")
    refund: bool = Field(description="Whether the customer asks for money back")


Support = decision(
    Support,
    examples=[
        (
            "The app crashes for all our users, we are losing sales!",
            Support(priority="urgent", refund=False),
        ),
        (
            "I was charged twice, please give me my money back.",
            {"priority": "normal", "refund": True},
        ),
    ],
)

TEXT = "Hi, the invoice PDF has a typo in my company name. No rush."


def test_examples_and_contextual_calibration_end_to_end(real, monkeypatch):
    monkeypatch.setattr("pcd_tools.decide.decider._DEFAULT", real)  # `Support.decide` runs on it
    d = real.with_calibration("contextual")
    shown = d.prompt(Support, TEXT)
    assert shown.examples == 2
    assert '<|im_start|>assistant\n{\n  "priority": "urgent",\n  "refund": false\n}' in shown.text
    assert shown.text.endswith(f"<|im_start|>user\n{TEXT}<|im_end|>\n<|im_start|>assistant\n{{")
    misses = d.content_free.stats["misses"]  # the session's model may have other schemas'
    first = d.decide(Support, TEXT)
    again = Support.decide(TEXT, calibration="contextual")  # the default decider
    warm = d.decide(Support, "Please cancel my subscription at the end of the month.")
    assert (first.examples, first.calibration_method) == (2, "contextual")
    assert first.content_free_ms > 0 and warm.content_free_ms == 0.0
    assert warm.prefix_cache_hit and d.content_free.stats["misses"] == misses + 1
    assert isinstance(first.value, Support) and isinstance(again.value, Support)
    sch = Support.__pcd_schema__
    for f in sch.fields:
        z = oracle_log_scores(d, sch, TEXT, f.name)
        cf = [np.log(softmax(oracle_log_scores(d, sch, t, f.name))) for t in CONTENT_FREE]
        want = softmax(z - np.mean(cf, axis=0))
        got = np.array(list(first.fields[f.name].distribution.values()))
        assert np.abs(got - want).max() < 1e-3, f.name
        assert first.fields[f.name].label == again.fields[f.name].label
    resp = first.to_response()
    assert resp["calibration_method"] == "contextual" and resp["examples"] == 2
    json.dumps(resp)
