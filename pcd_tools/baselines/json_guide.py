"""The JSON grammar of a schema as an outlines-core token index, for the constrained
baselines.

The JSON schema of a PCD schema (`json_schema_of`) with the whitespace the answer layout
needs (`WHITESPACE`) is compiled by outlines-core to a regex and, over the bytes each
token id stands for (`engine.decode.vocabulary`), to a token index (`guide_for`). The
grammar-constrained baseline (`generation.constrained_json`) masks its logits with that
index; the llama.cpp peer gets the same JSON schema.
"""

from __future__ import annotations

import json
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..engine.decode.vocabulary import vocabulary
from ..errors import InvalidArgumentError
from ..schema import Schema

__all__ = ["WHITESPACE", "Guide", "guide_for", "json_schema_of"]

# Whitespace the grammar allows between JSON tokens: enough for the pretty-printed layout
# PCD scores (`{\n  "key": value,\n  ...\n}`), and no more, so the constraint cannot stall.
WHITESPACE = r"[\n ]{0,3}"


def json_schema_of(schema: Schema) -> dict[str, Any]:
    """The JSON schema of a PCD schema: required keys in order, enums of their labels (a
    multi-label field: an object of booleans, one per label; read ranked: an array of
    its labels)."""
    props: dict[str, Any] = {}
    for f in schema.fields:
        if f.generation is not None:
            props[f.name] = f.generation.json_schema(f.optional)
        elif f.kind == "boolean" and not f.optional:
            props[f.name] = {"type": "boolean"}
        elif f.reading == "ranked":  # the layout PCD scores: a list of labels
            props[f.name] = _set(
                {
                    "type": "array",
                    "items": {"enum": list(f.labels)},
                    "minItems": f.min_labels or None,
                    "maxItems": f.max_labels,
                }
            )
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


def _set(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


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
