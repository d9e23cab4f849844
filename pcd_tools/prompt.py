"""Prompt text: the schema-only prefix, the context, and the per-field JSON suffixes.

Layout (see DESIGN §2)::

    [system: instructions + every field, its description and allowed values]  <- cached
    [user: the context]
    [assistant: "{"]
    per field, scored in parallel:  '\\n  "name": ' + <candidate JSON literal> + terminator

The prompt is tokenized in three pieces (schema part, context, tail) that meet at chat
special tokens, so the cached schema part is a token prefix of every request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .schema import FieldSpec, Schema

__all__ = ["PromptParts", "TextTokenizer", "build_prompt", "field_suffix", "render_system"]

DEFAULT_INSTRUCTIONS = "Classify the user's message."
_SENTINEL = "\x00PCD_CONTEXT\x00"


class TextTokenizer(Protocol):
    """What the engine needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str | None: ...


def _describe_choices(f: FieldSpec, order: Sequence[int] | None) -> str:
    idx = list(order) if order is not None else range(len(f.choices))
    parts = []
    for i in idx:
        c = f.choices[i]
        parts.append(f"{c.literal} ({c.description})" if c.description else c.literal)
    return ", ".join(parts)


def render_system(schema: Schema, choice_order: Mapping[str, Sequence[int]] | None = None) -> str:
    """The system message: task instructions and every field with its allowed values.

    Args:
        schema: The compiled schema.
        choice_order: Optional per-field order (indices into `choices`) in which allowed
            values are listed; used to measure and average out order bias.
    """
    lines = [schema.instructions.strip() or DEFAULT_INSTRUCTIONS, ""]
    lines.append(
        "Read the user's message and answer with a JSON object that has exactly these keys. "
        "For each key, the value must be one of its allowed values."
    )
    lines.append("")
    for f in schema.fields:
        desc = f.description.strip() or f.name.replace("_", " ")
        lines.append(f'"{f.name}": {desc}')
        order = choice_order.get(f.name) if choice_order else None
        lines.append(f"  allowed values: {_describe_choices(f, order)}")
    return "\n".join(lines)


@dataclass(frozen=True)
class PromptParts:
    """The prompt as text pieces. `head` depends only on the schema and is cached.

    Args:
        head: Everything before the context (system turn, user turn header).
        tail: Everything after the context, ending with the opening `{` of the answer.
    """

    head: str
    tail: str


def build_prompt(
    tokenizer: TextTokenizer,
    schema: Schema,
    *,
    choice_order: Mapping[str, Sequence[int]] | None = None,
) -> PromptParts:
    """Renders the chat template around a sentinel context and splits it.

    Models without a chat template get a plain-text layout.
    """
    system = render_system(schema, choice_order)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": _SENTINEL}]
    rendered: str | None = None
    try:
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except Exception:  # a template that rejects system turns: fold it into the user turn
        merged = [{"role": "user", "content": system + "\n\n" + _SENTINEL}]
        try:
            rendered = tokenizer.apply_chat_template(merged, add_generation_prompt=True)
        except Exception:
            rendered = None
    if not rendered or rendered.count(_SENTINEL) != 1:
        rendered = f"{system}\n\nMessage:\n{_SENTINEL}\n\nJSON answer:\n"
    head, tail = rendered.split(_SENTINEL)
    return PromptParts(head=head, tail=tail + "{")


def field_suffix(f: FieldSpec) -> str:
    """The JSON text that precedes a field's value (it follows the prompt's `{`)."""
    return f'\n  "{f.name}": '


def candidate_text(f: FieldSpec, literal: str, terminator: str) -> str:
    """The full text scored for one candidate: suffix, JSON literal and terminator."""
    return field_suffix(f) + literal + terminator


def terminator_for(schema: Schema) -> str:
    """The text that closes a value: `,` when more keys follow, else the closing brace."""
    return "," if len(schema.fields) > 1 else "\n}"


def describe(schema: Schema) -> dict[str, Any]:
    """A small summary used in telemetry and debugging."""
    return {"fields": len(schema.fields), "fingerprint": schema.fingerprint()}
