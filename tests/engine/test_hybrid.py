"""Schemas with generated fields on the tiny model: one JSON object, segment by segment.

Scored fields after generated text equal brute force over the full prompt holding that
text; the grammar is always respected; timings and passes add up.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Annotated, Any, Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, StringConstraints, create_model

from pcd_tools.engine.decode.value_regex import opener
from pcd_tools.errors import (
    GenerationLimitError,
    InvalidArgumentError,
    InvalidExampleError,
)
from pcd_tools.prompt import candidate_text, terminator_for
from pcd_tools.schema import compile_schema
from tests.engine.test_exactness import CONTEXT
from tests.oracle import oracle_log_scores, prompt_ids, softmax

pytestmark = pytest.mark.engine


class Reasoned(BaseModel):
    """Decide on a refund."""

    reasoning: str = Field(max_length=10, description="Why")
    decision: Literal["approve", "reject", "escalate"]
    urgent: bool
    reply: str = Field(max_length=6)
    tier: Literal["gold", "free"]


def _prefix_ids(d, seg) -> list[int]:
    """The ids the segment was scored after: every earlier segment's ids, in order."""
    out: list[int] = []
    for s in d.segments[: d.segments.index(seg)]:
        out.extend(s.token_ids)
    return out


def _check_scored_after(decider, schema, d, field, before=""):
    """`field`'s scores equal one full prompt per candidate holding all the text before it."""
    sch = compile_schema(schema)
    seg = next(s for s in d.segments if field in s.fields)
    assert seg.kind == "scored"
    # the text is exactly the ids that went into the cache (byte tokenizer: one per byte)
    assert decider.engine.encode_ids(seg.prefix) == _prefix_ids(d, seg)
    f = sch.field(field)
    term = terminator_for(sch)
    texts = [seg.prefix + before + candidate_text(f, c.literal, term) for c in f.choices]
    z = oracle_log_scores(decider, sch, CONTEXT, field, texts=texts)
    got = d.fields[field]
    np.testing.assert_allclose(np.array(got.log_scores), z, atol=1e-3, rtol=0)
    p = np.array(list(got.distribution.values()))
    assert np.abs(p - softmax(z)).max() < 1e-4, field
    assert got.label == f.choices[int(np.argmax(z))].label
    return np.abs(p - softmax(z)).max()


@pytest.mark.parametrize("mode", ["packed", "sequential"])
def test_scored_fields_after_generated_text_equal_full_prompts(tiny, mode):
    d = tiny.decide(Reasoned, CONTEXT, mode=mode)
    for name in ("decision", "urgent", "tier"):  # after the reasoning; tier after the reply too
        assert _check_scored_after(tiny, Reasoned, d, name) < 1e-4
    assert [s.kind for s in d.segments] == ["generated", "scored", "generated", "scored"]
    assert d.segments[-1].token_ids == ()  # the last answers: nothing reads them


def test_the_model_sees_one_json_object_in_declaration_order(tiny):
    d = tiny.decide(Reasoned, CONTEXT)
    obj = json.loads(d.json_text)
    assert list(obj) == ["reasoning", "decision", "urgent", "reply", "tier"]
    assert obj == {n: f.label for n, f in d.fields.items()}
    assert Reasoned.model_validate(obj) == d.value
    gen, scored = d.segments[0], d.segments[1]
    # the generated text, then the scored suffix: the decision is scored right after it
    assert gen.text == f'\n  "reasoning": {json.dumps(d.value.reasoning)},'
    assert scored.prefix == gen.text
    assert (
        scored.text
        == f'\n  "decision": "{d.value.decision}",\n  "urgent": {json.dumps(d.value.urgent)},'
    )
    assert d.segments[2].prefix == gen.text + scored.text
    preview = tiny.prompt(Reasoned, CONTEXT)
    assert preview.segments == (
        ("generated", ("reasoning",)),
        ("scored", ("decision", "urgent")),
        ("generated", ("reply",)),
        ("scored", ("tier",)),
    )
    assert preview.field_suffixes["reasoning"] == '\n  "reasoning": '
    assert "value: free text, at most 10 characters" in preview.text


def test_generated_results_have_no_probability_and_downstream_handles_it(tiny):
    d = tiny.decide(Reasoned, CONTEXT)
    r = d.fields["reasoning"]
    assert r.generated and r.probability is None and r.distribution == {}
    assert r.top_choices == [] and r.margin is None and r.entropy is None
    assert r.cardinality == 0 and r.expected is None
    # the opening quote is written with the key; the value's own tokens are decoded
    assert r.tokens == len(d.segments[0].token_ids) - len(
        tiny.engine.encode_ids('\n  "reasoning": "')
    )
    assert r.generation_ms > 0 and r.mean_logprob < 0
    scored = [f.probability for f in d.fields.values() if not f.generated]
    assert d.confidence == min(scored)
    assert set(d.low_confidence(1.01)) == {"decision", "urgent", "tier"}
    resp = d.to_response()
    json.dumps(resp)  # JSON-serialisable
    assert resp["parsed_json"]["reasoning"] == {"value": d.value.reasoning, "prob": None}
    tel = resp["field_telemetry"]["reasoning"]
    assert tel["confidence"] is None and tel["generated"] and tel["tokens"] == r.tokens
    assert resp["json_text"] == d.json_text and resp["generate_ms"] > 0
    assert resp["field_telemetry"]["decision"]["top_choices"]


def test_timings_add_up_and_every_decode_step_is_counted(tiny):
    tiny.engine.clear_cache()

    class OnlyText(BaseModel):
        a: str = Field(max_length=5)
        b: str = Field(max_length=3)

    d = tiny.decide(OnlyText, CONTEXT)
    tokens = d.fields["a"].tokens + d.fields["b"].tokens
    # one cold prefill, which also writes the opening field's key; then one call per token
    # but the last (the next field's key carries it); the last value's last token is
    # never run
    assert d.sequential_forward_passes == tokens
    assert d.confidence is None and d.low_confidence(0.5) == []
    d = tiny.decide(Reasoned, CONTEXT)
    b = d.batch
    parts = b.prefill_ms + b.suffix_eval_ms + b.generate_ms
    assert b.generate_ms > 0 and b.suffix_eval_ms > 0 and parts <= b.elapsed_ms * 1.001
    assert d.generate_ms == b.generate_ms and d.elapsed_ms == b.elapsed_ms
    assert b.to_dict()["generate_ms"] == round(b.generate_ms, 3)
    gen_tokens = sum(f.tokens for f in d.fields.values() if f.generated)
    # the prefill (with the reasoning's key), a step per token after each value's first,
    # the reply's key after the first scored answers, and two scored passes, each of which
    # runs the value just decoded first in its own call (one packed chunk each)
    assert d.sequential_forward_passes == 1 + (gen_tokens - 2) + 1 + 2


class Waves(BaseModel):
    """Route a ticket."""

    category: Literal["billing", "bug"]
    why: str = Field(max_length=8)
    sub: Literal["charge", "crash", "other"] = Field(json_schema_extra={"depends_on": ["category"]})
    team: Literal["t1", "t2"] = Field(json_schema_extra={"depends_on": ["sub"]})
    tags: list[Literal["vip", "angry"]]
    note: str | None = Field(default=None, max_length=4)


def test_dependent_fields_after_generated_text_take_waves_within_their_segment(tiny):
    d = tiny.decide(Waves, CONTEXT)
    # sub's parent was written before the generated text; team waits for sub, in its segment
    assert _check_scored_after(tiny, Waves, d, "sub") < 1e-4
    sub = f'\n  "sub": "{d.fields["sub"].label}",'
    assert _check_scored_after(tiny, Waves, d, "team", before=sub) < 1e-4
    seg = next(s for s in d.segments if "tags" in s.fields)
    labels = d.fields["tags"].labels
    assert set(labels) == {"vip", "angry"}
    flags = ", ".join(f'"{k}": {json.dumps(k in d.value.tags)}' for k in ("vip", "angry"))
    assert seg.text.endswith(f'\n  "tags": {{{flags}}},')  # a multi-label answer, written
    assert json.loads(d.json_text)["team"] == d.value.team


def test_decide_many_equals_decide_row_by_row(tiny):
    texts = [CONTEXT, "short", "Please cancel my plan today, it is too expensive."]
    many = tiny.decide_many(Reasoned, texts, batch_size=3)
    assert {d.batch.size for d in many} == {3}
    for t, m in zip(texts, many):
        one = tiny.decide(Reasoned, t)
        assert m.json_text == one.json_text
        for name in ("decision", "urgent", "tier"):
            a = np.array(list(m.fields[name].distribution.values()))
            b = np.array(list(one.fields[name].distribution.values()))
            assert np.abs(a - b).max() < 1e-4


def test_the_token_limit_raises_with_the_partial_text(tiny):
    with pytest.raises(GenerationLimitError) as e:
        tiny.decide(Reasoned, CONTEXT, max_new_tokens=3)
    err = e.value
    assert (err.field, err.limit, err.context_index) == ("reasoning", 3, 0)
    # the opening quote was written with the key: three decoded tokens after it
    assert err.partial_text.startswith('"')
    assert len(tiny.engine.encode_ids(err.partial_text[1:])) == 3
    assert "max_new_tokens=3" in str(err)

    class OwnLimit(BaseModel):
        why: str = Field(max_length=10, json_schema_extra={"max_new_tokens": 40})
        ok: bool

    # the field's own limit wins over the request's
    assert tiny.decide(OwnLimit, CONTEXT, max_new_tokens=1).fields["why"].tokens <= 40
    with pytest.raises(GenerationLimitError) as e:
        tiny.decide_many(Reasoned, ["x", CONTEXT], max_new_tokens=2)
    assert e.value.context_index in (0, 1)
    with pytest.raises(InvalidArgumentError, match="max_new_tokens must be an int >= 1"):
        tiny.decide(Reasoned, CONTEXT, max_new_tokens=0)


def test_options_the_hybrid_path_does_not_take_are_refused(tiny):
    for kwargs, fragment in [
        ({"orders": 2}, "orders=2"),
        ({"scoring": "pmi"}, "scoring='pmi'"),
        ({"calibration": "contextual"}, "calibration='contextual' (its content-free scores"),
    ]:
        with pytest.raises(InvalidArgumentError, match=re.escape(fragment)):
            tiny.decide(Reasoned, CONTEXT, **kwargs)
    with pytest.raises(InvalidArgumentError, match="has generated fields"):
        tiny.scores(Reasoned, [CONTEXT])
    with pytest.raises(InvalidExampleError):
        tiny.decide(Reasoned, CONTEXT, examples=[("x", {"decision": "approve"})])
    d = tiny.decide(Reasoned, CONTEXT, scoring="constrained", temperature=0.5)
    p = d.fields["decision"].distribution
    assert abs(sum(p.values()) - 1) < 1e-9


class Kinds(BaseModel):
    """Read an order."""

    when: datetime.date
    at: datetime.datetime
    items: list[Annotated[str, StringConstraints(max_length=4)]] = Field(min_length=1, max_length=2)
    qty: int = Field(ge=-5, le=1000)
    price: float = Field(ge=0, le=20)
    code: str | None = Field(default=None, pattern=r"[A-Z]{2}[0-9]")


def test_every_kind_decodes_to_a_valid_value_or_raises_the_limit(tiny):
    try:
        d = tiny.decide(Kinds, CONTEXT, max_new_tokens=40)
    except GenerationLimitError as e:  # a random model may write digits for ever
        assert e.field in ("price", "qty") and len(tiny.engine.encode_ids(e.partial_text)) == 40
        return
    v = d.value
    assert isinstance(v.when, datetime.date) and isinstance(v.at, datetime.datetime)
    assert 1 <= len(v.items) <= 2 and all(len(i) <= 4 for i in v.items)
    assert -5 <= v.qty <= 1000 and 0 <= v.price <= 20
    assert v.code is None or re.fullmatch(r"[A-Z]{2}[0-9]", v.code)
    assert d.fields["when"].label == v.when.isoformat()
    assert Kinds.model_validate(json.loads(d.json_text)) == v


# --- the grammar is always respected ------------------------------------------------------

PATTERNS = [r"[a-z]+", r"[A-Z]{2}-[0-9]{1,3}", r"(yes|no|maybe)", r"[a-f0-9]{4}", r"x.y"]


@st.composite
def _generated(draw, i: int) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["str", "pattern", "float", "int", "list", "date", "optional"]))
    if kind in ("str", "optional"):
        hi = draw(st.integers(1, 12))
        lo = draw(st.integers(0, hi))
        if kind == "str":
            return (f"g{i}", (str, Field(min_length=lo, max_length=hi)))
        return (f"g{i}", (str | None, Field(default=None, min_length=lo, max_length=hi)))
    if kind == "pattern":
        return (f"g{i}", (str, Field(pattern=draw(st.sampled_from(PATTERNS)))))
    if kind == "float":
        lo = draw(st.floats(-100, 100).map(lambda x: round(x, 2)))
        hi = lo + draw(st.floats(0, 50).map(lambda x: round(x, 2)))
        return (f"g{i}", (float, Field(ge=lo, le=hi)))
    if kind == "int":
        lo = draw(st.one_of(st.none(), st.integers(-1000, 1000)))
        # (a range of 1 to 255 values is scored instead)
        hi = draw(st.one_of(st.none(), st.integers(lo + 1 if lo is not None else -1000, 5000)))
        return (f"g{i}", (int, Field(ge=lo, le=hi)))
    if kind == "list":
        hi = draw(st.integers(0, 3))
        item = Annotated[str, StringConstraints(max_length=draw(st.integers(1, 5)))]
        return (f"g{i}", (list[item], Field(max_length=hi)))
    return (f"g{i}", (datetime.date, ...))


@st.composite
def hybrid_models(draw):
    gen = [draw(_generated(i)) for i in range(draw(st.integers(1, 3)))]
    scored = [("s0", (Literal["a", "b"], ...)), ("s1", (bool, ...))][: draw(st.integers(0, 2))]
    fields = draw(st.permutations(gen + scored))
    model = create_model(f"H{draw(st.integers(0, 10**9))}", **dict(fields))
    return model, draw(st.integers(1, 40))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(hybrid_models())
def test_the_grammar_is_always_respected(tiny, case):
    model, limit = case
    try:
        d = tiny.decide(model, CONTEXT, max_new_tokens=limit)
    except GenerationLimitError as e:
        assert e.limit == limit
        spec = compile_schema(model).field(e.field)
        lead = opener(spec.generation, spec.optional)  # written with the key, not decoded
        assert e.partial_text.startswith(lead)
        assert len(tiny.engine.encode_ids(e.partial_text[len(lead) :])) == limit
        return
    assert isinstance(d.value, model)
    if d.json_text is None:  # every drawn int had a small range: all fields are scored
        assert not any(f.generated for f in d.fields.values())
        return
    obj = json.loads(d.json_text)
    assert list(obj) == list(model.model_fields)  # one object, in declaration order
    assert model.model_validate(obj) == d.value
    for name, info in model.model_fields.items():
        pattern = next((m.pattern for m in info.metadata if getattr(m, "pattern", None)), None)
        if pattern is not None:  # the grammar matches the whole value, not a part of it
            assert re.fullmatch(pattern, getattr(d.value, name)), (pattern, obj[name])
        f = d.fields[name]
        assert (f.probability is None) == f.generated


class Customer(BaseModel):
    note: str = Field(max_length=5)
    tier: Literal["gold", "free"]


class Intake(BaseModel):
    """Read a ticket."""

    customer: Customer
    urgent: bool


def test_a_nested_generated_field_is_flattened_and_rebuilt(tiny):
    d = tiny.decide(Intake, CONTEXT)
    assert list(json.loads(d.json_text)) == ["customer.note", "customer.tier", "urgent"]
    assert d.value.customer.note == d.fields["customer.note"].value
    assert _check_scored_after(tiny, Intake, d, "customer.tier") < 1e-4


def test_adecide_gives_the_same_decision(tiny):
    import asyncio

    one = tiny.decide(Reasoned, CONTEXT, max_new_tokens=30)
    got = asyncio.run(tiny.adecide(Reasoned, CONTEXT, max_new_tokens=30))
    assert got.json_text == one.json_text and got.value == one.value
    with pytest.raises(GenerationLimitError):
        asyncio.run(tiny.adecide(Reasoned, CONTEXT, max_new_tokens=2))


def test_the_opening_fields_key_rides_in_the_prefill(tiny):
    """A schema that opens with a generated field (reasoning first, the agents' pattern)
    writes that field's key in the prefill's own call: its first token comes from the
    prefill's last logits, equal to one full prompt holding the key, and the value and
    everything after it are what writing the key apart gave."""
    from pcd_tools.answers.waves import WaveAnswers
    from pcd_tools.engine.decode.generate import forward
    from pcd_tools.engine.hybrid import _row_cache, prefill_rows, run_hybrid

    tiny.engine.clear_cache()
    sch = compile_schema(Reasoned)
    eos = tiny.loaded.eos_ids()
    hb = run_hybrid(
        tiny.engine,
        sch,
        [CONTEXT],
        mode=None,
        answers=WaveAnswers(sch, 1.0, lambda q, t: False),
        eos=eos,
    )
    key_ids = list(hb.segments[0][0].token_ids[: -len(hb.generated[0]["reasoning"].token_ids)])
    assert tiny.engine.encode_ids('\n  "reasoning": "') == key_ids
    # the prefill's last logits against the key run apart after the prompt (the old way)
    # and against one full prompt with the key, no cache
    plan = tiny.engine.plan(sch)
    ctx = tiny.engine.encode_ids(CONTEXT)
    with tiny.engine.kernels():
        _, valid, _, _, first = prefill_rows(tiny.engine, plan, [ctx], False, key_ids)
        kv0, valid0, _, _, none = prefill_rows(tiny.engine, plan, [ctx], False)
        apart = forward(tiny.engine.passes, key_ids, _row_cache(kv0, 0, valid0[0]))
        whole = tiny.engine.model(
            __import__("mlx.core").core.array([prompt_ids(tiny, sch, CONTEXT) + key_ids])
        )[0, -1]
    assert none is None and valid == [valid0[0] + len(key_ids)]
    np.testing.assert_allclose(first[0], apart, atol=1e-4)
    np.testing.assert_allclose(first[0], np.array(whole), atol=1e-4)
    # the first token decoded is the constrained argmax of those logits
    v = hb.generated[0]["reasoning"]
    assert v.logprobs[0] == pytest.approx(
        float(first[0][v.token_ids[0]] - np.logaddexp.reduce(first[0].astype(np.float64))),
        abs=1e-4,
    )


def test_the_opening_key_past_the_window_raises_naming_the_field(tiny, monkeypatch):
    from pcd_tools.errors import ContextTooLongError

    class LongKey(BaseModel):
        the_reasoning_behind_the_decision_in_one_short_sentence: str = Field(max_length=4)
        ok: bool

    tiny.engine.clear_cache()
    sch = compile_schema(LongKey)
    n = len(prompt_ids(tiny, sch, CONTEXT))
    plan = tiny.engine.plan(sch)
    key = len(
        tiny.engine.encode_ids('\n  "the_reasoning_behind_the_decision_in_one_short_sentence": "')
    )
    # room for the prompt and the scored pass, not for the prompt and the first key
    assert key > plan.extra_tokens
    monkeypatch.setattr(tiny.engine, "context_window", n + key - 1)
    with pytest.raises(ContextTooLongError, match="key of the generated field 'the_reasoning"):
        tiny.decide(LongKey, CONTEXT)
    monkeypatch.setattr(tiny.engine, "context_window", n + key + 64)  # and for the value
    assert tiny.decide(LongKey, CONTEXT).fields["ok"].probability is not None


def test_a_stem_in_the_chunks_call_equals_writing_it_first(tiny):
    """`Passes.packed_after`: rows' decoded tokens run in the scored chunk's own call give
    the K/V a separate write gives, and the chunk the scores it gives after that write;
    rows of a batch with stems of different lengths, one with none."""
    from pcd_tools.engine.decode.generate import write
    from pcd_tools.engine.hybrid import _Row, _row_cache, _stack

    eng = tiny.engine
    sch = compile_schema(Reasoned)
    plan = eng.plan(sch)
    sub = eng.wave_plan(plan, [q for q in plan.questions if q.field in ("decision", "urgent")])
    assert len(sub.chunks) == 1
    ctx = [eng.encode_ids(CONTEXT), eng.encode_ids(CONTEXT[:40]), eng.encode_ids(CONTEXT[:70])]
    stems = [eng.encode_ids('\n  "reasoning": "a refund",'), [], eng.encode_ids("ok")]
    with eng.kernels():
        rows = [plan.head_ids + c + plan.tail_ids for c in ctx]
        kv = eng.passes.prefill(rows, None)
        valid = [len(r) for r in rows]
        apart = [_Row(_row_cache(kv, r, n)) for r, n in enumerate(valid)]
        for row, stem in zip(apart, stems):
            if stem:
                write(eng.passes, stem, row.cache)
        kv_w, valid_w = _stack(apart)
        want = packed_result_of(eng, sub, kv_w, valid_w)
        kv0, valid0 = _stack([_Row(_row_cache(kv, r, n)) for r, n in enumerate(valid)])
        found, new = eng.passes.packed_after(sub, kv0, valid0, sub.chunks[0], stems)
    for r, stem in enumerate(stems):
        for li, (k, v) in enumerate(new):
            n = len(stem)
            got_k = np.array(k[r : r + 1, :, :n])
            ref_k = np.array(apart[r].cache[li].keys[:, :, valid[r] : valid[r] + n])
            # the stem is projected in another call shape than when written first, which
            # the BLAS blocks otherwise: float32 rounding on the scale of the largest key
            # (measured 1.8e-5 where keys reach 10, with OpenBLAS's AVX-512 kernels)
            np.testing.assert_allclose(
                got_k, ref_k, atol=1e-5 + 5e-6 * np.abs(ref_k).max(initial=0.0)
            )
            got_v = np.array(v[r : r + 1, :, :n])
            ref_v = np.array(apart[r].cache[li].values[:, :, valid[r] : valid[r] + n])
            np.testing.assert_allclose(
                got_v, ref_v, atol=1e-5 + 5e-6 * np.abs(ref_v).max(initial=0.0)
            )
    from pcd_tools.engine.passes.forward import packed_result

    got = packed_result(sub, [found], len(stems))
    for g, w in zip(got, want):
        for a, b in zip(g, w):  # float32 log p of -19: relative 8e-7 apart
            np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-5)


def packed_result_of(eng, sub, kv, valid):
    from pcd_tools.engine.passes.forward import packed_result

    return packed_result(sub, eng.passes.packed(sub, kv, valid, sub.chunks), len(valid))
