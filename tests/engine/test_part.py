"""A part of a schema (`Schema.part`) answers its fields as the whole schema does, and
scores nothing else (tiny model, float32: agreement to the packing's rounding)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools.schema import compile_schema
from tests.conftest import tiny_decider
from tests.engine.test_exactness import CONTEXT
from tests.engine.test_exactness_kinds import Intake, Rated, Request, Routed, Tagged, Triage

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tiny():
    """A tiny decider of its own: the session's keeps no prefix this module warmed (other
    modules count `sequential_forward_passes` on a cold cache)."""
    return tiny_decider(0)


class Hybrid(BaseModel):
    """Scored, generated, scored."""

    a: Literal["x", "y", "z"]
    note: str = Field(max_length=4)
    b: bool
    c: Literal["p", "q"]


def _agree(part_decision, whole_decision) -> None:
    for name, got in part_decision.fields.items():
        want = whole_decision.fields[name]
        assert got.label == want.label, name
        if want.probability is None:  # generated: the same text
            assert got.value == want.value, name
            continue
        a = np.array(list(got.distribution.values()))
        b = np.array(list(want.distribution.values()))
        assert np.abs(a - b).max() < 1e-4, name


@pytest.mark.parametrize("schema", [Routed, Triage, Request, Intake, Tagged, Rated])
def test_each_fields_part_answers_it_as_the_whole_does(tiny, schema):
    whole = compile_schema(schema)
    full = tiny.decide(whole, CONTEXT)
    for name in whole.field_names:
        part = whole.part([name])
        assert tiny.prompt(part, CONTEXT).text == tiny.prompt(whole, CONTEXT).text
        d = tiny.decide(part, CONTEXT)
        assert list(d.fields) == whole.needs([name])
        _agree(d, full)


def test_a_part_lists_values_in_the_wholes_orders(tiny):
    whole = compile_schema(Routed)
    _agree(
        tiny.decide(whole.part(["urgent"]), CONTEXT, orders=2),
        tiny.decide(whole, CONTEXT, orders=2),
    )


def test_a_part_before_every_generated_field_generates_nothing(tiny):
    whole = compile_schema(Hybrid)
    full = tiny.decide(whole, CONTEXT)
    first = tiny.decide(whole.part(["a"]), CONTEXT)
    assert list(first.fields) == ["a"] and first.generate_ms == 0
    assert first.sequential_forward_passes < full.sequential_forward_passes
    _agree(first, full)
    last = tiny.decide(whole.part(["c"]), CONTEXT)  # after `note`: written as the whole writes it
    assert list(last.fields) == ["a", "note", "c"]
    _agree(last, full)
