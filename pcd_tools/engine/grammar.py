"""The JSON grammar of a schema, as outlines-core needs it.

The JSON schema of a PCD schema (`json_schema_of`) with the whitespace the answer layout
needs (`WHITESPACE`) is compiled by outlines-core to a regex and, over the bytes each
token id stands for (`token_bytes`), to a token index (`guide_for`). The grammar-
constrained baseline (`baseline.constrained_json`) masks its logits with that index.
"""

from __future__ import annotations

import contextlib
import json
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from ..schema import Schema

__all__ = ["WHITESPACE", "Guide", "guide_for", "json_schema_of", "token_bytes", "vocabulary"]

# Whitespace the grammar allows between JSON tokens: enough for the pretty-printed layout
# PCD scores (`{\n  "key": value,\n  ...\n}`), and no more, so the constraint cannot stall.
WHITESPACE = r"[\n ]{0,3}"


def json_schema_of(schema: Schema) -> dict[str, Any]:
    """The JSON schema of a PCD schema: required keys in order, enums of their labels (a
    multi-label field: an object of booleans, one per label)."""
    props: dict[str, Any] = {}
    for f in schema.fields:
        if f.generation is not None:
            props[f.name] = f.generation.json_schema(f.optional)
        elif f.kind == "boolean" and not f.optional:
            props[f.name] = {"type": "boolean"}
        elif f.kind == "multilabel":  # the layout PCD scores: each label's true or false
            labels = [str(label) for label in f.labels]
            props[f.name] = {
                "type": "object",
                "properties": {label: {"type": "boolean"} for label in labels},
                "required": labels,
                "additionalProperties": False,
            }
        else:
            props[f.name] = {"enum": list(f.labels)}
    return {
        "type": "object",
        "properties": props,
        "required": [f.name for f in schema.fields],
        "additionalProperties": False,
    }


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


# --- the token index -----------------------------------------------------------------------


@dataclass
class Guide:
    """The outlines-core token index of a schema's JSON, for one tokenizer.

    Args:
        index: The `outlines_core.Index`.
        start: The index state after the prompt's final `{`.
        allowed: State -> allowed token ids (an `mx.array`, EOS excluded), filled by the
            decoder as it meets states.
        build_ms: Wall time of building the index.
    """

    index: Any
    start: int
    allowed: dict[int, Any]
    build_ms: float


_GUIDES: weakref.WeakKeyDictionary[Any, OrderedDict[str, Guide]] = weakref.WeakKeyDictionary()
_VOCABS: weakref.WeakKeyDictionary[Any, tuple[frozenset[int], tuple[Any, int, int | None]]] = (
    weakref.WeakKeyDictionary()
)


def vocabulary(tokenizer: Any, model: Any, eos: frozenset[int]) -> tuple[Any, int, int | None]:
    """The outlines-core `Vocabulary` of a tokenizer (EOS ids left out), cached.

    Args:
        tokenizer: The model's tokenizer.
        model: The model; its `args.vocab_size` (logit rows) sizes the vocabulary.
        eos: Ids that end generation; no index ever allows them.

    Returns:
        The vocabulary, the number of logit rows, and the id of a single `{` token
        (None if the tokenizer has none).
    """
    import outlines_core

    hit = _VOCABS.get(tokenizer)
    if hit is not None and hit[0] == eos:
        return hit[1]
    n_vocab = int(getattr(getattr(model, "args", None), "vocab_size", 0) or 0) or len(
        token_bytes(tokenizer, tokenizer.vocab_size)
    )
    table = token_bytes(tokenizer, n_vocab)
    eos_id = min(eos) if eos else n_vocab
    vocab: dict[bytes, list[int]] = {}
    brace = None
    for i, b in enumerate(table):
        if b and i not in eos:
            vocab.setdefault(b, []).append(i)
            if b == b"{" and brace is None:
                brace = i
    out = (outlines_core.Vocabulary(eos_id, vocab), n_vocab, brace)
    with contextlib.suppress(TypeError):  # not weak-referenceable: rebuild next time
        _VOCABS[tokenizer] = (eos, out)
    return out


def guide_for(schema: Schema, tokenizer: Any, model: Any, eos: frozenset[int]) -> Guide:
    """The outlines-core index of `schema` for this tokenizer, built once and cached.

    Args:
        schema: The compiled schema.
        tokenizer: The model's tokenizer.
        model: The model; its `args.vocab_size` (logit rows) sizes the vocabulary.
        eos: Ids that end generation; the index never allows them.

    Raises:
        InvalidArgumentError: The tokenizer has no single `{` token.
    """
    import outlines_core

    per_tok = _GUIDES.setdefault(tokenizer, OrderedDict())
    key = schema.fingerprint()
    hit = per_tok.get(key)
    if hit is not None:
        per_tok.move_to_end(key)
        return hit
    t0 = time.perf_counter()
    vocab, _, brace = vocabulary(tokenizer, model, eos)
    if brace is None:
        raise InvalidArgumentError("the tokenizer has no single `{` token; cannot constrain.")
    regex = outlines_core.json_schema.build_regex_from_schema(
        json.dumps(json_schema_of(schema)), WHITESPACE
    )
    index = outlines_core.Index(regex, vocab)
    start = index.get_next_state(index.get_initial_state(), brace)
    guide = Guide(index, start, {}, (time.perf_counter() - t0) * 1e3)
    per_tok[key] = guide
    while len(per_tok) > 16:
        per_tok.popitem(last=False)
    return guide
