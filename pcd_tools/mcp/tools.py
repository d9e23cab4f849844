"""The MCP tools: one per schema and its batch form (the generic ones: `generic`).

Each tool is a plain async function whose signature the SDK reads: the arguments become
the `inputSchema`, and the return annotation `Annotated[CallToolResult, OutputModel]`
gives the `outputSchema` while the function builds the result itself (structured content
plus one text block). Nothing here depends on the SDK's major version beyond `_sdk`.

Bad input (an empty or too-long text, labels out of range, a context over the model's
window) raises `ToolInputError`; the SDK turns it into a result with `isError: true`
carrying the message, and the server goes on serving.
"""

import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..answers.payload import decision_payload
from ..errors import PcdToolsError
from ..schema import Schema
from ._sdk import CallToolResult, Context, TextContent, ToolAnnotations, ToolError

__all__ = [
    "MAX_BATCH_TEXTS",
    "MAX_TEXT_CHARS",
    "ToolInputError",
    "ToolSpec",
    "schema_tools",
    "tool_name",
]

log = logging.getLogger("pcd_tools.mcp")

MAX_TEXT_CHARS = 200_000  # a guard before tokenizing; the model's window is the real limit
MAX_BATCH_TEXTS = 256
MIN_LABELS = 2
READ_ONLY = ToolAnnotations(readOnlyHint=True, idempotentHint=True, destructiveHint=False)


class ToolInputError(PcdToolsError, ToolError, ValueError):
    """A tool call the server cannot answer: its message goes back as the tool's error
    (the SDK's `ToolError`, which it reports with `isError: true` and its message)."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the server registers it (`server.add_tool(fn, name, description, ...)`)."""

    name: str
    description: str
    fn: Callable[..., Awaitable[Any]]
    title: str


@dataclass(frozen=True)
class Limits:
    """What one call may send: characters per text, texts per batch call."""

    max_text_chars: int = MAX_TEXT_CHARS
    max_batch_texts: int = MAX_BATCH_TEXTS


def tool_name(schema: Schema) -> str:
    """The schema's model name in snake_case: `ListingReview` -> `listing_review`."""
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", schema.name)
    return re.sub(r"[^a-zA-Z0-9_]", "_", s).strip("_").lower() or "decision"


# --- output models ---------------------------------------------------------------------


class SearchOut(BaseModel):
    """What a pruned search read."""

    model_config = ConfigDict(extra="forbid")

    read: int = Field(description="Trie positions whose logits were read.")
    positions: int = Field(description="The field's trie positions in all.")
    levels: int = Field(description="Levels the search ran after its first pass.")
    fallback: bool = Field(
        description="Whether it ran out of levels uncertified and read the whole trie."
    )


class PathOut(BaseModel):
    """One level of a taxonomy answer."""

    model_config = ConfigDict(extra="forbid")

    value: Any = Field(description="The label at this level.")
    probability: float = Field(description="Its probability given the levels above.")


class FieldAnswer(BaseModel):
    """One field's answer."""

    model_config = ConfigDict(extra="forbid")

    value: Any = Field(description="The answer as JSON (a generated field's text or number).")
    probability: float | None = Field(
        description="The answer's probability; null for a generated (free-text) field."
    )
    distribution: dict[str, float] = Field(
        description="Every allowed value's probability, keyed by its JSON text (a multi-label "
        "field: each label's probability of applying; a field of more than 255 values: its "
        "20 most probable); empty for a generated field."
    )
    candidates: int | None = Field(
        default=None, description="For a field of more than 255 values: how many it has."
    )
    certified: bool | None = Field(
        default=None,
        description="For a field read by certified pruned search: whether the answer is "
        "provably the most probable value.",
    )
    certified_top: int | None = Field(
        default=None,
        description="For a field read by pruned search: how many of its most probable "
        "values are certified, in order.",
    )
    search: SearchOut | None = Field(
        default=None, description="For a field read by pruned search: what it read."
    )
    path: list[PathOut] | None = Field(
        default=None,
        description="For a taxonomy: the answer's path from the top level, each level with "
        "its probability given the levels above (they multiply to the answer's).",
    )


def _python_name(name: str, i: int) -> str:
    safe = re.sub(r"\W", "_", name)
    return safe if safe.isidentifier() and not safe.startswith("_") else f"f{i}_{safe}"


@lru_cache(maxsize=128)
def output_model(schema: Schema) -> type[BaseModel]:
    """`{"value", "confidence", "fields", "action"}` for `schema`, as a Pydantic model."""
    fields_model = create_model(  # type: ignore[call-overload]
        f"{schema.name}Fields",
        __config__=ConfigDict(extra="forbid", populate_by_name=True),
        **{
            _python_name(f.name, i): (FieldAnswer, Field(alias=f.name))
            for i, f in enumerate(schema.fields)
        },
    )
    defs: dict[str, Any] = {
        "value": (schema.model, Field(description=f"The decided {schema.name}.")),
        "confidence": (
            float | None,
            Field(description="The lowest probability over the scored fields."),
        ),
        "fields": (fields_model, Field(description="Each field's answer and distribution.")),
        "action": (
            Literal["act", "review"],
            Field(description="'review' when any scored field is below the threshold."),
        ),
    }
    model: type[BaseModel] = create_model(
        f"{schema.name}Result", __config__=ConfigDict(extra="forbid"), **defs
    )
    return model


@lru_cache(maxsize=128)
def batch_model(schema: Schema) -> type[BaseModel]:
    """`{"results": [one result per text, in order]}`."""
    item: Any = output_model(schema)
    defs: dict[str, Any] = {
        "results": (list[item], Field(description="One result per text, in order."))
    }
    model: type[BaseModel] = create_model(
        f"{schema.name}BatchResult", __config__=ConfigDict(extra="forbid"), **defs
    )
    return model


# --- descriptions ------------------------------------------------------------------------

_GENERATED = {
    "string": "generated text",
    "number": "a generated number",
    "integer": "a generated integer",
    "string_list": "a generated list of texts",
    "date": "a generated ISO date",
    "datetime": "a generated ISO date-time",
}


def describe(schema: Schema, threshold: float) -> str:
    """The tool description: the docstring, then one line per field."""
    head = schema.instructions.strip() or f"Decide {schema.name} for a text."
    lines = [head, "", "Fields:"]
    for f in schema.fields:
        if f.generation is not None:
            kind = _GENERATED.get(f.generation.type, "generated")
        else:
            shown = [json.dumps(c.label) for c in f.choices[:12]]
            noun = "labels" if f.kind == "multilabel" else "values"
            more = f" ... ({len(f.choices)} {noun})" if len(f.choices) > 12 else ""
            kind = ("any of " if f.kind == "multilabel" else "one of ") + ", ".join(shown) + more
        desc = f": {f.description}" if f.description else ""
        lines.append(f"- {f.name} ({kind}){desc}")
    lines += [
        "",
        "Returns value (the decided fields), confidence (the lowest field probability), each "
        "field's probability and distribution, and action: 'review' when a field's "
        f"probability is below {threshold:g}, else 'act'.",
    ]
    return "\n".join(lines)


# --- checks ------------------------------------------------------------------------------


def check_text(text: Any, limits: Limits, where: str = "text") -> str:
    """`text` if it is a non-empty string within the limit, else `ToolInputError`."""
    if not isinstance(text, str):
        raise ToolInputError(f"{where} must be a string; got {type(text).__name__}.")
    if not text.strip():
        raise ToolInputError(f"{where} is empty or only whitespace: there is nothing to decide on.")
    if len(text) > limits.max_text_chars:
        raise ToolInputError(
            f"{where} has {len(text):,} characters; this server accepts at most "
            f"{limits.max_text_chars:,} (pcd mcp --max-text-chars). Nothing was truncated: "
            "send a shorter text."
        )
    return text


def check_texts(texts: Any, limits: Limits) -> list[str]:
    """Each text checked; between 1 and `max_batch_texts` of them."""
    if not isinstance(texts, list) or not texts:
        raise ToolInputError("texts must be a non-empty list of strings.")
    if len(texts) > limits.max_batch_texts:
        raise ToolInputError(
            f"texts has {len(texts)} items; this server accepts at most "
            f"{limits.max_batch_texts} per call (pcd mcp --max-batch). Split the list."
        )
    return [check_text(t, limits, f"texts[{i}]") for i, t in enumerate(texts)]


def _input_error(exc: Exception) -> ToolInputError:
    return ToolInputError(f"{type(exc).__name__}: {exc}")


# --- tools -------------------------------------------------------------------------------


def _result(payload: dict[str, Any], text: Any) -> Any:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(text, ensure_ascii=False))],
        structuredContent=payload,
        isError=False,
    )


def _annotate(
    fn: Callable[..., Any], name: str, params: list[inspect.Parameter], returns: Any
) -> None:
    """Gives `fn` the signature the SDK reads (arguments -> inputSchema, return ->
    outputSchema)."""
    fn.__name__ = fn.__qualname__ = name
    fn.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": returns}


def _param(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    """A keyword argument of a tool (optional when it has a `default`)."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


TextArg = Annotated[str, Field(description="The text to decide on, verbatim.")]
TextsArg = Annotated[
    list[str], Field(description="The texts to decide on, each verbatim; one result per text.")
]


async def _decide(decider: Any, schema: Any, text: str, kwargs: dict[str, Any]) -> Any:
    try:
        return await decider.adecide(schema, text, **kwargs)
    except (PcdToolsError, ValueError, TypeError) as exc:
        raise _input_error(exc) from exc


def schema_tools(
    decider: Any,
    schema: Schema,
    *,
    threshold: float,
    limits: Limits,
    decide_kwargs: dict[str, Any],
) -> list[ToolSpec]:
    """The tool of `schema` and its `_batch` form."""
    name = tool_name(schema)
    out, batch_out = output_model(schema), batch_model(schema)

    async def decide_one(**kwargs: Any) -> Any:
        text = check_text(kwargs.get("text"), limits)
        d = await _decide(decider, schema, text, decide_kwargs)
        payload = decision_payload(d, threshold)
        return _result(payload, payload["value"])

    async def decide_batch(**kwargs: Any) -> Any:
        texts = check_texts(kwargs.get("texts"), limits)
        ctx = kwargs.get("ctx")
        results = await decide_texts(decider, schema, texts, decide_kwargs, ctx)
        payloads = [decision_payload(d, threshold) for d in results]
        return _result({"results": payloads}, [p["value"] for p in payloads])

    _annotate(decide_one, name, [_param("text", TextArg)], Annotated[CallToolResult, out])
    _annotate(
        decide_batch,
        f"{name}_batch",
        [_param("texts", TextsArg), _param("ctx", Context)],
        Annotated[CallToolResult, batch_out],
    )
    desc = describe(schema, threshold)
    return [
        ToolSpec(name, desc, decide_one, schema.name),
        ToolSpec(
            f"{name}_batch",
            f"{desc}\n\nBatch form: decides every text of `texts` (at most "
            f"{limits.max_batch_texts}) and returns one result per text, in order; reports "
            "progress and can be cancelled.",
            decide_batch,
            f"{schema.name} (batch)",
        ),
    ]


async def decide_texts(
    decider: Any,
    schema: Any,
    texts: Sequence[str],
    decide_kwargs: dict[str, Any],
    ctx: Any,
) -> list[Any]:
    """Decides `texts` through the decider's queue (batched like any concurrent calls),
    reporting progress after each; cancelling the call cancels those not yet started."""

    async def progress(done: int, total: int) -> None:
        if ctx is not None:
            await ctx.report_progress(done, total, f"{done}/{total} decided")

    try:
        return list(
            await decider.adecide_many(schema, list(texts), progress=progress, **decide_kwargs)
        )
    except (PcdToolsError, ValueError, TypeError) as exc:
        raise _input_error(exc) from exc
