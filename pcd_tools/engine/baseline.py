"""Autoregressive baselines that PCD is measured against (benchmarks and evals).

All three use exactly the PCD prompt, `plan.head_ids + encode(context) + plan.tail_ids`,
which ends with the answer's opening `{`, on the decider's own model and weights:

- `greedy_json`: argmax decoding until the JSON object closes (braces balance outside
  strings) or EOS.
- `constrained_json`: grammar-constrained decoding. The JSON schema of the PCD schema is
  compiled to a regex and a token index by `outlines-core`; its allowed-token sets mask
  the logits in our own MLX loop (outlines' and llguidance's MLX paths need Metal).
- `bare_prefill_ms`: one plain prefill of the whole prompt, the physical floor.

With `prompt_cache=True` the generators reuse an mlx-lm `KVCache` of the schema part
(`plan.head_ids`), trimmed back after each call, as a production server would.
"""

from __future__ import annotations

import contextlib
import json
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError
from ..prompt import field_suffix
from ..schema import Schema, compile_schema
from .platform import import_mlx

if TYPE_CHECKING:
    from ..decider import Decider

mx = import_mlx()

__all__ = [
    "WHITESPACE",
    "GenerationResult",
    "bare_prefill_ms",
    "constrained_json",
    "greedy_json",
    "json_schema_of",
]

# Whitespace the grammar allows between JSON tokens: enough for the pretty-printed layout
# PCD scores (`{\n  "key": value,\n  ...\n}`), and no more, so the constraint cannot stall.
WHITESPACE = r"[\n ]{0,3}"
_HEAD_CACHES_PER_ENGINE = 4


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


# --- model plumbing ------------------------------------------------------------------------


def _split(model: Any) -> tuple[Any, Any]:
    """(transformer, head) when the model splits that way, so only needed logits are made."""
    inner = getattr(model, "model", None)
    if inner is None or not callable(inner):
        return None, None
    if hasattr(model, "lm_head"):
        return inner, model.lm_head
    if getattr(getattr(model, "args", None), "tie_word_embeddings", False):
        return inner, inner.embed_tokens.as_linear
    return None, None


def _last_logits(model: Any, tokens: Sequence[int], cache: list[Any]) -> Any:
    """Runs `tokens` through the model with `cache`; float32 logits of the last one, (V,)."""
    inner, head = _split(model)
    x = mx.array([list(tokens)], dtype=mx.int32)
    if inner is not None:
        return head(inner(x, cache=cache)[:, -1, :])[0].astype(mx.float32)
    return model(x, cache=cache)[0, -1, :].astype(mx.float32)


_HEADS: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[int, ...], list[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _prompt_cache(decider: Decider, head: list[int], use: bool) -> tuple[list[Any], int, int]:
    """A KV cache holding the schema part: (cache, tokens already in it, passes spent)."""
    from mlx_lm.models.cache import make_prompt_cache

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
    inner = _split(model)[0] or model
    inner(mx.array([head], dtype=mx.int32), cache=cache)
    mx.eval([c.state for c in cache])
    per_engine[key] = cache
    while len(per_engine) > _HEAD_CACHES_PER_ENGINE:
        per_engine.popitem(last=False)
    return cache, len(head), 1


def _eos_ids(decider: Decider) -> frozenset[int]:
    ids: Any = decider.loaded.eos_token_ids or getattr(
        decider.loaded.tokenizer, "eos_token_ids", None
    )
    return frozenset(int(i) for i in ids or ())


def _default_max_tokens(decider: Decider, schema: Schema) -> int:
    """Twice the tokens of the longest valid answer, plus slack."""
    enc = decider.engine.encode_ids
    longest = 0
    for f in schema.fields:
        lit = max((c.literal for c in f.choices), key=lambda s: len(enc(s)))
        longest += len(enc(field_suffix(f) + lit + ","))
    return 2 * longest + 16


# --- token bytes ---------------------------------------------------------------------------


def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: vocabulary character -> byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTES: weakref.WeakKeyDictionary[Any, list[bytes | None]] = weakref.WeakKeyDictionary()


def token_bytes(tokenizer: Any, n_vocab: int) -> list[bytes | None]:
    """The bytes each token id stands for (None for special or unknown ids), cached.

    Byte-level BPE (`Ġ`) and SentencePiece (`▁`, `<0xNN>`) vocabularies are read exactly
    from `id_to_token`; other tokenizers fall back to decoding each id alone.
    """
    hit = _BYTES.get(tokenizer)
    if hit is not None and len(hit) == n_vocab:
        return hit
    out: list[bytes | None] = [None] * n_vocab
    id_to_token = getattr(tokenizer, "id_to_token", None)
    backend = getattr(tokenizer, "backend", None)
    if id_to_token is not None:
        special = set(backend.get_added_tokens_decoder()) if backend is not None else set()
        probe = id_to_token(tokenizer.encode(" the")[0])
        byte_level = probe.startswith("Ġ")
        dec = _gpt2_byte_decoder()
        for i in range(min(n_vocab, tokenizer.vocab_size)):
            if i in special:
                continue
            tok = id_to_token(i)
            if byte_level:
                if all(ch in dec for ch in tok):
                    out[i] = bytes(dec[ch] for ch in tok)
            elif len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
                out[i] = bytes([int(tok[3:5], 16)])
            else:
                out[i] = tok.replace("▁", " ").encode("utf-8")
    else:
        for i in range(n_vocab):
            try:
                s = tokenizer.decode([i])
            except Exception:
                continue
            if s and "\ufffd" not in s:
                out[i] = s.encode("utf-8")
    with contextlib.suppress(TypeError):  # not weak-referenceable: recompute next time
        _BYTES[tokenizer] = out
    return out


# --- result analysis -----------------------------------------------------------------------


def _value_spans(json_text: str) -> dict[str, tuple[int, int]]:
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


def _finish(
    schema: Schema,
    text: str,
    token_spans: list[tuple[int, int]],
    probs: list[float],
    passes: int,
    times: tuple[float, float, float],
) -> GenerationResult:
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
        and all(_is_label(obj[f.name], f.labels) for f in schema.fields)
    )
    values = {n: obj[n] for n in names} if match and isinstance(obj, dict) else None
    value_probs = None
    if match and probs:
        value_probs = {}
        for name, (s, e) in _value_spans(json_text).items():
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


class _Scanner:
    """Tracks JSON nesting outside strings; `feed` returns where the object closed."""

    def __init__(self) -> None:
        self.depth, self.in_str, self.esc = 1, False, False

    def feed(self, s: str) -> int | None:
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
    eos = _eos_ids(decider)
    with decider.engine.lock, decider.engine.kernels():
        t0 = time.perf_counter()
        cache, start, passes = _prompt_cache(decider, plan.head_ids, prompt_cache)
        prompt = plan.head_ids + ctx + plan.tail_ids
        try:
            logits = _last_logits(decider.loaded.model, prompt[start:], cache)
            passes += 1
            ids: list[int] = []
            probs: list[float] = []
            scanner = _Scanner()
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
                logits = _last_logits(decider.loaded.model, [t], cache)
                passes += 1
            t2 = time.perf_counter()
            t1 = t1 or t2
        finally:
            if prompt_cache:
                from mlx_lm.models.cache import trim_prompt_cache

                trim_prompt_cache(cache, cache[0].offset - len(plan.head_ids))
    text = tok.decode(ids)
    close = _Scanner().feed(text)
    if close is not None:
        text = text[:close]
    return _finish(compiled, text, _spans(tok, ids), probs, passes, (t0, t1, t2))


def _spans(tok: Any, ids: list[int]) -> list[tuple[int, int]]:
    """Character span of each generated token within `"{" + text`."""
    spans, prev = [], 1
    for k in range(len(ids)):
        end = 1 + len(tok.decode(ids[: k + 1]))
        spans.append((prev, end))
        prev = end
    return spans


# --- grammar-constrained -------------------------------------------------------------------


def json_schema_of(schema: Schema) -> dict[str, Any]:
    """The JSON schema of a PCD schema: required keys in order, enums of their labels."""
    props: dict[str, Any] = {}
    for f in schema.fields:
        if f.kind == "boolean" and not f.optional:
            props[f.name] = {"type": "boolean"}
        else:
            props[f.name] = {"enum": list(f.labels)}
    return {
        "type": "object",
        "properties": props,
        "required": [f.name for f in schema.fields],
        "additionalProperties": False,
    }


@dataclass
class _Guide:
    index: Any
    start: int  # state after the prompt's "{"
    allowed: dict[int, Any]  # state -> mx.array of allowed ids (EOS excluded)
    build_ms: float


_GUIDES: weakref.WeakKeyDictionary[Any, OrderedDict[str, _Guide]] = weakref.WeakKeyDictionary()


def _guide(decider: Decider, schema: Schema) -> _Guide:
    """The outlines-core index of `schema` for this tokenizer, built once and cached."""
    import outlines_core

    per_tok = _GUIDES.setdefault(decider.loaded.tokenizer, OrderedDict())
    key = schema.fingerprint()
    hit = per_tok.get(key)
    if hit is not None:
        per_tok.move_to_end(key)
        return hit
    t0 = time.perf_counter()
    n_vocab = int(getattr(decider.loaded.model.args, "vocab_size", 0)) or len(
        token_bytes(decider.loaded.tokenizer, decider.loaded.tokenizer.vocab_size)
    )
    table = token_bytes(decider.loaded.tokenizer, n_vocab)
    eos = _eos_ids(decider)
    eos_id = min(eos) if eos else n_vocab
    vocab: dict[bytes, list[int]] = {}
    brace = None
    for i, b in enumerate(table):
        if b and i not in eos:
            vocab.setdefault(b, []).append(i)
            if b == b"{" and brace is None:
                brace = i
    if brace is None:
        raise InvalidArgumentError("the tokenizer has no single `{` token; cannot constrain.")
    regex = outlines_core.json_schema.build_regex_from_schema(
        json.dumps(json_schema_of(schema)), WHITESPACE
    )
    index = outlines_core.Index(regex, outlines_core.Vocabulary(eos_id, vocab))
    start = index.get_next_state(index.get_initial_state(), brace)
    guide = _Guide(index, start, {}, (time.perf_counter() - t0) * 1e3)
    per_tok[key] = guide
    while len(per_tok) > 16:
        per_tok.popitem(last=False)
    return guide


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
    guide = _guide(decider, compiled)
    ctx = decider.engine.encode_ids(context)
    tok = decider.loaded.tokenizer
    index = guide.index
    with decider.engine.lock, decider.engine.kernels():
        t0 = time.perf_counter()
        cache, start, passes = _prompt_cache(decider, plan.head_ids, prompt_cache)
        prompt = plan.head_ids + ctx + plan.tail_ids
        try:
            logits = _last_logits(decider.loaded.model, prompt[start:], cache)
            passes += 1
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
                logits = _last_logits(decider.loaded.model, [t], cache)
                passes += 1
            t2 = time.perf_counter()
            t1 = t1 or t2
        finally:
            if prompt_cache:
                from mlx_lm.models.cache import trim_prompt_cache

                trim_prompt_cache(cache, cache[0].offset - len(plan.head_ids))
    text = tok.decode(ids)
    return _finish(compiled, text, _spans(tok, ids), probs, passes, (t0, t1, t2))


# --- floor ---------------------------------------------------------------------------------


def bare_prefill_ms(decider: Decider, schema: Any, context: str) -> float:
    """Wall time of one plain prefill of the exact PCD prompt, without any cache.

    The model runs over the whole prompt into a fresh KV cache and produces the last
    position's logits: the least work any method needs before its first answer token.
    """
    from mlx_lm.models.cache import make_prompt_cache

    compiled = compile_schema(schema)
    plan = decider.engine.plan(compiled)
    prompt = plan.head_ids + decider.engine.encode_ids(context) + plan.tail_ids
    with decider.engine.lock, decider.engine.kernels():
        t0 = time.perf_counter()
        cache = make_prompt_cache(decider.loaded.model)
        logits = _last_logits(decider.loaded.model, prompt, cache)
        mx.eval(logits, [c.state for c in cache])
        return (time.perf_counter() - t0) * 1e3
