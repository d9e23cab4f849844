"""The System One wire format (`POST /v1/systemone`) mapped onto PCD schemas.

Request: `{model?, state, questions: {id: {type, instructions?, criteria?}}}`; each
question becomes one field of a compiled schema:

| question | field | answer |
|---|---|---|
| `noul` | boolean; `criteria.true/false` describe the outcomes | `noul` = P(true) |
| `choice` | enum of the `criteria` labels (a dict label -> description, or a list) | `choice`, `probabilities`, `confidence` |
| `score` | enum of the levels 0..n-1, each described by `criteria[i]` | `score` = Σ level·p, `legend`, `probabilities`, `confidence` |

Question ids can be any string; each gets an identifier-safe field name for the prompt.
An empty or whitespace-only `state` is a 422: there is nothing to decide on.
A choice or score takes 1 to 255 candidates, as every entry point does: a question with one
candidate is scored like any other and answers it with probability 1 (the probabilities
are relative to the candidates); none, or more than 255, is a 422.
"""

from __future__ import annotations

import functools
import json
import keyword
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..errors import SchemaError, TooFewChoicesError, TooManyChoicesError
from ..schema import MAX_CHOICES, FieldDefinition, Schema, StructuredSchema
from ..schema.spec import MIN_CHOICES
from .errors import ApiError

if TYPE_CHECKING:
    from ..answers.result import Decision

__all__ = [
    "QUESTION_TYPES",
    "SystemOneQuestion",
    "SystemOneRequest",
    "build_response",
    "parse_request",
    "state_text",
]

QUESTION_TYPES = ("noul", "choice", "score")
INSTRUCTIONS = "Answer every question about the content of the user's message."


@dataclass(frozen=True)
class SystemOneQuestion:
    """One question of a request.

    Args:
        id: The question id the client chose (the answer's key).
        type: `"noul"`, `"choice"` or `"score"`.
        field: The schema field that scores it.
        labels: Choice labels, or score levels as strings (`"0"`, `"1"`...).
        legend: For a score: level (as a string) -> the criterion that describes it.
    """

    id: str
    type: str
    field: str
    labels: tuple[str, ...] = ()
    legend: dict[str, Any] | None = None


@dataclass(frozen=True)
class SystemOneRequest:
    """A validated System One request.

    Args:
        model: The model name the client asked for (any name is served by the loaded model).
        context: The state as the text the model reads.
        questions: The questions in request order.
        schema: The compiled schema of every question that needs the model, or `None`.
        temperature: Softmax temperature (an extension; default 1).
    """

    model: str | None
    context: str
    questions: tuple[SystemOneQuestion, ...]
    schema: Schema | None
    temperature: float = 1.0


# --- content ----------------------------------------------------------------------------


def _content_text(value: Any, where: str, *, allow_none: bool = True) -> str | None:
    """Text for a `Content` value: a str as is, an object or array as JSON."""
    if value is None:
        if allow_none:
            return None
        raise ApiError(422, "invalid_request", f"{where} must not be null.", field=where)
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    raise ApiError(
        422,
        "invalid_request",
        f"{where} must be text, a JSON object or an array; got {_json_type(value)}.",
        field=where,
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def state_text(state: Any) -> str:
    """The context for a `state`: text as is, an array of texts joined by blank lines,
    anything else (an object, a mixed array) as indented JSON.

    Raises:
        ApiError: 422 naming `state` for a missing or wrongly typed state.
    """
    if isinstance(state, str):
        return state
    if isinstance(state, list) and all(isinstance(s, str) for s in state):
        return "\n\n".join(state)
    if isinstance(state, (dict, list)):
        return json.dumps(state, ensure_ascii=False, indent=2)
    raise ApiError(
        422,
        "invalid_request",
        f"state must be text, a JSON object or an array; got {_json_type(state)}.",
        field="state",
    )


# --- field names ----------------------------------------------------------------------------

_RESERVED = set(dir(BaseModel))


def _field_name(qid: str, taken: set[str]) -> str:
    """An identifier for the prompt and the schema that reads like the question id."""
    base = re.sub(r"\W+", "_", qid).strip("_") or "question"
    if base[0].isdigit():
        base = "q_" + base
    if keyword.iskeyword(base) or base in _RESERVED or base.startswith("model_"):
        base += "_"
    if not base.isidentifier():
        base = "question"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


# --- parsing --------------------------------------------------------------------------------


def parse_request(body: Any, *, max_questions: int = 64) -> SystemOneRequest:
    """Validates a System One request body and compiles its schema.

    Args:
        body: The decoded JSON body.
        max_questions: Most questions accepted; more is a 413.

    Raises:
        ApiError: 422 naming the field for an invalid request or schema (an empty or
            whitespace-only `state` included), 413 for too many questions.
    """
    if not isinstance(body, dict):
        raise ApiError(
            422, "invalid_request", f"The body must be a JSON object; got {_json_type(body)}."
        )
    if body.get("assets") is not None:
        raise ApiError(
            422,
            "unsupported_assets",
            "assets (images) need a vision-language model; this server scores text only.",
            field="assets",
        )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(
            422,
            "invalid_request",
            f"model must be a string; got {_json_type(model)}.",
            field="model",
        )
    if "state" not in body or body["state"] is None:
        raise ApiError(422, "invalid_request", "state is required.", field="state")
    context = state_text(body["state"])
    if not context.strip():
        raise ApiError(
            422,
            "invalid_request",
            f"state is empty or only whitespace ({_short(body['state'])}): there is nothing "
            "to decide on. Send the text, JSON object or array of texts to decide about.",
            field="state",
        )
    temperature = _temperature(body.get("temperature", 1.0))
    questions = body.get("questions")
    if not isinstance(questions, dict) or not questions:
        raise ApiError(
            422,
            "invalid_request",
            "questions must be a non-empty object of question id -> question; got "
            f"{_json_type(questions) if not isinstance(questions, dict) else 'an empty object'}.",
            field="questions",
        )
    if len(questions) > max_questions:
        raise ApiError(
            413,
            "too_many_questions",
            f"{len(questions)} questions given; the limit is max_questions={max_questions} "
            "per request. Split them over several requests.",
            field="questions",
        )
    # Canonical text of everything that shapes the schema: equal questions share one
    # compiled schema (and one cached prompt prefix).
    key = json.dumps(
        [[qid, _question_spec(qid, q)] for qid, q in questions.items()],
        ensure_ascii=False,
    )
    qs, schema = _compile(key)
    return SystemOneRequest(model, context, qs, schema, temperature)


def _temperature(t: Any) -> float:
    """A valid temperature (finite, > 0), or a 422 naming `temperature`."""
    try:
        ok = not isinstance(t, bool) and isinstance(t, (int, float)) and 0 < float(t) < math.inf
    except OverflowError:
        ok = False
    if not ok:
        raise ApiError(
            422,
            "invalid_request",
            f"temperature must be a finite number > 0; got {t!r}.",
            field="temperature",
        )
    return float(t)


def _question_spec(qid: str, q: Any) -> dict[str, Any]:
    """Validates one question and returns its normalised spec (JSON-serialisable)."""
    where = f"questions.{qid}"
    if not isinstance(q, dict):
        raise ApiError(
            422,
            "invalid_question",
            f"question {qid!r} must be an object with a 'type'; got {_json_type(q)}.",
            field=where,
        )
    qtype = q.get("type")
    if qtype not in QUESTION_TYPES:
        hint = " (box questions need a vision-language model)" if qtype == "box" else ""
        raise ApiError(
            422,
            "unknown_question_type",
            f"question {qid!r} has type {qtype!r}{hint}; accepted: {list(QUESTION_TYPES)}.",
            field=f"{where}.type",
        )
    extra = set(q) - {"type", "instructions", "criteria"}
    if extra:
        raise ApiError(
            422,
            "invalid_question",
            f"question {qid!r} has unknown key(s) {sorted(extra)}; accepted: "
            "['criteria', 'instructions', 'type'].",
            field=where,
        )
    instructions = _content_text(q.get("instructions"), f"{where}.instructions")
    criteria = q.get("criteria")
    cwhere = f"{where}.criteria"
    if qtype == "noul":
        if criteria is None:
            criteria = {}
        if not isinstance(criteria, dict) or set(criteria) - {"true", "false"}:
            raise ApiError(
                422,
                "invalid_question",
                f"criteria of noul question {qid!r} must be an object with optional keys "
                f"'true' and 'false'; got {_short(criteria)}.",
                field=cwhere,
            )
        outcomes = {k: _content_text(v, f"{cwhere}.{k}") for k, v in criteria.items()}
        outcomes = {k: v for k, v in outcomes.items() if v is not None}
        if instructions is None and not outcomes:
            raise ApiError(
                422,
                "invalid_question",
                f"noul question {qid!r} has neither instructions nor criteria; give at least one.",
                field=where,
            )
        return {"type": "noul", "instructions": instructions, "criteria": outcomes}
    if qtype == "choice":
        if isinstance(criteria, list):
            if not all(isinstance(c, str) for c in criteria):
                raise ApiError(
                    422,
                    "invalid_question",
                    f"criteria of choice question {qid!r} given as a list must hold label "
                    "strings; use an object label -> description to describe them.",
                    field=cwhere,
                )
            labels: list[list[Any]] = [[c, None] for c in criteria]
        elif isinstance(criteria, dict):
            labels = [[k, _content_text(v, f"{cwhere}.{k}")] for k, v in criteria.items()]
        else:
            raise ApiError(
                422,
                "invalid_question",
                f"choice question {qid!r} needs criteria: an object label -> description, or a "
                f"list of labels; got {_json_type(criteria)}.",
                field=cwhere,
            )
        _check_count(qid, "choice", len(labels), cwhere)
        return {"type": "choice", "instructions": instructions, "criteria": labels}
    if not isinstance(criteria, list):
        raise ApiError(
            422,
            "invalid_question",
            f"score question {qid!r} needs criteria: an ordered list describing levels 0, 1, ...; "
            f"got {_json_type(criteria)}.",
            field=cwhere,
        )
    levels = [_content_text(c, f"{cwhere}[{i}]", allow_none=False) for i, c in enumerate(criteria)]
    _check_count(qid, "score", len(levels), cwhere)
    return {"type": "score", "instructions": instructions, "criteria": levels, "raw": criteria}


def _check_count(qid: str, qtype: str, n: int, where: str) -> None:
    if n < 1:
        raise ApiError(
            422,
            "invalid_question",
            f"{qtype} question {qid!r} has no criteria; accepted: {MIN_CHOICES} to {MAX_CHOICES}.",
            field=where,
        )
    if n > MAX_CHOICES:
        raise ApiError(
            422,
            "too_many_choices",
            f"{qtype} question {qid!r} has {n} criteria; accepted: {MIN_CHOICES} to {MAX_CHOICES} per "
            "question. Split it into a coarse and a fine question.",
            field=where,
        )


def _short(v: Any) -> str:
    s = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else repr(v)
    return s if len(s) < 80 else s[:77] + "..."


@functools.lru_cache(maxsize=256)
def _compile(key: str) -> tuple[tuple[SystemOneQuestion, ...], Schema | None]:
    """Questions and schema for a canonical question list (cached)."""
    taken: set[str] = set()
    questions = []
    defs = []
    for qid, spec in json.loads(key):
        qtype = spec["type"]
        instr = spec["instructions"]
        if qtype == "noul":
            name = _field_name(qid, taken)
            outcomes = spec["criteria"]
            desc = instr or "; ".join(f"{k}: {v}" for k, v in outcomes.items())
            defs.append(
                FieldDefinition(name, "boolean", desc, choice_descriptions=dict(outcomes) or None)
            )
            questions.append(SystemOneQuestion(qid, qtype, name, ("true", "false")))
            continue
        if qtype == "choice":
            labels = tuple(str(lab) for lab, _ in spec["criteria"])
            descs = {lab: d for lab, d in spec["criteria"] if d is not None}
            legend = None
        else:
            labels = tuple(str(i) for i in range(len(spec["criteria"])))
            descs = {i: d for i, d in enumerate(spec["criteria"])}
            legend = {str(i): c for i, c in enumerate(spec["raw"])}
        name = _field_name(qid, taken)
        choices: list[Any] = list(labels) if qtype == "choice" else list(range(len(labels)))
        defs.append(
            FieldDefinition(
                name, "enum", instr or "", choices=choices, choice_descriptions=descs or None
            )
        )
        questions.append(SystemOneQuestion(qid, qtype, name, labels, legend))
    schema = None
    if defs:
        try:
            schema = StructuredSchema(defs, name="SystemOne", instructions=INSTRUCTIONS).schema
        except SchemaError as e:
            raise _schema_error(e, questions) from e
    return tuple(questions), schema


def _schema_error(e: SchemaError, questions: list[SystemOneQuestion]) -> ApiError:
    by_field = {q.field: q.id for q in questions}
    qid = by_field.get(e.field or "")
    where = f"questions.{qid}.criteria" if qid is not None else "questions"
    msg = str(e)
    if qid is not None:
        msg = f"question {qid!r}: {msg}"
    kind = (
        "too_few_choices"
        if isinstance(e, TooFewChoicesError)
        else "too_many_choices"
        if isinstance(e, TooManyChoicesError)
        else "invalid_schema"
    )
    return ApiError(422, kind, msg, field=where)


# --- answers --------------------------------------------------------------------------------


def build_response(
    request: SystemOneRequest, decision: Decision[Any] | None, *, model: str, input_tokens: int
) -> dict[str, Any]:
    """The System One response for `request`, from the decision of its schema.

    Args:
        request: The parsed request.
        decision: The decision of `request.schema` (`None` when it has no scored field).
        model: The name of the model that answered.
        input_tokens: Prompt tokens the model read.
    """
    answers: dict[str, Any] = {}
    for q in request.questions:
        if decision is None:  # pragma: no cover - the schema always covers these
            raise RuntimeError(f"no decision for question {q.id!r}")
        f = decision.fields[q.field]
        dist = {_label(k): float(p) for k, p in f.distribution.items()}
        answers[q.id] = _answer(q, dist)
    return {
        "model": model,
        "answers": answers,
        "usage": {"input_tokens": int(input_tokens), "output_tokens": 0},
    }


def _label(label: Any) -> str:
    if isinstance(label, bool):
        return "true" if label else "false"
    return str(label)


def _answer(q: SystemOneQuestion, dist: Mapping[str, float]) -> dict[str, Any]:
    if q.type == "noul":
        return {"type": "noul", "noul": _r(dist["true"])}
    probs = {lab: _r(dist[lab]) for lab in q.labels}
    best = max(q.labels, key=lambda lab: dist[lab])  # first on ties (declaration order)
    if q.type == "choice":
        return {
            "type": "choice",
            "choice": best,
            "probabilities": probs,
            "confidence": _r(dist[best]),
        }
    expected = sum(int(lab) * dist[lab] for lab in q.labels)
    return {
        "type": "score",
        "score": _r(expected),
        "legend": dict(q.legend or {}),
        "probabilities": probs,
        "confidence": _r(dist[best]),
    }


def _r(x: float) -> float:
    return round(float(x), 6)
