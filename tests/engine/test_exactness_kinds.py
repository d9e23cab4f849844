"""The second-stage schema kinds equal brute force: one full prompt per candidate path
(tiny model, float32)."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field, create_model

from pcd_tools.schema import compile_schema
from tests.engine.test_exactness import CONTEXT, _check
from tests.oracle import oracle_log_scores, softmax

pytestmark = pytest.mark.engine


class Rated(BaseModel):
    """Rate a support ticket."""

    severity: int = Field(ge=1, le=12, description="How bad it is")
    stars: int | None = Field(default=None, ge=0, le=3)


def test_int_range_matches_full_prompts(tiny):
    assert _check(tiny, Rated, CONTEXT) < 1e-4
    d = tiny.decide(Rated, CONTEXT)
    f = d.fields["severity"]
    assert list(f.distribution) == list(range(1, 13))
    assert f.expected == pytest.approx(sum(v * p for v, p in f.distribution.items()))
    assert d.value.severity == f.value


class Address(BaseModel):
    country: Literal["FR", "DE", "DK"]


class Customer(BaseModel):
    tier: Literal["gold", "free"] = Field(description="Plan")
    address: Address


class Intake(BaseModel):
    customer: Customer
    urgent: bool


def test_nested_model_matches_full_prompts_and_builds_the_instance(tiny):
    assert _check(tiny, Intake, CONTEXT) < 1e-4
    d = tiny.decide(Intake, CONTEXT)
    assert set(d.fields) == {"customer.tier", "customer.address.country", "urgent"}
    assert isinstance(d.value.customer.address, Address)
    assert d.value.customer.address.country == d.fields["customer.address.country"].value
    assert d.to_response()["parsed_json"]["customer.tier"]["value"] == d.value.customer.tier


class Tagged(BaseModel):
    """Tag a ticket."""

    tags: list[Literal["billing", "bug", "refund"]] = Field(description="Topics")
    urgent: bool


def test_multilabel_labels_match_full_prompts(tiny):
    d = tiny.decide(Tagged, CONTEXT)
    sch = compile_schema(Tagged)
    tags = d.fields["tags"]
    for label in ("billing", "bug", "refund"):
        stem = f'\n  "tags": {{"{label}": '
        z = oracle_log_scores(tiny, sch, CONTEXT, "tags", texts=[stem + "true,", stem + "false,"])
        assert abs(tags.labels[label] - softmax(z)[0]) < 1e-4, label
    assert tags.value == [k for k, p in tags.labels.items() if p >= 0.5]
    assert d.value.tags == tags.value
    assert _check(tiny, Tagged, CONTEXT, fields={"urgent"}) < 1e-4
    assert d.sequential_forward_passes == 2  # the labels share the one fields pass


class Routed(BaseModel):
    """Route a ticket."""

    category: Literal["billing", "bug", "account"]
    sub: Literal["charge", "crash", "login", "other"] = Field(
        json_schema_extra={"depends_on": ["category"]}
    )
    team: Literal["t1", "t2"] = Field(json_schema_extra={"depends_on": ["sub"]})
    urgent: bool


def _wave_texts(d, field, choices):
    """The brute-force texts of a later wave: the ancestors' answers, then the field."""
    parents = {"sub": ["category"], "team": ["category", "sub"]}[field]
    before = "".join(f'\n  "{p}": "{d.fields[p].label}",' for p in parents)
    return [before + f'\n  "{field}": "{c}",' for c in choices]


@pytest.mark.parametrize("mode", ["packed", "sequential"])
def test_later_waves_match_full_prompts_with_earlier_answers_written(tiny, mode):
    d = tiny.decide(Routed, CONTEXT, mode=mode)
    sch = compile_schema(Routed)
    assert _check(tiny, Routed, CONTEXT, fields={"category", "urgent"}) < 1e-4
    for field in ("sub", "team"):
        choices = sch.field(field).labels
        z = oracle_log_scores(tiny, sch, CONTEXT, field, texts=_wave_texts(d, field, choices))
        got = np.array(list(d.fields[field].distribution.values()))
        assert np.abs(got - softmax(z)).max() < 1e-4, field
        assert d.fields[field].label == choices[int(np.argmax(z))]
    assert d.value.team == d.fields["team"].value
    if mode == "packed":
        assert d.sequential_forward_passes == 4  # prefill, then one pass per wave


def test_decide_many_groups_contexts_by_their_earlier_answers(tiny):
    texts = [CONTEXT, "a", "zz", "hello world", "Please cancel."]
    many = tiny.decide_many(Routed, texts)
    for t, d in zip(texts, many):
        one = tiny.decide(Routed, t)
        for name in ("category", "sub", "team", "urgent"):
            assert d.fields[name].label == one.fields[name].label
            a = np.array(list(d.fields[name].distribution.values()))
            b = np.array(list(one.fields[name].distribution.values()))
            assert np.abs(a - b).max() < 1e-4
    # the team's wave ran as one pass per group of contexts with the same earlier answers
    assert len({d.fields["sub"].label for d in many}) == 4


SUBS = {"billing": ["refund", "invoice"], "bug": ["crash", "slow", "other"], "account": ["other"]}


class Triage(BaseModel):
    """Route a ticket."""

    category: Literal["billing", "bug", "account"]
    subcategory: str = Field(json_schema_extra={"choices_by": {"category": SUBS}})
    urgent: bool


def _conditional(tiny, sch, parent_text, field, values):
    texts = [f'{parent_text}\n  "{field}": "{v}",' for v in values]
    return softmax(oracle_log_scores(tiny, sch, CONTEXT, field, texts=texts))


def test_choices_by_joint_table_matches_full_prompts(tiny):
    sch = compile_schema(Triage)
    d = tiny.decide(Triage, CONTEXT)
    assert d.sequential_forward_passes == 2  # parent and every branch of the child: one pass
    p_cat = softmax(oracle_log_scores(tiny, sch, CONTEXT, "category"))
    want = {}
    for i, (cat, subs) in enumerate(SUBS.items()):
        cond = _conditional(tiny, sch, f'\n  "category": "{cat}",', "subcategory", subs)
        for s, pc in zip(subs, cond):
            want[(cat, s)] = p_cat[i] * pc
    got = d.joint[("category", "subcategory")]
    assert set(got) == set(want)
    assert max(abs(got[k] - want[k]) for k in want) < 1e-4
    best = max(want, key=want.get)
    assert (d.fields["category"].label, d.fields["subcategory"].label) == best
    assert (d.value.category, d.value.subcategory) == best
    for s in sch.field("subcategory").labels:  # the child's marginal
        m = sum(p for (_, c), p in want.items() if c == s)
        assert abs(d.fields["subcategory"].distribution[s] - m) < 1e-4
    assert abs(d.fields["category"].distribution["bug"] - p_cat[1]) < 1e-4
    rows = d.to_response()["joint"][0]
    assert rows["fields"] == ["category", "subcategory"] and len(rows["table"]) == 6


def test_over_the_budget_choices_by_falls_back_to_a_wave(tiny, monkeypatch):
    from pcd_tools import prompt

    monkeypatch.setattr(prompt, "JOINT_BUDGET", 10)
    Small = create_model(  # a new model: plans are cached per schema
        "Small", __base__=Triage, __doc__="Route a ticket, in waves."
    )
    sch = compile_schema(Small)
    d = tiny.decide(Small, CONTEXT)
    assert d.joint == {} and d.sequential_forward_passes == 3
    cat = d.fields["category"].label
    cond = _conditional(tiny, sch, f'\n  "category": "{cat}",', "subcategory", SUBS[cat])
    got = [d.fields["subcategory"].distribution[s] for s in SUBS[cat]]
    assert np.abs(np.array(got) - cond).max() < 1e-4
    others = [s for s in sch.field("subcategory").labels if s not in SUBS[cat]]
    assert all(d.fields["subcategory"].distribution[s] == 0.0 for s in others)


class Refund(BaseModel):
    kind: Literal["refund"]
    reason: Literal["late", "broken", "wrong_item"]


class Bug(BaseModel):
    kind: Literal["bug"]
    area: Literal["ui", "api"]
    blocking: bool


class Request(BaseModel):
    """Read a request."""

    request: Annotated[Refund | Bug, Field(discriminator="kind")]
    urgent: bool


def test_union_branches_match_full_prompts_and_build_the_branch(tiny):
    sch = compile_schema(Request)
    d = tiny.decide(Request, CONTEXT)
    assert d.sequential_forward_passes == 2
    p_kind = softmax(oracle_log_scores(tiny, sch, CONTEXT, "request.kind"))
    assert abs(d.fields["request.kind"].distribution["refund"] - p_kind[0]) < 1e-4
    score = []
    for t, (kind, branch) in enumerate([("refund", ["reason"]), ("bug", ["area", "blocking"])]):
        s = p_kind[t]
        for name in branch:
            f = sch.field(f"request[{kind}].{name}")
            lits = [c.literal for c in f.choices]
            texts = [f'\n  "request.kind": "{kind}",\n  "request.{name}": {lit},' for lit in lits]
            cond = softmax(oracle_log_scores(tiny, sch, CONTEXT, f.name, texts=texts))
            got = np.array(list(d.fields[f.name].distribution.values()))
            assert np.abs(got - cond).max() < 1e-4, f.name
            s *= cond.max()
        score.append(s)
    kind = ["refund", "bug"][int(np.argmax(score))]
    assert d.fields["request.kind"].label == kind
    assert d.value.request.kind == kind
    assert isinstance(d.value.request, Refund if kind == "refund" else Bug)
