"""Prompt text: the schema-only prefix, the context, and the per-field JSON suffixes.

Layout (see DESIGN §2)::

    [system: instructions + every field, its description and allowed values]  <- cached
    [user: example input, assistant: its JSON answer] per few-shot example     <- cached
    [user: the context]
    [assistant: "{"]
    per field, scored in parallel:  '\\n  "name": ' + <candidate JSON literal> + terminator

A schema with generated fields is answered in segments, in declaration order
(`pcd_tools.schema.generated.segments`): a generated field's value is decoded after
`'\\n  "name": '`, and a later run of scored fields is scored after everything written
so far (`segment_questions`, `written_answers`), so the model sees one JSON object.

The prompt is tokenized in three pieces (schema part, context, tail) that meet at chat
special tokens, so the cached schema part is a token prefix of every request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .schema import Example, FieldSpec, Schema
from .schema.spec import Answer, Written

__all__ = [
    "PromptParts",
    "PromptPreview",
    "Question",
    "Segment",
    "TextTokenizer",
    "build_prompt",
    "example_answer",
    "field_suffix",
    "questions",
    "render_system",
    "segment_questions",
    "written_answers",
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


# A field with more values than this is not listed in the system turn: the prompt names
# how many there are and shows the first few, and the token trie keeps the answer to the
# allowed values whatever the prompt shows. Listing 5,010 region names would take 45,899
# tokens, past most models' windows; at 599 time zones it was no more accurate than the
# sample (docs/labels-benchmarks.md, "Label sets beyond 255": 30% against 4% on the
# embedded model, 100% both on the 1.5B).
LIST_LIMIT = 255
LIST_SAMPLE = 5


def _describe_tree(f: FieldSpec) -> str:
    """A large taxonomy's line: how a path is written, and its top level."""
    tree = f.tree
    assert tree is not None
    tops = []
    for node in tree.top[: LIST_LIMIT if len(tree.top) <= LIST_LIMIT else LIST_SAMPLE]:
        d = tree.description(node)
        tops.append(f"{node} ({d})" if d else str(node))
    more = "" if len(tree.top) <= LIST_LIMIT else f", ... ({len(tree.top):,} in all)"
    null = ", or null" if f.optional else ""
    return (
        f"a path in a tree of {len(f.choices) - f.optional:,} labels, from the top level down "
        f"to the most specific label, the levels joined by {tree.separator!r}{null}; the top "
        f"level is one of: {', '.join(tops)}{more}"
    )


def _describe_choices(f: FieldSpec, order: Sequence[int] | None) -> str:
    if f.tree is not None and len(f.choices) > LIST_LIMIT:
        return _describe_tree(f)
    if len(f.choices) > LIST_LIMIT:
        shown = ", ".join(c.literal for c in f.choices[:LIST_SAMPLE])
        if f.kind == "multilabel":  # ranked
            return (
                f"{len(f.choices):,} labels, not all listed here; write each exactly as it "
                f"is usually written (they look like: {shown}, ...)"
            )
        return (
            f"one of {len(f.choices):,} values, not all listed here; write the one that "
            f"applies exactly as it is usually written (they look like: {shown}, ...)"
        )
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

    A part of a schema (`Schema.part`) renders its whole's system message.
    """
    schema = schema.shown
    lines = [schema.instructions.strip() or DEFAULT_INSTRUCTIONS, ""]
    each = (
        "For each key with allowed values, the value must be one of them; write the other "
        "keys' values as described, in this order."
        if schema.hybrid
        else "For each key, the value must be one of its allowed values."
    )
    lines.append(
        f"Read the user's message and answer with a JSON object that has exactly these keys. {each}"
    )
    lines.append("")
    for f in schema.fields:
        desc = f.description.strip() or f.key.replace("_", " ")
        if f.branch is not None:
            kind, index = f.branch
            desc += f" (only when {kind!r} is {schema.field(kind).choices[index].literal})"
        lines.append(f'"{f.key}": {desc}')
        order = choice_order.get(f.name) if choice_order else None
        if f.generated:
            lines.append(f"  value: {describe_generation(f)}")
        elif f.kind == "multilabel" and f.reading == "ranked":
            lines.append(
                "  a list of the labels that apply, the most relevant first, from: "
                f"{_describe_choices(f, order)}"
            )
        elif f.kind == "multilabel":
            lines.append(
                "  an object with each of these labels as a key, and true or false for whether "
                f"it applies: {_describe_choices(f, order)}"
            )
        else:
            lines.append(f"  allowed values: {_describe_choices(f, order)}")
    return "\n".join(lines)


def _span(lo: Any, hi: Any, unit: str) -> str:
    if lo is not None and hi is not None:
        return f"{lo} to {hi}{unit}"
    if lo is not None:
        return f"at least {lo}{unit}"
    return f"at most {hi}{unit}" if hi is not None else ""


def describe_generation(f: FieldSpec) -> str:
    """How a generated field's value is described in the system turn."""
    g = f.generation
    assert g is not None
    parts: list[str]
    if g.type == "string":
        parts = ["free text", _span(g.min_length, g.max_length, " characters")]
        if g.pattern:
            parts.append(f"matching the regular expression {g.pattern}")
    elif g.type in ("number", "integer"):
        parts = ["a number" if g.type == "number" else "an integer", _span(g.ge, g.le, "")]
    elif g.type == "string_list":
        parts = ["a list of strings", _span(g.min_length, g.max_length, " items")]
        parts.append(_span(g.item_min_length, g.item_max_length, " characters each"))
        if g.pattern:
            parts.append(f"each matching the regular expression {g.pattern}")
    elif g.type == "date":
        parts = ["a date as YYYY-MM-DD"]
    else:
        parts = ["a date and time as YYYY-MM-DDTHH:MM:SS"]
    if f.optional:
        parts.append("or null when the message does not say")
    return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class Segment:
    """One segment of a schema with generated fields, as it ran for one context.

    The answer is one JSON object written in declaration order: a scored segment is one
    packed pass over its fields after everything written before it; a generated segment
    decodes its fields one after the other.

    Args:
        kind: `"scored"` or `"generated"`.
        fields: Its fields, in declaration order.
        prefix: The JSON text after the prompt's `{` that the model had seen when the
            segment started (a scored segment's candidates are scored right after it).
        text: What the segment added to the JSON: a generated field's key, value and
            terminator; a scored segment's chosen answers, each written after its key.
        token_ids: The token ids of `text` as they went into the KV cache (a generated
            value's own tokens; written keys and answers tokenized as text); empty for a
            last scored segment, whose answers nothing reads.
    """

    kind: str
    fields: tuple[str, ...]
    prefix: str
    text: str
    token_ids: tuple[int, ...]


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
        segments: The order the answer is written in: `("scored", fields)` for one
            packed pass, `("generated", fields)` for fields decoded one after the other.
            A schema without generated fields is one scored segment. Each segment
            continues the JSON after everything before it (the decision's
            `Decision.segments` holds the text each one saw).
    """

    text: str
    token_ids: tuple[int, ...]
    schema_tokens: int
    context_tokens: int
    answer_start_tokens: int
    field_suffixes: dict[str, str]
    examples: int = 0
    segments: tuple[tuple[str, tuple[str, ...]], ...] = ()

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
    turn and the context's user turn, so they are part of the cached head. A part of a
    schema (`Schema.part`) gets its whole's head: instructions, every field, examples. Models without
    a chat template get a plain-text layout, with each example as a message and its
    answer.
    """
    whole = schema.shown  # a part of a schema is asked under its whole's prompt
    system = render_system(whole, choice_order)
    shots = [(e.input, example_answer(whole, e)) for e in whole.examples]
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
    field is an object of every label with `true` or `false` (read ranked: the list of
    its chosen labels, most probable first)."""
    parts = [_answer_part(schema.field(name), a) for name, a in example.answers]
    return "{" + ",".join(parts) + "\n}"


def _answer_part(f: FieldSpec, a: Answer) -> str:
    if isinstance(a, Written):  # a generated field's value, as written
        return field_suffix(f) + a.text
    if isinstance(a, tuple) and f.reading == "ranked":  # the chosen labels, ranked
        return f"{field_suffix(f)}[{', '.join(f.choices[i].literal for i in a)}]"
    if isinstance(a, tuple):
        flags = ", ".join(
            f"{json.dumps(str(c.label), ensure_ascii=False)}: {'true' if i in a else 'false'}"
            for i, c in enumerate(f.choices)
        )
        return f"{field_suffix(f)}{{{flags}}}"
    return field_suffix(f) + f.choices[a].literal


def written_answers(schema: Schema, answers: Sequence[tuple[str, Answer]]) -> str:
    """Scored answers as a segment writes them into the JSON before what follows: per
    field its suffix, value and a comma (a multi-label field: its object of labels)."""
    return "".join(_answer_part(schema.field(n), a) + "," for n, a in answers)


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
        given: The earlier answers written before it: (field, answer) pairs, the answer
            being a choice index, or for a multi-label parent the tuple of the indices
            of its chosen labels.
        choices: The indices of the field's choices the texts stand for, when only some
            are allowed after `given` (`choices_by`); None for all of them.
    """

    field: str
    label: int | None
    texts: tuple[str, ...]
    given: tuple[tuple[str, Answer], ...] = ()
    choices: tuple[int, ...] | None = None

    @property
    def key(self) -> str:
        """A name for messages: the field, or `field[label index]`, and what it is given."""
        name = self.field if self.label is None else f"{self.field}[{self.label}]"
        return name + "".join(f"|{f}={_answer_key(a)}" for f, a in self.given)


def _answer_key(a: Answer) -> str:
    """A written answer in a question's key: `2`, or a multi-label's chosen `[0,2]`."""
    return f"[{','.join(map(str, a))}]" if isinstance(a, tuple) else str(a)


def label_suffix(f: FieldSpec, index: int) -> str:
    """The JSON text before one label's yes/no: the field's key opening an object."""
    return f"{field_suffix(f)}{{{json.dumps(str(f.choices[index].label), ensure_ascii=False)}: "


def answer_text(f: FieldSpec, answer: Answer) -> str:
    """A written earlier answer: the field's key, the chosen value and a comma. A
    multi-label parent's answer (the indices of its chosen labels) is written as the
    fields pass and generation write that kind: an object of every label, in declared
    order, with `true` for the chosen ones and `false` for the others (read ranked: the
    list of the chosen labels, in the tuple's order)."""
    return _answer_part(f, answer) + ","


def field_questions(
    schema: Schema, f: FieldSpec, given: Sequence[tuple[str, Answer]] = ()
) -> list[Question]:
    """The questions of one field, after the earlier answers `given` (written in order;
    a multi-label parent's answer is the tuple of its chosen labels' indices)."""
    before = "".join(answer_text(schema.field(g), i) for g, i in given)
    given = tuple(given)
    if f.kind == "multilabel" and f.reading == "ranked":  # which label the list starts with
        texts = tuple(f"{before}{field_suffix(f)}[{c.literal}" for c in f.choices)
        return [Question(f.name, None, texts, given)]
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
        hit = [i for g, i in given if g == parent and isinstance(i, int)]
        allowed = table[hit[0]] if hit else None
    idx = allowed if allowed is not None else range(len(f.choices))
    texts = tuple(before + candidate_text(f, f.choices[i].literal, term) for i in idx)
    return [Question(f.name, None, texts, given, allowed)]


# Characters of candidate text a `choices_by` child may take in the first pass (every
# parent value's candidates, each after the parent's answer); above it, a later wave.
JOINT_BUDGET = 24_000


def _deps(f: FieldSpec, inside: set[str] | None) -> tuple[str, ...]:
    """The parents of `f` answered in the same pass or wave (those in `inside`)."""
    return f.depends_on if inside is None else tuple(p for p in f.depends_on if p in inside)


def joint_parent(schema: Schema, f: FieldSpec, inside: set[str] | None = None) -> str | None:
    """The parent a `choices_by` field is scored jointly with in the first pass: when the
    parent depends on nothing, the child on nothing else, and the texts fit the budget.

    With `inside` (a segment's fields), parents outside it count as already written."""
    if f.choices_by is None or _deps(f, inside) != (f.choices_by[0],):
        return None
    parent = schema.field(f.choices_by[0])
    if _deps(parent, inside):
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
    one per parent value with that value written first. Generated fields ask nothing."""
    return segment_questions(schema, [f.name for f in schema.fields if not f.generated])


def segment_questions(schema: Schema, names: Sequence[str]) -> list[Question]:
    """The first-pass questions of the scored fields `names` (a segment of a schema with
    generated fields, or all of them): parents outside `names` count as answered, since
    their answers are already written in the JSON before the segment."""
    inside = set(names)
    out: list[Question] = []
    for f in (schema.field(n) for n in names):
        deps = _deps(f, inside)
        if not deps:
            out.extend(field_questions(schema, f))
            continue
        if f.branch is not None and deps == (f.branch[0],):
            if not _deps(schema.field(f.branch[0]), inside):  # after its branch's value
                out.extend(field_questions(schema, f, [f.branch]))
            continue
        parent = joint_parent(schema, f, inside)
        if parent is not None:
            for i in range(schema.field(parent).cardinality):
                out.extend(field_questions(schema, f, [(parent, i)]))
    return out


def terminator_for(schema: Schema) -> str:
    """The text that closes a value: `,` when more keys follow, else the closing brace
    (a part of a schema closes its values as its whole does)."""
    return "," if len(schema.shown.fields) > 1 else "\n}"


def describe(schema: Schema) -> dict[str, Any]:
    """A small summary used in telemetry and debugging."""
    return {"fields": len(schema.fields), "fingerprint": schema.fingerprint()}
