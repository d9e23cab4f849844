"""The production pass equals one full prompt per candidate (tiny model, float32)."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools import StructuredSchema
from pcd_tools.schema import compile_schema
from tests.oracle import oracle_log_scores, softmax
from tests.schemas import Sentiment, Ticket, hs_codes, wide_schema_dict

pytestmark = pytest.mark.engine

CONTEXT = "Our billing page charges customers twice since this morning. Please fix! Ünïcødé ✓ 日本"


def _check(decider, schema, context, mode=None, tol=1e-4, fields=None, share_prompt=False):
    sch = compile_schema(schema)
    d = decider.decide(sch, context, mode=mode, scoring="full")  # the oracle scores full
    worst = 0.0
    for f in sch.fields:
        if fields is not None and f.name not in fields:
            continue
        z = oracle_log_scores(decider, sch, context, f.name, share_prompt=share_prompt)
        got = np.array(d.fields[f.name].log_scores)
        np.testing.assert_allclose(got, z, atol=tol * 10, rtol=0)
        p_ref = softmax(z)
        p_got = np.array(list(d.fields[f.name].distribution.values()))
        worst = max(worst, float(np.abs(p_ref - p_got).max()))
        assert worst < tol, (f.name, worst)
        assert d.fields[f.name].label == f.choices[int(np.argmax(p_ref))].label
    return worst


@pytest.mark.parametrize("mode", ["packed", "batched", "sequential"])
def test_ticket_matches_full_prompts(tiny, mode):
    # single-token-ish and shared-prefix candidates (BILLING / BILLING_DISPUTE), booleans
    assert _check(tiny, Ticket, CONTEXT, mode=mode) < 1e-4


def test_optional_and_docstring_fields_match(tiny):
    assert _check(tiny, Sentiment, "The pasta was cold.") < 1e-4


def test_255_choice_field_matches(tiny):
    codes = hs_codes(255)
    schema = StructuredSchema(
        {"hs_code": {"type": "enum", "choices": codes, "description": "HS code"}}
    )
    ctx = "Live horses for breeding"
    # every candidate against the cached-prompt reference (probabilities need all 255)
    assert _check(tiny, schema, ctx, share_prompt=True) < 1e-4
    # and a sample of candidates against one full prompt each
    d = tiny.decide(schema, ctx, scoring="full")  # the oracle scores full
    sample = [0, 1, 2, 17, 100, 128, 200, 254]
    z = oracle_log_scores(tiny, compile_schema(schema), ctx, "hs_code", only=sample)
    np.testing.assert_allclose(np.array(d.fields["hs_code"].log_scores)[sample], z, atol=1e-3)


def test_28_field_schema_matches(tiny):
    schema = StructuredSchema(wide_schema_dict(28))
    assert _check(tiny, schema, CONTEXT, share_prompt=True) < 1e-4
    # full prompts for a boolean and two shared-prefix enums
    assert _check(tiny, schema, CONTEXT, fields={"flag_0", "enum_1", "enum_5"}) < 1e-4


def test_constrained_scoring_renormalises_each_node(tiny):
    sch = compile_schema(Ticket)
    d = tiny.decide(sch, CONTEXT, scoring="constrained")
    full = tiny.decide(sch, CONTEXT, scoring="full")
    for f in sch.fields:
        z_full = np.array(full.fields[f.name].log_scores)
        z_con = np.array(d.fields[f.name].log_scores)
        # constrained scores are log-probabilities of a distribution over candidates
        assert abs(np.exp(z_con).sum() - 1.0) < 1e-6
        # and they never lose mass: each step's renormaliser is <= 1
        assert np.all(z_con >= z_full - 1e-9)


def test_decide_many_equals_decide(tiny):
    sch = compile_schema(Ticket)
    ctxs = ["short", CONTEXT, "A much longer message " * 12, ""]
    many = tiny.decide_many(sch, ctxs, batch_size=3, allow_empty=True)
    for c, m in zip(ctxs, many):
        one = tiny.decide(sch, c, allow_empty=True)
        for name in one.fields:
            np.testing.assert_allclose(
                list(m.fields[name].distribution.values()),
                list(one.fields[name].distribution.values()),
                atol=1e-5,
            )


def test_prefix_cache_hit_is_exact_and_counted(tiny):
    sch = compile_schema(Ticket)
    tiny.engine.clear_cache()
    cold = tiny.decide(sch, CONTEXT)
    warm = tiny.decide(sch, CONTEXT)
    assert (cold.prefix_cache_hit, warm.prefix_cache_hit) == (False, True)
    for name in cold.fields:
        np.testing.assert_allclose(
            cold.fields[name].log_scores, warm.fields[name].log_scores, atol=1e-4
        )
    # a cold single request is one prefill + the field passes; a warm one runs a fields
    # pass of one chunk in its prefill's call (`Passes.prefill_and_pack`)
    assert cold.sequential_forward_passes >= 2
    one_chunk = len(tiny.engine.plan(sch).chunks) == 1
    assert warm.sequential_forward_passes == cold.sequential_forward_passes - one_chunk


def test_subset_schema_decides_into_a_narrowed_model(tiny):
    sch = compile_schema(Ticket).subset(
        ["department"], choices={"department": ["BILLING", "TECHNICAL"]}
    )
    d = tiny.decide(sch, CONTEXT)
    assert list(d.fields) == ["department"]
    assert set(d.fields["department"].distribution) == {"BILLING", "TECHNICAL"}
    assert type(d.value).model_fields.keys() == {"department"}
    assert abs(sum(d.fields["department"].distribution.values()) - 1) < 1e-9


def test_decide_from_other_threads_with_a_cached_prefix(tiny):
    import threading

    sch = compile_schema(Ticket)
    ref = tiny.decide(sch, CONTEXT)  # fills the prefix cache on this thread
    out: list = []
    errors: list = []

    def work() -> None:
        try:
            out.append(tiny.decide(sch, CONTEXT))
            out.append(tiny.decide_many(sch, [CONTEXT, "other"], batch_size=2)[0])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    for d in out:
        for name in ref.fields:
            np.testing.assert_allclose(
                d.fields[name].log_scores, ref.fields[name].log_scores, atol=1e-4
            )


def test_unknown_mode_is_a_typed_error(tiny):
    from pcd_tools.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="accepted: 'packed', 'batched', 'sequential'"):
        tiny.decide(Ticket, "x", mode="parallel")
