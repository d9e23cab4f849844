"""The bytes each token id stands for, and the outlines-core vocabulary built from them.

A generated field is decoded under a token index (`generate.field_guide`); outlines-core
builds that index over a `Vocabulary` mapping byte strings to token ids. `token_bytes`
reads what each id writes (byte-level BPE, SentencePiece byte fallback, plain strings);
`vocabulary` builds and caches the `Vocabulary` of a tokenizer, EOS ids left out.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

__all__ = ["token_bytes", "vocabulary"]


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
