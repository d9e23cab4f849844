"""JSON schema -> Schema: the shapes OpenAI-style clients send compile like their models."""

from __future__ import annotations

import ast
import enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import pytest
from pydantic import BaseModel, Field, ValidationError

from pcd_tools.errors import (
    InvalidArgumentError,
    InvalidFieldNameError,
    InvalidJsonSchemaError,
    NestingTooDeepError,
    SchemaError,
    SchemaTooLargeError,
    TooManyChoicesError,
    UnsupportedFieldError,
    UnsupportedSchemaKeywordError,
)
from pcd_tools.schema import Schema, StructuredSchema, compile_schema
from pcd_tools.schema.json_schema import compile_json_schema, is_json_schema, json_schema_model

pytestmark = pytest.mark.unit


class Department(enum.Enum):
    BILLING = "BILLING"
    TECHNICAL = "TECHNICAL"
    ACCOUNT = "ACCOUNT"


class Level(int, enum.Enum):
    LOW = 1
    HIGH = 2


class Ticket(BaseModel):
    """Triage an inbound customer support ticket."""

    priority: Literal["P0", "P1", "P2"] = Field(
        description="Urgency tier",
        json_schema_extra={"choice_descriptions": {"P0": "outage", "P2": "question"}},
    )
    escalate: bool = Field(description="Whether to page on-call")
    department: Department = Field(description="Owning team")
    level: Level


class Optionals(BaseModel):
    topic: Literal["food", "service"] | None = Field(default=None, description="What it is about")
    positive: bool | None = None
    department: Department | None = None
    stars: int | None = Field(default=None, ge=1, le=5)


class Ranges(BaseModel):
    rating: int = Field(ge=1, le=5, description="Stars")
    tenth: int = Field(gt=0, lt=4)
    bucket: int = Field(ge=0, le=20, multiple_of=5)


class Address(BaseModel):
    region: Literal["eu", "us"]
    verified: bool


class Customer(BaseModel):
    tier: Literal["gold", "silver"] = Field(description="Plan")
    address: Address


class Nested(BaseModel):
    customer: Customer
    billing: Address
    urgent: bool


class Labels(BaseModel):
    tags: list[Literal["bug", "billing", "ux"]] = Field(
        min_length=1,
        max_length=2,
        description="Every topic that applies",
        json_schema_extra={"threshold": 0.3, "choice_descriptions": {"ux": "design"}},
    )
    teams: set[Department]


class Refund(BaseModel):
    kind: Literal["refund"]
    reason: Literal["late", "broken"]


class Bug(BaseModel):
    kind: Literal["bug"]
    blocking: bool
    severity: int = Field(ge=1, le=3)


class Request(BaseModel):
    """Read a request."""

    request: Annotated[Union[Refund, Bug], Field(discriminator="kind")]  # noqa: UP007
    urgent: bool


class Dependent(BaseModel):
    category: Literal["billing", "bug"]
    subcategory: str = Field(
        json_schema_extra={
            "choices_by": {"category": {"billing": ["refund", "invoice"], "bug": ["crash"]}}
        }
    )
    severity: Literal["low", "high"] = Field(json_schema_extra={"depends_on": ["category"]})
    team: Literal["a", "b", "c"] = Field(
        json_schema_extra={"choices_by": {"category": {"billing": ["a"], "bug": ["b", "c"]}}}
    )


MODELS = [Ticket, Optionals, Ranges, Nested, Labels, Request, Dependent]


def _projection(s: Schema, descriptions: bool = True) -> list[tuple[Any, ...]]:
    return [
        (
            f.name,
            f.kind,
            [c.literal for c in f.choices],
            [c.description for c in f.choices],
            f.optional,
            f.ordered,
            f.threshold,
            f.min_labels,
            f.max_labels,
            f.depends_on,
            f.choices_by,
            f.branch,
            f.description if descriptions else None,
        )
        for f in s.fields
    ]


def _strict(model: type[BaseModel]) -> dict[str, Any]:
    try:
        from openai.lib._pydantic import to_strict_json_schema
    except ImportError:
        pytest.skip("openai is not installed: no strict transformation to compare with")
    return to_strict_json_schema(model)


def _tool_parameters(model: type[BaseModel]) -> dict[str, Any]:
    try:
        from langchain_core.utils.function_calling import convert_to_openai_tool
    except ImportError:
        pytest.skip("langchain-core is not installed: no function-calling form to compare with")
    return convert_to_openai_tool(model)["function"]["parameters"]


# --- round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_model_json_schema_compiles_like_the_model(model):
    want, got = compile_schema(model), compile_json_schema(model.model_json_schema())
    assert _projection(got) == _projection(want)
    assert (got.name, got.instructions) == (want.name, want.instructions)
    assert got.fingerprint() == want.fingerprint()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_openais_strict_form_compiles_like_the_model(model):
    want, got = compile_schema(model), compile_json_schema(_strict(model))
    assert _projection(got) == _projection(want)
    assert (got.name, got.instructions) == (want.name, want.instructions)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_langchains_function_calling_form_compiles_like_the_model(model):
    got = compile_json_schema(_tool_parameters(model), name=model.__name__)
    assert _projection(got) == _projection(compile_schema(model))
    assert got.name == model.__name__


def test_a_strict_tool_form_with_inlined_refs_compiles_too():
    lc = pytest.importorskip("langchain_core.utils.function_calling")
    fn = lc.convert_to_openai_tool(Request, strict=True)["function"]
    got = compile_json_schema(fn["parameters"], name=fn["name"])
    assert _projection(got) == _projection(compile_schema(Request))


def test_a_union_without_a_discriminator_keyword_uses_the_const_in_every_branch():
    class Loose(BaseModel):
        request: Union[Refund, Bug]  # noqa: UP007

    props = Loose.model_json_schema()["properties"]["request"]
    assert "discriminator" not in props and "anyOf" in props
    s = compile_json_schema(Loose.model_json_schema())
    assert s.field_names == _names(Request)[:-1]
    assert s.field("request.kind").labels == ["refund", "bug"]


def _names(model: type[BaseModel]) -> list[str]:
    return compile_schema(model).field_names


def test_the_built_model_validates_and_builds_answers():
    s = compile_json_schema(Request.model_json_schema())
    answer = s.build(
        {
            "request.kind": "bug",
            "request[refund].reason": "late",  # another branch's answer: dropped
            "request[bug].blocking": True,
            "request[bug].severity": 2,
            "urgent": False,
        }
    )
    assert answer.model_dump() == {
        "request": {"kind": "bug", "blocking": True, "severity": 2},
        "urgent": False,
    }
    model = json_schema_model(Nested.model_json_schema())
    assert model is compile_json_schema(Nested.model_json_schema()).model
    with pytest.raises(ValidationError):  # additionalProperties: false -> extra keys forbidden
        model.model_validate({"customer": {}, "billing": {}, "urgent": True, "other": 1})


# --- the JSON-schema shapes themselves ---------------------------------------------------


def _obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def test_title_and_description_are_the_name_and_instructions():
    schema = {**_obj(ok={"type": "boolean"}), "title": "Review", "description": "Read it."}
    s = compile_json_schema(schema)
    assert (s.name, s.instructions) == ("Review", "Read it.")
    assert compile_json_schema(schema, name="review-v2").name == "review-v2"
    assert compile_json_schema(_obj(ok={"type": "boolean"})).name == "JsonSchema"


def test_enum_const_and_type_lists():
    s = compile_json_schema(
        _obj(
            color={"enum": ["red", "green"], "description": "The color"},
            size={"type": ["integer", "null"], "enum": [1, 2, 3, None]},
            flag={"enum": [True, False]},
            maybe={"type": ["boolean", "null"]},
            legacy={"type": "boolean", "nullable": True},
            mixed={"type": ["string", "integer"], "enum": ["a", 1]},
        )
    )
    assert [(f.name, f.kind, f.labels) for f in s.fields] == [
        ("color", "enum", ["red", "green"]),
        ("size", "enum", [1, 2, 3, None]),
        ("flag", "boolean", [True, False]),
        ("maybe", "boolean", [True, False, None]),
        ("legacy", "boolean", [True, False, None]),
        ("mixed", "enum", ["a", 1]),
    ]
    assert s.field("color").description == "The color"


def test_const_members_are_an_enum_with_choice_descriptions():
    s = compile_json_schema(
        _obj(
            mood={
                "oneOf": [
                    {"const": "happy", "description": "Pleased"},
                    {"const": "sad", "description": "Unhappy"},
                    {"type": "null"},
                ]
            },
            tags={"type": "array", "items": {"anyOf": [{"const": "a"}, {"const": "b"}]}},
        )
    )
    mood = s.field("mood")
    assert mood.labels == ["happy", "sad", None]
    assert [c.description for c in mood.choices][:2] == ["Pleased", "Unhappy"]
    assert (s.field("tags").kind, s.field("tags").labels) == ("multilabel", ["a", "b"])


def test_integer_bounds_exclusive_and_draft4_forms():
    s = compile_json_schema(
        _obj(
            a={"type": "integer", "exclusiveMinimum": 0.5, "exclusiveMaximum": 4},
            b={"type": "integer", "minimum": 0, "maximum": 4, "exclusiveMinimum": True},
            c={"type": "integer", "minimum": 1.5, "maximum": 3.9, "format": "int32"},
        )
    )
    assert [f.labels for f in s.fields] == [[1, 2, 3], [1, 2, 3, 4], [2, 3]]
    assert all(f.ordered for f in s.fields)


def test_one_member_allof_and_ref_siblings_are_merged():
    schema = {
        "type": "object",
        "properties": {
            "dept": {"allOf": [{"$ref": "#/$defs/Dept"}], "description": "Team"},
            "again": {"$ref": "#/$defs/Dept", "choice_descriptions": {"A": "first"}},
        },
        "$defs": {"Dept": {"enum": ["A", "B"], "type": "string"}},
    }
    s = compile_json_schema(schema)
    assert s.field("dept").description == "Team"
    assert s.field("again").choices[0].description == "first"


def test_a_recursive_model_top_is_accepted_when_its_recursion_is_not_reached():
    schema = {"$defs": {"Top": _obj(ok={"type": "boolean"})}, "$ref": "#/$defs/Top"}
    assert is_json_schema(schema)
    assert compile_json_schema(schema).field_names == ["ok"]


def test_equal_schemas_give_the_same_schema_and_order_matters():
    a = compile_json_schema(_obj(x={"type": "boolean"}, y={"type": "boolean"}))
    b = compile_json_schema(_obj(x={"type": "boolean"}, y={"type": "boolean"}))
    c = compile_json_schema(_obj(y={"type": "boolean"}, x={"type": "boolean"}))
    assert a is b
    assert c.field_names == ["y", "x"]


# --- refused ------------------------------------------------------------------------------

UNSUPPORTED = [
    ("max length", {"type": "string", "enum": ["a", "b"], "maxLength": 1}, "maxLength", ""),
    ("email", {"type": "string", "format": "email"}, "format", ""),
    ("format and length", {"type": "string", "format": "date", "maxLength": 10}, "maxLength", ""),
    ("exclusive float", {"type": "number", "exclusiveMinimum": 0}, "exclusiveMinimum", ""),
    ("float step", {"type": "number", "multipleOf": 0.5}, "multipleOf", ""),
    ("wide int step", {"type": "integer", "minimum": 0, "multipleOf": 5}, "multipleOf", ""),
    ("encoded", {"type": "string", "contentEncoding": "base64"}, "contentEncoding", ""),
    ("dates", {"type": "array", "items": {"type": "string", "format": "date"}}, "items", "/items"),
    ("objects", {"type": "array", "items": _obj(a={"type": "boolean"})}, "items", "/items"),
    ("no items", {"type": "array"}, "items", ""),
    ("map", {"type": "object", "additionalProperties": True}, "additionalProperties", ""),
    (
        "typed map",
        {"type": "object", "additionalProperties": {"type": "integer"}},
        "additionalProperties",
        "",
    ),
    ("free object", {"type": "object"}, "type", ""),
    ("not", {"not": {"type": "string"}}, "not", ""),
    ("if", {"if": {"type": "string"}, "then": {"type": "string"}}, "if", ""),
    ("pattern props", {"type": "object", "patternProperties": {}}, "patternProperties", ""),
    ("intersection", {"allOf": [{"type": "boolean"}, {"type": "boolean"}]}, "allOf", ""),
    ("float enum", {"enum": [0.5, 1.5]}, "enum", ""),
    ("only null", {"type": "null"}, "type", ""),
    ("untyped", {}, "type", ""),
    (
        "multipleOf",
        {"type": "integer", "minimum": 0, "maximum": 2, "multipleOf": 0.5},
        "multipleOf",
        "",
    ),
    ("remote ref", {"$ref": "https://example.com/s.json"}, "$ref", ""),
    (
        "no discriminator",
        {"anyOf": [_obj(a={"type": "boolean"}), _obj(b={"type": "boolean"})]},
        "anyOf",
        "",
    ),
    ("mixed union", {"oneOf": [{"type": "boolean"}, {"enum": ["a", "b"]}]}, "oneOf", ""),
    ("nullable object", {"anyOf": [_obj(a={"type": "boolean"}), {"type": "null"}]}, "anyOf", ""),
    ("nullable array", {"type": ["array", "null"], "items": {"enum": ["a", "b"]}}, "type", ""),
    (
        "branch without tag",
        {
            "oneOf": [_obj(k={"const": "a"}, v={"type": "boolean"}), _obj(v={"type": "boolean"})],
            "discriminator": {"propertyName": "k"},
        },
        "discriminator",
        "/oneOf/1",
    ),
]


@pytest.mark.parametrize(
    ("node", "keyword", "tail"), [u[1:] for u in UNSUPPORTED], ids=[u[0] for u in UNSUPPORTED]
)
def test_each_unsupported_keyword_is_refused_with_its_keyword_and_path(node, keyword, tail):
    schema = {"type": "object", "title": "T", "properties": {"customer": _obj(name=node)}}
    with pytest.raises(UnsupportedSchemaKeywordError) as e:
        compile_json_schema(schema)
    path = "/properties/customer/properties/name" + tail
    assert (e.value.keyword, e.value.path, e.value.field) == (keyword, path, "customer.name")
    assert isinstance(e.value, UnsupportedFieldError) and isinstance(e.value, TypeError)
    assert f"T.customer.name (at #{path})" in str(e.value)
    assert "accepted:" in str(e.value)


def test_free_text_numbers_dates_and_string_lists_become_generated_fields():
    import datetime

    from pcd_tools.schema.spec import Generation

    props = {
        "why": {"type": "string", "minLength": 2, "maxLength": 80, "pattern": "^[a-z ]+$"},
        "route": {"enum": ["a", "b"]},
        "amount": {"type": "number", "minimum": 0, "maximum": 1e6},
        "count": {"type": "integer", "minimum": 0},
        "wide": {"type": "integer", "minimum": 0, "maximum": 10**12},
        "when": {"type": ["string", "null"], "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 10, "pattern": "^[a-z]+$"},
            "minItems": 1,
            "maxItems": 3,
        },
        "note": {"type": "string", "max_new_tokens": 40},
    }
    s = compile_json_schema(_obj(**props))
    gen = {f.name: f.generation for f in s.fields}
    assert gen["route"] is None and not s.field("route").generated
    assert gen["why"] == Generation("string", 2, 80, "^[a-z ]+$")
    assert gen["amount"] == Generation("number", ge=0, le=1e6)
    assert gen["count"] == Generation("integer", ge=0)
    assert gen["wide"] == Generation("integer", ge=0, le=10**12)
    assert gen["when"] == Generation("date") and s.field("when").optional
    assert gen["at"] == Generation("datetime")
    assert gen["tags"] == Generation("string_list", 1, 3, "^[a-z]+$", None, None, None, 10)
    assert gen["note"] == Generation("string", max_new_tokens=40)
    # the model it builds validates what the grammar lets through, and refuses the rest
    model = json_schema_model(_obj(**props))
    ok = model(
        why="ok", route="a", amount=2.5, count=3, wide=7, when=None,
        at="2026-12-01T10:00:00", tags=["x"], note="",
    )  # fmt: skip
    assert isinstance(ok.at, datetime.datetime)
    with pytest.raises(ValueError):
        model(**{**ok.model_dump(), "tags": ["x"] * 4})


def test_a_pydantic_hybrid_model_and_its_json_schema_compile_alike():
    import datetime

    class Ticket(BaseModel):
        """A support ticket."""

        reason: str = Field(max_length=200, description="Why, in one sentence")
        route: Literal["billing", "tech"] = Field(description="Team")
        amount: float | None = Field(ge=0, description="Amount at stake")
        seen: datetime.date
        tags: list[str] = Field(max_length=3)

    native = compile_schema(Ticket)
    via_json = compile_json_schema(Ticket.model_json_schema())
    assert [(f.name, f.generation, f.optional) for f in via_json.fields] == [
        (f.name, f.generation, f.optional) for f in native.fields
    ]


def test_the_top_must_be_an_object():
    with pytest.raises(UnsupportedSchemaKeywordError) as e:
        compile_json_schema({"enum": ["a", "b"]})
    assert (e.value.keyword, e.value.path) == ("enum", "")


MALFORMED = [
    ("not a dict", ["type", "object"], ""),
    ("properties list", {"type": "object", "properties": ["a"]}, ""),
    ("property not a dict", _obj(a=True), "/properties/a"),
    ("unresolvable ref", _obj(a={"$ref": "#/$defs/Missing"}), "/properties/a"),
    ("anchor ref", _obj(a={"$ref": "#Name"}), "/properties/a"),
    ("defs not a dict", {**_obj(a={"type": "boolean"}), "$defs": []}, "/$defs"),
    ("enum not a list", _obj(a={"enum": "ab"}), "/properties/a"),
    ("empty enum", _obj(a={"enum": []}), "/properties/a"),
    ("duplicate value", _obj(a={"enum": ["x", "x"]}), "/properties/a"),
    ("value of the wrong type", _obj(a={"type": "string", "enum": [1, 2]}), "/properties/a"),
    ("unknown type", _obj(a={"type": "text"}), "/properties/a"),
    ("required not a property", {**_obj(a={"type": "boolean"}), "required": ["b"]}, ""),
    ("anyOf not a list", _obj(a={"anyOf": {"type": "boolean"}}), "/properties/a"),
    (
        "nan bound",
        _obj(a={"type": "integer", "minimum": 0, "maximum": float("nan")}),
        "/properties/a",
    ),
    ("description not a str", _obj(a={"type": "boolean", "description": 1}), "/properties/a"),
    (
        "minItems",
        _obj(a={"type": "array", "items": {"enum": ["x", "y"]}, "minItems": -1}),
        "/properties/a",
    ),
    (
        "discriminator",
        _obj(a={"oneOf": [_obj(k={"const": 1})] * 2, "discriminator": "k"}),
        "/properties/a/discriminator",
    ),
]


@pytest.mark.parametrize(
    ("schema", "path"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_a_malformed_schema_raises_invalid_json_schema_error_with_its_path(schema, path):
    with pytest.raises(InvalidJsonSchemaError) as e:
        compile_json_schema(schema)
    assert e.value.path == path
    assert isinstance(e.value, SchemaError) and "invalid JSON schema" in str(e.value)


@pytest.mark.parametrize("name", ["first-name", "_private", "model_config", "model_dump_json"])
def test_property_names_pydantic_cannot_hold_are_refused(name):
    with pytest.raises(InvalidFieldNameError, match=f"property name '{name}'"):
        compile_json_schema(_obj(**{name: {"type": "boolean"}}))


def test_names_that_shadow_basemodel_methods_still_work():
    s = compile_json_schema(_obj(json={"type": "boolean"}, schema={"type": "boolean"}))
    assert s.field_names == ["json", "schema"]


RECURSIVE = [
    {
        "$defs": {"Node": _obj(ok={"type": "boolean"}, child={"$ref": "#/$defs/Node"})},
        "$ref": "#/$defs/Node",
    },
    _obj(ok={"type": "boolean"}, me={"$ref": "#"}),
    {
        **_obj(a={"$ref": "#/$defs/A"}),
        "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
    },
    {
        "$defs": {
            "Node": _obj(
                ok={"type": "boolean"}, kids={"type": "array", "items": {"$ref": "#/$defs/Node"}}
            )
        },
        "$ref": "#/$defs/Node",
    },
]


@pytest.mark.parametrize("schema", RECURSIVE, ids=["self", "root", "alias loop", "via items"])
def test_ref_recursion_is_refused(schema):
    with pytest.raises(NestingTooDeepError, match="refers to itself"):
        compile_json_schema(schema)


def test_a_pydantic_recursive_model_is_refused():
    class Tree(BaseModel):
        ok: bool
        children: list[Tree]

    with pytest.raises(NestingTooDeepError):
        compile_json_schema(Tree.model_json_schema())


def _chain(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "boolean"}
    for _ in range(levels):
        node = _obj(x=node)
    return node


def test_objects_deeper_than_max_depth_are_refused():
    assert compile_json_schema(_chain(5)).field_names == ["x.x.x.x.x"]  # 4 levels below the top
    with pytest.raises(NestingTooDeepError, match="deeper than 4 levels"):
        compile_json_schema(_chain(6))
    with pytest.raises(NestingTooDeepError, match="deeper than 1 levels"):
        compile_json_schema(_chain(3), max_depth=1)


def test_a_def_used_shallow_then_deep_is_checked_at_each_use():
    defs = {"Leaf": _obj(a=_obj(b={"type": "boolean"}))}
    schema = {**_obj(x={"$ref": "#/$defs/Leaf"}, y=_obj(z={"$ref": "#/$defs/Leaf"})), "$defs": defs}
    assert compile_json_schema(schema, max_depth=3).field_names == ["x.a.b", "y.z.a.b"]
    with pytest.raises(NestingTooDeepError):
        compile_json_schema(schema, max_depth=2)


def test_max_fields_counts_the_compiled_fields():
    schema = Request.model_json_schema()
    assert compile_json_schema(schema, max_fields=5).field_names == _names(Request)
    with pytest.raises(SchemaTooLargeError) as e:
        compile_json_schema(schema, max_fields=4)
    assert (e.value.count, e.value.limit) == (5, 4)
    assert "5 fields" in str(e.value) and "at most 4" in str(e.value)
    labels = compile_json_schema(Labels.model_json_schema(), max_fields=2)
    assert labels.field_names == ["tags", "teams"]  # a multi-label field counts once


def test_a_shared_def_is_parsed_once_and_counted_at_each_use():
    defs = {"D": _obj(**{f"f{i}": {"type": "boolean"} for i in range(10)})}
    wide = {f"p{i}": {"$ref": "#/$defs/C"} for i in range(10)}
    schema = {
        **_obj(**{f"q{i}": {"$ref": "#/$defs/B"} for i in range(10)}),
        "$defs": {
            **defs,
            "B": _obj(**wide),
            "C": _obj(**{f"r{i}": {"$ref": "#/$defs/D"} for i in range(10)}),
        },
    }
    with pytest.raises(SchemaTooLargeError) as e:
        compile_json_schema(schema, max_fields=1000)
    assert e.value.count == 10_000


def test_choice_limits_are_the_usual_ones():
    assert (
        compile_json_schema(_obj(x={"enum": [f"v{i}" for i in range(300)]})).field("x").cardinality
        == 300
    )
    items = {"type": "array", "items": {"enum": [f"v{i}" for i in range(300)]}}
    assert compile_json_schema(_obj(x=items)).field("x").reading == "ranked"
    each = {**items, "reading": "each"}  # a PCD key, carried over like `threshold`
    with pytest.raises(TooManyChoicesError, match="300 labels"):
        compile_json_schema(_obj(x=each))
    assert compile_json_schema(_obj(x={"const": "only"})).field("x").labels == ["only"]
    with pytest.raises(InvalidJsonSchemaError, match=r"`enum` is not a non-empty list"):
        compile_json_schema(_obj(x={"enum": []}))


@pytest.mark.parametrize(
    "kwargs", [{"max_depth": 5}, {"max_depth": -1}, {"max_fields": 0}, {"name": 3}]
)
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(InvalidArgumentError):
        compile_json_schema(_obj(x={"type": "boolean"}), **kwargs)


# --- compile_schema, the dict form and the public path ------------------------------------


def test_compile_schema_accepts_a_json_schema():
    s = compile_schema(Ticket.model_json_schema())
    assert _projection(s) == _projection(compile_schema(Ticket))


def test_structured_schema_accepts_a_json_schema_alone_or_in_the_wrapper():
    js = {**_obj(ok={"type": "boolean"}), "title": "Check", "description": "Do it."}
    s = StructuredSchema(js)
    assert (s.name, s.instructions, s.schema.field_names, s.definitions) == (
        "Check",
        "Do it.",
        ["ok"],
        [],
    )
    w = StructuredSchema({"name": "W", "instructions": "Read.", "fields": js}).schema
    assert (w.name, w.instructions, w.field_names) == ("W", "Read.", ["ok"])


def test_the_dict_form_is_not_taken_for_a_json_schema():
    spec = {"type": {"type": "enum", "choices": ["a", "b"]}, "properties": {"type": "boolean"}}
    assert not is_json_schema(spec)
    assert compile_schema(spec).field_names == ["type", "properties"]


def test_the_public_path_reexports_the_compiler_without_a_web_framework():
    from pcd_tools.serve import openai_schema

    assert openai_schema.compile_json_schema is compile_json_schema
    assert openai_schema.json_schema_model is json_schema_model
    tree = ast.parse(Path(openai_schema.__file__).read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert imported <= {"__future__", "schema.json_schema"}
