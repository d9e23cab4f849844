"""Generated field kinds: how they compile, what they refuse, and their grammar's regexes."""

from __future__ import annotations

import datetime
import re
from decimal import Decimal
from types import SimpleNamespace
from typing import Annotated, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter

from pcd_tools import StructuredSchema
from pcd_tools.engine.decode.value_regex import (
    DATE,
    TIME,
    decimal_range,
    field_regex,
    int_range,
    json_string_pattern,
)
from pcd_tools.errors import (
    InvalidExampleError,
    InvalidFieldOptionError,
    UnsupportedFieldError,
    UnsupportedUnionError,
)
from pcd_tools.prompt import questions, render_system
from pcd_tools.schema import compile_schema
from pcd_tools.schema.generated import generation_for, segments
from pcd_tools.schema.spec import Generation

pytestmark = pytest.mark.unit


class Reply(BaseModel):
    """Answer a support ticket."""

    reasoning: str = Field(max_length=200, description="Why")
    decision: Literal["approve", "reject"]
    urgent: bool
    reply_draft: str | None = Field(
        default=None, min_length=2, json_schema_extra={"max_new_tokens": 64}
    )
    amount: float = Field(ge=0, le=1500.5)
    count: int
    big: int = Field(ge=0, le=10_000)
    tags: list[Annotated[str, StringConstraints(max_length=12)]] = Field(max_length=3)
    due: datetime.date
    at: datetime.datetime
    code: str = Field(pattern=r"^[A-Z]{3}-[0-9]{2}$")


def test_every_generated_kind_compiles_to_its_generation():
    s = compile_schema(Reply)
    g = {f.name: f.generation for f in s.fields}
    assert g["decision"] is None and g["urgent"] is None
    assert g["reasoning"] == Generation("string", max_length=200)
    assert g["reply_draft"] == Generation("string", min_length=2, max_new_tokens=64)
    assert s.field("reply_draft").optional
    assert g["amount"] == Generation("number", ge=0.0, le=1500.5)
    assert g["count"] == Generation("integer")
    assert g["big"] == Generation("integer", ge=0, le=10_000)  # > 255 values: generated
    assert g["tags"] == Generation("string_list", max_length=3, item_max_length=12)
    assert g["due"] == Generation("date") and g["at"] == Generation("datetime")
    assert g["code"].pattern == r"^[A-Z]{3}-[0-9]{2}$"
    assert s.hybrid and all(s.field(n).choices == () for n in g if g[n] is not None)
    # a bounded int of at most 255 values stays scored
    assert not compile_schema(Small).field("n").generated


class Small(BaseModel):
    n: int = Field(ge=1, le=5)


def test_json_schema_fragments_name_the_constraints():
    s = compile_schema(Reply)
    frag = {f.name: f.generation.json_schema(f.optional) for f in s.fields if f.generated}
    assert frag["reasoning"] == {"type": "string", "maxLength": 200}
    assert frag["reply_draft"] == {"anyOf": [{"type": "string", "minLength": 2}, {"type": "null"}]}
    assert frag["amount"] == {"type": "number", "minimum": 0.0, "maximum": 1500.5}
    assert frag["tags"] == {
        "type": "array",
        "items": {"type": "string", "maxLength": 12},
        "maxItems": 3,
    }
    assert frag["due"] == {"type": "string", "format": "date"}
    assert s.to_spec()["fields"][0]["generation"] == {"type": "string", "max_length": 200}


def test_segments_follow_the_declaration_and_questions_skip_generated_fields():
    s = compile_schema(Reply)
    assert segments(s) == [
        ("generated", ("reasoning",)),
        ("scored", ("decision", "urgent")),
        ("generated", ("reply_draft", "amount", "count", "big", "tags", "due", "at", "code")),
    ]
    assert [q.field for q in questions(s)] == ["decision", "urgent"]


def test_the_system_turn_describes_generated_values():
    text = render_system(compile_schema(Reply))
    assert "For each key with allowed values, the value must be one of them" in text
    assert '"reasoning": Why\n  value: free text, at most 200 characters' in text
    assert "value: free text, at least 2 characters, or null when the message does not say" in text
    assert "value: a number, 0.0 to 1500.5" in text
    assert "value: a list of strings, at most 3 items, at most 12 characters each" in text
    assert "value: a date as YYYY-MM-DD" in text
    assert "matching the regular expression ^[A-Z]{3}-[0-9]{2}$" in text
    # a schema of scored fields keeps its old system turn (and fingerprint)
    assert "For each key, the value must be one of its allowed values." in render_system(
        compile_schema(Small)
    )


def test_the_dict_form_accepts_string_number_and_integer_fields():
    s = StructuredSchema(
        {
            "why": {"type": "string", "max_length": 80, "max_new_tokens": 30},
            "route": {"type": "enum", "choices": ["a", "b"]},
            "amount": {"type": "number", "ge": 0, "le": 9.5},
            "code": {"type": "string", "pattern": "[a-z]+", "optional": True},
            "n": {"type": "integer", "ge": 0},
        },
        name="D",
    ).schema
    assert s.field("why").generation == Generation("string", max_length=80, max_new_tokens=30)
    assert s.field("amount").generation == Generation("number", ge=0.0, le=9.5)
    assert s.field("code").optional and s.field("code").generation.pattern == "[a-z]+"
    assert s.field("n").generation == Generation("integer", ge=0)
    assert s.build({"why": "x", "route": "a", "amount": 1.5, "code": None, "n": 3}).n == 3
    with pytest.raises(
        Exception, match=r"D.why: a 'string' field is generated and takes no choices"
    ):
        StructuredSchema({"why": {"type": "string", "choices": ["a"]}}, name="D")


def test_what_a_grammar_cannot_enforce_is_refused_by_name():
    cases = [
        (
            float,
            Field(gt=0),
            UnsupportedFieldError,
            "gt=0 on a generated float; accepted: ge and le",
        ),
        (int, Field(ge=0, multiple_of=5), UnsupportedFieldError, "multiple_of=5 on an int"),
        (str, Field(min_length=5, max_length=2), InvalidFieldOptionError, "min_length=5 is above"),
        (float, Field(ge=3, le=1), InvalidFieldOptionError, "ge=3.0 is above le=1.0"),
        (
            str,
            Field(json_schema_extra={"max_new_tokens": 0}),
            InvalidFieldOptionError,
            "max_new_tokens=0",
        ),
        (
            bool,
            Field(json_schema_extra={"max_new_tokens": 5}),
            InvalidFieldOptionError,
            "on a scored field",
        ),
        (bytes, Field(), UnsupportedFieldError, "unsupported annotation bytes"),
    ]
    for tp, info, error, fragment in cases:
        model = type("M", (BaseModel,), {"__annotations__": {"x": tp}, "x": info})
        with pytest.raises(error) as e:
            compile_schema(model)
        assert "M.x" in str(e.value) and fragment in str(e.value), str(e.value)
        assert "accepted" in str(e.value)


def test_a_pattern_the_grammar_cannot_follow_is_refused():
    for pattern, fragment in ((r"(?=a)b", "look-arounds"), (r"(a)\1", "a back-reference")):
        meta = [SimpleNamespace(pattern=pattern)]  # (Pydantic's own regex engine refuses both)
        with pytest.raises(UnsupportedFieldError, match=re.escape(fragment)):
            generation_for("M", "x", str, meta, {})
    with pytest.raises(InvalidFieldOptionError, match="is not a regular expression"):
        generation_for("M", "x", str, [SimpleNamespace(pattern="[a-")], {})


def test_orders_that_segments_cannot_honour_are_refused():
    class BeforeParent(BaseModel):
        child: Literal["a", "b"] = Field(json_schema_extra={"depends_on": ["parent"]})
        why: str
        parent: Literal["x", "y"]

    class OnGenerated(BaseModel):
        why: str
        child: Literal["a", "b"] = Field(json_schema_extra={"depends_on": ["why"]})

    class GeneratedChild(BaseModel):
        parent: Literal["x", "y"]
        why: str = Field(json_schema_extra={"depends_on": ["parent"]})

    class Split(BaseModel):
        parent: Literal["x", "y"]
        why: str
        child: str = Field(json_schema_extra={"choices_by": {"parent": {"x": ["a"], "y": ["b"]}}})

    class Note(BaseModel):
        kind: Literal["note"]
        text: str

    class Other(BaseModel):
        kind: Literal["other"]
        ok: bool

    class InUnion(BaseModel):
        item: Annotated[Note | Other, Field(discriminator="kind")]

    for model, error, fragment in [
        (BeforeParent, UnsupportedFieldError, "declared after a generated field"),
        (OnGenerated, UnsupportedFieldError, "depends on 'why', a generated field"),
        (GeneratedChild, UnsupportedFieldError, "a generated field with depends_on"),
        (Split, UnsupportedFieldError, "choices_by parent 'parent' is separated"),
        (InUnion, UnsupportedUnionError, "is generated (string)"),
    ]:
        with pytest.raises(error, match=re.escape(fragment)):
            compile_schema(model)


def test_a_parent_before_a_generated_field_is_written_not_waited_for():
    class Across(BaseModel):
        parent: Literal["x", "y"]
        why: str
        child: Literal["a", "b"] = Field(json_schema_extra={"depends_on": ["parent"]})

    s = compile_schema(Across)
    assert segments(s) == [("scored", ("parent",)), ("generated", ("why",)), ("scored", ("child",))]


def test_model_config_examples_on_a_schema_with_generated_fields_are_checked():
    class WithExamples(BaseModel):
        model_config = ConfigDict(json_schema_extra={"examples": [{"input": "x", "output": {}}]})
        why: str
        ok: bool

    with pytest.raises(InvalidExampleError, match="no value for 'why'"):
        compile_schema(WithExamples)

    class Good(BaseModel):
        model_config = ConfigDict(
            json_schema_extra={"examples": [{"input": "x", "output": {"why": "w", "ok": True}}]}
        )
        why: str
        ok: bool

    assert compile_schema(Good).examples[0].answer("why").text == '"w"'


def test_a_subset_keeps_generated_fields_and_refuses_to_narrow_them():
    s = compile_schema(Reply)
    sub = s.subset(["reasoning", "decision"])
    assert sub.field("reasoning").generated
    assert sub.build({"reasoning": "because", "decision": "approve"}).reasoning == "because"
    with pytest.raises(Exception, match="a generated field has no choices"):
        s.subset(["reasoning"], choices={"reasoning": ["x"]})


# --- the grammar's regexes -------------------------------------------------------------------

bounds = st.one_of(st.none(), st.integers(-(10**6), 10**6))


@settings(max_examples=200, deadline=None)
@given(bounds, bounds, st.lists(st.integers(-(10**7), 10**7), max_size=20))
def test_int_range_matches_exactly_the_integers_in_bounds(lo, hi, ns):
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    rx = re.compile(int_range(lo, hi))
    for n in [*ns, *(b + d for b in (lo, hi) if b is not None for d in (-1, 0, 1)), 0]:
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(rx.fullmatch(str(n))) == inside, (lo, hi, n)
    assert not rx.fullmatch("-0") and not rx.fullmatch("007")


decimals = st.decimals(min_value=-1000, max_value=1000, places=3, allow_nan=False)
float_bounds = st.one_of(st.none(), st.floats(-1000, 1000).map(lambda x: round(x, 2)))


@settings(max_examples=200, deadline=None)
@given(float_bounds, float_bounds, st.lists(decimals, max_size=20))
def test_decimal_range_matches_only_decimals_in_bounds(lo, hi, xs):
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    rx = re.compile(decimal_range(lo, hi))
    lo_d = Decimal(repr(lo + 0.0)) if lo is not None else None
    hi_d = Decimal(repr(hi + 0.0)) if hi is not None else None
    edges = [
        b + d for b in (lo_d, hi_d) if b is not None for d in map(Decimal, ("-0.001", "0", "0.001"))
    ]
    for x in [*xs, *edges]:
        text = format(x.normalize(), "f") if x != 0 else "0"
        inside = (lo_d is None or x >= lo_d) and (hi_d is None or x <= hi_d)
        if rx.fullmatch(text):  # every text the grammar allows is a number within the bounds
            assert inside, (lo, hi, text)
            value = float(text)
            assert (lo is None or value >= lo) and (hi is None or value <= hi)
        elif inside and not text.startswith("-0"):
            raise AssertionError(("a number within the bounds is refused", lo, hi, text))


@settings(max_examples=200, deadline=None)
@given(st.dates(min_value=datetime.date(1, 1, 1)), st.text("0123456789-", min_size=10, max_size=10))
def test_the_date_grammar_allows_real_dates_only(day, text):
    rx = re.compile(DATE)
    assert rx.fullmatch(day.isoformat())
    if rx.fullmatch(text):
        assert datetime.date.fromisoformat(text)  # no 2023-02-29 or 2023-04-31


def test_the_datetime_grammar_parses_with_pydantic():
    rx = re.compile(f"{DATE}T{TIME}")
    adapter = TypeAdapter(datetime.datetime)
    for ok in ("2024-02-29T23:59:59", "2023-01-01T00:00:00.123456Z", "2023-06-30T10:00:00+02:00"):
        assert rx.fullmatch(ok) and adapter.validate_python(ok)
    for bad in ("2023-02-29T10:00:00", "2023-01-01T24:00:00", "2023-01-01T10:60:00"):
        assert not rx.fullmatch(bad)


def test_a_pattern_is_grouped_and_kept_inside_json_string_characters():
    rx = re.compile(json_string_pattern(r"^yes|no$"))
    assert rx.fullmatch('"yes"') and rx.fullmatch('"no"') and not rx.fullmatch('"yesno"')
    dot = re.compile(json_string_pattern(r"a.c"))
    assert dot.fullmatch('"abc"') and not dot.fullmatch('"a"c"')
    assert dot.fullmatch(r'"a\tc"') and not dot.fullmatch(r'"a\nc"')  # `.` is no newline
    neg = re.compile(json_string_pattern(r"[^x]+"))
    assert neg.fullmatch('"abc"') and not neg.fullmatch('"a"b"')


def test_a_field_regex_ends_with_its_terminator_and_may_be_null():
    gen = Generation("integer", ge=1, le=12)
    rx = re.compile(field_regex(gen, True, "\n}"))
    assert rx.fullmatch("12\n}") and rx.fullmatch("null\n}") and not rx.fullmatch("13\n}")
    assert re.fullmatch(field_regex(Generation("string_list"), False, ","), '["a", "b"],')
