"""The tokenizer of a GGUF file, rebuilt with `tokenizers` from its metadata.

transformers' GGUF path needs torch, so the vocabulary, the merges and the model's
pre-tokenizer (`tokenizer.ggml.pre`: SmolLM2 splits digits one by one, Llama 3 and Qwen2
use their own regexes) are reproduced here, together with the Jinja chat template.
"""

from __future__ import annotations

import json
import warnings
from datetime import datetime
from typing import Any

from pcd_tools.errors import ModelLoadError

__all__ = ["GGUFTokenizer"]

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_SPLIT_PRE = {"llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
_DIGIT_PRE = ("smollm", "starcoder", "refact")  # single digits, then GPT-2's regex
_GPT2_PRE = ("gpt-2", "default")
_END_TOKENS = (
    "<|im_end|> <|endoftext|> <|eot_id|> <|end_of_text|> <|eom_id|> <|end|> </s> <end_of_turn>"
)


def _bpe(meta: dict[str, Any], pre: str) -> tuple[Any, Any, Any]:
    """Model, pre-tokenizer and decoder of a byte-level BPE (`"gpt2"`) vocabulary."""
    from tokenizers import Regex, decoders, models
    from tokenizers import pre_tokenizers as pt

    tokens = meta["tokenizer.ggml.tokens"]
    vocab = dict(zip(tokens, range(len(tokens)), strict=True))  # a repeated token: its last id
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    model = models.BPE(vocab, merges, ignore_merges=pre in ("llama-bpe", "smaug-bpe"))
    byte_level: Any = pt.ByteLevel(add_prefix_space=False, use_regex=pre not in _SPLIT_PRE)
    if pre in _DIGIT_PRE:
        pre_tok = pt.Sequence([pt.Digits(individual_digits=True), byte_level])
    elif pre in _SPLIT_PRE:
        pre_tok = pt.Sequence([pt.Split(Regex(_SPLIT_PRE[pre]), "isolated"), byte_level])
    else:
        pre_tok = byte_level
    return model, pre_tok, decoders.ByteLevel()


def _sentencepiece(meta: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Model, pre-tokenizer and decoder of a SentencePiece BPE (`"llama"`) vocabulary."""
    from tokenizers import decoders, models, pre_tokenizers

    tokens = meta["tokenizer.ggml.tokens"]
    scores = meta.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    # SentencePiece stores no merges: each split of a piece into two pieces is one, ranked
    # by the merged piece's score, then its id, then the ids of its halves (the order of
    # transformers' SentencePieceExtractor).
    splits, get = [], vocab.get
    for tok, i in vocab.items():
        for k in range(1, len(tok)):
            if (a := get(tok[:k])) is not None and (b := get(tok[k:])) is not None:
                splits.append((-scores[i], i, a, b))
    splits.sort()
    merges = [(tokens[a], tokens[b]) for _, _, a, b in splits]
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk] if unk is not None else None
    model = models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
    pre_tok = pre_tokenizers.Metaspace(prepend_scheme="first" if prefix else "never", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    return model, pre_tok, decoders.Sequence(steps + [decoders.Strip(" ", 1, 0)] * prefix)


class GGUFTokenizer:
    """A `tokenizers` tokenizer rebuilt from GGUF metadata, with the model's chat template.

    Args:
        meta: The GGUF metadata (`tokenizer.ggml.*` and `tokenizer.chat_template`).
        source: The file it came from, for messages.

    Attributes:
        backend: The underlying `tokenizers.Tokenizer`.
        bos_token_id: The BOS id, if the file declares one.
        eos_token_id: The EOS id, if the file declares one.
        eos_token_ids: Ids that end a turn: EOS/EOT ids and tokens like `<|im_end|>`.
        add_bos: Whether the model expects BOS first. `encode` never adds it.
        chat_template: The Jinja chat template, if any.
        pre: The pre-tokenizer reproduced (`tokenizer.ggml.pre`, "default" if unknown).

    Raises:
        ModelLoadError: The vocabulary type is neither "gpt2" nor "llama".
    """

    def __init__(self, meta: dict[str, Any], *, source: str | None = None):
        from tokenizers import AddedToken, Tokenizer

        kind, self.pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
        if kind == "gpt2":
            if self.pre not in (*_DIGIT_PRE, *_SPLIT_PRE, *_GPT2_PRE):
                warnings.warn(
                    f"{source}: unknown tokenizer.ggml.pre {self.pre!r}; using GPT-2's regex, "
                    "so some text may tokenize differently than in llama.cpp.",
                    stacklevel=2,
                )
                self.pre = "default"
            model, pre_tok, decoder = _bpe(meta, self.pre)
        elif kind == "llama":
            model, pre_tok, decoder = _sentencepiece(meta)
        else:
            raise ModelLoadError(
                f"{source!r} has a {kind!r} tokenizer; pcd-tools rebuilds only 'gpt2' "
                "(byte-level BPE) and 'llama' (SentencePiece) tokenizers from GGUF.",
                source=source,
            )
        self.backend = Tokenizer(model)
        self.backend.pre_tokenizer, self.backend.decoder = pre_tok, decoder
        tokens = meta["tokenizer.ggml.tokens"]
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        # CONTROL (3) and USER_DEFINED (4) tokens: matched whole before BPE, kept by decode.
        added = [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=False)
            if ty in (3, 4)
        ]
        self.backend.add_special_tokens(added)
        self.bos_token_id: int | None = meta.get("tokenizer.ggml.bos_token_id")
        self.eos_token_id: int | None = meta.get("tokenizer.ggml.eos_token_id")
        ids = {meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
        ids |= {self.backend.token_to_id(t) for t in _END_TOKENS.split()}
        self.eos_token_ids: set[int] = {i for i in ids if i is not None}
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama"))
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        self._template: Any = None

    @property
    def vocab_size(self) -> int:
        """Number of tokens in the vocabulary, special tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token text maps to its one id. No BOS is added."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included."""
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry such as "Ġhello", or None."""
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        """Vocabulary entry of an id, as the GGUF file spells it.

        Raises:
            IndexError: The id is outside the vocabulary.
        """
        if (token := self.backend.id_to_token(token_id)) is None:
            raise IndexError(f"Token id {token_id} is outside the vocabulary of {self.vocab_size}")
        return token

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render `messages` with the model's chat template in a sandboxed Jinja env.

        `enable_thinking` is False unless given: a template that reads it (Qwen3's) then
        opens the answer without a reasoning block, as PCD scores the answer directly.

        Args:
            messages: Chat messages, each with "role" and "content".
            add_generation_prompt: Whether to open the assistant turn at the end.
            **kwargs: Extra template variables, e.g. `tools` or `enable_thinking`.

        Raises:
            ModelLoadError: The GGUF file has no chat template.
        """
        if self.chat_template is None:
            raise ModelLoadError(
                "This GGUF file has no tokenizer.chat_template; use the GGUF of an instruct "
                "model, which ships one."
            )
        if self._template is None:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
                x, ensure_ascii=False, indent=indent
            )
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        bos, eos = (
            "" if i is None else self.id_to_token(i) for i in (self.bos_token_id, self.eos_token_id)
        )
        kwargs.setdefault("enable_thinking", False)
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
            **kwargs,
        )
