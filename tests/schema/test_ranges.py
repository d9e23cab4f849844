"""Integer ranges: bounded `int` fields compile to an ordered field of the integers."""

from __future__ import annotations

from typing import Annotated

import numpy as np
import pytest
from pydantic import BaseModel, Field, conint

from pcd_tools.answers.result import FieldResult
from pcd_tools.errors import TooFewChoicesError
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit


def test_every_spelling_of_a_bounded_int_compiles_to_its_integers_in_order():
    class M(BaseModel):
        a: int = Field(ge=1, le=5)
        b: Annotated[int, Field(ge=0, lt=3)]
        c: conint(gt=0, le=4)  # type: ignore[valid-type]
        d: int = Field(ge=0, le=20, multiple_of=5)
        e: int | None = Field(default=None, ge=1, le=3)

    s = compile_schema(M)
    assert [f.labels for f in s.fields] == [
        [1, 2, 3, 4, 5],
        [0, 1, 2],
        [1, 2, 3, 4],
        [0, 5, 10, 15, 20],
        [1, 2, 3, None],
    ]
    assert [f.ordered for f in s.fields] == [True] * 5
    assert s.field("a").choices[0].literal == "1"
    assert s.field("e").optional is True
    assert s.build({"a": 3, "b": 0, "c": 4, "d": 15, "e": None}) == M(a=3, b=0, c=4, d=15)


def test_a_range_changes_the_fingerprint_only_by_its_values_and_order_flag():
    class Lit(BaseModel):
        a: int = Field(ge=1, le=2)

    spec = compile_schema(Lit).to_spec()["fields"][0]
    assert spec["ordered"] is True
    assert spec["choices"] == [["1", None], ["2", None]]


def test_a_range_over_255_values_is_generated_within_its_bounds():
    class Big(BaseModel):
        amount: int = Field(ge=0, le=1000)

    f = compile_schema(Big).field("amount")
    assert f.generated and f.choices == ()
    assert (f.generation.type, f.generation.ge, f.generation.le) == ("integer", 0, 1000)


def test_255_values_is_accepted():
    class Edge(BaseModel):
        n: int = Field(ge=1, le=255)

    assert compile_schema(Edge).field("n").cardinality == 255


@pytest.mark.parametrize(
    ("kwargs", "missing"), [({}, "lower or upper"), ({"ge": 1}, "upper"), ({"le": 3}, "lower")]
)
def test_a_free_int_is_generated_with_the_bounds_it_has(kwargs, missing):
    class Free(BaseModel):
        n: int = Field(**kwargs)

    g = compile_schema(Free).field("n").generation
    assert g is not None and g.type == "integer"
    assert (g.ge, g.le) == (kwargs.get("ge"), kwargs.get("le"))
    assert missing  # (a free int used to be refused for its missing bound)


def test_a_single_value_range_is_one_choice_and_an_empty_one_is_too_few():
    class One(BaseModel):
        n: int = Field(ge=3, le=3)

    class Empty(BaseModel):
        n: int = Field(ge=3, le=2)

    assert compile_schema(One).field("n").labels == [3]
    with pytest.raises(TooFewChoicesError) as e:
        compile_schema(Empty)
    assert str(e.value) == (
        "Empty.n: the int range 3..2 in annotation int has 0 value(s); accepted: 1 to 255 "
        "values per scored field."
    )


def test_expected_is_the_mean_over_the_integers_and_ignores_not_stated():
    class R(BaseModel):
        n: int | None = Field(default=None, ge=1, le=3)
        flag: bool

    s = compile_schema(R)
    probs = np.array([0.2, 0.2, 0.4, 0.2])
    res = FieldResult.from_probs(s.field("n"), probs, np.log(probs))
    assert res.expected == pytest.approx((1 * 0.2 + 2 * 0.2 + 3 * 0.4) / 0.8)
    flag = FieldResult.from_probs(s.field("flag"), np.array([0.5, 0.5]), np.zeros(2))
    assert flag.expected is None
