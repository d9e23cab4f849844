"""`POST /v1/chat/completions`: an OpenAI chat-completions request read as a PCD decision.

A request is a decision when it asks for structured output, in one of two ways:

- `response_format: {"type": "json_schema", "json_schema": {"name", "schema", ...}}`
  (`client.chat.completions.parse(response_format=Model)`, LangChain's
  `with_structured_output(Model, method="json_schema")`);
- one forced tool: `tool_choice: {"type": "function", "function": {"name": ...}}`, or
  `"required"` with exactly one tool (`with_structured_output(..., method="function_calling")`).

The JSON schema is compiled by `compile_json_schema` (see `openai_schema`); the system
messages are prepended to its instructions, and the other messages become the context,
rendered with the model's own chat template (`conversation_context`). Anything else is
refused with a message that says how to ask: this server scores answers, it never makes
up a chat reply.

| parameter | what PCD does with it |
|---|---|
| `temperature` | PCD's softmax temperature (default 1); 0 is the limit: probability 1 on the answer |
| `n` | 1 only (PCD's answer is deterministic) |
| `logprobs`, `top_logprobs` | one entry per scored field value, with its log-probability under PCD (generated fields have none) |
| `max_tokens`, `max_completion_tokens` | an answer longer than this is a 400, never cut; also each generated field's token limit |
| `stream`, `stream_options.include_usage` | server-sent events of the same answer |
| `seed`, `top_p`, `stop`, penalties, `user`, `metadata`, `store`, ... | accepted; no effect on a scored answer |
| `pcd` (via `extra_body`) | `{"orders"?, "scoring"?, "allow_empty"?, "calibration"?, "examples"?, "pruning"?}` as in `/v1/decide` |
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..decide.checks import SCORINGS, check_pruning
from ..decide.orders import check_orders
from ..errors import InvalidArgumentError, SchemaError
from ..prompt import DEFAULT_INSTRUCTIONS, TextTokenizer, build_prompt, render_system
from ..schema import Schema
from .errors import ApiError
from .systemone import _json_type

__all__ = ["ChatRequest", "conversation_context", "parse_chat"]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
HONOURED = (
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "messages",
    "model",
    "n",
    "pcd",
    "response_format",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
)
# Accepted and without effect: sampling knobs (PCD does not sample) and bookkeeping.
NO_EFFECT = (
    "frequency_penalty",
    "metadata",
    "parallel_tool_calls",
    "presence_penalty",
    "prompt_cache_key",
    "reasoning_effort",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "top_p",
    "user",
)
PCD_KEYS = ("allow_empty", "calibration", "examples", "orders", "pruning", "scoring")
CALIBRATIONS = ("contextual", "none")
MAX_ORDERS = 16
HOW_TO_ASK = (
    "This server answers structured decisions by scoring the allowed answers; it does not "
    "generate chat replies. Ask with response_format={'type': 'json_schema', 'json_schema': "
    "{'name': ..., 'schema': {...}}} (the openai client's chat.completions.parse("
    "response_format=Model), LangChain's with_structured_output(Model)) or force one tool "
    "with tool_choice={'type': 'function', 'function': {'name': ...}}."
)


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions request.

    Args:
        schema: The compiled schema, system messages prepended to its instructions.
        context: The conversation as the text between the schema part of the prompt and
            the answer (see `conversation_context`).
        temperature: PCD's temperature; 0 asks for the zero-temperature limit.
        tool: The forced tool's name, or None for `response_format`.
        stream: Answer as server-sent events.
        include_usage: With `stream`, send a last chunk with `usage`.
        logprobs: Fill `choices[0].logprobs`.
        top_logprobs: Alternatives per value in `logprobs` (0-20).
        max_tokens: Most tokens the answer's JSON may take, or None.
        scoring: `"auto"` (the default, as in `Decider.decide`), `"full"`,
            `"constrained"` or `"pmi"`.
        orders: Listing orders averaged over.
        allow_empty: Decide on an empty conversation.
        calibration: `"contextual"` or `"none"`, or None for the server's setting.
        pruning: `"auto"`, `"on"` or `"off"` (`Decider.decide(..., pruning=)`).
    """

    schema: Schema
    context: str
    temperature: float
    tool: str | None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    max_tokens: int | None = None
    scoring: str = "auto"
    orders: int = 1
    allow_empty: bool = False
    calibration: str | None = None
    pruning: str = "auto"

    @property
    def pcd_temperature(self) -> float:
        """The temperature the decision is scored at (1 for the zero limit)."""
        return self.temperature or 1.0

    @property
    def max_new_tokens(self) -> int | None:
        """The limit of each generated field: `max_tokens`, since no field of the answer may
        take more than the whole answer (which is checked once it is written)."""
        return self.max_tokens


def _bad(message: str, param: str | None = None, status: int = 400) -> ApiError:
    return ApiError(status, "invalid_request_error", message, field=param)


def parse_chat(body: Any, tokenizer: TextTokenizer, *, max_questions: int = 64) -> ChatRequest:
    """Validates a chat-completions body and compiles its schema and context.

    Args:
        body: The decoded JSON body.
        tokenizer: The served model's tokenizer (its chat template renders the messages).
        max_questions: Most fields a schema may have.

    Raises:
        ApiError: 400 for a request that is not a structured decision or has a bad
            parameter, 422 for a schema keyword PCD cannot score (naming the keyword and
            its path), 413 for a schema over `max_questions` fields.
    """
    if not isinstance(body, dict):
        raise _bad(f"The body must be a JSON object; got {_json_type(body)}.")
    unknown = sorted(set(body) - set(HONOURED) - set(NO_EFFECT))
    if unknown:
        raise _bad(
            f"Unknown or unsupported parameter(s) {unknown}; accepted: "
            f"{sorted(HONOURED + NO_EFFECT)}.",
            unknown[0],
        )
    if body.get("logit_bias"):
        raise _bad("logit_bias is not supported: PCD scores whole answers.", "logit_bias")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise _bad(
            f"n={n!r}: this server returns exactly one choice (n=1): a scored answer is "
            "deterministic, and its probabilities are in choices[0].pcd.",
            "n",
        )
    temperature = _temperature(body.get("temperature"))
    messages = _messages(body.get("messages"))
    raw, name, tool = _requested_schema(body)
    schema = _compile(raw, name, max_questions)
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    if system:
        instructions = schema.instructions.strip() or DEFAULT_INSTRUCTIONS
        schema = dataclasses.replace(schema, instructions=f"{system}\n\n{instructions}")
    pcd = _pcd_options(body.get("pcd"))
    if pcd["examples"] is not None:
        from ..schema.examples import with_examples

        try:
            schema = with_examples(schema, pcd["examples"], "pcd.examples")
        except SchemaError as e:
            raise ApiError(422, "invalid_example", str(e), field="pcd.examples") from e
    if not turns and not pcd["allow_empty"]:
        raise _bad(
            "messages has no user, assistant or tool message: there is nothing to decide on. "
            'Add the text as a user message, or send extra_body={"pcd": {"allow_empty": true}} '
            "to decide from the schema alone.",
            "messages",
        )
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad(
            f"stream_options must be an object; got {_json_type(options)}.", "stream_options"
        )
    logprobs = _flag(body, "logprobs")
    top = body.get("top_logprobs")
    if top is not None and (
        isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20
    ):
        raise _bad(f"top_logprobs must be an integer from 0 to 20; got {top!r}.", "top_logprobs")
    if top and not logprobs:
        raise _bad("top_logprobs needs logprobs=true.", "top_logprobs")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise _bad(f"max_tokens must be an integer >= 1; got {max_tokens!r}.", "max_tokens")
    context = conversation_context(tokenizer, schema, turns)
    if not context.strip() and not pcd["allow_empty"]:
        raise _bad(
            "messages hold only whitespace: there is nothing to decide on. Add the text as a "
            'user message, or send extra_body={"pcd": {"allow_empty": true}} (the JSON body\'s '
            '"pcd": {"allow_empty": true}) to decide from the schema alone.',
            "messages",
            status=422,
        )
    return ChatRequest(
        schema=schema,
        context=context,
        temperature=temperature,
        tool=tool,
        stream=stream,
        include_usage=bool(options.get("include_usage")) and stream,
        logprobs=logprobs,
        top_logprobs=top or 0,
        max_tokens=max_tokens,
        scoring=pcd["scoring"],
        orders=pcd["orders"],
        allow_empty=pcd["allow_empty"],
        calibration=pcd["calibration"],
        pruning=pcd["pruning"],
    )


def _flag(body: dict[str, Any], key: str) -> bool:
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(f"{key} must be true or false; got {_json_type(v)}.", key)
    return v


def _temperature(t: Any) -> float:
    if t is None:
        return 1.0
    ok = not isinstance(t, bool) and isinstance(t, (int, float)) and 0 <= t < math.inf
    if not ok:
        raise _bad(
            f"temperature must be a finite number >= 0 (PCD's softmax temperature; 0 puts "
            f"probability 1 on the answer); got {t!r}.",
            "temperature",
        )
    return float(t)


def _messages(messages: Any) -> list[dict[str, str]]:
    """The messages as `{"role", "content"}` with text content."""
    if not isinstance(messages, list) or not messages:
        raise _bad(
            f"messages must be a non-empty array of messages; got {_json_type(messages)}.",
            "messages",
        )
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise _bad(
                f"{where} must be an object with a role in {list(ROLES)}; got "
                f"{_json_type(m) if role is None else repr(role)}.",
                where,
            )
        role = "system" if m["role"] == "developer" else m["role"]
        text = _content_text(m.get("content"), where)
        if role == "assistant" and m.get("tool_calls"):
            text = "\n".join([text, *(_call_text(c, where) for c in m["tool_calls"])]).strip()
        if role in ("tool", "function"):
            name = m.get("name") or m.get("tool_call_id") or "tool"
            text = f"[{name} returned] {text}"
            role = "tool"
        out.append({"role": role, "content": text})
    return out


def _content_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, dict) else None
            if kind != "text" or not isinstance(p.get("text"), str):
                raise _bad(
                    f"{where}.content[{j}]: only text parts are accepted "
                    f"({{'type': 'text', 'text': ...}}); got {kind or _json_type(p)!r}.",
                    f"{where}.content",
                )
            parts.append(p["text"])
        return "\n".join(parts)
    raise _bad(
        f"{where}.content must be a string or an array of text parts; got {_json_type(content)}.",
        f"{where}.content",
    )


def _call_text(call: Any, where: str) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        raise _bad(f"{where}.tool_calls: each call needs a function object.", f"{where}.tool_calls")
    return f"[called {fn.get('name')} with {fn.get('arguments')}]"


def _requested_schema(body: dict[str, Any]) -> tuple[Any, str | None, str | None]:
    """The JSON schema asked for, its name, and the forced tool's name (or None)."""
    fmt = body.get("response_format")
    tools = body.get("tools")
    choice = body.get("tool_choice")
    forced = _forced_tool(tools, choice)
    if fmt is not None and forced is not None:
        raise _bad(
            "Send either response_format or a forced tool call, not both.", "response_format"
        )
    if forced is not None:
        params = forced.get("parameters")
        if params is None:
            raise _bad(
                f"tool {forced.get('name')!r} has no parameters schema: nothing to decide.",
                "tools",
            )
        desc = forced.get("description")
        if isinstance(params, dict) and isinstance(desc, str) and "description" not in params:
            params = {**params, "description": desc}  # the tool's description is the task
        return params, str(forced["name"]), str(forced["name"])
    if fmt is None:
        raise _bad(HOW_TO_ASK, "response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind != "json_schema":
        raise _bad(
            f"response_format type {kind!r} is not a structured decision. " + HOW_TO_ASK,
            "response_format",
        )
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise _bad(
            "response_format.json_schema must be an object with a 'schema' object (and a 'name').",
            "response_format.json_schema",
        )
    return spec["schema"], spec.get("name"), None


def _forced_tool(tools: Any, choice: Any) -> dict[str, Any] | None:
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise _bad("tool_choice forces a tool, but tools is empty.", "tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise _bad(f"tools must be a non-empty array; got {_json_type(tools)}.", "tools")
    fns = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name', "
                "'parameters'}}}.",
                f"tools[{i}]",
            )
        fns.append(fn)
    names = [f["name"] for f in fns]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if choice.get("type") != "function" or name not in names:
            raise _bad(
                f"tool_choice names {name!r}, which is not in tools; tools: {names}.",
                "tool_choice",
            )
        return fns[names.index(name)]
    if choice == "required":
        if len(fns) != 1:
            raise _bad(
                f"tool_choice='required' with {len(fns)} tools: name the one to call with "
                "tool_choice={'type': 'function', 'function': {'name': ...}}.",
                "tool_choice",
            )
        return fns[0]
    raise _bad(
        f"tool_choice={choice!r} leaves the model free to chat. " + HOW_TO_ASK, "tool_choice"
    )


def _compile(raw: Any, name: str | None, max_questions: int) -> Schema:
    from ..errors import InvalidJsonSchemaError, SchemaTooLargeError, UnsupportedSchemaKeywordError
    from ..schema.json_schema import compile_json_schema

    try:
        return compile_json_schema(raw, name=name, max_fields=max_questions)
    except SchemaTooLargeError as e:
        raise ApiError(413, "too_many_questions", str(e), field="schema") from e
    except UnsupportedSchemaKeywordError as e:
        raise ApiError(422, "unsupported_schema", str(e), field=e.path or "schema") from e
    except InvalidJsonSchemaError as e:
        raise ApiError(422, "invalid_schema", str(e), field=e.path or "schema") from e
    except SchemaError as e:
        raise ApiError(422, "invalid_schema", str(e), field="schema") from e


def _pcd_options(raw: Any) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict) or set(raw) - set(PCD_KEYS):
        raise _bad(f"pcd must be an object with keys from {list(PCD_KEYS)}; got {raw!r}.", "pcd")
    try:
        orders = check_orders(raw.get("orders", 1))
    except InvalidArgumentError as e:
        raise _bad(str(e), "pcd.orders") from e
    if orders > MAX_ORDERS:
        raise _bad(
            f"pcd.orders={orders} is over this server's limit of {MAX_ORDERS}.", "pcd.orders"
        )
    scoring = raw.get("scoring", "auto")
    if scoring not in SCORINGS:
        raise _bad(f"pcd.scoring must be one of {list(SCORINGS)}; got {scoring!r}.", "pcd.scoring")
    allow_empty = raw.get("allow_empty", False)
    if not isinstance(allow_empty, bool):
        raise _bad("pcd.allow_empty must be true or false.", "pcd.allow_empty")
    calibration = raw.get("calibration")
    if calibration is not None and calibration not in CALIBRATIONS:
        raise _bad(
            f"pcd.calibration must be one of {list(CALIBRATIONS)}; got {calibration!r}.",
            "pcd.calibration",
        )
    try:
        pruning = check_pruning(raw.get("pruning", "auto"), orders, scoring)
    except InvalidArgumentError as e:
        raise _bad(str(e), "pcd.pruning") from e
    return {
        "orders": orders,
        "scoring": scoring,
        "allow_empty": allow_empty,
        "calibration": calibration,
        "examples": raw.get("examples"),
        "pruning": pruning,
    }


_OPEN = "\x00PCD_TURNS_OPEN\x00"
_CLOSE = "\x00PCD_TURNS_CLOSE\x00"


def conversation_context(
    tokenizer: TextTokenizer, schema: Schema, turns: list[dict[str, str]]
) -> str:
    """The conversation as the context text of a PCD prompt.

    PCD's prompt is `[schema part][context][answer start]`, with the schema part as a
    system turn and the context as one user turn. One user message is that context as
    is, so the prompt equals `Decider.decide(schema, text)`'s. A longer conversation is
    rendered with the model's chat template: the context is then the text between the
    schema part and the answer, template tokens included, so the model sees every turn
    as its template writes it, and the schema part stays a cached prefix. A conversation
    that does not start with a user turn and end with a user or tool turn (or a model
    without a chat template) falls back to a plain transcript in one user turn:
    `user: ...`, `assistant: ...` lines.

    Args:
        tokenizer: The served model's tokenizer.
        schema: The schema the prompt is built for.
        turns: The non-system messages, `{"role", "content"}` with text content.
    """
    if not turns:
        return ""
    if len(turns) == 1 and turns[0]["role"] == "user":
        return turns[0]["content"]
    if turns[0]["role"] == "user" and turns[-1]["role"] in ("user", "tool"):
        parts = build_prompt(tokenizer, schema)
        marked = [dict(t) for t in turns]
        marked[0]["content"] = _OPEN + marked[0]["content"]
        marked[-1]["content"] = marked[-1]["content"] + _CLOSE
        messages = [{"role": "system", "content": render_system(schema)}, *marked]
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except Exception:  # a template that rejects a role: use the transcript
            text = None
        if text and text.count(_OPEN) == 1 and text.count(_CLOSE) == 1:
            before, rest = text.split(_OPEN)
            middle, after = rest.split(_CLOSE)
            if before == parts.head and after + "{" == parts.tail:
                return middle
    return "\n\n".join(f"{t['role']}: {t['content']}" for t in turns)
