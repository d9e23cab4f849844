"""Few-shot examples on a schema with generated fields: each generated value is checked
against its annotation and written into the example's answer as the decoder would write
it; the examples sit in the cached schema part of the prompt."""

from __future__ import annotations

import datetime
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools.errors import InvalidExampleError
from pcd_tools.schema import compile_schema, with_examples
from pcd_tools.schema.spec import Written

pytestmark = pytest.mark.engine


class Routed(BaseModel):
    """Route a support message."""

    reason: str = Field(max_length=16, description="Why")
    route: Literal["billing", "tech"]
    amount: float | None = Field(default=None, ge=0, description="Amount at stake")
    due: datetime.date | None = None


EXAMPLES = [
    {"input": "Refund my double charge of $30.", "output": {
        "reason": "double charge", "route": "billing", "amount": 30, "due": "2026-12-24",
    }},
    ("The app crashes on start.", Routed(reason="crash", route="tech", amount=None)),
]  # fmt: skip


def test_generated_values_are_checked_and_written_as_json():
    s = with_examples(compile_schema(Routed), EXAMPLES)
    first, second = s.examples
    assert first.answer("reason") == Written('"double charge"')
    assert first.answer("amount") == Written("30.0")
    assert first.answer("due") == Written('"2026-12-24"')
    assert second.answer("amount") == Written("null") and second.answer("route") == 1
    spec = s.to_spec()["examples"][0]["output"]
    assert spec == {
        "reason": "double charge",
        "route": "billing",
        "amount": 30.0,
        "due": "2026-12-24",
    }
    assert s.fingerprint() != compile_schema(Routed).fingerprint()


@pytest.mark.parametrize(
    ("output", "field", "why"),
    [
        ({"reason": "x" * 17, "route": "tech"}, "reason", "at most 16 characters"),
        ({"reason": "ok", "route": "tech", "amount": -1}, "amount", "greater than or equal to 0"),
        ({"reason": "ok", "route": "tech", "due": "soon"}, "due", "valid date"),
        ({"reason": 7, "route": "tech"}, "reason", "valid string"),
    ],
)
def test_a_bad_generated_value_names_the_example_and_the_field(output, field, why):
    with pytest.raises(InvalidExampleError, match=why) as e:
        with_examples(compile_schema(Routed), [{"input": "text", "output": output}])
    assert e.value.field == field and e.value.index == 0


def test_examples_reach_the_cached_prompt_of_a_hybrid_decision(tiny):
    text = "I was charged twice."
    preview = tiny.prompt(Routed, text, examples=EXAMPLES)
    assert '"reason": "double charge",\n  "route": "billing",\n  "amount": 30.0' in preview.text
    first = tiny.decide(Routed, text, examples=EXAMPLES, max_new_tokens=24)
    again = tiny.decide(Routed, "The app crashes.", examples=EXAMPLES, max_new_tokens=24)
    assert first.examples == 2 and again.prefix_cache_hit
    plain = tiny.decide(Routed, text, max_new_tokens=24)
    assert plain.examples == 0 and plain.prompt_tokens < first.prompt_tokens
