"""Few-shot examples: where they come from, how they are checked, and how they render."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from pcd_tools import decision
from pcd_tools.errors import InvalidExampleError, SchemaError
from pcd_tools.prompt import build_prompt, example_answer, field_suffix
from pcd_tools.schema import Example, compile_schema, with_examples
from pcd_tools.schema.examples import with_wrapper_examples
from tests.conftest import ByteTokenizer
from tests.schemas import Department, Ticket

pytestmark = pytest.mark.unit

DOWN = {"priority": "P0_CRITICAL", "requires_escalation": True, "department": "TECHNICAL"}
INVOICE = {"priority": "P3_LOW", "requires_escalation": False, "department": "BILLING"}


class Configured(BaseModel):
    """Triage a ticket."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"input": "The site is down", "output": DOWN}]}
    )
    priority: Literal["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"]
    requires_escalation: bool
    department: Department


def test_model_config_examples_are_compiled_and_change_the_fingerprint():
    sch = compile_schema(Configured)
    assert sch.examples == (
        Example(
            "The site is down", (("priority", 0), ("requires_escalation", 0), ("department", 2))
        ),
    )
    bare = with_examples(sch, [])
    assert bare.examples == () and "examples" not in bare.to_spec()
    assert sch.to_spec()["examples"] == [{"input": "The site is down", "output": DOWN}]
    assert sch.fingerprint() != bare.fingerprint()
    other = with_examples(sch, [("The site is down", INVOICE)])
    assert other.fingerprint() not in {sch.fingerprint(), bare.fingerprint()}


def test_decorator_examples_take_instances_dicts_and_follow_model_config():
    class Tri(Configured):
        pass

    decorated = decision(
        Tri,
        examples=[
            ("Please send the invoice again", Tri(**INVOICE)),
            {"input": "Card charged twice", "output": dict(INVOICE, department="BILLING_DISPUTE")},
        ],
    )
    assert decorated is Tri and callable(Tri.decide)
    ex = Tri.__pcd_schema__.examples
    assert [e.input for e in ex] == [
        "The site is down",  # model_config's first
        "Please send the invoice again",
        "Card charged twice",
    ]
    assert ex[1].answer("department") == 0 and ex[2].answer("department") == 1
    assert compile_schema(Tri) is Tri.__pcd_schema__

    @decision(examples=[("All good, thanks", INVOICE)])
    class Plain(BaseModel):
        priority: Literal["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"]
        requires_escalation: bool
        department: Department

    assert compile_schema(Plain).examples[0].answer("priority") == 3


def test_a_bad_decorator_example_fails_at_decoration_time_with_its_index_and_field():
    with pytest.raises(InvalidExampleError) as e:

        @decision(examples=[("ok", INVOICE), ("bad", dict(INVOICE, priority="URGENT"))])
        class Bad(BaseModel):
            priority: Literal["P0_CRITICAL", "P1_HIGH", "P2_NORMAL", "P3_LOW"]
            requires_escalation: bool
            department: Department

    err = e.value
    assert isinstance(err, SchemaError)
    assert (err.index, err.field, err.model) == (1, "priority", "Bad")
    msg = str(err)
    assert "example #1" in msg and "'URGENT'" in msg and "P0_CRITICAL" in msg
    assert "@decision(examples=...)" in msg


class Address(BaseModel):
    country: Literal["FR", "DE"]


class Refund(BaseModel):
    kind: Literal["refund"]
    reason: Literal["late", "broken"]


class Bug(BaseModel):
    kind: Literal["bug"]
    blocking: bool


SUBS = {"billing": ["refund", "invoice"], "bug": ["crash", "other"]}


class Rich(BaseModel):
    """Read a request."""

    tags: list[Literal["billing", "bug", "refund"]] = Field(max_length=2)
    severity: int = Field(ge=0, le=100)
    stars: int | None = Field(default=None, ge=1, le=5)
    address: Address
    request: Annotated[Refund | Bug, Field(discriminator="kind")]
    category: Literal["billing", "bug"]
    sub: str = Field(json_schema_extra={"choices_by": {"category": SUBS}})


GOOD = {
    "tags": ["bug", "billing"],
    "severity": 40,
    "stars": None,
    "address": {"country": "DE"},
    "request": {"kind": "bug", "blocking": True},
    "category": "bug",
    "sub": "crash",
}


def test_every_field_kind_is_checked_and_rendered_as_the_fields_pass_writes_it():
    sch = with_examples(compile_schema(Rich), [("It crashes in Berlin", GOOD)])
    (ex,) = sch.examples
    assert ex.answer("tags") == (0, 1)  # declared order
    assert ex.answer("severity") == 40 and ex.answer("stars") == 5  # null: the last choice
    assert ex.answer("request[refund].reason") is None  # the branch not taken
    assert ex.answer("request[bug].blocking") == 0
    want = (
        "{"
        '\n  "tags": {"billing": true, "bug": true, "refund": false},'
        '\n  "severity": 40,'
        '\n  "stars": null,'
        '\n  "address.country": "DE",'
        '\n  "request.kind": "bug",'
        '\n  "request.blocking": true,'
        '\n  "category": "bug",'
        '\n  "sub": "crash"'
        "\n}"
    )
    assert example_answer(sch, ex) == want
    # each value is written after exactly the suffix the fields pass scores it after
    for f in sch.fields:
        if ex.answer(f.name) is not None:
            assert field_suffix(f) in want
    # an Optional field may be left out: it is written as null
    left_out = {k: v for k, v in GOOD.items() if k != "stars"}
    assert with_examples(sch, [("x", left_out)]).examples[0].answers == ex.answers


def test_a_flat_answer_is_json_dumps_with_indent_2():
    sch = with_examples(compile_schema(Ticket), [("The site is down", DOWN)])
    assert example_answer(sch, sch.examples[0]) == json.dumps(DOWN, indent=2)


def _bad(**change):
    out = json.loads(json.dumps(GOOD))
    for k, v in change.items():
        if v is ...:
            out.pop(k)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize(
    ("output", "field", "words"),
    [
        (_bad(category="legal"), "category", ["'legal'", "['billing', 'bug']"]),
        (_bad(severity=101), "severity", ["101", "an int from 0 to 100"]),
        (_bad(severity="40"), "severity", ["'40'", "an int from 0 to 100"]),
        (_bad(stars=0), "stars", ["0", "[1, 2, 3, 4, 5, None]"]),
        (_bad(category=...), "category", ["no value for 'category'", "Optional"]),
        (_bad(tags="bug"), "tags", ["not a list of labels"]),
        (_bad(tags=["bug", "spam"]), "tags", ["'spam' is not one of its labels"]),
        (_bad(tags=["bug", "bug"]), "tags", ["is given twice"]),
        (_bad(tags=["bug", "billing", "refund"]), "tags", ["3 label(s)", "0 to 2"]),
        (_bad(address={"country": "US"}), "address.country", ["'US'", "['FR', 'DE']"]),
        (_bad(address={}), "address.country", ["no value for 'address.country'"]),
        (_bad(sub="refund"), "sub", ["not allowed when 'category' is 'bug'", "['crash', 'other']"]),
        (
            _bad(request={"kind": "bug", "blocking": "yes"}),
            "request[bug].blocking",
            ["'yes'", "[True, False]"],
        ),
        (_bad(request={"kind": "bug"}), "request[bug].blocking", ["'request.blocking'"]),
        (_bad(request={"kind": "other"}), "request.kind", ["'other'", "['refund', 'bug']"]),
    ],
)
def test_a_bad_value_names_the_example_the_field_and_what_is_accepted(output, field, words):
    sch = compile_schema(Rich)
    with pytest.raises(InvalidExampleError) as e:
        with_examples(sch, [("fine", GOOD), ("also fine", GOOD), ("bad", output)])
    assert (e.value.index, e.value.field, e.value.source) == (2, field, "examples=")
    msg = str(e.value)
    assert msg.startswith("Rich: example #2 of examples=:")
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize(
    ("output", "words"),
    [
        (_bad(colour="red"), ["unknown key(s) ['colour']", "accepted keys"]),
        (_bad(request={"kind": "bug", "blocking": True, "reason": "late"}), ["request.reason"]),
        (_bad(address={"country": "DE", "zip": "10115"}), ["address.zip"]),
    ],
)
def test_unknown_keys_are_refused(output, words):
    with pytest.raises(InvalidExampleError) as e:
        with_examples(compile_schema(Rich), [("bad", output)])
    assert e.value.index == 0 and e.value.field is None
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("just text", ["got str", "(text, answer)"]),
        (("a", "b", "c"), ["got tuple"]),
        ({"input": "x"}, ["no ['output']"]),
        ({"input": "x", "output": {}, "why": 1}, ["unknown key(s) ['why']"]),
        (("   ", DOWN), ["input '   '", "non-empty str"]),
        ((3, DOWN), ["input 3"]),
        (("x", ["P0"]), ["output is a list"]),
        (("x", Configured(**DOWN)), ["output is a Configured", "instance of Ticket"]),
    ],
)
def test_malformed_examples_are_refused(item, words):
    with pytest.raises(InvalidExampleError) as e:
        with_examples(compile_schema(Ticket), [item])
    assert e.value.index == 0
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("raw", ["text", {"input": "x", "output": DOWN}, 3])
def test_examples_must_be_a_list(raw):
    with pytest.raises(InvalidExampleError, match="must be a list of examples"):
        with_examples(compile_schema(Ticket), raw)


def test_bools_and_ints_are_not_confused():
    sch = compile_schema(Ticket)
    with pytest.raises(InvalidExampleError, match=r"1 is not an allowed value.*\[True, False\]"):
        with_examples(sch, [("x", dict(DOWN, requires_escalation=1))])
    assert (
        with_examples(sch, [("x", dict(DOWN, department=Department.ACCOUNT))])
        .examples[0]
        .answer("department")
        == 3
    )


def test_the_dict_form_wrapper_examples_helper():
    wrapper = {
        "name": "triage",
        "fields": {
            "urgent": {"type": "boolean"},
            "team": {"type": "enum", "choices": ["a", "b"]},
        },
        "examples": [{"input": "Server on fire", "output": {"urgent": True, "team": "b"}}],
    }
    sch = compile_schema({"fields": wrapper["fields"], "name": "triage"})
    got = with_wrapper_examples(sch, wrapper)
    assert got.examples == (Example("Server on fire", (("urgent", 0), ("team", 1))),)
    assert with_wrapper_examples(sch, {"fields": wrapper["fields"]}) is sch
    assert with_wrapper_examples(sch, None) is sch  # not a wrapper
    with pytest.raises(InvalidExampleError, match=r"of the schema's 'examples'.*'c'"):
        with_wrapper_examples(sch, dict(wrapper, examples=[("x", {"urgent": True, "team": "c"})]))


def test_a_subset_keeps_the_examples_it_can_show():
    sch = with_examples(compile_schema(Ticket), [("down", DOWN), ("invoice", INVOICE)])
    sub = sch.subset(["department"], choices={"department": ["BILLING", "ACCOUNT"]})
    assert sub.examples == (Example("invoice", (("department", 0),)),)
    assert sch.subset(["priority"]).examples == (
        Example("down", (("priority", 0),)),
        Example("invoice", (("priority", 3),)),
    )


class TemplateTokenizer(ByteTokenizer):
    """A chat template that renders `<|role|>content<|end|>` turns."""

    def __init__(self, system_ok=True):
        self.system_ok = system_ok

    def apply_chat_template(self, messages, add_generation_prompt=True):
        if not self.system_ok and any(m["role"] == "system" for m in messages):
            raise ValueError("no system turns")
        out = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        return out + ("<|assistant|>" if add_generation_prompt else "")


def test_examples_are_earlier_turns_in_the_cached_head():
    sch = with_examples(compile_schema(Ticket), [("down", DOWN), ("invoice", INVOICE)])
    parts = build_prompt(TemplateTokenizer(), sch)
    a, b = (json.dumps(x, indent=2) for x in (DOWN, INVOICE))
    assert parts.head.endswith(
        f"<|end|><|user|>down<|end|><|assistant|>{a}<|end|>"
        f"<|user|>invoice<|end|><|assistant|>{b}<|end|><|user|>"
    )
    assert parts.head.startswith("<|system|>") and parts.tail == "<|end|><|assistant|>{"
    folded = build_prompt(TemplateTokenizer(system_ok=False), sch)
    assert folded.head.startswith("<|user|>Classify") or folded.head.startswith("<|user|>Triage")
    assert "\n\ndown<|end|><|assistant|>" in folded.head
    plain = build_prompt(ByteTokenizer(), sch)
    assert plain.head.endswith(
        f"\n\nMessage:\ndown\n\nJSON answer:\n{a}\n\nMessage:\ninvoice\n\nJSON answer:\n{b}"
        "\n\nMessage:\n"
    )
    assert plain.tail == "\n\nJSON answer:\n{"
    assert build_prompt(ByteTokenizer(), compile_schema(Ticket)).head.endswith(
        'allowed values: "BILLING", "BILLING_DISPUTE", "TECHNICAL", "ACCOUNT"\n\nMessage:\n'
    )


def test_the_dict_form_wrapper_takes_examples():
    from pcd_tools.errors import InvalidExampleError
    from pcd_tools.schema import StructuredSchema

    fields = {"tone": {"type": "enum", "choices": ["calm", "angry"], "description": "Tone"}}
    ok = StructuredSchema(
        {
            "name": "T",
            "fields": fields,
            "examples": [{"input": "Thanks!", "output": {"tone": "calm"}}],
        }
    )
    assert [e.input for e in ok.schema.examples] == ["Thanks!"]
    with pytest.raises(InvalidExampleError, match="tone"):
        StructuredSchema(
            {"fields": fields, "examples": [{"input": "x", "output": {"tone": "sad"}}]}
        )
