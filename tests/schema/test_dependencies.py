"""Dependent fields: parents resolved, cycles named, waves from a topological sort."""

from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, create_model

from pcd_tools.errors import DependencyCycleError, UnknownParentError
from pcd_tools.prompt import field_questions, questions
from pcd_tools.schema import compile_schema
from pcd_tools.schema.dependencies import ancestors, waves

pytestmark = pytest.mark.unit


class Inner(BaseModel):
    kind: Literal["a", "b"]
    detail: Literal["x", "y"] = Field(json_schema_extra={"depends_on": ["kind"]})


class Routed(BaseModel):
    category: Literal["billing", "bug"]
    sub: Literal["x", "y"] = Field(json_schema_extra={"depends_on": ["category"]})
    team: Literal["t1", "t2"] = Field(json_schema_extra={"depends_on": "sub"})
    urgent: bool
    inner: Inner


def test_parents_resolve_and_fields_fall_into_waves():
    s = compile_schema(Routed)
    assert s.field("team").depends_on == ("sub",)
    assert s.field("inner.detail").depends_on == ("inner.kind",)  # a sibling first
    assert waves(s.name, s.fields) == [
        ["category", "urgent", "inner.kind"],
        ["sub", "inner.detail"],
        ["team"],
    ]
    assert ancestors(s.fields, "team") == ["category", "sub"]
    assert [q.field for q in questions(s)] == ["category", "urgent", "inner.kind"]
    assert s.to_spec()["fields"][2]["depends_on"] == ["sub"]


def test_a_later_wave_writes_the_ancestors_answers_before_its_suffix():
    s = compile_schema(Routed)
    (q,) = field_questions(s, s.field("team"), [("category", 1), ("sub", 0)])
    assert q.texts[0] == '\n  "category": "bug",\n  "sub": "x",\n  "team": "t1",'
    assert q.given == (("category", 1), ("sub", 0))
    assert q.key == "team|category=1|sub=0"


def test_a_cycle_is_named():
    class C(BaseModel):
        a: bool = Field(json_schema_extra={"depends_on": ["c"]})
        b: bool = Field(json_schema_extra={"depends_on": ["a"]})
        c: bool = Field(json_schema_extra={"depends_on": ["b"]})

    with pytest.raises(DependencyCycleError) as e:
        compile_schema(C)
    assert str(e.value).startswith(
        "C: the fields depend on each other in a cycle (a -> c -> b -> a)"
    )


def test_an_unknown_or_self_parent_names_the_fields_that_exist():
    class U(BaseModel):
        a: bool
        b: bool = Field(json_schema_extra={"depends_on": ["nope"]})

    class S(BaseModel):
        a: bool = Field(json_schema_extra={"depends_on": ["a"]})
        b: bool

    with pytest.raises(UnknownParentError) as e:
        compile_schema(U)
    assert str(e.value) == (
        "U.b: depends on 'nope', which is not another field of U; accepted: one of ['a']."
    )
    assert (e.value.model, e.value.field) == ("U", "b")
    with pytest.raises(UnknownParentError, match=r"S.a: depends on 'a'"):
        compile_schema(S)
    with pytest.raises(UnknownParentError, match=r"depends_on=3; accepted: a list of field names"):
        compile_schema(create_model("N", a=(bool, Field(json_schema_extra={"depends_on": 3}))))


def test_a_multilabel_parent_is_a_wave_and_its_chosen_labels_are_written():
    class M(BaseModel):
        tags: list[Literal["a", "b", "c"]]
        b: bool = Field(json_schema_extra={"depends_on": ["tags"]})

    s = compile_schema(M)
    assert waves(s.name, s.fields) == [["tags"], ["b"]]
    assert [(q.field, q.label) for q in questions(s)] == [("tags", 0), ("tags", 1), ("tags", 2)]
    (q,) = field_questions(s, s.field("b"), [("tags", (1,))])
    assert q.texts[0] == '\n  "tags": {"a": false, "b": true, "c": false},\n  "b": true,'


@st.composite
def dags(draw):
    n = draw(st.integers(1, 7))
    parents = [
        sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [] for i in range(n)
    ]
    order = draw(st.permutations(range(n)))  # declaration order differs from the DAG's
    return parents, order


@settings(max_examples=60, deadline=None)
@given(dags())
def test_random_dags_compile_into_the_right_waves(dag):
    parents, order = dag
    defs = {}
    for i in order:
        extra = {"depends_on": [f"f{p}" for p in parents[i]]}
        defs[f"f{i}"] = (bool, Field(json_schema_extra=extra))
    s = compile_schema(create_model("D", **defs))
    got = waves(s.name, s.fields)
    level = {}
    for i in range(len(parents)):  # parents have smaller indices: a plain longest path
        level[i] = 1 + max((level[p] for p in parents[i]), default=-1)
    assert [sorted(w) for w in got] == [
        sorted(f"f{i}" for i in level if level[i] == k) for k in range(max(level.values()) + 1)
    ]
    declared = [f"f{i}" for i in order]
    for w in got:  # declaration order inside each wave
        assert w == sorted(w, key=declared.index)
