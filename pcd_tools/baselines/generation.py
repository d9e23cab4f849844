"""Autoregressive baselines that PCD is measured against (benchmarks and evals).

All three use exactly the PCD prompt, `plan.head_ids + encode(context) + plan.tail_ids`,
which ends with the answer's opening `{`, on the decider's own model and weights:

- `greedy_json`: argmax decoding until the JSON object closes (braces balance outside
  strings) or EOS.
- `constrained_json`: grammar-constrained decoding. The JSON schema of the PCD schema is
  compiled to a regex and a token index by `outlines-core`; its allowed-token sets mask
  the logits in our own MLX loop (outlines' and llguidance's MLX paths need Metal).
- `bare_prefill_ms`: one plain prefill of the whole prompt, the physical floor;
  `warm_prefill_ms`: the same for the part a warm request prefills (after the cached
  schema part).

The prompt runs through MLX; each generated token then takes one step through the same
decoder as PCD's generated fields: native int8 steps (`fast_decode`) where the engine
uses them (`decode="auto"` on CPU), MLX float32 otherwise, so comparisons stay like for
like. Native steps leave the MLX cache holding the prompt only.

With `prompt_cache=True` the generators reuse an mlx-lm `KVCache` of the schema part
(`plan.head_ids`), trimmed back after each call, as a production server would. The
grammar lives in `json_guide`, the reading of the answer in `json_answer`.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from .._lazy import mlx_lm_module
from ..engine.decode.generate import last_logits
from ..engine.host.blas import import_mlx
from ..errors import InvalidArgumentError
from ..prompt import field_suffix
from ..schema import Schema, compile_schema
from .json_answer import GenerationResult, ObjectScanner, build_result, token_spans
from .json_guide import WHITESPACE, guide_for, json_schema_of

if TYPE_CHECKING:
    from ..decide.decider import Decider

mx = import_mlx()

__all__ = [
    "WHITESPACE",
    "GenerationResult",
    "bare_prefill_ms",
    "constrained_json",
    "greedy_json",
    "json_schema_of",
    "warm_prefill_ms",
]

_HEAD_CACHES_PER_ENGINE = 4


# --- model plumbing ------------------------------------------------------------------------


class _Steps:
    """The one-token steps of a baseline after its prompt: native int8 steps where the
    engine decodes natively (`fast_decode`), as PCD's generated fields do, else MLX."""

    def __init__(self, decider: Decider, cache: list[Any], limit: int):
        from ..engine.decode.native_steps import decoder_for

        self.passes, self.cache = decider.engine.passes, cache
        decoder = decoder_for(decider.engine)
        self.native = decoder.stepper([cache], limit) if decoder is not None else None

    def __call__(self, t: int) -> Any:
        """Float32 logits, (V,), after token `t`."""
        if self.native is None:
            return last_logits(self.passes, [t], self.cache)
        return mx.array(self.native.step([t])[0])

    def close(self) -> None:
        if self.native is not None:
            self.native.close()


_HEADS: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[int, ...], list[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _prompt_cache(decider: Decider, head: list[int], use: bool) -> tuple[list[Any], int, int]:
    """A KV cache holding the schema part: (cache, tokens already in it, passes spent)."""
    make_prompt_cache = mlx_lm_module("models.cache").make_prompt_cache

    model = decider.loaded.model
    if not use:
        return make_prompt_cache(model), 0, 0
    per_engine = _HEADS.setdefault(decider.engine, OrderedDict())
    key = tuple(head)
    cache = per_engine.get(key)
    if cache is not None:
        per_engine.move_to_end(key)
        return cache, len(head), 0
    cache = make_prompt_cache(model)
    inner = decider.engine.passes.inner or model
    inner(mx.array([head], dtype=mx.int32), cache=cache)
    mx.eval([c.state for c in cache])
    per_engine[key] = cache
    while len(per_engine) > _HEAD_CACHES_PER_ENGINE:
        per_engine.popitem(last=False)
    return cache, len(head), 1


def _default_max_tokens(decider: Decider, schema: Schema) -> int:
    """Twice the tokens of the longest valid answer, plus slack (a generated field counts
    its token limit)."""
    from ..engine.decode.generate import DEFAULT_MAX_NEW_TOKENS

    enc = decider.engine.encode_ids
    longest = 0
    for f in schema.fields:
        if f.generation is not None:  # a generated field: its own token limit
            longest += len(enc(field_suffix(f))) + (
                f.generation.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
            )
            continue
        lit = max((c.literal for c in f.choices), key=lambda s: len(enc(s)))
        longest += len(enc(field_suffix(f) + lit + ","))
    return 2 * longest + 16


def _check_max(max_tokens: int | None, decider: Decider, schema: Schema) -> int:
    if max_tokens is None:
        return _default_max_tokens(decider, schema)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidArgumentError(f"max_tokens must be an int >= 1 or None; got {max_tokens!r}.")
    return max_tokens


# --- greedy --------------------------------------------------------------------------------


def greedy_json(
    decider: Decider,
    schema: Any,
    context: str,
    *,
    max_tokens: int | None = None,
    prompt_cache: bool = True,
) -> GenerationResult:
    """Greedy (argmax) JSON generation from the PCD prompt until the object closes.

    Args:
        decider: The decider whose model, tokenizer and prompt are used.
        schema: Anything `compile_schema` accepts.
        context: The text to decide on.
        max_tokens: Generation limit (default: twice the longest valid answer, plus 16).
        prompt_cache: Reuse a cached KV of the schema part of the prompt.

    Returns:
        The generated answer with its token count, passes and timings.
    """
    compiled = compile_schema(schema)
    limit = _check_max(max_tokens, decider, compiled)
    plan = decider.engine.plan(compiled)
    ctx = decider.engine.encode_ids(context)
    tok = decider.loaded.tokenizer
    eos = decider.loaded.eos_ids()
    with decider.engine.lock, decider.engine.request():
        t0 = time.perf_counter()
        cache, start, passes = _prompt_cache(decider, plan.head_ids, prompt_cache)
        prompt = plan.head_ids + ctx + plan.tail_ids
        try:
            logits = last_logits(decider.engine.passes, prompt[start:], cache)
            passes += 1
            step = _Steps(decider, cache, limit)
            ids: list[int] = []
            probs: list[float] = []
            scanner = ObjectScanner()
            text = ""
            t1 = 0.0
            while len(ids) < limit:
                nxt = mx.argmax(logits)
                lp = logits[nxt] - mx.logsumexp(logits)
                mx.eval(nxt, lp)
                if not t1:
                    t1 = time.perf_counter()
                t = int(nxt.item())
                if t in eos:
                    break
                ids.append(t)
                probs.append(float(np.exp(lp.item())))
                piece = tok.decode([t])
                close = scanner.feed(piece)
                if close is not None:
                    text += piece[:close]
                    break
                text += piece
                if len(ids) >= limit:
                    break
                logits = step(t)
                passes += 1
            t2 = time.perf_counter()
            t1 = t1 or t2
            step.close()
        finally:
            if prompt_cache:
                mlx_lm_module("models.cache").trim_prompt_cache(
                    cache, cache[0].offset - len(plan.head_ids)
                )
    text = tok.decode(ids)
    close = ObjectScanner().feed(text)
    if close is not None:
        text = text[:close]
    return build_result(compiled, text, token_spans(tok, ids), probs, passes, (t0, t1, t2))


# --- grammar-constrained -------------------------------------------------------------------


def constrained_json(
    decider: Decider,
    schema: Any,
    context: str,
    *,
    max_tokens: int | None = None,
    prompt_cache: bool = True,
) -> GenerationResult:
    """Grammar-constrained greedy generation of the schema's JSON from the PCD prompt.

    At every step only tokens the outlines-core index allows from the current state are
    considered; the answer therefore always matches the schema unless `max_tokens` cuts
    it. The index is built once per (schema, tokenizer) and is not timed.

    Args:
        decider: The decider whose model, tokenizer and prompt are used.
        schema: Anything `compile_schema` accepts.
        context: The text to decide on.
        max_tokens: Generation limit (default: twice the longest valid answer, plus 16).
        prompt_cache: Reuse a cached KV of the schema part of the prompt.

    Returns:
        The generated answer; `value_probs` are renormalised over the allowed tokens.
    """
    compiled = compile_schema(schema)
    limit = _check_max(max_tokens, decider, compiled)
    plan = decider.engine.plan(compiled)
    guide = guide_for(
        compiled, decider.loaded.tokenizer, decider.loaded.model, decider.loaded.eos_ids()
    )
    ctx = decider.engine.encode_ids(context)
    tok = decider.loaded.tokenizer
    index = guide.index
    with decider.engine.lock, decider.engine.request():
        t0 = time.perf_counter()
        cache, start, passes = _prompt_cache(decider, plan.head_ids, prompt_cache)
        prompt = plan.head_ids + ctx + plan.tail_ids
        try:
            logits = last_logits(decider.engine.passes, prompt[start:], cache)
            passes += 1
            step = _Steps(decider, cache, limit)
            state = guide.start
            ids: list[int] = []
            probs: list[float] = []
            t1 = 0.0
            while len(ids) < limit and not index.is_final_state(state):
                allowed = guide.allowed.get(state)
                if allowed is None:
                    allowed = mx.array(
                        [t for t in index.get_allowed_tokens(state) if t < logits.shape[0]],
                        dtype=mx.int32,
                    )
                    guide.allowed[state] = allowed
                sub = logits[allowed]
                best = mx.argmax(sub)
                lp = sub[best] - mx.logsumexp(sub)
                mx.eval(best, lp)
                if not t1:
                    t1 = time.perf_counter()
                t = int(allowed[best].item())
                ids.append(t)
                probs.append(float(np.exp(lp.item())))
                state = index.get_next_state(state, t)
                if state is None or index.is_final_state(state) or len(ids) >= limit:
                    break
                logits = step(t)
                passes += 1
            t2 = time.perf_counter()
            t1 = t1 or t2
            step.close()
        finally:
            if prompt_cache:
                mlx_lm_module("models.cache").trim_prompt_cache(
                    cache, cache[0].offset - len(plan.head_ids)
                )
    text = tok.decode(ids)
    return build_result(compiled, text, token_spans(tok, ids), probs, passes, (t0, t1, t2))


# --- floor ---------------------------------------------------------------------------------


def bare_prefill_ms(decider: Decider, schema: Any, context: str) -> float:
    """Wall time of one plain prefill of the exact PCD prompt, without any cache.

    The model runs over the whole prompt into a fresh KV cache and produces the last
    position's logits: the least work any method needs before its first answer token.
    """
    make_prompt_cache = mlx_lm_module("models.cache").make_prompt_cache

    compiled = compile_schema(schema)
    plan = decider.engine.plan(compiled)
    prompt = plan.head_ids + decider.engine.encode_ids(context) + plan.tail_ids
    with decider.engine.lock, decider.engine.request():
        t0 = time.perf_counter()
        cache = make_prompt_cache(decider.loaded.model)
        logits = last_logits(decider.engine.passes, prompt, cache)
        mx.eval(logits, [c.state for c in cache])
        return (time.perf_counter() - t0) * 1e3


def warm_prefill_ms(decider: Decider, schema: Any, context: str) -> float:
    """Wall time of one plain prefill of the part of the PCD prompt that a warm request
    prefills: the context and the answer start (`encode(context) + plan.tail_ids`), after
    the schema part's K/V (`plan.head_ids`) from the engine's prefix cache, last position's
    logits only.

    The floor of a warm request: what a warm `decide` prefills before (and, in one call,
    together with) its fields pass, without the fields. On a prefix-cache miss the schema
    part is prefilled and cached first, untimed, as a request would cache it.
    `bare_prefill_ms` is the cold floor (the whole prompt into a fresh cache).
    """
    compiled = compile_schema(schema)
    engine = decider.engine
    plan = engine.plan(compiled)
    ctx_ids = engine.encode_ids(context)
    engine.check_length(plan, ctx_ids)
    row = ctx_ids + list(plan.tail_ids)
    with engine.lock, engine.request(), mx.stream(engine.stream):
        prefix = engine.prefix_cache.get(plan.head_ids)
        if prefix is None:
            prefix = engine.passes.prefill([list(plan.head_ids)], None)
            engine.prefix_cache.put(plan.head_ids, prefix)
        t0 = time.perf_counter()
        engine.passes.prefill_with_logits([row], prefix, last=True)
        return (time.perf_counter() - t0) * 1e3
