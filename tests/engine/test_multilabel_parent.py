"""`depends_on` a multi-label parent (and an int range, and a nested model's field): the
parent's chosen labels are written into the JSON before the child's suffix, as the JSON
writer writes that kind, and the child is scored in the next wave, exactly as one full
prompt per candidate (tiny model, float32)."""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field, create_model

from pcd_tools.prompt import example_answer, field_questions
from pcd_tools.schema import compile_schema
from pcd_tools.schema.spec import Example
from tests.engine.test_exactness import CONTEXT
from tests.oracle import oracle_log_scores, softmax

pytestmark = pytest.mark.engine

FLAGS = ("counterfeit", "weapon", "animal", "off_platform_payment")


def _moderation(threshold: float = 0.5) -> type[BaseModel]:
    """The issue's schema: a multi-label `flags`, then `remove` that depends on it."""
    return create_model(
        "Moderation",
        __doc__="Moderate a marketplace listing.",
        flags=(
            list[Literal[FLAGS]],  # type: ignore[valid-type]
            Field(description="What the listing shows", json_schema_extra={"threshold": threshold}),
        ),
        remove=(
            bool,
            Field(description="Remove the listing", json_schema_extra={"depends_on": ["flags"]}),
        ),
    )


def _flags_text(chosen) -> str:
    body = ", ".join(f'"{f}": {"true" if f in chosen else "false"}' for f in FLAGS)
    return f'\n  "flags": {{{body}}},'


def test_the_written_parent_is_the_json_writers_object_of_every_label():
    s = compile_schema(_moderation())
    (q,) = field_questions(s, s.field("remove"), [("flags", (0, 2))])
    assert q.texts == (
        '\n  "flags": {"counterfeit": true, "weapon": false, "animal": true, '
        '"off_platform_payment": false},\n  "remove": true,',
        '\n  "flags": {"counterfeit": true, "weapon": false, "animal": true, '
        '"off_platform_payment": false},\n  "remove": false,',
    )
    assert q.given == (("flags", (0, 2)),)
    assert q.key == "remove|flags=[0,2]"
    # the same text a few-shot example's answer (the prompt's JSON writer) has
    shot = example_answer(s, Example("x", (("flags", (0, 2)), ("remove", 0))))
    assert shot.startswith("{" + q.texts[0][: -len("true,")])
    assert json.loads("{" + q.texts[0][:-1] + "}")["flags"] == {
        "counterfeit": True,
        "weapon": False,
        "animal": True,
        "off_platform_payment": False,
    }
    (none,) = field_questions(s, s.field("remove"), [("flags", ())])
    assert none.texts[1].startswith(_flags_text(()))


def _two_chosen_threshold(tiny) -> float:
    """A threshold between the 2nd and 3rd most probable labels, so two are chosen and
    two are not (the written object then holds both `true` and `false`)."""
    p = sorted(tiny.decide(_moderation(), CONTEXT).fields["flags"].labels.values())[::-1]
    assert p[1] > p[2]
    return float((p[1] + p[2]) / 2)


@pytest.mark.parametrize("mode", ["packed", "sequential"])
def test_a_multilabel_parent_is_written_and_its_child_matches_full_prompts(tiny, mode, monkeypatch):
    model = _moderation(_two_chosen_threshold(tiny))
    sch = compile_schema(model)
    asked = []
    real_plan = tiny.engine.wave_plan
    monkeypatch.setattr(
        tiny.engine, "wave_plan", lambda plan, qs: asked.append(qs) or real_plan(plan, qs)
    )
    d = tiny.decide(model, CONTEXT, mode=mode)
    flags = d.fields["flags"]
    assert len(flags.label) == 2
    assert flags.label == [f for f in FLAGS if flags.labels[f] >= sch.field("flags").threshold]
    texts = [_flags_text(flags.label) + f'\n  "remove": {v},' for v in ("true", "false")]
    z = oracle_log_scores(tiny, sch, CONTEXT, "remove", texts=texts)
    remove = d.fields["remove"]
    np.testing.assert_allclose(remove.log_scores, z, atol=1e-3, rtol=0)
    got = np.array(list(remove.distribution.values()))
    assert np.abs(got - softmax(z)).max() < 1e-4
    assert remove.value is (bool(np.argmax(z) == 0))
    assert d.value.remove is remove.value and d.value.flags == flags.value
    if mode == "packed":
        assert [q.texts for qs in asked for q in qs] == [tuple(texts)]
        # the prefill, the labels' pass (in the prefill's call when the schema part was
        # cached: `Passes.prefill_and_pack`), remove's wave
        assert d.sequential_forward_passes == (2 if d.prefix_cache_hit else 3)


class Review(BaseModel):
    risk: int = Field(ge=0, le=3, description="Risk level")
    tags: list[Literal["spam", "scam", "ok"]] = Field(json_schema_extra={"threshold": 0.3})


class Listing(BaseModel):
    """Review a listing."""

    review: Review
    action: Literal["keep", "hold", "remove"] = Field(
        json_schema_extra={"depends_on": ["review.risk", "review.tags"]}
    )
    notify: bool = Field(json_schema_extra={"depends_on": ["action"]})


def test_int_range_and_nested_parents_write_their_answers_in_declared_order(tiny):
    sch = compile_schema(Listing)
    d = tiny.decide(Listing, CONTEXT)
    risk, tags = d.fields["review.risk"], d.fields["review.tags"]
    flags = ", ".join(
        f'"{t}": {"true" if t in tags.label else "false"}' for t in ("spam", "scam", "ok")
    )
    # a nested field's key is its dotted name (the flattened layout the prompt lists)
    before = f'\n  "review.risk": {risk.label},\n  "review.tags": {{{flags}}},'
    texts = [before + f'\n  "action": "{a}",' for a in ("keep", "hold", "remove")]
    z = oracle_log_scores(tiny, sch, CONTEXT, "action", texts=texts)
    np.testing.assert_allclose(d.fields["action"].log_scores, z, atol=1e-3, rtol=0)
    got = np.array(list(d.fields["action"].distribution.values()))
    assert np.abs(got - softmax(z)).max() < 1e-4
    after = before + f'\n  "action": "{d.fields["action"].label}",'
    z2 = oracle_log_scores(
        tiny,
        sch,
        CONTEXT,
        "notify",
        texts=[after + f'\n  "notify": {v},' for v in ("true", "false")],
    )
    np.testing.assert_allclose(d.fields["notify"].log_scores, z2, atol=1e-3, rtol=0)
    got2 = np.array(list(d.fields["notify"].distribution.values()))
    assert np.abs(got2 - softmax(z2)).max() < 1e-4
    assert d.sequential_forward_passes == 4  # prefill, first pass, action, notify
    assert d.value.review.tags == tags.value and d.value.action == d.fields["action"].value
