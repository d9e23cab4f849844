"""Shared toy data and stand-ins for the eval tests (and `tests/cli/test_eval_calibrate.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pcd_tools.answers.calibration import Calibration
from pcd_tools.schema import compile_schema

SCHEMA = {
    "mood": {"type": "enum", "choices": ["calm", "angry", "sad"], "description": "Mood"},
    "urgent": {"type": "boolean", "description": "Whether it is urgent"},
}
TEXTS = ["hello there", "this is broken!!", "I lost it", "fine, thanks", "NOW please", "meh"]
LABELS = [
    {"mood": "calm", "urgent": False},
    {"mood": "angry", "urgent": True},
    {"mood": "sad", "urgent": False},
    {"mood": "calm", "urgent": False},
    {"mood": "angry", "urgent": True},
    {"mood": "sad"},  # a missing label is skipped for that field
]


def toy_calibration(**kw: Any) -> Calibration:
    schema = compile_schema(SCHEMA)
    base = dict(
        model_id="tiny-llama-0",
        schema_name=schema.name,
        schema_fingerprint=schema.fingerprint(),
        temperatures={"mood": 2.0},
        fitted_on={"dataset": "toy", "n": 6, "seed": 1, "ids": ["a", "b"]},
    )
    base.update(kw)
    return Calibration(**base)


def softmax(z, t, b):
    s = z / t + b
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def draw(rng, z, t, b):
    s = z / t + b
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return (p.cumsum(axis=1) > rng.uniform(size=(len(z), 1))).argmax(axis=1)


@dataclass
class FakeGeneration:
    values: dict[str, Any] | None
    value_probs: dict[str, float] | None
    is_valid_json: bool = True
    schema_match: bool = True
    wall_ms: float = 5.0
    passes: int = 9
    tokens: int = 9
    text: str = ""


def stub_baseline(decider, schema, text):
    if text == "meh":
        return FakeGeneration(None, None, is_valid_json=False, schema_match=False, text="{")
    return FakeGeneration({"mood": "calm", "urgent": False}, {"mood": 0.9, "urgent": 0.6})


def fake_load(tiny):
    """`Decider.load` returning the tiny model, calibrated when asked."""
    return classmethod(
        lambda cls, *a, calibration=None, **k: (
            tiny.with_calibration(calibration) if calibration else tiny
        )
    )
