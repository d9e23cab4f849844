"""Nested models: flattened into dotted fields, rebuilt into the real nested instance."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools.errors import EmptySchemaError, NestingTooDeepError, UnsupportedFieldError
from pcd_tools.prompt import field_suffix, render_system
from pcd_tools.schema import compile_schema
from pcd_tools.schema.nested import unflatten

pytestmark = pytest.mark.unit


class Address(BaseModel):
    country: Literal["FR", "DE"] = Field(description="Country of the address")


class Customer(BaseModel):
    tier: Literal["gold", "free"] = Field(description="Plan the customer is on")
    address: Address
    rating: int = Field(ge=1, le=3)


class Intake(BaseModel):
    """Read an intake form."""

    customer: Customer
    urgent: bool


def test_nested_fields_are_flattened_with_dotted_names_in_order():
    s = compile_schema(Intake)
    assert s.field_names == [
        "customer.tier",
        "customer.address.country",
        "customer.rating",
        "urgent",
    ]
    assert s.field("customer.tier").description == "Plan the customer is on"
    assert s.field("customer.rating").ordered is True
    assert field_suffix(s.field("customer.address.country")) == '\n  "customer.address.country": '
    assert '"customer.tier": Plan the customer is on' in render_system(s)


def test_build_returns_the_real_nested_instance():
    s = compile_schema(Intake)
    v = s.build(
        {
            "customer.tier": "gold",
            "customer.address.country": "DE",
            "customer.rating": 2,
            "urgent": False,
        }
    )
    assert v == Intake(
        customer=Customer(tier="gold", address=Address(country="DE"), rating=2), urgent=False
    )
    assert isinstance(v.customer.address, Address)


def test_a_narrowed_subset_stays_flat():
    sub = compile_schema(Intake).subset(
        ["customer.tier", "urgent"], choices={"customer.tier": ["gold"]}
    )
    assert sub.field("customer.tier").labels == ["gold"]
    v = sub.build({"customer.tier": "gold", "urgent": True})
    assert v.model_dump() == {"customer.tier": "gold", "urgent": True}


def test_unflatten():
    assert unflatten({"a.b.c": 1, "a.d": 2, "e": 3}) == {"a": {"b": {"c": 1}, "d": 2}, "e": 3}


def test_recursion_is_refused_naming_the_chain():
    class Node(BaseModel):
        child: Node
        ok: bool

    Node.model_rebuild()
    with pytest.raises(NestingTooDeepError) as e:
        compile_schema(Node)
    assert str(e.value).startswith("Node.child: nested models recurse (Node -> Node); accepted:")
    assert (e.value.model, e.value.field) == ("Node", "child")


def test_too_deep_nesting_is_refused():
    class L5(BaseModel):
        x: bool

    class L4(BaseModel):
        n: L5

    class L3(BaseModel):
        n: L4

    class L2(BaseModel):
        n: L3

    class L1(BaseModel):
        n: L2

    class Top(BaseModel):
        n: L1

    with pytest.raises(NestingTooDeepError, match=r"Top.n.n.n.n.n: nested models go deeper than 4"):
        compile_schema(Top)


def test_optional_and_empty_nested_models_are_refused():
    class Empty(BaseModel):
        pass

    class A(BaseModel):
        c: Customer | None = None

    class B(BaseModel):
        e: Empty

    with pytest.raises(UnsupportedFieldError, match=r"A.c: an optional nested model \(Customer"):
        compile_schema(A)
    with pytest.raises(EmptySchemaError, match=r"B.e: nested model Empty declares no fields"):
        compile_schema(B)


def test_unsupported_leaf_names_its_dotted_path():
    class Inner(BaseModel):
        note: bytes

    class Outer(BaseModel):
        inner: Inner

    with pytest.raises(
        UnsupportedFieldError, match=r"^Outer.inner.note: unsupported annotation bytes"
    ):
        compile_schema(Outer)
