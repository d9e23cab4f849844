"""Decision-call options: listing orders, empty contexts, per-item telemetry, prompt preview."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools.decide.orders import orderings
from pcd_tools.errors import InvalidArgumentError, InvalidContextError
from pcd_tools.schema import compile_schema
from tests.schemas import Ticket

pytestmark = pytest.mark.engine

TEXT = "Our billing page charges customers twice since this morning."


# --- orders=k -----------------------------------------------------------------------------


def test_orders_average_the_rotated_listings_exactly(tiny):
    sch = compile_schema(Ticket)
    tiny.decide(Ticket, TEXT, orders=3)  # every listing's schema part cached: all warm
    avg = tiny.decide(Ticket, TEXT, orders=3)
    runs = [tiny.decide(Ticket, TEXT, choice_order=o) for o in orderings(sch, 3)]
    assert avg.orders == 3
    for f in sch.fields:
        want = np.mean([list(d.fields[f.name].distribution.values()) for d in runs], axis=0)
        got = np.array(list(avg.fields[f.name].distribution.values()))
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert avg.fields[f.name].label == f.choices[int(np.argmax(want))].label
        flips = sum(d.fields[f.name].label != avg.fields[f.name].label for d in runs)
        assert avg.fields[f.name].flip_rate == flips / 3
    assert avg.flip_rate == max(r.flip_rate for r in avg.fields.values())
    assert avg.sequential_forward_passes == sum(d.sequential_forward_passes for d in runs)


def test_the_rotations_list_every_value_at_spread_positions(tiny):
    sch = compile_schema(Ticket)
    k = 4
    orders = orderings(sch, k)
    assert orders[0] == {f.name: list(range(f.cardinality)) for f in sch.fields}
    for f in sch.fields:
        firsts = [o[f.name][0] for o in orders]
        assert len(set(firsts)) == min(k, f.cardinality)  # k different values listed first
        for o in orders:
            assert sorted(o[f.name]) == list(range(f.cardinality))


def test_one_order_reports_no_flip_rate(tiny):
    d = tiny.decide(Ticket, TEXT)
    assert d.orders == 1
    assert d.flip_rate is None
    assert all(f.flip_rate is None for f in d.fields.values())
    assert d.to_response()["orders"] == 1


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "2", None])
def test_orders_must_be_a_positive_int(tiny, bad):
    with pytest.raises(InvalidArgumentError, match="orders must be an int >= 1"):
        tiny.decide(Ticket, TEXT, orders=bad)


def test_orders_and_choice_order_cannot_be_combined(tiny):
    with pytest.raises(InvalidArgumentError, match="cannot be combined"):
        tiny.decide(Ticket, TEXT, orders=2, choice_order={"priority": [3, 2, 1, 0]})


# --- empty contexts -------------------------------------------------------------------------


@pytest.mark.parametrize("ctx", ["", "   ", "\n\t "])
def test_an_empty_context_is_refused(tiny, ctx):
    with pytest.raises(InvalidContextError, match=r"empty or only whitespace.*allow_empty=True"):
        tiny.decide(Ticket, ctx)


def test_an_empty_context_in_a_batch_is_named_by_index(tiny):
    with pytest.raises(InvalidContextError, match="context #1 is empty"):
        tiny.decide_many(Ticket, ["fine", " ", "also fine"])


def test_allow_empty_decides_on_nothing(tiny):
    d = tiny.decide(Ticket, "", allow_empty=True)
    assert set(d.fields) == {f.name for f in compile_schema(Ticket).fields}
    assert abs(sum(d.fields["priority"].distribution.values()) - 1.0) < 1e-9


# --- telemetry per item ---------------------------------------------------------------------


def test_decide_many_reports_each_items_share_and_the_batch_total(tiny):
    ctxs = ["one", "two two", "three three three", "four", "five five"]
    ds = tiny.decide_many(Ticket, ctxs, batch_size=5)
    batch = ds[0].batch
    assert batch is not None and batch.size == 5
    assert all(d.batch is batch for d in ds)
    assert sum(d.elapsed_ms for d in ds) == pytest.approx(batch.elapsed_ms, rel=1e-9)
    assert sum(d.prefill_ms for d in ds) == pytest.approx(batch.prefill_ms, rel=1e-9)
    assert sum(d.suffix_eval_ms for d in ds) == pytest.approx(batch.suffix_eval_ms, rel=1e-9)
    assert batch.prefill_ms + batch.suffix_eval_ms <= batch.elapsed_ms * 1.001
    assert ds[0].to_response()["batch"]["size"] == 5


def test_batches_are_reported_per_engine_call(tiny):
    ds = tiny.decide_many(Ticket, ["a", "bb", "ccc"], batch_size=2)
    sizes = sorted(d.batch.size for d in ds)
    assert sizes == [1, 2, 2]
    totals = {id(d.batch): d.batch.elapsed_ms for d in ds}
    assert sum(d.elapsed_ms for d in ds) == pytest.approx(sum(totals.values()), rel=1e-9)


def test_one_decision_is_its_own_batch(tiny):
    d = tiny.decide(Ticket, TEXT)
    assert d.batch.size == 1
    assert d.elapsed_ms == d.batch.elapsed_ms


# --- prompt preview -------------------------------------------------------------------------


def test_prompt_preview_is_what_the_engine_runs(tiny):
    p = tiny.prompt(Ticket, TEXT)
    d = tiny.decide(Ticket, TEXT)
    plan = tiny.engine.plan(compile_schema(Ticket), None)
    assert p.token_count == d.prompt_tokens
    assert list(p.token_ids) == [
        *plan.head_ids,
        *tiny.engine.encode_ids(TEXT),
        *plan.tail_ids,
    ]
    assert p.text == tiny.loaded.tokenizer.decode(p.token_ids)
    assert TEXT in p.text and p.text.endswith("{")
    assert p.schema_tokens == len(plan.head_ids)
    assert p.context_tokens == len(TEXT.encode())
    assert p.schema_tokens + p.context_tokens + p.answer_start_tokens == p.token_count
    assert p.field_suffixes["priority"] == '\n  "priority": '
    assert str(p) == p.text


def test_prompt_preview_follows_the_listing_order(tiny):
    a = tiny.prompt(Ticket, TEXT).text
    b = tiny.prompt(Ticket, TEXT, choice_order={"priority": [3, 2, 1, 0]}).text
    assert a != b
    assert a.index('"P0_CRITICAL"') < a.index('"P3_LOW"')
    assert b.index('"P3_LOW"') < b.index('"P0_CRITICAL"')
