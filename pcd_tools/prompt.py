"""Prompt text: the schema-only prefix, the context, and the per-field JSON suffixes.

Layout (see DESIGN §2)::

    [system: instructions + every field, its description and allowed values]  <- cached
    [user: example input, assistant: its JSON answer] per few-shot example     <- cached
    [user: the context]
    [assistant: "{"]
    per field, scored in parallel:  '\\n  "name": ' + <candidate JSON literal> + terminator

The prompt is tokenized in three pieces (schema part, context, tail) that meet at chat
special tokens, so the cached schema part is a token prefix of every request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .schema import Example, FieldSpec, Schema

__all__ = [
    "PromptParts",
    "PromptPreview",
    "Question",
    "TextTokenizer",
    "build_prompt",
    "example_answer",
    "field_suffix",
    "questions",
    "render_system",
]

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
        desc = f.description.strip() or f.key.replace("_", " ")
        if f.branch is not None:
            kind, index = f.branch
            desc += f" (only when {kind!r} is {schema.field(kind).choices[index].literal})"
        lines.append(f'"{f.key}": {desc}')
        order = choice_order.get(f.name) if choice_order else None
        if f.kind == "multilabel":
            lines.append(
                "  an object with each of these labels as a key, and true or false for whether "
                f"it applies: {_describe_choices(f, order)}"
            )
        else:
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


@dataclass(frozen=True)
class PromptPreview:
    """What the model sees for one decision (`Decider.prompt`).

    Args:
        text: The prompt, decoded from the token ids the engine runs, up to and
            including the answer's opening `{`.
        token_ids: Those ids.
        schema_tokens: Tokens of the schema part (kept in the prefix cache across
            requests); a BOS token, if the model takes one, is counted here.
        context_tokens: Tokens of the context.
        answer_start_tokens: Tokens after the context, up to the answer's `{`.
        field_suffixes: Per field, the JSON text its pass continues the prompt with before
            the candidates are scored.
        examples: Few-shot examples in the schema part (earlier user/assistant turns).
    """

    text: str
    token_ids: tuple[int, ...]
    schema_tokens: int
    context_tokens: int
    answer_start_tokens: int
    field_suffixes: dict[str, str]
    examples: int = 0

    @property
    def token_count(self) -> int:
        """Prompt length in tokens (what counts against the model's window)."""
        return len(self.token_ids)

    def __str__(self) -> str:
        return self.text


def build_prompt(
    tokenizer: TextTokenizer,
    schema: Schema,
    *,
    choice_order: Mapping[str, Sequence[int]] | None = None,
) -> PromptParts:
    """Renders the chat template around a sentinel context and splits it.

    The schema's few-shot examples are earlier user/assistant turns between the system
    turn and the context's user turn, so they are part of the cached head. Models without
    a chat template get a plain-text layout, with each example as a message and its
    answer.
    """
    system = render_system(schema, choice_order)
    shots = [(e.input, example_answer(schema, e)) for e in schema.examples]
    turns = [
        {"role": role, "content": text}
        for user, answer in shots
        for role, text in (("user", user), ("assistant", answer))
    ]
    messages = [
        {"role": "system", "content": system},
        *turns,
        {"role": "user", "content": _SENTINEL},
    ]
    rendered: str | None = None
    try:
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except Exception:  # a template that rejects system turns: fold it into the first user turn
        merged = [*turns, {"role": "user", "content": _SENTINEL}]
        merged[0] = {"role": "user", "content": system + "\n\n" + merged[0]["content"]}
        try:
            rendered = tokenizer.apply_chat_template(merged, add_generation_prompt=True)
        except Exception:
            rendered = None
    if not rendered or rendered.count(_SENTINEL) != 1:
        shown = "".join(f"Message:\n{u}\n\nJSON answer:\n{a}\n\n" for u, a in shots)
        rendered = f"{system}\n\n{shown}Message:\n{_SENTINEL}\n\nJSON answer:\n"
    head, tail = rendered.split(_SENTINEL)
    return PromptParts(head=head, tail=tail + "{")


def example_answer(schema: Schema, example: Example) -> str:
    """An example's answer as the fields pass writes JSON: `{`, then per answered field
    its suffix (`\\n  "key": `) and value, joined by commas, then `\\n}`. A multi-label
    field is an object of every label with `true` or `false`."""
    parts = []
    for name, a in example.answers:
        f = schema.field(name)
        if isinstance(a, tuple):
            flags = ", ".join(
                f"{json.dumps(str(c.label), ensure_ascii=False)}: {'true' if i in a else 'false'}"
                for i, c in enumerate(f.choices)
            )
            parts.append(f"{field_suffix(f)}{{{flags}}}")
        else:
            parts.append(field_suffix(f) + f.choices[a].literal)
    return "{" + ",".join(parts) + "\n}"


def field_suffix(f: FieldSpec) -> str:
    """The JSON text that precedes a field's value (it follows the prompt's `{`)."""
    return f'\n  "{f.key}": '


def candidate_text(f: FieldSpec, literal: str, terminator: str) -> str:
    """The full text scored for one candidate: suffix, JSON literal and terminator."""
    return field_suffix(f) + literal + terminator


@dataclass(frozen=True)
class Question:
    """One scored unit of a fields pass: a field, or one label of a multi-label field,
    possibly after earlier answers written into the JSON.

    Args:
        field: The field's name.
        label: For one label of a multi-label field, its index in the field's choices;
            None for a whole field.
        texts: Per candidate, the full text scored: the earlier answers (if any), the
            JSON before the value, the candidate's literal and its terminator (for a
            label: `true` then `false`).
        given: The earlier answers written before it: (field, choice index) pairs.
        choices: The indices of the field's choices the texts stand for, when only some
            are allowed after `given` (`choices_by`); None for all of them.
    """

    field: str
    label: int | None
    texts: tuple[str, ...]
    given: tuple[tuple[str, int], ...] = ()
    choices: tuple[int, ...] | None = None

    @property
    def key(self) -> str:
        """A name for messages: the field, or `field[label index]`, and what it is given."""
        name = self.field if self.label is None else f"{self.field}[{self.label}]"
        return name + "".join(f"|{f}={i}" for f, i in self.given)


def label_suffix(f: FieldSpec, index: int) -> str:
    """The JSON text before one label's yes/no: the field's key opening an object."""
    return f"{field_suffix(f)}{{{json.dumps(str(f.choices[index].label), ensure_ascii=False)}: "


def answer_text(f: FieldSpec, index: int) -> str:
    """A written earlier answer: the field's key, the chosen value and a comma."""
    return f"{field_suffix(f)}{f.choices[index].literal},"


def field_questions(
    schema: Schema, f: FieldSpec, given: Sequence[tuple[str, int]] = ()
) -> list[Question]:
    """The questions of one field, after the earlier answers `given` (written in order)."""
    before = "".join(answer_text(schema.field(g), i) for g, i in given)
    given = tuple(given)
    if f.kind == "multilabel":
        out = []
        for i in range(len(f.choices)):
            stem = before + label_suffix(f, i)
            out.append(Question(f.name, i, (stem + "true,", stem + "false,"), given))
        return out
    term = terminator_for(schema)
    allowed: tuple[int, ...] | None = None
    if f.choices_by is not None:
        parent, table = f.choices_by
        hit = [i for g, i in given if g == parent]
        allowed = table[hit[0]] if hit else None
    idx = allowed if allowed is not None else range(len(f.choices))
    texts = tuple(before + candidate_text(f, f.choices[i].literal, term) for i in idx)
    return [Question(f.name, None, texts, given, allowed)]


# Characters of candidate text a `choices_by` child may take in the first pass (every
# parent value's candidates, each after the parent's answer); above it, a later wave.
JOINT_BUDGET = 24_000


def joint_parent(schema: Schema, f: FieldSpec) -> str | None:
    """The parent a `choices_by` field is scored jointly with in the first pass: when the
    parent depends on nothing, the child on nothing else, and the texts fit the budget."""
    if f.choices_by is None or f.depends_on != (f.choices_by[0],):
        return None
    parent = schema.field(f.choices_by[0])
    if parent.depends_on:
        return None
    size = sum(
        len(t)
        for i in range(len(parent.choices))
        for q in field_questions(schema, f, [(parent.name, i)])
        for t in q.texts
    )
    return parent.name if size <= JOINT_BUDGET else None


def questions(schema: Schema) -> list[Question]:
    """The questions of the first pass, in order: one per field that depends on nothing
    (one per label of a multi-label field), and for a `choices_by` child scored jointly,
    one per parent value with that value written first."""
    out: list[Question] = []
    for f in schema.fields:
        if not f.depends_on:
            out.extend(field_questions(schema, f))
            continue
        if f.branch is not None and f.depends_on == (f.branch[0],):
            if not schema.field(f.branch[0]).depends_on:  # after its branch's value
                out.extend(field_questions(schema, f, [f.branch]))
            continue
        parent = joint_parent(schema, f)
        if parent is not None:
            for i in range(schema.field(parent).cardinality):
                out.extend(field_questions(schema, f, [(parent, i)]))
    return out


def terminator_for(schema: Schema) -> str:
    """The text that closes a value: `,` when more keys follow, else the closing brace."""
    return "," if len(schema.fields) > 1 else "\n}"


def describe(schema: Schema) -> dict[str, Any]:
    """A small summary used in telemetry and debugging."""
    return {"fields": len(schema.fields), "fingerprint": schema.fingerprint()}
