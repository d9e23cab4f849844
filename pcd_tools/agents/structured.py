"""`decider.with_structured_output(Schema)`: a drop-in for a chat model's structured runnable.

It accepts what a chat model accepts (a string, a list of messages or `(role, text)`
tuples, a `PromptValue`) and returns the schema's model instance. System messages become
the task instructions (they sit in the cached system turn); the other messages are the
context. With `include_raw=True` the output is `{"raw": AIMessage, "parsed": ...,
"parsing_error": None}` and `raw.response_metadata["distributions"]` holds every scored
field's full distribution.

A model with generated fields (`reason: str`, `amount: float`, ...) works too: they are
decoded under their grammar in declaration order on the same cache (a `reason` declared
before a `Literal` route is written before the route is scored), their probability is
None, and `usage_metadata["output_tokens"]` counts their tokens.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from ..decide.checks import check_max_new_tokens
from ..decide.orders import check_orders
from ..decide.worker import call_model, run_on_worker
from ..errors import InvalidArgumentError
from ..schema import Schema, compile_schema
from .threshold import check_threshold

__all__ = ["decision_message", "structured_runnable", "to_context"]

_ROLE = {"human": "User", "ai": "Assistant", "tool": "Tool", "function": "Tool"}


def _message_text(msg: Any) -> str:
    text = msg.text
    return text if isinstance(text, str) else str(text)


def _messages_context(messages: Sequence[Any]) -> tuple[str, str]:
    system = [_message_text(m) for m in messages if m.type == "system"]
    rest = [m for m in messages if m.type != "system"]
    if len(rest) == 1:
        ctx = _message_text(rest[0])
    else:
        ctx = "\n".join(f"{_ROLE.get(m.type, m.type.title())}: {_message_text(m)}" for m in rest)
    return ctx, "\n\n".join(s for s in system if s.strip())


def _jsonable(value: Any) -> Any:
    from langchain_core.messages import BaseMessage

    if isinstance(value, BaseMessage):
        return {"role": value.type, "content": _message_text(value)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def to_context(value: Any, *, input_key: str | None = None) -> tuple[str, str]:
    """Turns LangChain-style input into `(context, system_instructions)`.

    Args:
        value: A string, a message, a list of messages (or `(role, text)` tuples), a
            `PromptValue`, a LangChain decision `State`, or a mapping.
        input_key: For a mapping, the key whose value is the context (then `"messages"`);
            otherwise the whole mapping is serialised as JSON.

    Returns:
        The text to decide on and the text of any system messages ("" if none).
    """
    from langchain_core.messages import BaseMessage, convert_to_messages
    from langchain_core.prompt_values import PromptValue

    if isinstance(value, str):
        return value, ""
    if isinstance(value, PromptValue):
        return _messages_context(value.to_messages())
    if isinstance(value, BaseMessage):
        return _messages_context([value])
    if isinstance(value, Mapping):
        for key in (input_key, "messages"):
            if key is not None and key in value:
                return to_context(value[key])
        return json.dumps(_jsonable(value), ensure_ascii=False, default=str), ""
    if isinstance(value, Sequence):
        try:
            return _messages_context(convert_to_messages(value))
        except (ValueError, TypeError, NotImplementedError):
            return json.dumps(_jsonable(value), ensure_ascii=False, default=str), ""
    raise InvalidArgumentError(
        f"cannot decide on input of type {type(value).__name__}; accepted: str, messages, "
        "a PromptValue or a mapping with the text under its input key."
    )


def with_instructions(schema: Schema, system: str) -> Schema:
    """`schema` with the caller's system text prepended to its task instructions."""
    if not system.strip():
        return schema
    text = system.strip() + ("\n\n" + schema.instructions if schema.instructions else "")
    return dataclasses.replace(schema, instructions=text)


def decision_message(decision: Any, schema: Schema) -> Any:
    """An `AIMessage` like a chat model's tool-calling reply, carrying the distributions."""
    from langchain_core.messages import AIMessage

    labels = {n: f.label for n, f in decision.fields.items()}
    generated = sum(f.tokens or 0 for f in decision.fields.values())
    meta = {
        "model_name": decision.model_id,
        "model_provider": "pcd_tools",
        "distributions": {
            n: dict(f.distribution) for n, f in decision.fields.items() if not f.generated
        },
        "probabilities": {n: f.probability for n, f in decision.fields.items()},
        "confidence": decision.confidence,
        "pcd": decision.to_response(),
    }
    if decision.orders > 1:
        meta["flip_rate"] = decision.flip_rate
    return AIMessage(
        content=json.dumps(labels, ensure_ascii=False, separators=(",", ":")),
        tool_calls=[{"name": schema.name, "args": labels, "id": f"pcd_{uuid.uuid4().hex[:12]}"}],
        response_metadata=meta,
        usage_metadata={
            "input_tokens": decision.prompt_tokens,
            "output_tokens": generated,
            "total_tokens": decision.prompt_tokens + generated,
        },
    )


def structured_runnable(decider: Any, schema: Any, include_raw: bool = False, **kwargs: Any) -> Any:
    """The Runnable behind `Decider.with_structured_output`.

    Args:
        decider: The `Decider` that scores.
        schema: A Pydantic model (parsed output: its instance) or any other schema form
            (parsed output: a dict of JSON values, as chat models return for dict schemas).
        include_raw: Return `{"raw": AIMessage, "parsed": ..., "parsing_error": None}`.
        **kwargs: `temperature`, `scoring`, `orders` (average over k listing orders, as
            `Decider.decide`; `raw.response_metadata["flip_rate"]` then reports the
            flips), `examples` and `calibration` (few-shot examples held in the cached
            prefix, and `"contextual"`, as `Decider.decide`), `max_new_tokens` (the token
            limit of generated fields, as `Decider.decide`), `threshold` (raise
            `LowConfidenceError` when the confidence of the scored fields is below it, for
            `with_fallbacks`), and `use_system_messages` (default True: system messages
            become instructions).

    Returns:
        A `Runnable[LanguageModelInput, BaseModel | dict]` with `invoke` and `ainvoke`.

    Raises:
        InvalidArgumentError: for an unknown option or a bad `orders`.
    """
    from langchain_core.runnables import RunnableLambda

    compiled = compile_schema(schema)
    as_model = isinstance(schema, type) and issubclass(schema, BaseModel)
    known = {
        "calibration",
        "examples",
        "max_new_tokens",
        "temperature",
        "scoring",
        "orders",
        "threshold",
        "use_system_messages",
    }
    unknown = set(kwargs) - known
    if unknown:
        raise InvalidArgumentError(
            f"with_structured_output got unknown option(s) {sorted(unknown)}; accepted: "
            f"include_raw, {', '.join(sorted(known))}."
        )
    if "orders" in kwargs:
        check_orders(kwargs["orders"])
    if "max_new_tokens" in kwargs:  # checked now, not at the first call
        check_max_new_tokens(kwargs["max_new_tokens"])
    if "examples" in kwargs:  # checked now, not at the first call
        from ..schema.examples import with_examples

        compiled = with_examples(compiled, kwargs["examples"], "with_structured_output(examples=)")
    opts = ("temperature", "scoring", "orders", "calibration", "max_new_tokens")
    decide_kw = {k: kwargs[k] for k in opts if k in kwargs}
    threshold = kwargs.get("threshold")
    if threshold is not None:  # checked now, not at the first call
        threshold = check_threshold(threshold, "with_structured_output(threshold=)")
    use_system = kwargs.get("use_system_messages", True)

    def run(value: Any) -> Any:
        from .errors import LowConfidenceError

        context, system = to_context(value)
        target = with_instructions(compiled, system) if use_system else compiled
        decision = call_model(decider, decider.decide, target, context, **decide_kw)
        confidence = decision.confidence  # None when every field is generated
        if threshold is not None and confidence is not None and confidence < threshold:
            raise LowConfidenceError(decision, threshold=threshold)
        parsed = decision.value if as_model else {n: f.label for n, f in decision.fields.items()}
        if not include_raw:
            return parsed
        return {
            "raw": decision_message(decision, compiled),
            "parsed": parsed,
            "parsing_error": None,
        }

    async def arun(value: Any) -> Any:
        return await run_on_worker(decider, run, value)

    return RunnableLambda(run, afunc=arun, name=f"PCDStructuredOutput[{compiled.name}]")
