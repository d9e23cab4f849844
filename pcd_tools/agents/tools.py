"""`DecisionTool`: a LangChain tool that decides a schema for the text it is given.

The tool answers in LangChain's `content_and_artifact` format:

- content (what the calling LLM reads): compact JSON
  `{"values": {...}, "probabilities": {...}, "low_confidence": [...]}`, plus
  `"flip_rate"` when the tool averages over `orders > 1` listing orders;
- artifact (what the program reads, on `ToolMessage.artifact`): the full `Decision`.

`ainvoke` never blocks the event loop: it queues on the engine's single worker thread.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from langchain_core.tools import BaseTool, ToolException
from pydantic import BaseModel, ConfigDict, Field

from ..decide.checks import check_max_new_tokens
from ..decide.generated import check_hybrid_options
from ..decide.orders import check_orders
from ..decide.worker import call_model, run_on_worker
from ..errors import InvalidArgumentError, PcdToolsError, SchemaError
from ..schema import Schema, compile_schema
from .threshold import check_threshold

__all__ = ["DecisionTool", "TextInput"]


class TextInput(BaseModel):
    """Input of a `DecisionTool`: the text to classify."""

    text: str = Field(description="The text to classify, verbatim.")


def _snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return re.sub(r"[^a-zA-Z0-9_]", "_", s).strip("_").lower() or "decision"


def _describe(schema: Schema) -> str:
    head = schema.instructions.strip() or f"Classify a text into {schema.name}."
    parts = [
        f"{f.name} ({_GENERATED[f.generation.type]}, generated)"
        if f.generation is not None
        else f"{f.name} ({', '.join(json.dumps(c.label) for c in f.choices)})"
        for f in schema.fields
    ]
    per = "scored field" if schema.hybrid else "field"
    return f"{head} Returns {'; '.join(parts)}, with a probability per {per}."


_GENERATED = {
    "string": "text",
    "number": "a number",
    "integer": "an integer",
    "string_list": "a list of texts",
    "date": "an ISO date",
    "datetime": "an ISO date-time",
}


class DecisionTool(BaseTool):
    """Decides a schema for a text, with probabilities, as a LangChain tool.

    Build one with `decider.as_tool(Schema)` or `DecisionTool.from_decider(...)`.

    Args:
        decider: The `Decider` that scores.
        schema: The decision schema (any form `compile_schema` accepts).
        threshold: Fields whose probability is below it are listed as `low_confidence`.
        temperature: Softmax temperature (> 0).
        orders: Average each field's distribution over this many listing orders
            (`Decider.decide(..., orders=k)`); the content then reports `flip_rate`.
        max_new_tokens: The token limit of each generated field that sets none itself
            (None: 256); a field that reaches it is a tool error carrying its partial text.
        format_input: Turns the tool arguments into the context; default: the `text`
            argument, the only argument, or the arguments as JSON.
        args_schema: Input model; default `TextInput` (`{"text": str}`).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    decider: Any = Field(exclude=True)
    schema_: Any = Field(alias="schema", exclude=True)
    threshold: float = 0.8
    temperature: float = 1.0
    orders: int = 1
    max_new_tokens: int | None = None
    format_input: Callable[[dict[str, Any]], str] | None = Field(default=None, exclude=True)
    response_format: str = "content_and_artifact"  # type: ignore[assignment]
    args_schema: Any = TextInput

    def __init__(self, **kwargs: Any):
        """Checks the options first, so a bad value raises `InvalidArgumentError` here.

        Raises:
            InvalidArgumentError: unless `threshold` is a probability in [0, 1],
                `orders` an int >= 1 (1 with generated fields) and `max_new_tokens` None
                or an int >= 1.
        """
        check_threshold(kwargs.get("threshold", 0.8), "DecisionTool(threshold=)")
        orders = check_orders(kwargs.get("orders", 1))
        check_max_new_tokens(kwargs.get("max_new_tokens"))
        schema = kwargs.get("schema", kwargs.get("schema_"))
        if orders > 1 and schema is not None:  # refuses orders > 1 with generated fields
            compiled = compile_schema(schema)
            if compiled.hybrid:
                check_hybrid_options(compiled, orders=orders)
        super().__init__(**kwargs)

    @classmethod
    def from_decider(
        cls,
        decider: Any,
        schema: Any,
        name: str | None = None,
        description: str | None = None,
        **kwargs: Any,
    ) -> DecisionTool:
        """A tool deciding `schema` on `decider`.

        Args:
            decider: The `Decider`.
            schema: The decision schema.
            name: Tool name; default `classify_<schema_name>`.
            description: Tool description; default: the schema's instructions and fields.
            **kwargs: Other fields (`threshold`, `temperature`, `orders`, `args_schema`, ...).

        Raises:
            SchemaError: if the schema cannot be scored.
            InvalidArgumentError: for a bad `orders`.
        """
        compiled = compile_schema(schema)
        return cls(
            decider=decider,
            schema=compiled,
            name=name or f"classify_{_snake(compiled.name)}",
            description=description or _describe(compiled),
            **kwargs,
        )

    @property
    def compiled(self) -> Schema:
        """The compiled schema."""
        return compile_schema(self.schema_)

    def _context(self, kwargs: dict[str, Any]) -> str:
        if self.format_input is not None:
            return self.format_input(kwargs)
        if isinstance(kwargs.get("text"), str):
            return kwargs["text"]
        if len(kwargs) == 1 and isinstance(next(iter(kwargs.values())), str):
            return next(iter(kwargs.values()))
        return json.dumps(kwargs, ensure_ascii=False, default=str, sort_keys=True)

    def _decide(self, kwargs: dict[str, Any]) -> tuple[str, Any]:
        try:
            decision = call_model(
                self.decider,
                self.decider.decide,
                self.compiled,
                self._context(kwargs),
                temperature=self.temperature,
                orders=self.orders,
                **({} if self.max_new_tokens is None else {"max_new_tokens": self.max_new_tokens}),
            )
        except SchemaError:
            raise  # a programming error, not something the calling model can fix
        except (PcdToolsError, ValueError, TypeError) as exc:
            raise ToolException(f"{type(exc).__name__}: {exc}") from exc
        content = {
            "values": {n: f.label for n, f in decision.fields.items()},
            "probabilities": {
                n: None if f.probability is None else round(f.probability, 4)
                for n, f in decision.fields.items()
            },
            "low_confidence": decision.low_confidence(self.threshold),
        }
        if self.orders > 1:
            flips = decision.flip_rate
            content["flip_rate"] = None if flips is None else round(flips, 4)
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")), decision

    def _run(self, *args: Any, run_manager: Any = None, **kwargs: Any) -> tuple[str, Any]:
        if args:
            raise InvalidArgumentError(
                f"{self.name} takes keyword arguments only; got {len(args)} positional."
            )
        return self._decide(kwargs)

    async def _arun(self, *args: Any, run_manager: Any = None, **kwargs: Any) -> tuple[str, Any]:
        if args:
            raise InvalidArgumentError(
                f"{self.name} takes keyword arguments only; got {len(args)} positional."
            )
        return await run_on_worker(self.decider, self._decide, kwargs)
