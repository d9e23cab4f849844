"""`POST /v1/decisions`: the OpenAI Decisions API, answered by scoring.

The request and answer shapes are those of the `openai` SDK's `decision_create_params` and
`Decision` types (`client.decisions.create`). Each question becomes one field of the same
`Schema` that the equivalent System One request compiles to, so the two routes give the
same probabilities and share micro-batches:

| question | System One equivalent | answer |
|---|---|---|
| `predicate` | `noul` with the instructions | `probability` = P(true) |
| `choice` (2-255 typed values) | `choice` with `criteria` value -> description | `choice` (typed), `probabilities` per value, `confidence` |
| `score` (2-10 levels) | `score` with `criteria[i]` = `"label: description"` | `score` = Σ i·p_i over the level indices, `probabilities` per level, `confidence` |

`confidence` is the answer's probability, as everywhere in the project (`FieldResult.probability`,
System One). A choice value is a string or a boolean: the model sees `"true"` and `true` as
different JSON values, and the answer gives each back with its own JSON type (a question
with boolean values has no System One equivalent; it compiles to the same kind of field).

**One choice.** The SDK's `decision_create_params` says "Provide between 2 and 255
choices", so a choice question with one choice (or none) is a 400 `too_few_choices` on
`questions[i].choices`, even though the library, `/v1/systemone` and `/v1/decide` answer a
single allowed value with probability 1: a request this route accepts is one every
Decisions server accepts. (`langchain_openai`'s `Choice` lets one through; the server
answers it with this 400.)

**Input.** A string is the context as is (like a System One `state`). A list of items
may start with `system` and `developer` messages: those before any other item are the
task instructions, the schema's `instructions` (their texts joined by blank lines), which
the prompt puts in its system message, cached with the questions, in place of the
route's default "Answer every question about the content of the user's message.". That
is where a Pydantic schema's docstring goes when the schema is ported
(`pcd_tools.schema.decisions_request`), so the route asks it as `Decider.decide` does.
The instructions are part of the schema's fingerprint: requests with other instructions
have their own prefix-cache entry and never share a micro-batch. The other items are the
context, rendered the way the chat route renders messages: one user message is its text;
user messages only are joined by blank lines; anything else is a readable transcript,
`role: text` blocks, where a `function_call` / `custom_tool_call` reads
`assistant: [called NAME with ARGUMENTS]` and its output `tool: [NAME returned] OUTPUT`.
A system or developer message after another item is part of the input being judged, and
is rendered in the transcript. A tool output whose `call_id` names no earlier call of its
kind is a 400, and so is an input with instructions only (nothing to decide on).

**Refusals.** PCD refuses a question only where it cannot read it: an image part in a
question's `instructions` (this server reads text only) gets `{"type": "refusal"}` and the
other questions are answered. An image in `input`, which every question reads, is a 400.
Nothing else produces a refusal: every other question is scored over its declared options.

**Usage.** `input_tokens` is the prompt's length; `input_tokens_details.cached_tokens` the
tokens of the questions' part read from the prefix cache, `cache_write_tokens` those
written to it by the request's batch; `output_tokens` is 0 (nothing is generated) and
`total_tokens` their sum. `prompt_cache_key` keeps a caller's prefix-cache entries apart
from everyone else's (`PrefixCache.partition`); `prompt_cache_options` and parts'
`prompt_cache_breakpoint` are accepted, and PCD's cache boundary is always the end of the
questions' part. `safety_identifier` is accepted and logged, nothing more.

**Errors** are OpenAI error objects, `{"error": {"message", "type", "param", "code"}}`,
with `param` a JSON path such as `questions[2].choices`: 400 for an invalid request,
401 for a missing or wrong key, 413 for a body, a prompt or a number of questions over the
server's limits, 422 for a context the model refuses, 429 for a full queue.

**Clients.** Point the official clients at the server's `/v1`:

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="<key or anything>")
    client.decisions.create(model="pcd", input="...", questions=[...])

    from langchain_openai.decisions import OpenAIDecisions
    decisions = OpenAIDecisions(model="pcd", base_url="http://127.0.0.1:8000/v1", api_key="...")

`pcd_tools.agents.DecisionsStage` uses such an `OpenAIDecisions` as a cascade stage.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field as PydField
from pydantic import create_model

from ..schema import Schema
from ..schema.spec import Choice
from .decisions_request import MAX_LEVELS, input_parts, input_text
from .decisions_request import ImagePart as _Image
from .decisions_request import bad as _bad
from .decisions_request import choices as _choices
from .decisions_request import levels as _levels
from .decisions_request import parts_text as _parts_text
from .systemone import _compile, _json_type

if TYPE_CHECKING:
    from ..answers.result import Decision

__all__ = [
    "MAX_LEVELS",
    "MAX_QUESTIONS",
    "DecisionQuestion",
    "DecisionsRequest",
    "build_decision",
    "error_type",
    "input_text",
    "parse_decisions",
]

log = logging.getLogger("pcd_tools.serve")

MAX_QUESTIONS = 400  # the API's own limit; the server's --max-questions may be lower
QUESTION_TYPES = ("predicate", "choice", "score")
REQUEST_KEYS = (
    "input",
    "model",
    "prompt_cache_key",
    "prompt_cache_options",
    "questions",
    "safety_identifier",
)
MAX_SAFETY_IDENTIFIER = 64


@dataclass(frozen=True)
class DecisionQuestion:
    """One question of a request, in request order.

    Args:
        name: The question's name, or None when unnamed.
        type: `"predicate"`, `"choice"` or `"score"`.
        field: The schema field that scores it, or None when it is refused.
        values: A choice question's values (str or bool), in order.
        levels: A score question's level labels, in order.
        refusal: Why the question is refused (None when it is answered).
    """

    name: str | None
    type: str
    field: str | None
    values: tuple[str | bool, ...] = ()
    levels: tuple[str, ...] = ()
    refusal: str | None = None


@dataclass(frozen=True)
class DecisionsRequest:
    """A validated Decisions request.

    Args:
        model: The model name the client asked for (the loaded model answers any name).
        context: The input as the text the model reads.
        questions: The questions in request order.
        schema: The compiled schema of the answered questions, or None when all are refused.
        systemone: The equivalent System One `questions` object (for the answered ones;
            System One has no task instructions: with `instructions`, its schema's
            prompt differs in them).
        prompt_cache_key: The caller's prefix-cache partition, or None.
        safety_identifier: The caller's end-user identifier (logged only), or None.
        instructions: The task instructions from `input`'s leading system and developer
            messages (the schema's `instructions`), or None for the route's default.
    """

    model: str
    context: str
    questions: tuple[DecisionQuestion, ...]
    schema: Schema | None
    systemone: dict[str, Any]
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    instructions: str | None = None


def error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


# --- questions ------------------------------------------------------------------------------

_QUESTION_KEYS = {
    "predicate": ("instructions", "name", "type"),
    "choice": ("choices", "instructions", "name", "type"),
    "score": ("instructions", "levels", "name", "type"),
}


def _question(q: Any, i: int, names: set[str]) -> tuple[DecisionQuestion, Any]:
    """A validated question and its System One spec (None when refused)."""
    where = f"questions[{i}]"
    if not isinstance(q, dict):
        raise _bad(
            f"{where} must be an object with a 'type'; got {_json_type(q)}.", where, "invalid_type"
        )
    qtype = q.get("type")
    if qtype not in QUESTION_TYPES:
        raise _bad(
            f"{where} has type {qtype!r}; accepted: {list(QUESTION_TYPES)}.",
            f"{where}.type",
            "unknown_question_type",
        )
    extra = sorted(set(q) - set(_QUESTION_KEYS[qtype]))
    if extra:
        raise _bad(
            f"{where} ({qtype}) has unknown key(s) {extra}; accepted: "
            f"{list(_QUESTION_KEYS[qtype])}.",
            f"{where}.{extra[0]}",
            "unknown_parameter",
        )
    name = q.get("name")
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise _bad(
                f"{where}.name must be a non-empty string or absent; got {name!r}.", f"{where}.name"
            )
        if name in names:
            raise _bad(
                f"{where}.name {name!r} is already the name of an earlier question; names "
                "key the answers, so each must be unique.",
                f"{where}.name",
                "duplicate_name",
            )
        names.add(name)
    if "instructions" not in q:
        raise _bad(
            f"{where}.instructions is required.",
            f"{where}.instructions",
            "missing_required_parameter",
        )
    refusal = None
    try:
        instructions = _parts_text(q["instructions"], f"{where}.instructions", "instructions")
    except _Image as e:
        refusal, instructions = f"{e.where} is an image; this server reads text only.", ""
    if refusal is None and not instructions.strip():
        raise _bad(f"{where}.instructions is empty: say what to decide.", f"{where}.instructions")
    if qtype == "predicate":
        spec: Any = {"type": "noul", "instructions": instructions, "criteria": {}}
        question = DecisionQuestion(name, qtype, None)
    elif qtype == "choice":
        values, descs = _choices(q.get("choices"), where)
        question = DecisionQuestion(name, qtype, None, values=tuple(values))
        spec = {"type": "choice", "instructions": instructions, "criteria": descs}
    else:
        labels, texts = _levels(q.get("levels"), where)
        question = DecisionQuestion(name, qtype, None, levels=tuple(labels))
        spec = {"type": "score", "instructions": instructions, "criteria": texts, "raw": texts}
    if refusal is not None:
        return dataclasses.replace(question, refusal=refusal), None
    return question, spec


# --- the request ----------------------------------------------------------------------------


def parse_decisions(body: Any, *, max_questions: int = 64) -> DecisionsRequest:
    """Validates a Decisions request body and compiles its schema.

    Args:
        body: The decoded JSON body.
        max_questions: The server's most questions per request (`--max-questions`).

    Raises:
        ApiError: 400 naming the parameter at fault (`param`, a JSON path), 413 for more
            questions than `max_questions` (but within the API's 400).
    """
    if not isinstance(body, dict):
        raise _bad(f"The body must be a JSON object; got {_json_type(body)}.", None, "invalid_type")
    unknown = sorted(set(body) - set(REQUEST_KEYS))
    if unknown:
        raise _bad(
            f"Unknown parameter(s) {unknown}; accepted: {list(REQUEST_KEYS)}.",
            unknown[0],
            "unknown_parameter",
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(
            f"model is required: any model name (the loaded model answers it); got "
            f"{_json_type(model)}.",
            "model",
            "missing_required_parameter" if model is None else "invalid_type",
        )
    cache_key = _optional_str(body, "prompt_cache_key")
    safety = _optional_str(body, "safety_identifier")
    if safety is not None and len(safety) > MAX_SAFETY_IDENTIFIER:
        raise _bad(
            f"safety_identifier has {len(safety)} characters; accepted: at most "
            f"{MAX_SAFETY_IDENTIFIER}.",
            "safety_identifier",
        )
    _cache_options(body.get("prompt_cache_options"))
    instructions, context = input_parts(body.get("input"))
    raw = body.get("questions")
    if not isinstance(raw, list) or not raw:
        raise _bad(
            f"questions must be an array of 1 to {MAX_QUESTIONS} questions; got "
            f"{'an empty array' if isinstance(raw, list) else _json_type(raw)}.",
            "questions",
            "missing_required_parameter" if raw is None else "invalid_value",
        )
    if len(raw) > MAX_QUESTIONS:
        raise _bad(
            f"questions has {len(raw)} questions; the API accepts 1 to {MAX_QUESTIONS}.",
            "questions",
            "too_many_questions",
        )
    if len(raw) > max_questions:
        raise _bad(
            f"questions has {len(raw)} questions; this server's limit is --max-questions="
            f"{max_questions} per request. Split them over several requests.",
            "questions",
            "too_many_questions",
            413,
        )
    names: set[str] = set()
    parsed = [_question(q, i, names) for i, q in enumerate(raw)]
    questions, schema, systemone = _compile_questions(parsed, instructions)
    return DecisionsRequest(
        model, context, questions, schema, systemone, cache_key, safety, instructions
    )


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    v = body.get(key)
    if v is not None and not isinstance(v, str):
        raise _bad(f"{key} must be a string; got {_json_type(v)}.", key, "invalid_type")
    return v


def _cache_options(opts: Any) -> None:
    if opts is None:
        return
    if not isinstance(opts, dict) or set(opts) - {"mode", "ttl"}:
        raise _bad(
            "prompt_cache_options must be an object with optional 'mode' and 'ttl'.",
            "prompt_cache_options",
            "invalid_type",
        )
    if opts.get("mode") not in (None, "implicit", "explicit"):
        raise _bad(
            f"prompt_cache_options.mode is {opts['mode']!r}; accepted: 'implicit', 'explicit'.",
            "prompt_cache_options.mode",
        )
    if opts.get("ttl") not in (None, "30m"):
        raise _bad(
            f"prompt_cache_options.ttl is {opts['ttl']!r}; accepted: '30m'.",
            "prompt_cache_options.ttl",
        )


def _compile_questions(
    parsed: list[tuple[DecisionQuestion, Any]], instructions: str | None = None
) -> tuple[tuple[DecisionQuestion, ...], Schema | None, dict[str, Any]]:
    """The questions with their fields, and the schema System One compiles them to, with
    `instructions` as its task instructions when given.

    A boolean choice value goes through System One's compiler as a placeholder string
    (one no string value of the question uses); its field then gets the typed choice back
    (JSON `true`/`false`, listed and scored as such). The compiled questions are cached
    by System One (`_compile`); the instructions are set on a copy, so they reach the
    schema's fingerprint and prompt, never the cache.
    """
    key: list[list[Any]] = []
    systemone: dict[str, Any] = {}
    typed: dict[int, list[tuple[int, bool]]] = {}  # position in key -> (choice, bool value)
    answered: list[int] = []
    for i, (q, spec) in enumerate(parsed):
        if spec is None:
            continue
        qid = q.name if q.name is not None else f"question_{i + 1}"
        if spec["type"] == "choice":
            strings = {v for v, _ in spec["criteria"] if isinstance(v, str)}
            bools = []
            for j, (v, _) in enumerate(spec["criteria"]):
                if isinstance(v, bool):
                    bools.append((j, v))
                    text = json.dumps(v)
                    while text in strings:
                        text += "_"
                    strings.add(text)
                    spec["criteria"][j][0] = text
            if bools:
                typed[len(key)] = bools
        answered.append(i)
        key.append([qid, spec])
        systemone[qid] = _systemone_question(spec)
    if not key:
        return tuple(q for q, _ in parsed), None, {}
    qs, schema = _compile(json.dumps(key, ensure_ascii=False))
    assert schema is not None  # every answered question is scored
    if typed:
        schema = _typed(schema, [qs[k].field for k in typed], list(typed.values()))
    if instructions is not None:
        schema = dataclasses.replace(schema, instructions=instructions)
    out = [q for q, _ in parsed]
    for k, i in enumerate(answered):
        out[i] = dataclasses.replace(out[i], field=qs[k].field)
    return tuple(out), schema, systemone


def _systemone_question(spec: dict[str, Any]) -> dict[str, Any]:
    q: dict[str, Any] = {"type": spec["type"], "instructions": spec["instructions"]}
    if spec["type"] == "choice":
        q["criteria"] = {v: d for v, d in spec["criteria"]}
    elif spec["type"] == "score":
        q["criteria"] = list(spec["criteria"])
    return q


def _typed(schema: Schema, fields: list[str], bools: list[list[tuple[int, bool]]]) -> Schema:
    """`schema` with the boolean choices of `fields` given back their JSON type."""
    by_field = dict(zip(fields, bools))
    new = []
    for f in schema.fields:
        if f.name in by_field:
            choices = list(f.choices)
            for j, v in by_field[f.name]:
                c = choices[j]
                lit = json.dumps(v)
                choices[j] = Choice(value=v, literal=lit, label=v, description=c.description)
            f = dataclasses.replace(f, choices=tuple(choices))
        new.append(f)
    defs: dict[str, Any] = {
        f.name: (
            Literal[tuple(c.value for c in f.choices)],
            PydField(description=f.description or None),
        )
        for f in new
    }
    model = create_model(schema.model.__name__, __doc__=schema.instructions or None, **defs)
    return dataclasses.replace(schema, fields=tuple(new), model=model)


# --- the answer -----------------------------------------------------------------------------


def build_decision(
    request: DecisionsRequest,
    decision: Decision[Any] | None,
    *,
    model: str,
    input_tokens: int,
    cached_tokens: int,
    cache_write_tokens: int,
) -> dict[str, Any]:
    """The `Decision` body of `request` from the decision of its schema.

    Args:
        request: The parsed request.
        decision: The decision of `request.schema` (None when every question is refused).
        model: The name of the model that answered.
        input_tokens: Prompt tokens the model read.
        cached_tokens: Prompt tokens read from the prefix cache.
        cache_write_tokens: Prompt tokens written to the prefix cache.
    """
    answers = []
    for q in request.questions:
        if q.field is None or decision is None:
            answers.append({"type": "refusal", "name": q.name})
            continue
        dist = decision.fields[q.field].distribution
        answers.append(_answer(q, dist))
    return {
        "model": model,
        "answers": answers,
        "usage": {
            "input_tokens": int(input_tokens),
            "input_tokens_details": {
                "cached_tokens": int(cached_tokens),
                "cache_write_tokens": int(cache_write_tokens),
            },
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": int(input_tokens),
        },
    }


def _answer(q: DecisionQuestion, dist: dict[Any, float]) -> dict[str, Any]:
    if q.type == "predicate":
        return {"type": "predicate", "name": q.name, "probability": float(dist[True])}
    keys: list[Any] = list(q.values) if q.type == "choice" else list(range(len(q.levels)))
    probs = [float(dist[k]) for k in keys]
    best = max(range(len(keys)), key=lambda j: probs[j])  # first on ties
    if q.type == "choice":
        return {
            "type": "choice",
            "name": q.name,
            "choice": keys[best],
            "confidence": probs[best],
            "probabilities": [{"value": v, "probability": p} for v, p in zip(keys, probs)],
        }
    return {
        "type": "score",
        "name": q.name,
        "score": sum(i * p for i, p in enumerate(probs)),
        "confidence": probs[best],
        "probabilities": [
            {"value": i, "label": label, "probability": p}
            for i, (label, p) in enumerate(zip(q.levels, probs))
        ],
    }


def log_request(request_id: str, request: DecisionsRequest) -> None:
    """Logs the request's `safety_identifier` (the only thing PCD does with it)."""
    if request.safety_identifier is not None:
        log.info(
            "decisions request %s: safety_identifier=%r, %d question(s)",
            request_id,
            request.safety_identifier,
            len(request.questions),
        )
