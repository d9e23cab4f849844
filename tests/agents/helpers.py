"""Helpers for the agents tests: logit-biased tiny deciders and a structured fake chat model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableLambda
from pydantic import BaseModel, Field

from tests.conftest import ByteTokenizer, make_tiny_model


def biased_decider(bias: dict[int, float], seed: int = 0, context_window: int = 8192):
    """A tiny decider whose lm_head bias forces the bytes in `bias`."""
    from pcd_tools.decide.decider import Decider
    from pcd_tools.engine.load.sources import LoadedModel

    loaded = LoadedModel(
        model=make_tiny_model(seed, bias=bias),
        tokenizer=ByteTokenizer(),
        model_id=f"tiny-biased-{seed}",
        source="test",
        path="",
        model_type="llama",
        context_window=context_window,
        dtype="float32",
        device="cpu",
    )
    return Decider(loaded)


def forcing(letter: str, logit: float = 400.0) -> dict[int, float]:
    """A bias for `letter` (byte tokenizer).

    Every other byte then costs about `logit` nats, so among candidates of equal length
    with disjoint letters, the one starting with `letter` wins by about `logit` nats.
    """
    return {ord(letter): logit}


class StructuredFakeChatModel(BaseChatModel):
    """A chat model that answers `with_structured_output(schema)` from a rule.

    It records every schema and message list it received, so tests can assert what a
    cascade escalated. `answer(schema, messages)` returns a dict of field -> value; the
    default picks the last allowed value of each `Literal`.
    """

    received: list[tuple[type[BaseModel], list[BaseMessage]]] = Field(default_factory=list)
    fail: bool = False
    model_name: str = "fake-big-model"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, **kw: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage("ok"))])

    @property
    def _llm_type(self) -> str:
        return "structured-fake"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def with_structured_output(self, schema: Any, *, include_raw: bool = False, **kw: Any) -> Any:
        def run(messages: Any) -> Any:
            msgs = list(messages) if isinstance(messages, list) else messages.to_messages()
            self.received.append((schema, msgs))
            if self.fail:
                raise RuntimeError("provider unavailable")
            values = {}
            for name, info in schema.model_fields.items():
                allowed = _allowed(info.annotation)
                values[name] = allowed[-1]
            return schema.model_validate(values)

        return RunnableLambda(run)


def _allowed(tp: Any) -> list[Any]:
    import typing

    if tp is bool:
        return [True, False]
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Literal:
        return list(args)
    out: list[Any] = []
    for a in args:
        out.extend([None] if a is type(None) else _allowed(a))
    return out
