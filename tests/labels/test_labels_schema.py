"""`Labels` and taxonomies as schemas: files, trees, their errors, and the prompt."""

from __future__ import annotations

import json
import math
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from pcd_tools import Labels
from pcd_tools.errors import (
    DuplicateChoiceError,
    InvalidChoiceError,
    SchemaError,
    TooFewChoicesError,
    UnknownParentError,
)
from pcd_tools.prompt import LIST_LIMIT, render_system
from pcd_tools.schema import TaxonomyCycleError, compile_schema
from pcd_tools.schema.json_schema import compile_json_schema

pytestmark = pytest.mark.unit

TREE = [
    {"value": "Food", "description": "things to eat"},
    {"value": "Tools"},
    {"value": "Fruit", "parent": "Food"},
    {"value": "Bread", "parent": "Food"},
    {"value": "apple", "parent": "Fruit", "description": "a red or green fruit"},
    {"value": "banana", "parent": "Fruit"},
    {"value": "rye", "parent": "Bread"},
    {"value": "Hand tools", "parent": "Tools"},
    {"value": "hammer", "parent": "Hand tools"},
    {"value": "saw", "parent": "Hand tools"},
]


def _csv(tmp_path, rows, header="value,description,parent"):
    p = tmp_path / "labels.csv"
    cols = header.split(",")
    lines = [header] + [",".join(str(r.get(c, "")) for c in cols) for r in rows]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_a_flat_file_builds_the_literal_with_its_descriptions(tmp_path):
    rows = [
        {"value": f"code-{i}", "description": f"the {i}th" if i % 2 else ""} for i in range(600)
    ]
    for path in (_csv(tmp_path, rows, "value,description"), tmp_path / "l.json"):
        if path.suffix == ".json":
            path.write_text(json.dumps(rows))
        labels = Labels.from_file(path)
        assert len(labels) == 600 and not labels.is_tree

        class Coded(BaseModel):
            code: labels.type = Field(description="the code")  # type: ignore[name-defined]

        f = compile_schema(Coded).field("code")
        assert f.cardinality == 600 and f.tree is None
        assert f.choices[1].description == "the 1th" and f.choices[0].description is None
    # a JSON list of plain values
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(["a", "b", 3]))
    assert Labels.from_file(plain).values == ("a", "b", 3)


def test_a_tree_file_is_a_taxonomy_written_as_paths(tmp_path):
    labels = Labels.from_file(_csv(tmp_path, TREE))
    assert labels.is_tree and labels.leaves == ("apple", "banana", "rye", "hammer", "saw")

    class Item(BaseModel):
        """Categorize the item."""

        item: labels.type = Field(description="The category")  # type: ignore[name-defined]

    f = compile_schema(Item).field("item")
    assert [c.literal for c in f.choices] == [
        '"Food > Fruit > apple"',
        '"Food > Fruit > banana"',
        '"Food > Bread > rye"',
        '"Tools > Hand tools > hammer"',
        '"Tools > Hand tools > saw"',
    ]
    assert [c.label for c in f.choices] == list(labels.leaves)  # the value is the leaf
    assert f.tree.top == ("Food", "Tools") and f.tree.description("Food") == "things to eat"
    assert f.tree.paths[3] == ("Tools", "Hand tools", "hammer")
    assert f.choices[0].description == "a red or green fruit"
    # the Pydantic model keeps a JSON schema
    assert "taxonomy" in Item.model_json_schema()["properties"]["item"]
    # and the JSON schema form reads the same tree
    js = compile_json_schema(Item.model_json_schema() | {"title": "Item"})
    assert [c.literal for c in js.field("item").choices] == [c.literal for c in f.choices]


def test_label_set_errors_are_typed_and_name_the_problem(tmp_path):
    with pytest.raises(TooFewChoicesError, match="no values"):
        Labels(())
    with pytest.raises(DuplicateChoiceError, match="'a' is listed twice"):
        Labels(("a", "b", "a"))
    with pytest.raises(InvalidChoiceError, match="accepted: str or int"):
        Labels(("a", 1.5))
    with pytest.raises(UnknownParentError, match="parent 'Z' of 'a' is not a value"):
        Labels(("a", "b"), parents={"a": "Z"})
    with pytest.raises(
        TaxonomyCycleError, match=r"cycle: 'a' -> 'b' -> 'a'|cycle: 'b' -> 'a' -> 'b'"
    ):
        Labels(("a", "b", "c"), parents={"a": "b", "b": "a", "c": "a"})
    with pytest.raises(InvalidChoiceError, match="no 'value' column"):
        Labels.from_file(_csv(tmp_path, [{"name": "x"}], "name"))
    bad = tmp_path / "x.txt"
    bad.write_text("a\n")
    with pytest.raises(InvalidChoiceError, match=r"accepted: \.csv or \.json"):
        Labels.from_file(bad)
    with pytest.raises(InvalidChoiceError, match="is not a file"):
        Labels.from_file(tmp_path / "missing.csv")


def test_a_taxonomy_given_by_hand_is_checked_too():
    def model(extra):
        class M(BaseModel):
            x: Literal["a", "b"] = Field(json_schema_extra={"taxonomy": extra})

        return M

    with pytest.raises(TaxonomyCycleError, match="cycle"):
        compile_schema(model({"parents": [["a", "P"], ["P", "Q"], ["Q", "P"], ["b", "P"]]}))
    with pytest.raises(UnknownParentError, match="'b' has no parent"):
        compile_schema(model({"parents": [["a", "P"]]}))
    with pytest.raises(SchemaError, match="both an answer and a parent"):
        compile_schema(model({"parents": [["a", "b"], ["b", "P"]]}))
    with pytest.raises(SchemaError, match="two parents"):
        compile_schema(model({"parents": [["a", "P"], ["a", "Q"], ["b", "P"]]}))
    with pytest.raises(SchemaError, match=r"accepted: .*parents"):
        compile_schema(model(["a"]))


def test_a_large_field_is_not_listed_in_the_prompt():
    values = tuple(f"zone-{i:04d}" for i in range(LIST_LIMIT + 1))

    class Big(BaseModel):
        z: Literal[values] = Field(description="the zone")  # type: ignore[valid-type]

    class Small(BaseModel):
        z: Literal[values[:LIST_LIMIT]] = Field(description="the zone")  # type: ignore[valid-type]

    big = render_system(compile_schema(Big))
    assert f"one of {LIST_LIMIT + 1:,} values, not all listed" in big
    assert '"zone-0004", ...' in big and '"zone-0005"' not in big
    small = render_system(compile_schema(Small))
    assert f'"zone-{LIST_LIMIT - 1:04d}"' in small and "not all listed" not in small


def test_a_large_taxonomy_lists_its_top_level():
    values, parents = ["A", "B"], {}
    for i in range(300):
        values.append(f"leaf {i}")
        parents[f"leaf {i}"] = "A" if i % 2 else "B"
    labels = Labels(tuple(values), {"A": "the first"}, parents)

    class T(BaseModel):
        t: labels.type  # type: ignore[name-defined]

    text = render_system(compile_schema(T))
    assert "a path in a tree of 300 labels" in text
    assert "joined by ' > '" in text and "the top level is one of: A (the first), B" in text
    assert math.isclose(len(labels), 300)
