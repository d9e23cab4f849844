"""Few-shot examples on the tiny model: held in the cached schema prefix, exact, per call."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from pcd_tools.errors import InvalidExampleError
from pcd_tools.schema import compile_schema, with_examples
from tests.engine.test_exactness import CONTEXT, _check
from tests.schemas import Ticket

pytestmark = pytest.mark.engine

DOWN = {"priority": "P0_CRITICAL", "requires_escalation": True, "department": "TECHNICAL"}
INVOICE = {"priority": "P3_LOW", "requires_escalation": False, "department": "BILLING"}
EXAMPLES = [("The whole site is down for everyone.", DOWN), ("Resend my invoice.", INVOICE)]


def _dists(d):
    return {n: np.array(list(f.distribution.values())) for n, f in d.fields.items()}


def _same(a, b, tol=1e-5):
    for name, p in _dists(a).items():
        np.testing.assert_allclose(p, _dists(b)[name], atol=tol)


def test_a_second_request_prefills_only_its_context(tiny, monkeypatch):
    sch = with_examples(compile_schema(Ticket), EXAMPLES)
    engine = tiny.engine
    engine.clear_cache()
    calls: list[tuple[bool, list[int]]] = []
    real = engine.passes.prefill

    def spy(tokens, prefix):
        calls.append((prefix is not None, [len(t) for t in tokens]))
        return real(tokens, prefix)

    def spy_packed(
        plan, prefix, rows, ch, *more
    ):  # a warm prefill with the fields pass's one chunk
        calls.append((True, [len(t) for t in rows]))
        return real_packed(plan, prefix, rows, ch, *more)

    real_packed = engine.passes.prefill_and_pack
    monkeypatch.setattr(engine.passes, "prefill", spy)
    monkeypatch.setattr(engine.passes, "prefill_and_pack", spy_packed)
    hits = engine.stats["prefix_hits"]
    cold = tiny.decide(sch, "First message.")
    warm = tiny.decide(sch, CONTEXT)
    shown = tiny.prompt(sch, CONTEXT)
    bare = tiny.prompt(Ticket, CONTEXT)
    assert (cold.prefix_cache_hit, warm.prefix_cache_hit) == (False, True)
    assert engine.stats["prefix_hits"] == hits + 1
    # cold: the whole prompt in one prefill; warm: only the context and the answer start
    assert calls[0] == (False, [cold.prompt_tokens])
    assert calls[1] == (True, [shown.context_tokens + shown.answer_start_tokens])
    assert warm.prompt_tokens == shown.token_count
    # the schema part counts the examples' turns, and that is what the cache holds
    turns = sum(len(t) + len(json.dumps(a, indent=2)) for t, a in EXAMPLES)
    assert shown.schema_tokens > bare.schema_tokens + turns
    assert engine.plan(sch).head_ids in engine.prefix_cache
    assert len(engine.plan(sch).head_ids) == shown.schema_tokens
    assert (cold.examples, warm.examples, shown.examples, bare.examples) == (2, 2, 2, 0)
    assert warm.to_response()["examples"] == 2


def test_other_examples_are_another_schema_prefix(tiny):
    one = with_examples(compile_schema(Ticket), EXAMPLES[:1])
    two = with_examples(compile_schema(Ticket), EXAMPLES)
    tiny.decide(two, CONTEXT)
    assert tiny.decide(two, CONTEXT).prefix_cache_hit
    d = tiny.decide(one, CONTEXT)
    assert not d.prefix_cache_hit and d.examples == 1
    assert tiny.engine.plan(one).head_ids != tiny.engine.plan(two).head_ids


def test_decisions_with_examples_equal_full_prompts(tiny):
    sch = with_examples(compile_schema(Ticket), EXAMPLES)
    assert _check(tiny, sch, CONTEXT) < 1e-4
    plain = tiny.decide(Ticket, CONTEXT)
    moved = max(
        float(np.abs(p - _dists(plain)[n]).max())
        for n, p in _dists(tiny.decide(sch, CONTEXT)).items()
    )
    assert moved > 1e-3  # the examples reach the model


def test_call_examples_replace_the_schemas_own(tiny):
    sch = with_examples(compile_schema(Ticket), EXAMPLES)
    per_call = tiny.decide(Ticket, CONTEXT, examples=EXAMPLES)
    _same(per_call, tiny.decide(sch, CONTEXT))
    assert per_call.examples == 2
    cleared = tiny.decide(sch, CONTEXT, examples=[])
    _same(cleared, tiny.decide(Ticket, CONTEXT))
    assert cleared.examples == 0
    many = tiny.decide_many(Ticket, [CONTEXT, "Resend it please."], examples=EXAMPLES)
    _same(many[0], per_call, tol=1e-4)
    async_one = asyncio.run(tiny.adecide(Ticket, CONTEXT, examples=EXAMPLES))
    _same(async_one, per_call, tol=1e-4)
    assert async_one.examples == 2


def test_the_prompt_shows_the_examples_as_turns(tiny):
    shown = tiny.prompt(Ticket, CONTEXT, examples=EXAMPLES)
    a, b = (json.dumps(x, indent=2) for x in (DOWN, INVOICE))
    assert (
        f"Message:\n{EXAMPLES[0][0]}\n\nJSON answer:\n{a}\n\n"
        f"Message:\n{EXAMPLES[1][0]}\n\nJSON answer:\n{b}\n\n"
        f"Message:\n{CONTEXT}\n\nJSON answer:\n{{"
    ) in shown.text
    assert shown.text.endswith(f"Message:\n{CONTEXT}\n\nJSON answer:\n{{")
    assert shown.examples == 2


def test_a_bad_call_example_is_a_typed_error(tiny):
    bad = [EXAMPLES[0], ("Cancel my plan.", dict(INVOICE, department="SALES"))]
    with pytest.raises(InvalidExampleError) as e:
        tiny.decide(Ticket, CONTEXT, examples=bad)
    assert (e.value.index, e.value.field) == (1, "department")
    assert "'SALES'" in str(e.value) and "'BILLING_DISPUTE'" in str(e.value)
    with pytest.raises(InvalidExampleError):
        asyncio.run(tiny.adecide(Ticket, CONTEXT, examples=bad))
    with pytest.raises(InvalidExampleError, match="example #1"):
        tiny.prompt(Ticket, CONTEXT, examples=bad)
