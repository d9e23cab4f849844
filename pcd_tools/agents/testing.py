"""Offline test doubles: a LangChain chat model whose structured output you script.

LangChain's `GenericFakeChatModel` has no `with_structured_output`, so it cannot stand in
for a `ChatModelStage`. `FakeStructuredChatModel` can: it answers each
`with_structured_output(schema)` call with the next scripted answer (or a callable's),
validated against the schema it was asked for, and it can be told to raise, to test
`Cascade(..., on_stage_error=...)`. Nothing touches the network.

    from pcd_tools.agents.testing import FakeStructuredChatModel

    fake = FakeStructuredChatModel(responses=[{"topic": "login"}])
    Cascade(Ticket, stages=[decider, fake]).invoke("I cannot log in")
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from pydantic import BaseModel, Field, PrivateAttr, TypeAdapter

__all__ = ["FakeStructuredChatModel"]

Script = Callable[[list[BaseMessage], Any], Any]


class FakeStructuredChatModel(BaseChatModel):
    """A chat model for tests whose `with_structured_output` returns scripted answers.

    An answer is a mapping of field -> value, a Pydantic model instance, or an exception
    (raised when its turn comes). It is validated against the schema passed to
    `with_structured_output` (a Pydantic model, a `TypedDict` or a JSON-schema dict), so
    an answer outside a cascade's narrowed candidates fails as a real provider's would.

    Args:
        responses: Answers returned in turn, one per call; or a callable
            `(messages, schema) -> answer`. Default: the first allowed value of each field,
            which in a cascade is the most probable candidate so far.
        error: If set, every call raises it (e.g. a bad API key).
        model_name: The name a `ChatModelStage` reports.

    Attributes:
        calls: `(schema, messages)` for every call, in order (`schema` is None for a
            plain `invoke`, which replies with the next answer as JSON text).

    Raises:
        IndexError: on a call after the scripted answers ran out.
    """

    responses: Sequence[Any] | Script | None = None
    error: BaseException | None = None
    model_name: str = "fake-structured-chat-model"
    calls: list[tuple[Any, list[BaseMessage]]] = Field(default_factory=list)
    _turn: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "fake-structured-chat-model"

    def _next(self, messages: list[BaseMessage], schema: Any) -> Any:
        self.calls.append((schema, messages))
        if self.error is not None:
            raise self.error
        if self.responses is None:
            out: Any = _first_allowed(schema) if schema is not None else {}
        elif callable(self.responses):
            out = self.responses(messages, schema)
        else:
            if self._turn >= len(self.responses):
                raise IndexError(
                    f"{type(self).__name__} ran out of answers: call {self._turn + 1}, "
                    f"{len(self.responses)} scripted answers."
                )
            out = self.responses[self._turn]
            self._turn += 1
        if isinstance(out, BaseException):
            raise out
        return out

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        text = json.dumps(_as_data(self._next(messages, None)))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])

    def with_structured_output(
        self, schema: Any, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[Any, Any]:
        """A runnable that answers `schema` with the next scripted answer.

        Args:
            schema: A Pydantic model, a `TypedDict` or a JSON-schema dict.
            include_raw: Return `{"raw", "parsed", "parsing_error"}` as LangChain does;
                a validation error is then reported in `parsing_error`, not raised.
            **kwargs: Accepted and ignored (`method`, `strict`, ...).

        Returns:
            A runnable from a string, messages or a prompt value to the validated answer.
        """

        def run(value: Any) -> Any:
            messages = self._convert_input(value).to_messages()
            data = _as_data(self._next(messages, schema))
            try:
                parsed, error = _validate(schema, data), None
            except ValueError as exc:
                if not include_raw:
                    raise
                parsed, error = None, exc
            if not include_raw:
                return parsed
            raw = AIMessage(json.dumps(data, default=str))
            return {"raw": raw, "parsed": parsed, "parsing_error": error}

        return RunnableLambda(run, name=f"{self.model_name}.with_structured_output")


def _as_data(answer: Any) -> Any:
    return answer.model_dump(mode="json") if isinstance(answer, BaseModel) else answer


def _json_schema(schema: Any) -> dict[str, Any]:
    if isinstance(schema, Mapping):
        return dict(schema.get("parameters", schema) if "properties" not in schema else schema)
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    return TypeAdapter(schema).json_schema()


def _validate(schema: Any, data: Any) -> Any:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_validate(data)
    if not isinstance(schema, Mapping):
        return TypeAdapter(schema).validate_python(data)
    js = _json_schema(schema)
    props = js.get("properties", {})
    if not isinstance(data, Mapping):
        raise ValueError(f"the answer is a {type(data).__name__}; expected an object.")
    for key in js.get("required", []):
        if key not in data:
            raise ValueError(f"the answer lacks the required field {key!r}.")
    for key, value in data.items():
        if props and key not in props:
            raise ValueError(f"the answer's field {key!r} is not in {sorted(props)}.")
        allowed = props.get(key, {}).get("enum")
        if allowed is not None and value not in allowed:
            raise ValueError(f"the answer's {key!r} is {value!r}; accepted: {allowed}.")
    return dict(data)


def _first_allowed(schema: Any) -> dict[str, Any]:
    """The first allowed value of each field that has a finite set of them."""
    js = _json_schema(schema)
    defs = js.get("$defs", {})

    def first(prop: dict[str, Any]) -> Any:
        if "$ref" in prop:
            return first(defs[prop["$ref"].rsplit("/", 1)[-1]])
        if "enum" in prop:
            return prop["enum"][0]
        if "const" in prop:
            return prop["const"]
        if prop.get("type") == "boolean":
            return True
        for option in prop.get("anyOf", []):
            if option.get("type") != "null":
                return first(option)
        if "default" in prop:
            return prop["default"]
        raise ValueError(
            f"no default answer for {prop}: give FakeStructuredChatModel(responses=...)."
        )

    return {name: first(prop) for name, prop in js.get("properties", {}).items()}
