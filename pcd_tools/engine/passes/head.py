"""The output head at a few vocabulary rows: the logits a field scored constrained reads.

A field scored constrained (`scoring="constrained"`, and a large field under `"auto"`)
normalises each trie node over its own allowed tokens, so the rest of the vocabulary
changes none of its scores. A pruned search reads such a field's nodes level by level
after a long prompt, and there the whole head is a large share of each position's work:
151,936 rows of 1,536 on a 1.5B, about a sixth of its products, for the 11 tokens a tariff
code's node allows. `head_at` computes those rows alone.

Every output of the head is its own row's product with the hidden state, so the rows
taken alone give that row's logit: bit for bit on the int8 kernels (each output column
is summed on its own, `_qgemm.c`), up to the float32 products' own rounding elsewhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..host.blas import import_mlx

mx = import_mlx()
import mlx.nn as nn  # noqa: E402

__all__ = ["head_at"]


def head_at(head: Any, x: Any, tokens: np.ndarray) -> np.ndarray:
    """`head(x)[..., tokens]` in float32, computing only those rows of the head.

    Args:
        head: The model's output head: a linear layer, or a tied embedding's
            `as_linear` (mlx's float or quantized layers, or a GGUF tensor's).
        x: Hidden states (..., D), an MLX array.
        tokens: Vocabulary ids, (U,) int.

    Returns:
        (..., U) float32 logits, as numpy.
    """
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    module = getattr(head, "__self__", head)  # a tied embedding's bound `as_linear`
    weight: Any = getattr(module, "weight", None)  # a GGUF layer's is a plain attribute
    if getattr(module, "gguf_encoded", False) and hasattr(weight, "take_rows"):
        from ..load.qlinear import product_at_rows

        return product_at_rows(module, x, ids)
    idx = mx.array(ids.astype(np.int32))
    quantized = isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    if quantized and getattr(module, "mode", "affine") == "affine":
        y = mx.quantized_matmul(
            x,
            weight[idx],
            module["scales"][idx],
            module["biases"][idx],
            transpose=True,
            group_size=module.group_size,
            bits=module.bits,
        )
    elif isinstance(module, (nn.Linear, nn.Embedding)) and not quantized:
        y = x @ weight[idx].T
    else:  # a head of another kind: the whole vocabulary (its bias included), the columns
        return np.array(head(x)[..., idx].astype(mx.float32))
    if isinstance(module, (nn.Linear, nn.QuantizedLinear)) and "bias" in module:
        y = y + module["bias"][idx]
    y = y.astype(mx.float32)
    mx.eval(y)
    return np.array(y)
