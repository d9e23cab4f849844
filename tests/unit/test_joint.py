"""Joint answers of `choices_by` fields from synthetic scores (no model)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from pcd_tools.answers.joint import answers
from pcd_tools.prompt import questions
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit

SUBS = {"a": ["a1", "a2"], "b": ["b1", "shared", "b3"], "c": ["shared"]}


class Pair(BaseModel):
    parent: Literal["a", "b", "c"]
    child: str = Field(json_schema_extra={"choices_by": {"parent": SUBS}})
    flag: bool


SCHEMA = compile_schema(Pair)
QS = questions(SCHEMA)
scores = st.floats(-20, 0, allow_nan=False)


@settings(max_examples=80, deadline=None)
@given(st.data(), st.floats(0.3, 3.0))
def test_joint_marginals_sum_to_one_and_the_best_answer_is_the_joint_argmax(data, temperature):
    logz = [
        np.array(data.draw(st.lists(scores, min_size=len(q.texts), max_size=len(q.texts))))
        for q in QS
    ]
    fields, joint = answers(SCHEMA, QS, logz, temperature)
    table = joint[("parent", "child")]
    assert sum(table.values()) == pytest.approx(1.0)
    assert set(table) == {(p, c) for p, cs in SUBS.items() for c in cs}
    for name in ("parent", "child", "flag"):
        assert sum(fields[name].distribution.values()) == pytest.approx(1.0)
    for p in SUBS:  # the parent's marginal is its own distribution
        got = sum(v for (pp, _), v in table.items() if pp == p)
        assert got == pytest.approx(fields["parent"].distribution[p])
    for c in fields["child"].distribution:
        got = sum(v for (_, cc), v in table.items() if cc == c)
        assert got == pytest.approx(fields["child"].distribution[c])
    best = (fields["parent"].label, fields["child"].label)
    assert table[best] == max(table.values())
    assert fields["child"].probability == pytest.approx(fields["child"].distribution[best[1]])
    assert fields["parent"].probability == pytest.approx(fields["parent"].distribution[best[0]])


def test_the_joint_best_answer_can_differ_from_answering_the_parent_first():
    # P(a) = 0.55 but split over two children; P(c) = 0.45 with its single child.
    z = {
        "parent": np.log([0.55, 1e-9, 0.45]),
        "child|parent=0": np.log([0.5, 0.5]),
        "child|parent=1": np.log([1 / 3] * 3),
        "child|parent=2": np.array([0.0]),
        "flag": np.log([0.9, 0.1]),
    }
    fields, joint = answers(SCHEMA, QS, [z[q.key] for q in QS], 1.0)
    assert (fields["parent"].label, fields["child"].label) == ("c", "shared")
    assert max(fields["parent"].distribution, key=fields["parent"].distribution.get) == "a"
    assert fields["parent"].probability == pytest.approx(0.45)
    assert joint[("parent", "child")][("a", "a1")] == pytest.approx(0.275)
    assert fields["child"].distribution["a2"] == pytest.approx(0.275)
