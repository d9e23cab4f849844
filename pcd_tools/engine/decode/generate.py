"""Grammar-constrained decoding of one generated field on a context's KV cache.

A generated field's value is decoded greedily after its key (`'\\n  "name": '`), on the
same KV cache as the rest of the answer: the key (and any answers written before it)
run as one MLX call, then one step per token: native 8-bit steps (`fast_decode`, one
step for every context of a batch that has not ended, `decode_rows`) or MLX float32
calls. At each step the token is the most probable one that

- outlines-core's index of the field's regular expression (`value_regex.field_regex`:
  the value, then its terminator `,` or `\\n}`) allows from the current state, and
- keeps a string's characters and a list's items within their bounds (`TextLimits`,
  which walks the token's bytes; counted repetitions in the regex would make the index
  too slow to build).

Nothing is cut afterwards: when the grammar has not ended after the field's token limit,
`GenerationLimitError` carries what was generated.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...answers.softmax import log_softmax_at
from ...errors import GenerationError, GenerationLimitError
from ...schema import FieldSpec
from ..host.blas import import_mlx
from .text_limits import LimitState, TextLimits
from .value_regex import field_regex, opener
from .vocabulary import token_bytes, vocabulary

mx = import_mlx()

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "FieldGuide",
    "GeneratedValue",
    "TextLimits",
    "decode_rows",
    "field_guide",
    "forward",
    "last_logits",
    "write",
]

# A generated field's token limit when neither the field nor the request sets one.
DEFAULT_MAX_NEW_TOKENS = 256
_GUIDES_KEPT = 32


@dataclass
class FieldGuide:
    """Everything needed to decode one field's value for one tokenizer, built once.

    Args:
        regex: The value's regular expression, terminator included.
        index: The outlines-core `Index` of `regex`.
        table: The bytes of every token id (None for special ones).
        limits: The character and item counts the regex leaves to the decoder.
        masks: Index state -> allowed token ids as a boolean mask, filled as met.
        build_ms: Wall time of building the index.
        opener: What the value starts with, written with the key instead of decoded
            (`value_regex.opener`: `"` for a string or a date, `[` for a list, or "").
    """

    regex: str
    index: Any
    table: list[bytes | None]
    limits: TextLimits
    masks: dict[int, np.ndarray]
    build_ms: float
    opener: str = ""

    @property
    def limit_start(self) -> LimitState:
        """The length walker's state after the opener (inside the string after `"`)."""
        return (True, False, 0, 0, False) if self.opener == '"' else TextLimits.start

    def mask(self, state: int, n_vocab: int) -> np.ndarray:
        """The tokens the index allows from `state` (EOS never)."""
        hit = self.masks.get(state)
        if hit is None:
            hit = np.zeros(n_vocab, dtype=bool)
            allowed = [t for t in self.index.get_allowed_tokens(state) if t < n_vocab]
            hit[allowed] = True
            self.masks[state] = hit
        return hit


# Per tokenizer, (regex, EOS ids) -> (index, its state masks, build ms): the index is the
# costly part and depends on the regex only; the limits are the field's own.
_CACHE: weakref.WeakKeyDictionary[
    Any, OrderedDict[tuple[str, str], tuple[Any, dict[int, np.ndarray], float]]
] = weakref.WeakKeyDictionary()


def field_guide(
    tokenizer: Any, model: Any, eos: frozenset[int], spec: FieldSpec, terminator: str
) -> FieldGuide:
    """The guide of a generated field followed by `terminator`; the index of its regex
    is built once per tokenizer and shared by the fields with the same regex.

    Raises:
        GenerationError: if outlines-core cannot build the index of the field's regex
            (e.g. a `pattern` its regex engine does not read).
    """
    import outlines_core

    assert spec.generation is not None
    first = opener(spec.generation, spec.optional)
    regex = field_regex(spec.generation, spec.optional, terminator, opened=True)
    vocab, n_vocab, _ = vocabulary(tokenizer, model, eos)
    table = token_bytes(tokenizer, n_vocab)
    per_tok = _CACHE.setdefault(tokenizer, OrderedDict())
    key = (regex, ",".join(map(str, sorted(eos))))
    hit = per_tok.get(key)
    if hit is not None:
        per_tok.move_to_end(key)
        return FieldGuide(regex, hit[0], table, TextLimits(spec.generation), hit[1], hit[2], first)
    t0 = time.perf_counter()
    try:
        index = outlines_core.Index(regex, vocab)
    except Exception as e:  # outlines-core raises plain ValueError / its own errors
        raise GenerationError(
            f"{spec.name}: cannot build the grammar of the generated field from the regular "
            f"expression {regex!r} ({e}); accepted: a pattern in the common regex syntax "
            "(classes, groups, alternation, repetition).",
            field=spec.name,
        ) from None
    masks: dict[int, np.ndarray] = {}
    ms = (time.perf_counter() - t0) * 1e3
    with contextlib.suppress(TypeError):
        per_tok[key] = (index, masks, ms)
        while len(per_tok) > _GUIDES_KEPT:
            per_tok.popitem(last=False)
    return FieldGuide(regex, index, table, TextLimits(spec.generation), masks, ms, first)


@dataclass(frozen=True)
class GeneratedValue:
    """One generated field's value for one context.

    Args:
        field: The field's name.
        text: The value's JSON text (its terminator left out).
        token_ids: The value's tokens, its terminator included.
        logprobs: Each token's full-vocabulary log-probability.
        ms: Wall time of writing its key and decoding it.
    """

    field: str
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    ms: float

    @property
    def mean_logprob(self) -> float:
        """The mean log-probability of its tokens."""
        return float(np.mean(self.logprobs))


def last_logits(passes: Any, tokens: Sequence[int], cache: list[Any]) -> Any:
    """Runs `tokens` after `cache` (which grows by them); the last position's float32
    logits, (V,), as a lazy MLX array (only the last position goes through the head)."""
    x = mx.array([list(tokens)], dtype=mx.int32)
    if passes.inner is not None:
        logits = passes.head(passes.inner(x, cache=cache)[:, -1, :])[0]
    else:
        logits = passes.model(x, cache=cache)[0, -1, :]
    return logits.astype(mx.float32)


def forward(passes: Any, tokens: Sequence[int], cache: list[Any]) -> np.ndarray:
    """`last_logits`, evaluated, in numpy."""
    logits = last_logits(passes, tokens, cache)
    mx.eval(logits)
    return np.array(logits)


def write(passes: Any, tokens: Sequence[int], cache: list[Any]) -> None:
    """Runs `tokens` into `cache` without reading any logits (text written, not decoded)."""
    passes.run(mx.array([list(tokens)], dtype=mx.int32), cache)
    mx.eval([x for c in cache for x in (c.keys, c.values)])


class _MlxSteps:
    """One-token steps through MLX float32, one model call per row (the reference path);
    the same interface as `fast_decode.Stepper`."""

    def __init__(self, passes: Any, caches: Sequence[list[Any]]):
        self.passes, self.caches = passes, caches

    def position(self, row: int) -> int:
        return int(self.caches[row][0].offset)

    def step(self, tokens: Sequence[int], rows: Sequence[int]) -> list[np.ndarray]:
        return [forward(self.passes, [t], self.caches[r]) for t, r in zip(tokens, rows)]

    def close(self) -> None:
        pass


class _Row:
    """One context's greedy decoding of one field under its guide."""

    def __init__(self, guide: FieldGuide, first: np.ndarray, t0: float):
        self.state = guide.index.get_initial_state()
        self.lstate: Any = guide.limit_start
        self.opener = guide.opener  # written with the key; part of the value's text
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.logits = first
        self.t0, self.t1 = t0, 0.0


def decode_rows(
    passes: Any,
    caches: Sequence[list[Any]],
    forced: Sequence[Sequence[int]],
    guide: FieldGuide,
    spec: FieldSpec,
    limit: int,
    tokenizer: Any,
    *,
    terminator: str,
    max_position: int,
    decoder: Any = None,
    first: Sequence[np.ndarray] | None = None,
) -> tuple[list[GeneratedValue], list[list[int]], int]:
    """Writes each row's `forced` tokens (earlier answers and the key) into its cache with
    one MLX call, then decodes the field's value for every row under `guide`.

    With `decoder` (a `fast_decode.NativeDecoder`) the rows step in lockstep through
    native int8 steps, all rows in one call per step; a row that has ended stops
    stepping. Its value's tokens are then not in its cache: the caller writes them with
    whatever follows (one MLX float32 call), as it writes the last token on the MLX path,
    so later passes see exactly the K/V of MLX decoding. Without it each row's steps are
    MLX calls (the reference).

    Args:
        passes: The model's `Passes` (transformer and head).
        caches: Per row, its mlx-lm `KVCache`s, holding everything before `forced`.
        forced: Per row, the token ids to run first (they end with the field's key).
        guide: The field's guide.
        spec: The field.
        limit: The most tokens a value may take.
        tokenizer: Decodes the values' text.
        terminator: The text the grammar ends a value with (`,` or `\\n}`).
        max_position: The model's window: positions beyond it raise.
        decoder: The native decoder, or None for MLX steps.
        first: Per row, the logits after its cache when `forced` is already in it (the
            prefill wrote the key): no model call before the first step. `forced` must
            then be empty for every row.

    Returns:
        Per row its value and the value's tokens not yet in its cache (for the caller
        to write), and the model calls that ran one after another.

    Raises:
        GenerationLimitError: if a row's grammar has not ended after `limit` tokens (the
            first such row; `context_index` is its index in `caches`).
        GenerationError: if no token can continue a row's grammar.
        ContextTooLongError: if a row reaches the model's window.
    """
    from ...errors import ContextTooLongError

    rows: list[_Row] = []
    if first is not None:
        if len(first) != len(caches) or any(forced):
            raise ValueError("`first` needs one logits row per cache and nothing forced")
        t0 = time.perf_counter()
        rows = [_Row(guide, np.asarray(f, dtype=np.float32), t0) for f in first]
    for cache, ids in zip(caches, forced if first is None else ()):
        t0 = time.perf_counter()
        if cache[0].offset + len(ids) > max_position:
            raise ContextTooLongError(
                cache[0].offset + len(ids),
                max_position,
                detail=f"Writing the key of the generated field {spec.name!r} reached the "
                "model's window.",
            )
        rows.append(_Row(guide, forward(passes, ids, cache), t0))
    calls = len(rows) if first is None else 0
    steps: Any = (
        decoder.stepper(caches, limit) if decoder is not None else _MlxSteps(passes, caches)
    )
    index = guide.index
    n_vocab = rows[0].logits.shape[0]
    active = [r for r, row in enumerate(rows) if not index.is_final_state(row.state)]
    try:
        while active:
            for r in active:
                _check(rows[r], r, steps.position(r), spec, limit, tokenizer, max_position)
            stepping = [r for r in active if rows[r].ids]
            if stepping:
                out = steps.step([rows[r].ids[-1] for r in stepping], stepping)
                calls += 1 if decoder is not None else len(stepping)
                for r, logits in zip(stepping, out):
                    rows[r].logits = logits
            for r in active:
                row = rows[r]
                scores = np.where(guide.mask(row.state, n_vocab), row.logits, -np.inf)
                t, row.lstate = _pick(scores, guide, row.lstate, spec, tokenizer, row.ids)
                row.ids.append(t)
                row.lps.append(log_softmax_at(row.logits, t))
                row.state = index.get_next_state(row.state, t)
                if index.is_final_state(row.state):
                    row.t1 = time.perf_counter()
            active = [r for r in active if not index.is_final_state(rows[r].state)]
    finally:
        steps.close()
    values, pending = [], []
    for row in rows:
        text = tokenizer.decode(row.ids)
        if not text.endswith(terminator):
            raise GenerationError(
                f"{spec.name}: the decoded value {text!r} does not end with {terminator!r}; "
                "the tokenizer's decoding disagrees with its token bytes.",
                field=spec.name,
                partial_text=text,
            )
        ms = ((row.t1 or time.perf_counter()) - row.t0) * 1e3
        values.append(
            GeneratedValue(
                spec.name,
                guide.opener + text[: len(text) - len(terminator)],
                tuple(row.ids),
                tuple(row.lps),
                ms,
            )
        )
        pending.append(list(row.ids) if decoder is not None else row.ids[-1:])
    return values, pending, calls


def _check(
    row: _Row,
    r: int,
    position: int,
    spec: FieldSpec,
    limit: int,
    tokenizer: Any,
    max_position: int,
) -> None:
    """Raises if row `r` may not take another token: its limit, or the window."""
    from ...errors import ContextTooLongError

    if len(row.ids) >= limit:
        partial = row.opener + tokenizer.decode(row.ids)
        raise GenerationLimitError(
            f"{spec.name}: the generated value did not end within max_new_tokens={limit} "
            f"tokens; generated so far: {partial!r}. Accepted: a larger max_new_tokens "
            "(per request, or json_schema_extra={'max_new_tokens': n} on the field), or a "
            "max_length that makes the grammar end sooner.",
            field=spec.name,
            limit=limit,
            partial_text=partial,
            context_index=r,
        )
    if position + 1 > max_position:
        raise ContextTooLongError(
            position + 1,
            max_position,
            detail=f"Decoding the generated field {spec.name!r} reached the model's window.",
        )


def _pick(
    scores: np.ndarray,
    guide: FieldGuide,
    lstate: Any,
    spec: FieldSpec,
    tokenizer: Any,
    ids: list[int],
) -> tuple[int, Any]:
    """The best allowed token that keeps the counts within their limits."""
    best = int(np.argmax(scores))
    if not np.isfinite(scores[best]):
        raise GenerationError(
            f"{spec.name}: no token of the vocabulary continues the grammar "
            f"{guide.regex!r} after {tokenizer.decode(ids)!r}; accepted: a pattern whose "
            "characters the tokenizer can write.",
            field=spec.name,
            partial_text=guide.opener + tokenizer.decode(ids),
        )
    if not guide.limits.active:
        return best, lstate
    nxt = guide.limits.step(lstate, guide.table[best] or b"")
    if nxt is not None:  # nearly always: sort the vocabulary only when the best is cut
        return best, nxt
    for t in np.argsort(-scores, kind="stable"):
        t = int(t)
        if not np.isfinite(scores[t]):
            break
        nxt = guide.limits.step(lstate, guide.table[t] or b"")
        if nxt is not None:
            return t, nxt
    raise GenerationError(
        f"{spec.name}: no token keeps the value within its length limits after "
        f"{tokenizer.decode(ids)!r} (greedy decoding met a pattern the lengths cut short); "
        "accepted: lengths the pattern can always meet, or the lengths written into the "
        "pattern itself (e.g. [a-z]{1,20}).",
        field=spec.name,
        partial_text=guide.opener + tokenizer.decode(ids),
    )
