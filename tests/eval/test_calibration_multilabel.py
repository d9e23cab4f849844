"""Calibration of a multi-label field: one temperature (and bias) per label, fitted as
that label's yes/no question and applied by the decider under `field[label]`."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools.eval.calibration import calibration_from_decisions
from pcd_tools.eval.datasets import DatasetError

pytestmark = pytest.mark.engine

TAGS = ("refund", "login", "outage")


class Ticket(BaseModel):
    """Tag a support ticket."""

    tags: list[Literal["refund", "login", "outage"]] = Field(description="Every tag that applies")
    urgent: bool


TEXTS = [
    "Refund my duplicate charge please.",
    "I cannot log in since yesterday.",
    "Everything is down, total outage!",
    "Refund me, and also the login page is broken.",
    "The site is down and I want a refund.",
    "Login fails with error 500.",
]
GOLD = [
    {"tags": ["refund"], "urgent": False},
    {"tags": ["login"], "urgent": False},
    {"tags": ["outage"], "urgent": True},
    {"tags": ["refund", "login"], "urgent": False},
    {"tags": ["outage", "refund"], "urgent": True},
    {"tags": ["login"], "urgent": True},
]


def test_one_calibration_per_label_and_the_decider_applies_it(tiny):
    decisions = tiny.decide_many(Ticket, TEXTS)
    for method in ("temperature", "temperature_bias"):
        cal = calibration_from_decisions(Ticket, decisions, GOLD, method=method)
        assert set(cal.temperatures) == {"urgent", *(f"tags[{t}]" for t in TAGS)}
        for t in TAGS:
            assert cal.metrics[f"tags[{t}]"]["n"] == len(TEXTS)
        calibrated = tiny.with_calibration(cal).decide(Ticket, TEXTS[3])
        raw = decisions[3].fields["tags"]
        for i, t in enumerate(TAGS):
            z = np.array([raw.log_scores[i], 0.0]) / cal.temperature(f"tags[{t}]")
            z = z + np.array(cal.biases.get(f"tags[{t}]", [0.0, 0.0]))
            want = 1.0 / (1.0 + math.exp(z[1] - z[0]))
            assert calibrated.fields["tags"].labels[t] == pytest.approx(want, abs=1e-6)


def test_a_multilabel_gold_must_be_a_list_of_allowed_labels(tiny):
    decisions = tiny.decide_many(Ticket, TEXTS[:2])
    with pytest.raises(DatasetError, match="multi-label"):
        calibration_from_decisions(Ticket, decisions, [{"tags": "refund"}, {"tags": []}])
    with pytest.raises(DatasetError, match="billing"):
        calibration_from_decisions(Ticket, decisions, [{"tags": ["billing"]}, {"tags": []}])
