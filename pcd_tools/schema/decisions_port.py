"""A schema as an OpenAI Decisions request: `client.decisions.create(**decisions_request(...))`.

A schema ported to the Decisions API (`client.decisions.create(model=..., input=...,
questions=[...])`, served by `pcd serve` at `/v1/decisions`) is asked as `decide` asks it:

    from pcd_tools.schema import decisions_request
    r = client.decisions.create(model="pcd", **decisions_request(Route, text))

gives, on `pcd serve`, the probabilities of `decider.decide(Route, text)`: the request
compiles to a schema with the same prompt (instructions, fields, allowed values and their
descriptions, in order). Each field becomes one question, named after the field, whose
`instructions` are the field's description (its name, spaced, when it has none, as the
prompt shows it):

| field | question |
|---|---|
| `bool` | `predicate` (P(true)); a `choice` of `true` / `false` when the values are described |
| `Literal` / `Enum` of strings | `choice`, each value with its `choice_descriptions` entry |
| `int` values `0..n-1`, 2 <= n <= 10, each described | `score`, one level per value, its label the description |

The task instructions (the model's docstring) travel as a leading `developer` message of
`input`, which `/v1/decisions` makes the schema's instructions (the system prompt), then
the text as a `user` message. An empty docstring is sent as an empty developer message:
the prompt then holds the library's default instruction, as `decide`'s does.

What a Decisions request cannot carry raises `UnportableFieldError` naming the field:
generated fields (`str`, `float`, a free `int`, dates, lists), multi-label fields,
`Optional` fields (their `null` value), nested models and unions, `depends_on` and
`choices_by` ties, int values other than `0..n-1` or without a description each, a field
name the server would rename for the prompt, and few-shot examples.

This module builds plain dicts: no `openai`, no server. It sits in the schema layer since
it reads only the compiled `Schema`; the server's side is `pcd_tools.serve.decisions`.
"""

from __future__ import annotations

import keyword
from typing import Any, NoReturn

from pydantic import BaseModel

from ..errors import UnportableFieldError
from .compile import compile_schema
from .spec import FieldSpec, Schema

__all__ = [
    "API_MIN_CHOICES",
    "MAX_LEVELS",
    "MIN_LEVELS",
    "decisions_input",
    "decisions_questions",
    "decisions_request",
]

# The Decisions API's own limits (`decision_create_params`): a choice question takes 2 to
# 255 values, a score question 2 to 10 levels.
API_MIN_CHOICES = 2
MIN_LEVELS, MAX_LEVELS = 2, 10

_ACCEPTED = (
    "accepted: bool, a Literal or Enum of strings, or int values 0..n-1 (2 <= n <= "
    f"{MAX_LEVELS}) each with a choice description, with no Optional, nesting, union or "
    "dependency"
)
_RESERVED = set(dir(BaseModel))


def decisions_request(schema: Any, text: str) -> dict[str, Any]:
    """`input` and `questions` of a Decisions request that asks `schema` about `text`.

    Args:
        schema: A Pydantic model class, or anything `compile_schema` accepts.
        text: The text to decide on.

    Returns:
        `{"input": [developer message, user message], "questions": [...]}`, to pass as
        `client.decisions.create(model=..., **decisions_request(schema, text))`.

    Raises:
        SchemaError: if the schema is invalid.
        UnportableFieldError: for a field, or examples, a Decisions request cannot carry
            (see the module docstring).
    """
    compiled = compile_schema(schema)
    return {"input": decisions_input(compiled, text), "questions": decisions_questions(compiled)}


def decisions_input(schema: Any, text: str) -> list[dict[str, str]]:
    """The `input` items: the schema's instructions as a `developer` message, then `text`
    as a `user` message."""
    compiled = compile_schema(schema)
    return [
        {"role": "developer", "content": compiled.instructions},
        {"role": "user", "content": text},
    ]


def decisions_questions(schema: Any) -> list[dict[str, Any]]:
    """One Decisions question per field, in declaration order, named after the field.

    Raises:
        UnportableFieldError: as `decisions_request`.
    """
    compiled = compile_schema(schema)
    if compiled.whole is not None:
        raise UnportableFieldError(
            f"{compiled.name} is a part of a schema (Schema.part), asked under its whole "
            "schema's prompt; accepted: the whole schema.",
            model=compiled.name,
        )
    if compiled.examples:
        raise UnportableFieldError(
            f"{compiled.name} has {len(compiled.examples)} few-shot example(s), which reach "
            "the prompt; a Decisions request has nowhere to put them. Accepted: a schema "
            "without examples.",
            model=compiled.name,
        )
    return [_question(compiled, f) for f in compiled.fields]


def _question(schema: Schema, f: FieldSpec) -> dict[str, Any]:
    _check(schema, f)
    # the prompt shows a field without a description by its name, spaced
    instructions = f.description.strip() or f.key.replace("_", " ")
    values = [c.label for c in f.choices]
    described = any(c.description for c in f.choices)
    if f.kind == "boolean" and not described:
        return {"type": "predicate", "name": f.name, "instructions": instructions}
    if all(isinstance(v, (str, bool)) for v in values):
        if len(values) < API_MIN_CHOICES:
            _refuse(
                schema,
                f,
                f"has {len(values)} allowed value; a Decisions choice takes "
                f"{API_MIN_CHOICES} to 255",
            )
        choices = [
            {"value": c.label, **({"description": c.description} if c.description else {})}
            for c in f.choices
        ]
        return {"type": "choice", "name": f.name, "instructions": instructions, "choices": choices}
    if values != list(range(len(values))) or not MIN_LEVELS <= len(values) <= MAX_LEVELS:
        _refuse(
            schema,
            f,
            f"has the values {values}; a Decisions score question answers levels 0..n-1 "
            f"({MIN_LEVELS} <= n <= {MAX_LEVELS})",
        )
    if not all(c.description for c in f.choices):
        _refuse(
            schema,
            f,
            "has int values without a description each; a Decisions score level needs a "
            "label, which the prompt shows next to its value (describe every value with "
            "json_schema_extra={'choice_descriptions': {...}})",
        )
    levels = [{"label": c.description} for c in f.choices]
    return {"type": "score", "name": f.name, "instructions": instructions, "levels": levels}


def _check(schema: Schema, f: FieldSpec) -> None:
    """Refuses what a Decisions question cannot express, or would ask differently."""
    why = None
    if f.generated:
        why = "is generated (free text, a number, a date or a list), not a closed set"
    elif f.kind == "multilabel":
        why = "is multi-label (a yes/no per label)"
    elif f.branch is not None or "." in f.name:
        why = "belongs to a nested model or a union branch"
    elif f.depends_on or f.choices_by is not None:
        why = "depends on another field's answer (depends_on / choices_by)"
    elif f.optional:
        why = "is Optional: its null value has no Decisions equivalent (choices are str or bool)"
    elif (
        not f.name.isidentifier()
        or keyword.iskeyword(f.name)
        or f.name in _RESERVED
        or f.name.startswith("model_")
    ):  # `pcd_tools.serve.systemone` renames such a question for the prompt
        why = "has a name the server would rename for the prompt"
    if why is not None:
        _refuse(schema, f, why)


def _refuse(schema: Schema, f: FieldSpec, why: str) -> NoReturn:
    raise UnportableFieldError(
        f"{schema.name}.{f.name} {why}, so it cannot be asked as a Decisions question; "
        f"{_ACCEPTED}.",
        model=schema.name,
        field=f.name,
    )
