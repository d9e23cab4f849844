"""Multi-label fields: one yes/no question per label; threshold and length bounds."""

from __future__ import annotations

import enum
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools.answers.field_scores import field_results
from pcd_tools.answers.result import FieldResult, choose_labels
from pcd_tools.errors import InvalidFieldOptionError, UnsupportedFieldError
from pcd_tools.prompt import questions, render_system
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit


class Channel(enum.Enum):
    EMAIL = "email"
    PHONE = "phone"


class Tagged(BaseModel):
    """Tag a ticket."""

    tags: list[Literal["billing", "bug", "refund"]] = Field(
        description="Topics", json_schema_extra={"threshold": 0.3}
    )
    seen: set[Channel] = Field(min_length=1, max_length=1)
    urgent: bool


def test_list_set_and_enum_labels_compile_to_multilabel_fields():
    s = compile_schema(Tagged)
    tags, seen = s.field("tags"), s.field("seen")
    assert (tags.kind, tags.labels, tags.threshold) == (
        "multilabel",
        ["billing", "bug", "refund"],
        0.3,
    )
    assert (seen.kind, seen.labels, seen.min_labels, seen.max_labels) == (
        "multilabel",
        ["email", "phone"],
        1,
        1,
    )
    assert (tags.min_labels, tags.max_labels, seen.threshold) == (0, None, 0.5)
    assert 'true or false for whether it applies: "billing", "bug", "refund"' in render_system(s)


def test_each_label_is_its_own_yes_no_question_after_the_other_fields_text():
    s = compile_schema(Tagged)
    qs = questions(s)
    assert [q.key for q in qs] == ["tags[0]", "tags[1]", "tags[2]", "seen[0]", "seen[1]", "urgent"]
    assert qs[1].texts == ('\n  "tags": {"bug": true,', '\n  "tags": {"bug": false,')
    assert qs[5].texts == ('\n  "urgent": true,', '\n  "urgent": false,')


def test_choose_labels_threshold_then_bounds():
    p = np.array([0.9, 0.2, 0.6, 0.6])
    assert choose_labels(p, 0.5) == [0, 2, 3]
    assert choose_labels(p, 0.5, max_labels=2) == [0, 2]  # ties: declared order
    assert choose_labels(p, 0.95, min_labels=1) == [0]
    assert choose_labels(p, 0.1) == [0, 1, 2, 3]
    assert choose_labels(np.array([0.1, 0.2]), 0.5) == []


def test_field_results_build_labels_value_and_the_instance():
    s = compile_schema(Tagged)
    qs = questions(s)
    # log scores (z_true, z_false) per label; P(yes) = sigmoid(z_true - z_false)
    z = [np.log([p, 1 - p]) for p in (0.35, 0.1, 0.8, 0.4, 0.45)] + [np.log([0.7, 0.3])]
    res = field_results(s, qs, z, 1.0)
    tags = res["tags"]
    assert tags.value == ["billing", "refund"]  # threshold 0.3
    assert tags.labels == pytest.approx({"billing": 0.35, "bug": 0.1, "refund": 0.8})
    assert tags.probability == pytest.approx(0.35)  # the least certain decision
    assert tags.log_scores == pytest.approx(tuple(np.log(p / (1 - p)) for p in (0.35, 0.1, 0.8)))
    seen = res["seen"]
    assert seen.value == [Channel.PHONE]  # none passes 0.5; min_length=1 takes the best
    assert seen.probability == pytest.approx(0.45)
    v = s.build({n: r.value for n, r in res.items()})
    assert v == Tagged(tags=["billing", "refund"], seen={Channel.PHONE}, urgent=True)
    assert res["urgent"].labels is None
    assert list(res) == ["tags", "seen", "urgent"]


def test_multilabel_result_summaries():
    s = compile_schema(Tagged)
    r = FieldResult.from_labels(s.field("tags"), np.array([0.9, 0.5, 0.0]), [0.0, 0.0, 0.0])
    assert r.margin == pytest.approx(0.0)
    assert r.entropy == pytest.approx(-(0.9 * np.log(0.9) + 0.1 * np.log(0.1)) + np.log(2))
    assert r.top_choices[0] == ("billing", 0.9)


@pytest.mark.parametrize(
    ("extra", "kw", "match"),
    [
        ({"threshold": 1.0}, {}, r"M.t: threshold 1.0 in json_schema_extra; accepted: a number"),
        ({"threshold": "x"}, {}, r"threshold 'x'"),
        ({}, {"min_length": 3, "max_length": 2}, r"min_length=3, max_length=2 with 2 labels"),
        ({}, {"min_length": 3}, r"min_length=3, max_length=None with 2 labels"),
        ({}, {"max_length": 0}, r"max_length=0"),
    ],
)
def test_bad_options_are_typed_errors(extra, kw, match):
    class M(BaseModel):
        t: list[Literal["a", "b"]] = Field(json_schema_extra=extra, **kw)

    with pytest.raises(InvalidFieldOptionError, match=match) as e:
        compile_schema(M)
    assert (e.value.model, e.value.field) == ("M", "t")


def test_unsupported_items_and_too_few_labels():
    class S(BaseModel):
        t: list[float]

    class One(BaseModel):
        t: list[Literal["a"]]

    with pytest.raises(UnsupportedFieldError, match=r"S.t: unsupported annotation list\[float\]"):
        compile_schema(S)
    one = compile_schema(One).field("t")  # one label: one yes/no question
    assert (one.kind, one.labels) == ("multilabel", ["a"])
