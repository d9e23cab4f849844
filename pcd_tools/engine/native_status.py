"""What decodes generated fields on this machine, for `pcd models --doctor`."""

from __future__ import annotations

import os

from ..errors import InvalidArgumentError, NativeBuildError
from .decode_parts import _default_threads, _isa_from_env, check_weights
from .fast_decode import check_decode
from .native import load_decode_kernels

__all__ = ["decode_status"]


def decode_status() -> str:
    """What decodes generated fields here, for `pcd models --doctor`: the mode
    (`$PCD_DECODE`, else "auto") and whether `_decode.c` builds and loads, with its ISA
    path and threads; on failure, what runs instead and why."""
    try:
        mode = check_decode(None)
        weights = check_weights(None)
    except InvalidArgumentError as e:
        return f"error: {e}"
    if mode == "mlx":
        return "mlx: MLX float32 steps (PCD_DECODE=mlx)"
    try:
        lib = load_decode_kernels()
        isa = int(lib.pcd_decode_path(_isa_from_env(None)))
    except (NativeBuildError, InvalidArgumentError) as e:
        if mode == "int8":
            return f"int8: unavailable, decode='int8' raises DecodeUnavailableError: {e}"
        return f"auto: MLX float32 steps (native int8 decode unavailable: {e})"
    if not isa:
        return f"{mode}: the ISA PCD_DECODE_ISA={os.environ.get('PCD_DECODE_ISA')!r} is not on this CPU"
    name = {512: "AVX-512", 256: "AVX2+FMA", 1: "portable C"}.get(isa, str(isa))
    reads = {
        "auto": "a GGUF kept encoded read from its file blocks with 8-bit activations where "
        "it computes in int8, or when an 8-bit copy would need over a quarter of the "
        "available memory; else the copy",
        "file": "a GGUF kept encoded read from its file blocks",
        "copy": "an 8-bit copy of the weights",
    }[weights]
    return (
        f"{mode}: native int8 steps ({name}, {_default_threads()} threads) on CPU engines "
        f"of llama / qwen2 models, weights={weights}: {reads}; MLX float32 steps elsewhere"
    )
