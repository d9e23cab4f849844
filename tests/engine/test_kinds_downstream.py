"""The second-stage kinds downstream: decide_many, orders, calibration per label, the
response dict, narrowing, and the prefix cache (tiny model)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcd_tools.answers.calibration import Calibration
from pcd_tools.schema import compile_schema
from tests.engine.test_exactness import CONTEXT
from tests.engine.test_exactness_kinds import Rated, Request, Routed, Tagged, Triage

pytestmark = pytest.mark.engine

TEXTS = [CONTEXT, "Please refund my order, it arrived broken.", "App crashes on login"]


@pytest.mark.parametrize("schema", [Tagged, Triage, Request, Rated])
def test_decide_many_equals_decide_and_the_response_is_json(tiny, schema):
    many = tiny.decide_many(schema, TEXTS)
    for t, d in zip(TEXTS, many):
        one = tiny.decide(schema, t)
        assert d.value == one.value
        for name, f in one.fields.items():
            a = np.array(list(f.distribution.values()))
            b = np.array(list(d.fields[name].distribution.values()))
            assert np.abs(a - b).max() < 1e-4, name
        json.dumps(d.to_response())  # serialisable, joint tables included


def test_a_warm_request_reuses_the_schema_prefix_and_agrees(tiny):
    tiny.engine.clear_cache()
    cold = tiny.decide(Routed, CONTEXT)
    warm = tiny.decide(Routed, CONTEXT)
    assert (cold.prefix_cache_hit, warm.prefix_cache_hit) == (False, True)
    assert warm.value == cold.value
    # warm: the fields pass's first chunk runs in the prefill's call (one call less)
    first = tiny.engine._first_chunks(tiny.engine.plan(compile_schema(Routed)), "packed", None)
    one_chunk = first is not None and len(first) == 1
    assert warm.sequential_forward_passes == cold.sequential_forward_passes - one_chunk


def test_orders_average_labels_and_joint_tables(tiny):
    d = tiny.decide(Triage, CONTEXT, orders=2)
    assert d.orders == 2
    assert sum(d.joint[("category", "subcategory")].values()) == pytest.approx(1.0)
    t = tiny.decide(Tagged, CONTEXT, orders=2)
    assert set(t.fields["tags"].labels) == {"billing", "bug", "refund"}
    assert t.value.tags == t.fields["tags"].value


def test_calibration_has_a_temperature_per_label(tiny):
    raw = tiny.decide(Tagged, CONTEXT)
    cal = Calibration(
        model_id=tiny.model_id,
        schema_name="Tagged",
        schema_fingerprint=compile_schema(Tagged).fingerprint(),
        temperatures={"tags[bug]": 3.0},
    )
    d = tiny.with_calibration(cal).decide(Tagged, CONTEXT)
    log_odds = dict(zip(["billing", "bug", "refund"], raw.fields["tags"].log_scores))
    assert d.fields["tags"].labels["bug"] == pytest.approx(1 / (1 + np.exp(-log_odds["bug"] / 3)))
    assert d.fields["tags"].labels["billing"] == pytest.approx(raw.fields["tags"].labels["billing"])


def test_a_narrowed_subset_drops_ties_to_fields_left_out(tiny):
    s = compile_schema(Triage).subset(
        ["subcategory", "urgent"], choices={"subcategory": ["crash", "slow"]}
    )
    assert (s.field("subcategory").choices_by, s.field("subcategory").depends_on) == (None, ())
    d = tiny.decide(s, CONTEXT)
    assert d.value.subcategory in ("crash", "slow")
    r = compile_schema(Routed).subset(["team"])
    assert r.field("team").depends_on == ()
    assert tiny.decide(r, CONTEXT).value.team in ("t1", "t2")


@pytest.mark.parametrize("seed_text", TEXTS)
def test_orders_answer_a_joint_pair_with_the_best_cell_of_the_averaged_table(tiny, seed_text):
    d = tiny.decide(Triage, seed_text, orders=3)
    table = d.joint[("category", "subcategory")]
    best = max(table, key=lambda key: table[key])
    assert (d.fields["category"].label, d.fields["subcategory"].label) == best
    spec = compile_schema(Triage).field("subcategory")
    parent = compile_schema(Triage).field("category")
    pi = [c.label for c in parent.choices].index(best[0])
    assert best[1] in [spec.choices[i].label for i in spec.choices_by[1][pi]]  # allowed
    assert (d.value.category, d.value.subcategory) == best


@pytest.mark.parametrize("text", TEXTS)
def test_orders_keep_only_the_answered_branch_of_a_union(tiny, text):
    d = tiny.decide(Request, text, orders=3)
    schema = compile_schema(Request)
    kinds = {f.branch[0] for f in schema.fields if f.branch is not None}
    for kind in kinds:
        taken = schema.field(kind).choices.index(
            next(c for c in schema.field(kind).choices if c.label == d.fields[kind].label)
        )
        for f in schema.fields:
            if f.branch is not None and f.branch[0] == kind:
                assert (f.name in d.fields) == (f.branch[1] == taken)
    json.dumps(d.to_response())
