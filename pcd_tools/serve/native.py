"""`POST /v1/decide`: our own schema dict plus a context, answered with the seed's dict.

Body: `{"schema": S, "context": str, "temperature"?: float, "scoring"?:
"auto"|"full"|"constrained"|"pmi" (default "auto", as in `Decider.decide`), "orders"?: int, "allow_empty"?: bool, "calibration"?:
"contextual"|"none", "examples"?: [...], "pruning"?: "auto"|"on"|"off"}` where `S` is the `StructuredSchema` dict form
(`{name: {"type", "choices", ...}}`), that form wrapped as
`{"name"?, "instructions"?, "fields": {...}, "examples"?: [...]}`, a list of `{"name", "type", ...}` objects,
or a JSON schema (`{"type": "object", "properties": ...}`, compiled by
`compile_json_schema`).

`orders` (default 1) averages each field's distribution over that many listing orders
(`Decider.decide(..., orders=k)`); the response then reports `orders` and `flip_rate`.
An empty or whitespace-only `context` is a 422 unless `"allow_empty": true`.
`examples` (`[{"input": text, "output": {field: value}}, ...]`) are few-shot turns held in
the cached schema prefix; a bad one is a 422 naming the example and the field.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from ..decide.checks import SCORINGS, check_max_new_tokens, check_pruning
from ..decide.orders import check_orders
from ..errors import InvalidArgumentError, SchemaError
from ..schema import Schema, StructuredSchema
from .errors import ApiError
from .systemone import _json_type, _temperature

__all__ = ["DecideRequest", "parse_decide"]

CALIBRATIONS = ("contextual", "none")
MAX_ORDERS = 16
KEYS = (
    "allow_empty",
    "calibration",
    "context",
    "examples",
    "max_new_tokens",
    "orders",
    "pruning",
    "schema",
    "scoring",
    "temperature",
)


@dataclass(frozen=True)
class DecideRequest:
    """A validated `/v1/decide` request.

    Args:
        schema: The compiled schema.
        context: The text to decide on.
        temperature: Softmax temperature (> 0).
        scoring: `"auto"` (the default, as in `Decider.decide`), `"full"`,
            `"constrained"` or `"pmi"`.
        orders: Listing orders averaged over (>= 1).
        allow_empty: Decide on an empty or whitespace-only context.
        calibration: `"contextual"` or `"none"`, or None for the server's decider setting.
        max_new_tokens: The token limit of each generated field that sets none itself, or
            None for the library's default (256).
        pruning: `"auto"`, `"on"` or `"off"` (`Decider.decide(..., pruning=)`).
    """

    schema: Schema
    context: str
    temperature: float
    scoring: str
    orders: int = 1
    allow_empty: bool = False
    calibration: str | None = None
    max_new_tokens: int | None = None
    pruning: str = "auto"


def parse_decide(body: Any, *, max_questions: int = 64) -> DecideRequest:
    """Validates a `/v1/decide` body and compiles its schema.

    Raises:
        ApiError: 422 naming the field (the schema error's message for a bad schema; an
            empty context without `allow_empty`; `orders` not an int >= 1), 413 for more
            than `max_questions` fields.
    """
    if not isinstance(body, dict):
        raise ApiError(
            422, "invalid_request", f"The body must be a JSON object; got {_json_type(body)}."
        )
    extra = set(body) - set(KEYS)
    if extra:
        raise ApiError(
            422,
            "invalid_request",
            f"unknown key(s) {sorted(extra)}; accepted: {list(KEYS)}.",
        )
    context = body.get("context")
    if not isinstance(context, str):
        raise ApiError(
            422,
            "invalid_request",
            f"context must be a string; got {_json_type(context)}.",
            field="context",
        )
    allow_empty = body.get("allow_empty", False)
    if not isinstance(allow_empty, bool):
        raise ApiError(
            422,
            "invalid_request",
            f"allow_empty must be true or false; got {_json_type(allow_empty)}.",
            field="allow_empty",
        )
    if not allow_empty and not context.strip():
        raise ApiError(
            422,
            "invalid_request",
            f"context is empty or only whitespace ({_short(context)}): there is nothing to "
            'decide on. Send "allow_empty": true to decide anyway (the model then answers '
            "from the schema alone).",
            field="context",
        )
    try:
        orders = check_orders(body.get("orders", 1))
    except InvalidArgumentError as e:
        raise ApiError(422, "invalid_request", str(e), field="orders") from e
    if orders > MAX_ORDERS:
        # each order is a full prefill and fields pass on the one model worker
        raise ApiError(
            422,
            "invalid_request",
            f"orders={orders} is over this server's limit of {MAX_ORDERS}; accepted: an int "
            f"from 1 to {MAX_ORDERS}.",
            field="orders",
        )
    t = _temperature(body.get("temperature", 1.0))
    scoring = body.get("scoring", "auto")
    if scoring not in SCORINGS:
        raise ApiError(
            422,
            "invalid_request",
            f"scoring must be one of {list(SCORINGS)}; got {scoring!r}.",
            field="scoring",
        )
    calibration = body.get("calibration")
    if calibration is not None and calibration not in CALIBRATIONS:
        raise ApiError(
            422,
            "invalid_request",
            f"calibration must be one of {list(CALIBRATIONS)} (label-free; a fitted calibration "
            f"is set when the server starts: pcd serve --calibration FILE); got {calibration!r}.",
            field="calibration",
        )
    try:
        limit = check_max_new_tokens(body.get("max_new_tokens"))
    except InvalidArgumentError as e:
        raise ApiError(422, "invalid_request", str(e), field="max_new_tokens") from e
    try:
        pruning = check_pruning(body.get("pruning", "auto"), orders, scoring)
    except InvalidArgumentError as e:
        raise ApiError(422, "invalid_request", str(e), field="pruning") from e
    options = (t, scoring, orders, allow_empty, calibration, limit, pruning)
    spec = body.get("schema")
    if isinstance(spec, dict) and _is_json_schema(spec):
        return DecideRequest(
            _with_examples(_compile_json(spec, max_questions), body), context, *options
        )
    name, instructions, fields = _unwrap(spec)
    n = len(fields)
    if n > max_questions:
        raise ApiError(
            413,
            "too_many_questions",
            f"the schema has {n} fields; the limit is max_questions={max_questions} per "
            "request. Split it over several requests.",
            field="schema.fields",
        )
    key = json.dumps([name, instructions, fields], ensure_ascii=False)
    schema = _compile(key)
    if isinstance(spec, dict) and "examples" in spec and "fields" in spec:
        schema = _with_examples(schema, {"examples": spec["examples"]}, "schema.examples")
    return DecideRequest(_with_examples(schema, body), context, *options)


def _with_examples(schema: Schema, body: dict[str, Any], where: str = "examples") -> Schema:
    """The schema with the request's few-shot examples (kept in the cached prefix)."""
    if "examples" not in body:
        return schema
    from ..schema.examples import with_examples

    try:
        return with_examples(schema, body["examples"], where)
    except SchemaError as e:
        raise ApiError(422, "invalid_example", str(e), field=where) from e


def _unwrap(spec: Any) -> tuple[str, str, dict[str, Any]]:
    if not isinstance(spec, (dict, list)) or not spec:
        raise ApiError(
            422,
            "invalid_schema",
            "schema must be a non-empty object of field name -> {'type', 'choices', ...}, that "
            f"object under 'fields', or a list of fields; got {_json_type(spec)}.",
            field="schema",
        )
    name, instructions, fields = "StructuredSchema", "", spec
    if (
        isinstance(spec, dict)
        and "fields" in spec
        and set(spec) <= {"name", "instructions", "fields", "examples"}
    ):
        name = spec.get("name", name)
        instructions = spec.get("instructions", instructions)
        fields = spec["fields"]
        for key, v in (("name", name), ("instructions", instructions)):
            if not isinstance(v, str):
                raise ApiError(
                    422,
                    "invalid_schema",
                    f"schema.{key} must be a string; got {_json_type(v)}.",
                    field=f"schema.{key}",
                )
    if isinstance(fields, list):
        fields = _from_list(fields)
    if not isinstance(fields, dict):
        raise ApiError(
            422,
            "invalid_schema",
            f"schema.fields must be an object or a list; got {_json_type(fields)}.",
            field="schema.fields",
        )
    return name, instructions, fields


def _from_list(items: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ApiError(
                422,
                "invalid_schema",
                f"schema field #{i} must be an object with a string 'name'; got {_short(item)}.",
                field=f"schema.fields[{i}]",
            )
        rest = {k: v for k, v in item.items() if k != "name"}
        if "field_type" in rest and "type" not in rest:
            rest["type"] = rest.pop("field_type")
        if item["name"] in out:
            raise ApiError(
                422,
                "invalid_schema",
                f"schema field {item['name']!r} is declared twice.",
                field=f"schema.fields[{i}]",
            )
        out[item["name"]] = rest
    return out


def _short(v: Any) -> str:
    s = json.dumps(v, ensure_ascii=False)
    return s if len(s) < 80 else s[:77] + "..."


@functools.lru_cache(maxsize=256)
def _compile(key: str) -> Schema:
    name, instructions, fields = json.loads(key)
    try:
        return StructuredSchema(fields, name=name, instructions=instructions).schema
    except SchemaError as e:
        where = f"schema.fields.{e.field}" if e.field else "schema"
        raise ApiError(422, "invalid_schema", str(e), field=where) from e
    except (TypeError, ValueError) as e:  # a malformed spec the schema compiler did not type
        raise ApiError(422, "invalid_schema", f"invalid schema: {e}", field="schema") from e


def _is_json_schema(spec: Any) -> bool:
    from ..schema.json_schema import is_json_schema

    return isinstance(spec, dict) and is_json_schema(spec)


def _compile_json(spec: dict[str, Any], max_questions: int) -> Schema:
    """A JSON schema (`{"type": "object", "properties": ...}`) as the request's schema."""
    from ..errors import InvalidJsonSchemaError, SchemaTooLargeError, UnsupportedSchemaKeywordError
    from ..schema.json_schema import compile_json_schema

    try:
        return compile_json_schema(spec, max_fields=max_questions)
    except SchemaTooLargeError as e:
        raise ApiError(413, "too_many_questions", str(e), field="schema") from e
    except (UnsupportedSchemaKeywordError, InvalidJsonSchemaError) as e:
        raise ApiError(422, "invalid_schema", str(e), field="schema" + (e.path or "")) from e
    except SchemaError as e:
        raise ApiError(422, "invalid_schema", str(e), field="schema") from e
