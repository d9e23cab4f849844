"""Schemas with generated fields: the answer's segments, run on each context's KV cache.

The answer is one JSON object written in declaration order
(`pcd_tools.schema.generated.segments`). After the prefill of the prompt (up to the
answer's `{`), each context keeps its own mlx-lm `KVCache`, and the segments run in
order:

- a **generated** segment decodes its fields one after the other on that cache
  (`generate.decode_rows`): the text written since the last model call (a scored
  segment's answers, or the previous value) and the field's key run as one MLX call,
  then one step per token. A generated field that opens the answer has its key run in
  the prefill's own call instead (its first token from the prefill's last logits). With native int8 decoding (`fast_decode`, the default on CPU)
  all contexts of the batch step in lockstep, one native step for every context whose
  value has not ended; the value's tokens then go into the MLX cache with what follows,
  so scored fields see float32 K/V exactly as with MLX decoding. On the MLX path the
  contexts decode one after the other;
- a **scored** segment is one packed pass over its fields' suffixes (with the waves of
  its own dependent fields) after everything written so far: the contexts' caches are
  stacked (right-padded) into one batch, exactly as the first pass of a schema without
  generated fields runs after the prompt. The value decoded just before it runs first,
  in the same call when the segment is one packed chunk (`Passes.packed_after`: its
  K/V then join the caches), else in a call of its own. The chosen answers are then
  written into the JSON before what follows.

The prefill and the scored passes batch the contexts; so do the decode steps with
native decoding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._lazy import mlx_lm_module
from ..answers.waves import WaveAnswers
from ..errors import ContextTooLongError, GenerationLimitError
from ..prompt import (
    Question,
    Segment,
    field_suffix,
    segment_questions,
    terminator_for,
    written_answers,
)
from ..schema import Schema
from ..schema.generated import segments
from .decode.generate import DEFAULT_MAX_NEW_TOKENS, GeneratedValue, decode_rows, field_guide, write
from .decode.native_steps import decoder_for
from .host.blas import import_mlx
from .kernels import cpu_ops as cpu_kernels
from .passes.forward import LayerKV, packed_result
from .passes.kv_parts import kv_head
from .passes.pack import Plan
from .passes.trie import FieldTrie

if TYPE_CHECKING:
    from .scorer import Engine, PassMode

mx = import_mlx()

__all__ = ["HybridBatch", "prefill_rows", "run_hybrid"]

Scored = tuple[Question, FieldTrie, np.ndarray]


@dataclass
class HybridBatch:
    """What a schema with generated fields gave for a batch of contexts.

    Args:
        scored: Per context, every scored question with its trie and edge log p.
        generated: Per context, each generated field's value.
        segments: Per context, the segments as they ran.
        prompt_tokens: Per context, prompt length in tokens.
        prefill_ms: Wall time of the prefill.
        suffix_eval_ms: Wall time of the scored passes, with the written text they
            follow (a generated value just decoded) run into the caches first: in the
            same model call where the segment is one packed chunk.
        generate_ms: Wall time of everything else: grammar indexes, written answers and
            keys, every decode step. The three add up to the call's wall time.
        sequential_forward_passes: Model calls that ran one after another.
        prefix_cache_hit: Whether the schema part came from the cache.
        attention_ms: Time in the native attention kernel over the call, summed over
            the threads that ran it.
    """

    scored: list[list[Scored]]
    generated: list[dict[str, GeneratedValue]]
    segments: list[list[Segment]]
    prompt_tokens: list[int]
    prefill_ms: float
    suffix_eval_ms: float
    generate_ms: float
    sequential_forward_passes: int
    prefix_cache_hit: bool
    attention_ms: float = 0.0


@dataclass
class _Row:
    """One context's state between segments."""

    cache: list[Any]
    pending: list[int] = field(default_factory=list)  # written ids not yet in the cache
    text: str = ""  # the JSON after `{` so far
    scored: list[Scored] = field(default_factory=list)
    generated: dict[str, GeneratedValue] = field(default_factory=dict)
    segments: list[Segment] = field(default_factory=list)


def prefill_rows(
    engine: Engine,
    plan: Plan,
    ctx_ids: list[list[int]],
    use_cache: bool,
    then: Sequence[int] = (),
) -> tuple[LayerKV, list[int], int, bool, np.ndarray | None]:
    """Each context's prompt (after the cached schema part) prefilled as one batch.

    Args:
        engine: The engine.
        plan: The schema's plan (its schema part and prompt tail).
        ctx_ids: Each context's token ids.
        use_cache: Reuse (and fill) the schema-prefix KV cache.
        then: Token ids written after every prompt in the same call (the key of a
            generated field that opens the answer); the last position's logits are then
            returned, so that field decodes without a model call of its own.

    Returns:
        The K/V (right-padded rows), each row's length, the model calls that ran one
        after another, whether the schema part came from the prefix cache, and with
        `then` each row's logits after it (B, V), else None.
    """
    head = plan.head_ids
    prefix = engine.prefix_cache.get(head) if use_cache else None
    hit = prefix is not None
    engine.stats["prefix_hits" if hit else "prefix_misses"] += 1
    rows = [c + plan.tail_ids + list(then) for c in ctx_ids]
    valid = [len(head) + len(r) for r in rows]
    last = bool(then)
    engine.fit_threads()
    if prefix is None and len(rows) == 1:
        kv, logits = engine._parallel(
            [lambda: engine.passes.prefill_with_logits([head + rows[0]], None, last)]
        )[0]
        if use_cache:
            n = len(head)
            engine.prefix_cache.put(head, [kv_head(k, v, n) for k, v in kv])
        return kv, valid, 1, hit, logits
    passes = 1
    if prefix is None:
        prefix = engine._parallel([lambda: engine.passes.prefill([head], None)])[0]
        passes += 1
        if use_cache:
            engine.prefix_cache.put(head, prefix)
    kv, logits = engine._parallel([lambda: engine.passes.prefill_with_logits(rows, prefix, last)])[
        0
    ]
    return kv, valid, passes, hit, logits


def _row_cache(kv: LayerKV, r: int, n: int) -> list[Any]:
    KVCache = mlx_lm_module("models.cache").KVCache

    out = []
    for k, v in kv:
        c = KVCache()
        c.state = (k[r : r + 1, :, :n], v[r : r + 1, :, :n], n)
        out.append(c)
    return out


def _stack(rows: Sequence[_Row]) -> tuple[LayerKV, list[int]]:
    """The rows' caches as one right-padded batch, and each row's length."""
    valid = [row.cache[0].offset for row in rows]
    width = max(valid)
    kv: LayerKV = []
    for li in range(len(rows[0].cache)):
        ks, vs = [], []
        for row, n in zip(rows, valid):
            c = row.cache[li]
            pad = [(0, 0), (0, 0), (0, width - n), (0, 0)]
            k, v = c.keys[:, :, :n], c.values[:, :, :n]
            ks.append(mx.pad(k, pad) if n < width else k)
            vs.append(mx.pad(v, pad) if n < width else v)
        kv.append((mx.concatenate(ks, axis=0), mx.concatenate(vs, axis=0)))
    mx.eval([x for pair in kv for x in pair])
    return kv, valid


def run_hybrid(
    engine: Engine,
    schema: Schema,
    contexts: Sequence[str],
    *,
    mode: PassMode | None,
    answers: WaveAnswers,
    choice_order: dict[str, Sequence[int]] | None = None,
    max_new_tokens: int | None = None,
    eos: frozenset[int] = frozenset(),
    use_prefix_cache: bool = True,
) -> HybridBatch:
    """Answers a schema with generated fields for each context, segment by segment.

    Args:
        engine: The engine (model, plans, prefix cache, passes).
        schema: The compiled schema (with generated fields).
        contexts: The texts.
        mode: The layout of the scored passes (None: the engine's default).
        answers: How a scored segment's answers are chosen (temperature, calibration);
            its waves and written answers are restricted to the segment.
        choice_order: Per-field listing order of allowed values in the prompt.
        max_new_tokens: The token limit of generated fields that set none themselves
            (None: `DEFAULT_MAX_NEW_TOKENS`).
        eos: Token ids that end generation; no grammar allows them.
        use_prefix_cache: Reuse (and fill) the schema-prefix KV cache.

    Raises:
        GenerationLimitError: naming the field and the context (`context_index`).
        ContextTooLongError: if the prompt, or the answer so far, outgrows the window.
        InvalidArgumentError: for an unknown mode.
    """
    pass_mode = engine.check_mode(mode)
    plan = engine.plan(schema, choice_order)
    ctx_ids = [engine.encode_ids(c) for c in contexts]
    lengths = [
        engine.check_length(plan, c, i if len(contexts) > 1 else None)
        for i, c in enumerate(ctx_ids)
    ]
    term = terminator_for(schema)
    parts = segments(schema)
    # A generated field that opens the answer: its key goes into the prefill's call,
    # whose last logits give its first token (one model call fewer than writing it apart)
    then: list[int] = []
    tk = time.perf_counter()  # its grammar index counts in generate_ms, as every other
    if parts and parts[0][0] == "generated":
        then = _key(engine, schema, parts[0][1][0], eos, term)[1]
        for i, n in enumerate(lengths):
            if n + len(then) > engine.context_window:
                raise ContextTooLongError(
                    n + len(then),
                    engine.context_window,
                    detail=f"Writing the key of the generated field {parts[0][1][0]!r} "
                    f"after the prompt{f' (context #{i})' if len(contexts) > 1 else ''} "
                    "reached the model's window.",
                )
    key_s = time.perf_counter() - tk
    with engine.lock, cpu_kernels.metering() as meter:
        t0 = time.perf_counter()
        kv, valid, passes, hit, first = prefill_rows(engine, plan, ctx_ids, use_prefix_cache, then)
        rows = [_Row(_row_cache(kv, r, n)) for r, n in enumerate(valid)]
        del kv
        t1 = time.perf_counter()
        suffix_s = 0.0
        for kind, names in parts:
            if kind == "generated":
                passes += _generate(engine, schema, rows, names, max_new_tokens, eos, term, first)
                first = None  # only the opening field's key was prefilled
                continue
            ts = time.perf_counter()
            passes += _score_segment(engine, plan, schema, rows, names, pass_mode, answers)
            suffix_s += time.perf_counter() - ts
        t2 = time.perf_counter()  # a last generated value's last token is never run
    total = t2 - t1 + key_s
    return HybridBatch(
        scored=[row.scored for row in rows],
        generated=[row.generated for row in rows],
        segments=[row.segments for row in rows],
        prompt_tokens=lengths,
        prefill_ms=(t1 - t0) * 1e3,
        suffix_eval_ms=suffix_s * 1e3,
        generate_ms=(total - suffix_s) * 1e3,
        sequential_forward_passes=passes,
        prefix_cache_hit=hit,
        attention_ms=meter.ms,
    )


def _feed_pending(engine: Engine, rows: Sequence[_Row]) -> int:
    """Runs each row's written but not yet run tokens (a generated value's last one);
    returns the model calls."""
    calls = 0
    with mx.stream(engine.stream), engine.kernels():
        for row in rows:
            if row.pending:
                need = row.cache[0].offset + len(row.pending)
                if need > engine.context_window:
                    raise ContextTooLongError(
                        need,
                        engine.context_window,
                        detail="The answer written so far outgrows the model's window.",
                    )
                write(engine.passes, row.pending, row.cache)
                row.pending = []
                calls += 1
    return calls


def _key(
    engine: Engine, schema: Schema, name: str, eos: frozenset[int], term: str
) -> tuple[Any, list[int], str]:
    """A generated field's guide, the ids of its key (with the value's opener: the opening
    quote is written, not decoded) and the text its value ends with."""
    spec = schema.field(name)
    end = "\n}" if name == schema.fields[-1].name else term
    guide = field_guide(engine.tokenizer, engine.model, eos, spec, end)
    return guide, engine.encode_ids(field_suffix(spec) + guide.opener), end


def _generate(
    engine: Engine,
    schema: Schema,
    rows: Sequence[_Row],
    names: Sequence[str],
    max_new_tokens: int | None,
    eos: frozenset[int],
    term: str,
    first: np.ndarray | None = None,
) -> int:
    """Decodes a generated segment's fields for every row; returns the model calls.

    With native decoding the rows decode each field in lockstep (one step for all rows
    that have not ended); on the MLX path they decode one after the other. `first`: each
    row's logits after the first field's key, already in its cache (the prefill ran it).
    """
    decoder = decoder_for(engine)
    if decoder is not None:
        index = range(len(rows))
        return _generate_rows(
            engine, schema, rows, index, names, max_new_tokens, eos, term, decoder, first
        )
    total = 0
    for r, row in enumerate(rows):
        mine = None if first is None else first[r : r + 1]
        total += _generate_rows(
            engine, schema, [row], [r], names, max_new_tokens, eos, term, None, mine
        )
    return total


def _generate_rows(
    engine: Engine,
    schema: Schema,
    rows: Sequence[_Row],
    index: Sequence[int],
    names: Sequence[str],
    max_new_tokens: int | None,
    eos: frozenset[int],
    term: str,
    decoder: Any,
    first: np.ndarray | None = None,
) -> int:
    """Decodes a generated segment's fields for `rows` (their positions in the batch are
    `index`) together; returns the model calls."""
    calls = 0
    prefix = [row.text for row in rows]
    texts = ["" for _ in rows]
    ids: list[list[int]] = [[] for _ in rows]
    tok = engine.tokenizer
    for name in names:
        spec = schema.field(name)
        assert spec.generation is not None
        limit = spec.generation.max_new_tokens or max_new_tokens or DEFAULT_MAX_NEW_TOKENS
        guide, key_ids, end = _key(engine, schema, name, eos, term)
        forced = [[] if first is not None else [*row.pending, *key_ids] for row in rows]
        with mx.stream(engine.stream), engine.kernels():
            try:
                values, pending, n = decode_rows(
                    engine.passes,
                    [row.cache for row in rows],
                    forced,
                    guide,
                    spec,
                    limit,
                    tok,
                    terminator=end,
                    max_position=engine.context_window,
                    decoder=decoder,
                    first=None if first is None else list(first),
                )
            except GenerationLimitError as e:
                e.context_index = index[e.context_index or 0]
                raise
        first = None
        calls += n
        for j, row in enumerate(rows):
            value = values[j]
            row.generated[name] = value
            row.pending = pending[j]
            texts[j] += field_suffix(spec) + value.text + end  # value.text has the opener
            ids[j] += [*key_ids, *value.token_ids]
    for j, row in enumerate(rows):
        row.segments.append(Segment("generated", tuple(names), prefix[j], texts[j], tuple(ids[j])))
        row.text += texts[j]
    return calls


def _score_segment(
    engine: Engine,
    plan: Plan,
    schema: Schema,
    rows: Sequence[_Row],
    names: tuple[str, ...],
    mode: PassMode,
    answers: WaveAnswers,
) -> int:
    """One scored segment over every row: its pass (and its own waves) on the stacked
    caches; writes each row's chosen answers. Returns the model calls.

    The tokens written since the last model call (a generated value just decoded) go in
    first. Where the segment is one packed chunk they run in the chunk's own call, before
    it (`Passes.packed_after`), and their K/V join the rows' caches; else one call each.
    """
    sub = engine.wave_plan(plan, segment_questions(schema, names))
    stems = [list(row.pending) for row in rows]
    written = max(row.cache[0].offset + len(st) for row, st in zip(rows, stems))
    if written + sub.extra_tokens > engine.context_window:
        raise ContextTooLongError(
            written + sub.extra_tokens,
            engine.context_window,
            detail=f"The scored fields {list(names)} follow {written} tokens of prompt and "
            f"answer and need {sub.extra_tokens} more.",
        )
    if any(stems) and mode == "packed" and len(sub.chunks) == 1:
        kv, valid = _stack(rows)
        found, new = engine._parallel(
            [lambda: engine.passes.packed_after(sub, kv, valid, sub.chunks[0], stems)]
        )[0]
        for r, row in enumerate(rows):
            n = len(stems[r])
            if n:
                for c, (k, v) in zip(row.cache, new):
                    c.update_and_fetch(k[r : r + 1, :, :n], v[r : r + 1, :, :n])
            row.pending = []
        kv, valid = _stack(rows)
        edge, calls = packed_result(sub, [found], len(rows)), 1
    else:
        calls = _feed_pending(engine, rows)
        kv, valid = _stack(rows)
        edge, n_calls = engine._fields_pass(sub, kv, valid, mode)
        calls += n_calls
    asked = [list(sub.questions) for _ in rows]
    tries = [list(sub.tries) for _ in rows]
    within = answers.within(names)
    calls += engine._waves(sub, kv, valid, valid, mode, within.next_questions, edge, asked, tries)
    last = names[-1] == schema.fields[-1].name
    for r, row in enumerate(rows):
        items = list(zip(asked[r], tries[r], edge[r]))
        row.scored.extend(items)
        text = written_answers(schema, within.chosen(items))
        ids = () if last else tuple(engine.encode_ids(text))
        row.segments.append(Segment("scored", names, row.text, text, ids))
        row.text += text
        row.pending = [*row.pending, *ids]
    return calls
