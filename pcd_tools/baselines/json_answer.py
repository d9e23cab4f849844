"""Reading a generated JSON answer: where the object closes, which characters each token
and each top-level value cover, and the `GenerationResult` that reports it all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..schema import Schema

__all__ = ["GenerationResult", "ObjectScanner", "build_result", "token_spans", "value_spans"]


@dataclass
class GenerationResult:
    """One autoregressive answer and what it cost.

    Args:
        text: Generated text after the prompt's final `{` (cut at the closing brace).
        json_text: `"{" + text`, the text that is parsed.
        tokens: Generated tokens.
        passes: Sequential forward passes: prefill calls plus one per generated token
            after the first (the prefill's logits give the first).
        wall_ms: Wall time of the whole call.
        prefill_ms: Wall time until the first token's logits (schema-part prefill included
            on a prompt-cache miss).
        decode_ms: Wall time of the token-by-token loop.
        is_valid_json: Whether `json_text` parses.
        schema_match: Whether it is an object with exactly the schema's keys, each holding
            one of its allowed values.
        values: Field name -> JSON label, when `schema_match`.
        value_probs: Per field, the product of the probabilities the sampler gave the
            tokens overlapping the value's JSON text (constrained: renormalised over the
            allowed tokens); None when unavailable.
    """

    text: str
    json_text: str
    tokens: int
    passes: int
    wall_ms: float
    prefill_ms: float
    decode_ms: float
    is_valid_json: bool
    schema_match: bool
    values: dict[str, Any] | None
    value_probs: dict[str, float] | None


def value_spans(json_text: str) -> dict[str, tuple[int, int]]:
    """Character span of each top-level value of a JSON object (empty if malformed)."""
    dec = json.JSONDecoder()
    spans: dict[str, tuple[int, int]] = {}
    ws = " \t\n\r"
    i = 1
    try:
        while i < len(json_text):
            while json_text[i] in ws:
                i += 1
            if json_text[i] == "}":
                break
            key, i = dec.raw_decode(json_text, i)
            while json_text[i] in ws:
                i += 1
            i += 1  # ':'
            while json_text[i] in ws:
                i += 1
            _, end = dec.raw_decode(json_text, i)
            spans[str(key)] = (i, end)
            i = end
            while json_text[i] in ws:
                i += 1
            if json_text[i] == ",":
                i += 1
    except (ValueError, IndexError):
        return spans
    return spans


def _is_label(value: Any, labels: Sequence[Any]) -> bool:
    # `True == 1` in Python: compare types too
    return any(value == lab and type(value) is type(lab) for lab in labels)


def _fits(f: Any, value: Any) -> bool:
    """Whether a generated value is one of the field's answers (a multi-label field: an
    object with each label's true or false; a generated field: a value that validates)."""
    if f.generation is not None:
        from pydantic import TypeAdapter, ValidationError

        from ..schema.spec import python_type

        try:
            TypeAdapter(python_type(f.generation, f.optional)).validate_python(value)
        except ValidationError:
            return False
        return True
    if f.reading == "ranked":  # distinct labels, within the length limits
        return (
            isinstance(value, list)
            and all(_is_label(v, f.labels) for v in value)
            and len(set(map(str, value))) == len(value)
            and f.min_labels <= len(value) <= (f.max_labels or len(f.labels))
        )
    if f.kind == "multilabel":
        labels = [str(label) for label in f.labels]
        return (
            isinstance(value, dict)
            and sorted(value) == sorted(labels)
            and all(isinstance(v, bool) for v in value.values())
        )
    return _is_label(value, f.labels)


def build_result(
    schema: Schema,
    text: str,
    token_spans: list[tuple[int, int]],
    probs: list[float],
    passes: int,
    times: tuple[float, float, float],
) -> GenerationResult:
    """The result of a generated answer: parsed, checked against the schema, and the
    probability of each value read from the tokens that overlap its text.

    Args:
        schema: The compiled schema.
        text: Generated text after the prompt's final `{`.
        token_spans: Character span of each generated token within `"{" + text`.
        probs: Probability the decoder gave each generated token.
        passes: Sequential forward passes spent.
        times: `perf_counter` at the start, at the first token's logits, at the end.
    """
    t0, t1, t2 = times
    json_text = "{" + text
    try:
        obj = json.loads(json_text)
        valid = True
    except ValueError:
        obj, valid = None, False
    names = [f.name for f in schema.fields]
    match = (
        isinstance(obj, dict)
        and sorted(obj) == sorted(names)
        and all(_fits(f, obj[f.name]) for f in schema.fields)
    )
    values = {n: obj[n] for n in names} if match and isinstance(obj, dict) else None
    value_probs = None
    if match and probs:
        value_probs = {}
        for name, (s, e) in value_spans(json_text).items():
            p = 1.0
            for (ts, te), q in zip(token_spans, probs):
                if ts < e and te > s:
                    p *= q
            value_probs[name] = p
    return GenerationResult(
        text=text,
        json_text=json_text,
        tokens=len(probs),
        passes=passes,
        wall_ms=(t2 - t0) * 1e3,
        prefill_ms=(t1 - t0) * 1e3,
        decode_ms=(t2 - t1) * 1e3,
        is_valid_json=valid,
        schema_match=match,
        values=values,
        value_probs=value_probs,
    )


class ObjectScanner:
    """Tracks JSON nesting outside strings, from just inside the answer's opening `{`."""

    def __init__(self) -> None:
        self.depth, self.in_str, self.esc = 1, False, False

    def feed(self, s: str) -> int | None:
        """Reads `s`; returns the index just past the brace that closed the object, if any."""
        for k, ch in enumerate(s):
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif ch == "\\":
                    self.esc = True
                elif ch == '"':
                    self.in_str = False
            elif ch == '"':
                self.in_str = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return k + 1
        return None


def token_spans(tok: Any, ids: list[int]) -> list[tuple[int, int]]:
    """Character span of each generated token within `"{" + text`."""
    spans, prev = [], 1
    for k in range(len(ids)):
        end = 1 + len(tok.decode(ids[: k + 1]))
        spans.append((prev, end))
        prev = end
    return spans
