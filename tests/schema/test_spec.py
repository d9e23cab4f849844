"""The compiled Schema: fingerprint and subset."""

from __future__ import annotations

import pytest

from pcd_tools import StructuredSchema
from pcd_tools.schema import compile_schema

pytestmark = pytest.mark.unit


def test_fingerprint_changes_with_anything_that_reaches_the_prompt():
    base = {"p": {"type": "enum", "choices": ["A", "B"], "description": "x"}}
    fp = compile_schema(base).fingerprint()
    assert (
        compile_schema(
            {"p": {"type": "enum", "choices": ["A", "C"], "description": "x"}}
        ).fingerprint()
        != fp
    )
    assert (
        compile_schema(
            {"p": {"type": "enum", "choices": ["A", "B"], "description": "y"}}
        ).fingerprint()
        != fp
    )
    assert (
        compile_schema(
            {"p": {"type": "enum", "choices": ["B", "A"], "description": "x"}}
        ).fingerprint()
        != fp
    )


def test_subset_narrows_fields_and_choices():
    s = StructuredSchema(
        {"a": {"type": "enum", "choices": ["x", "y", "z"]}, "b": {"type": "boolean"}}
    ).schema
    sub = s.subset(["a"], choices={"a": ["z", "x"]})
    assert sub.field_names == ["a"]
    assert sub.field("a").labels == ["x", "z"]
