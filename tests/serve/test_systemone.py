"""System One request parsing and answer mapping (no model)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pcd_tools.serve.errors import ApiError
from pcd_tools.serve.systemone import _answer, build_response, parse_request, state_text

pytestmark = pytest.mark.serve


def _body(**questions):
    return {"model": "jev-latest", "state": "hello", "questions": questions}


def test_noul_choice_score_map_to_boolean_and_enums():
    req = parse_request(
        _body(
            billing={"type": "noul", "instructions": "Is it billing?", "criteria": {"true": "yes"}},
            tone={"type": "choice", "criteria": {"calm": None, "angry": "upset"}},
            urgency={"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]},
        )
    )
    assert req.model == "jev-latest"
    assert req.context == "hello"
    fields = {f.name: f for f in req.schema.fields}
    assert list(fields) == ["billing", "tone", "urgency"]
    assert fields["billing"].kind == "boolean"
    assert fields["billing"].description == "Is it billing?"
    assert fields["billing"].choices[0].description == "yes"
    assert fields["tone"].labels == ["calm", "angry"]
    assert [c.description for c in fields["tone"].choices] == [None, "upset"]
    assert fields["urgency"].labels == [0, 1]
    assert [c.description for c in fields["urgency"].choices] == ["low", "high"]


def test_choice_criteria_as_list_and_odd_ids_get_identifier_fields():
    req = parse_request(
        _body(
            **{
                "is-spam?": {"type": "noul", "instructions": "Spam?"},
                "1st": {"type": "choice", "criteria": ["a", "b", "c"]},
                "schema": {"type": "noul", "instructions": "x"},
            }
        )
    )
    names = [q.field for q in req.questions]
    assert names == ["is_spam", "q_1st", "schema_"]
    assert req.schema.field("q_1st").labels == ["a", "b", "c"]


def test_question_order_is_kept():
    req = parse_request(
        _body(
            zeta={"type": "noul", "instructions": "?"},
            alpha={"type": "choice", "criteria": {"b": None, "a": None}},
        )
    )
    assert req.schema.field_names == ["zeta", "alpha"]
    assert req.schema.field("alpha").labels == ["b", "a"]


def test_equal_questions_share_one_compiled_schema():
    a = parse_request(_body(x={"type": "noul", "instructions": "?"}))
    b = parse_request({"state": "other", "questions": {"x": {"type": "noul", "instructions": "?"}}})
    assert a.schema is b.schema


def test_state_forms():
    assert state_text("plain") == "plain"
    assert state_text(["a", "b"]) == "a\n\nb"
    assert state_text({"subject": "Duplicate charge"}) == '{\n  "subject": "Duplicate charge"\n}'
    with pytest.raises(ApiError) as e:
        state_text(12)
    assert e.value.status == 422 and e.value.field == "state"


@pytest.mark.parametrize(
    ("question", "status", "field", "words"),
    [
        ({"type": "box"}, 422, "questions.q.type", "box"),
        ({"type": "rank", "criteria": ["a"]}, 422, "questions.q.type", "accepted"),
        ({"type": "choice"}, 422, "questions.q.criteria", "needs criteria"),
        ({"type": "choice", "criteria": {}}, 422, "questions.q.criteria", "no criteria"),
        (
            {"type": "choice", "criteria": [str(i) for i in range(256)]},
            422,
            "questions.q.criteria",
            "256 criteria",
        ),
        ({"type": "choice", "criteria": ["a", "a"]}, 422, "questions.q.criteria", "twice"),
        ({"type": "score", "criteria": "low"}, 422, "questions.q.criteria", "ordered list"),
        ({"type": "noul"}, 422, "questions.q", "neither instructions nor criteria"),
        ({"type": "noul", "instructions": 3}, 422, "questions.q.instructions", "number"),
        ("noul", 422, "questions.q", "must be an object"),
    ],
)
def test_bad_questions_name_the_field(question, status, field, words):
    with pytest.raises(ApiError) as e:
        parse_request(_body(q=question))
    assert e.value.status == status
    assert e.value.field == field
    assert words in e.value.message


def test_255_choices_are_accepted():
    req = parse_request(_body(q={"type": "choice", "criteria": [f"c{i}" for i in range(255)]}))
    assert req.schema.field("q").cardinality == 255


def test_more_than_64_questions_is_413_and_64_is_fine():
    qs = {f"q{i}": {"type": "noul", "instructions": "?"} for i in range(65)}
    with pytest.raises(ApiError) as e:
        parse_request({"state": "x", "questions": qs})
    assert e.value.status == 413 and "max_questions=64" in e.value.message
    del qs["q64"]
    assert len(parse_request({"state": "x", "questions": qs}).questions) == 64


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"questions": {"a": {"type": "noul", "instructions": "?"}}}, "state"),
        ({"state": "x", "questions": {}}, "questions"),
        ({"state": "x", "questions": []}, "questions"),
        (
            {"state": "x", "model": 3, "questions": {"a": {"type": "noul", "instructions": "?"}}},
            "model",
        ),
        ({"state": "x", "assets": {"<image:1>": {}}, "questions": {}}, "assets"),
        (
            {
                "state": "x",
                "temperature": 0,
                "questions": {"a": {"type": "noul", "instructions": "?"}},
            },
            "temperature",
        ),
    ],
)
def test_bad_requests_are_422_naming_the_field(body, field):
    with pytest.raises(ApiError) as e:
        parse_request(body)
    assert e.value.status == 422
    assert e.value.field == field


def test_build_response_expected_score():
    req = parse_request(
        _body(
            ok={"type": "noul", "instructions": "?"},
            tone={"type": "choice", "criteria": ["calm", "angry"]},
            lvl={"type": "score", "criteria": ["a", {"k": 1}, "c"]},
        )
    )
    fields = {
        "ok": SimpleNamespace(distribution={True: 0.8, False: 0.2}),
        "tone": SimpleNamespace(distribution={"calm": 0.5, "angry": 0.5}),
        "lvl": SimpleNamespace(distribution={0: 0.2, 1: 0.3, 2: 0.5}),
    }
    out = build_response(req, SimpleNamespace(fields=fields), model="m", input_tokens=7)
    assert out["model"] == "m"
    assert out["usage"] == {"input_tokens": 7, "output_tokens": 0}
    a = out["answers"]
    assert list(a) == ["ok", "tone", "lvl"]
    assert a["ok"] == {"type": "noul", "noul": 0.8}
    # ties go to the first declared choice
    assert a["tone"] == {
        "type": "choice",
        "choice": "calm",
        "probabilities": {"calm": 0.5, "angry": 0.5},
        "confidence": 0.5,
    }
    assert a["lvl"]["score"] == pytest.approx(0.3 + 2 * 0.5)
    assert a["lvl"]["legend"] == {"0": "a", "1": {"k": 1}, "2": "c"}
    assert a["lvl"]["probabilities"] == {"0": 0.2, "1": 0.3, "2": 0.5}
    assert a["lvl"]["confidence"] == 0.5


@pytest.mark.parametrize(
    ("question", "choices"),
    [
        ({"type": "choice", "criteria": ["one"]}, ["one"]),
        ({"type": "choice", "criteria": {"one": "the only outcome"}}, ["one"]),
        ({"type": "score", "criteria": ["single"]}, [0]),
    ],
)
def test_a_single_candidate_is_one_field_as_the_python_api_compiles_it(question, choices):
    # one allowed value is accepted everywhere (README, "One allowed value"): the same
    # one-choice field as the Python API's, scored in the pass with probability 1
    from pcd_tools import FieldDefinition, StructuredSchema

    py = StructuredSchema([FieldDefinition("only", "enum", choices=choices)], name="SystemOne")
    req = parse_request(_body(ok={"type": "noul", "instructions": "?"}, only=question))
    assert req.schema.field("only").labels == py.schema.field("only").labels == choices
    q = req.questions[1]
    answer = _answer(q, {q.labels[0]: 1.0})
    assert answer["probabilities"] == {q.labels[0]: 1.0} and answer["confidence"] == 1.0
