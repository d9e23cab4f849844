"""The arithmetic of a pass: how many floating-point operations a prefill or a packed
fields pass costs on a loaded model, so that benchmarks can report rates (GFLOP/s).

Three numbers describe a decoder-only transformer for this purpose
(BENCHMARKS.md, "The arithmetic"):

- per token, the linear maps of every layer: 2 x inputs x outputs each;
- per (query, key) pair, the attention of every layer: 4 x query width (the scores and
  the product with the values);
- per position whose logits are read, the LM head: 2 x vocabulary x hidden size.

Norms, RoPE, residual adds and the softmax are left out: they are a few per cent of a
pass, and leaving them out makes a rate a lower bound of the work done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Arithmetic", "arithmetic", "linear_flops"]


@dataclass(frozen=True)
class Arithmetic:
    """FLOP counts of one model.

    Args:
        linear_per_token: All layers' linear maps, per token.
        attention_per_pair: All layers' attention, per (query, key) pair.
        head_per_position: The LM head, per position whose logits are read.
        layers: The number of transformer layers.
    """

    linear_per_token: float
    attention_per_pair: float
    head_per_position: float
    layers: int

    def prefill(self, tokens: int, cached: int = 0, head_positions: int = 0) -> float:
        """FLOPs of a causal prefill of `tokens` after `cached` tokens of KV cache.

        The masked half of the causal square is not computed (the engine's attention
        skips it), so each new token attends to the cache and to itself and its
        predecessors.
        """
        pairs = tokens * cached + tokens * (tokens + 1) / 2
        return (
            tokens * self.linear_per_token
            + pairs * self.attention_per_pair
            + head_positions * self.head_per_position
        )

    def packed(self, chunks: Sequence[Any], prompt: int) -> float:
        """FLOPs of the packed fields passes of `chunks` (`pack.Chunk`) after a prompt of
        `prompt` tokens: every pack token attends to the whole prompt and to the pack
        tokens its mask allows; the head runs at each chunk's slots."""
        total = 0.0
        for ch in chunks:
            t = len(ch.tokens)
            pairs = t * prompt + int(np.count_nonzero(ch.allow))
            total += (
                t * self.linear_per_token
                + pairs * self.attention_per_pair
                + len(ch.slots) * self.head_per_position
            )
        return total


def _dims(module: Any) -> tuple[int, int] | None:
    """(inputs, outputs) of a linear map, plain or quantized; None for anything else."""
    weight = getattr(module, "weight", None)
    if weight is None or getattr(weight, "ndim", 0) != 2:
        return None
    name = type(module).__name__
    if name in ("Linear", "Embedding", "GGUFLinear", "GGUFEmbedding"):
        return int(weight.shape[1]), int(weight.shape[0])
    if name in ("QuantizedLinear", "QuantizedEmbedding"):
        return int(module.scales.shape[1] * module.group_size), int(weight.shape[0])
    return None


def linear_flops(module: Any) -> float:
    """FLOPs per token of one module: 2 x inputs x outputs for a linear map, plain or
    quantized; 0 for anything else (norms, embeddings)."""
    if "Linear" not in type(module).__name__:
        return 0.0
    dims = _dims(module)
    return 0.0 if dims is None else 2.0 * dims[0] * dims[1]


def arithmetic(model: Any) -> Arithmetic | None:
    """The FLOP counts of an mlx-lm model, or None for a layout this does not know.

    Args:
        model: An mlx-lm model with `model.layers` whose attention modules have a
            `q_proj` (llama-like architectures, which are the packable ones).
    """
    inner = getattr(model, "model", None)
    layers = list(getattr(inner, "layers", None) or [])
    if not layers:
        return None
    linear = 0.0
    attention = 0.0
    for layer in layers:
        q_dims = _dims(getattr(getattr(layer, "self_attn", None), "q_proj", None))
        if q_dims is None:
            return None
        attention += 4.0 * q_dims[1]
        linear += sum(linear_flops(m) for _, m in layer.named_modules())
    head = getattr(model, "lm_head", None)
    dims = _dims(head) if head is not None else _dims(getattr(inner, "embed_tokens", None))
    if dims is None:
        return None
    return Arithmetic(linear, attention, 2.0 * dims[0] * dims[1], len(layers))
