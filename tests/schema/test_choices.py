"""Choice limits: a single-choice field takes any number of values; a multi-label field
1 to 255 labels (each is a question of its own); memory bounds the rest."""

from __future__ import annotations

import enum
from typing import Literal

import pytest
from pydantic import BaseModel, Field

import pcd_tools
from pcd_tools import StructuredSchema
from pcd_tools.engine.passes.pack import check_trie_memory
from pcd_tools.errors import (
    DuplicateChoiceError,
    LabelSetTooLargeError,
    TooFewChoicesError,
    TooManyChoicesError,
)
from pcd_tools.schema import compile_schema
from pcd_tools.schema.json_schema import compile_json_schema

pytestmark = pytest.mark.unit

MANY = tuple(f"CODE_{i:05d}" for i in range(5000))


def test_every_single_choice_form_takes_thousands_of_values():
    class Billing(BaseModel):
        code: Literal[MANY]  # type: ignore[valid-type]

    Codes = enum.Enum("Codes", {v: v for v in MANY})

    class ByEnum(BaseModel):
        code: Codes

    assert compile_schema(Billing).field("code").cardinality == 5000
    assert compile_schema(ByEnum).field("code").cardinality == 5000
    assert pcd_tools.decision(Billing)  # the decorator compiles it too
    js = {"type": "object", "properties": {"code": {"enum": list(MANY)}}, "required": ["code"]}
    assert compile_json_schema(js).field("code").cardinality == 5000
    seed = StructuredSchema({"c": {"type": "enum", "choices": list(MANY)}})
    assert seed.schema.field("c").cardinality == 5000


def test_a_multilabel_field_read_each_takes_at_most_255_labels_and_says_why():
    ok = StructuredSchema({"m": {"type": "multilabel", "choices": [f"l{i}" for i in range(255)]}})
    assert ok.schema.field("m").cardinality == 255

    class Tags(BaseModel):
        tags: list[Literal[MANY[:300]]] = Field(json_schema_extra={"reading": "each"})  # type: ignore[valid-type]

    with pytest.raises(TooManyChoicesError) as e:
        compile_schema(Tags)
    msg = str(e.value)
    assert len(msg) < 500, len(msg)
    assert "Tags.tags" in msg and "300 labels" in msg and "1 to 255" in msg
    assert "yes/no question" in msg and "any number of values" in msg and "'ranked'" in msg
    # the count, the limit and the advice come first, then a few example values
    assert msg.index("300 labels") < msg.index("any number") < msg.index("'CODE_00000'")
    assert "'CODE_00004'" in msg and "'CODE_00005'" not in msg and "and 295 more" in msg
    assert e.value.model == "Tags" and e.value.field == "tags"


def test_too_many_labels_examples_are_truncated():
    long = [f"{i}-" + "x" * 500 for i in range(256)]
    with pytest.raises(TooManyChoicesError) as e:
        StructuredSchema({"m": {"type": "multilabel", "choices": long, "reading": "each"}})
    assert len(str(e.value)) < 600
    assert "and 251 more" in str(e.value)


def test_empty_and_duplicate_label_sets_are_refused():
    with pytest.raises(DuplicateChoiceError, match="CODE_00001"):
        StructuredSchema({"c": {"type": "enum", "choices": [*MANY[:3], "CODE_00001"]}})
    with pytest.raises(TooFewChoicesError, match="at least 1 choice"):
        StructuredSchema({"c": {"type": "enum", "choices": []}})


def test_the_limit_that_remains_is_memory_with_the_numbers():
    seqs = [[1, 2, 3, i, 9] for i in range(1000)]
    check_trie_memory("S", "code", seqs, available=1 << 30)  # 5 MB of 1 GiB: fine
    with pytest.raises(LabelSetTooLargeError) as e:
        check_trie_memory("S", "code", seqs, available=8 << 20)
    msg = str(e.value)
    assert isinstance(e.value, TooManyChoicesError)
    assert "S.code: 1,000 labels (5,000 candidate tokens)" in msg
    assert "GiB available now" in msg and "bytes per candidate token" in msg
    assert e.value.model == "S" and e.value.field == "code"
