"""The GGUF (ggml) tensor types the native code reads: one Python table, the twin of
`gguf_blocks.h` (a test parses the header and checks that the two agree)."""

from __future__ import annotations

__all__ = ["GGUF_TYPES", "K_QUANTS", "block_of", "type_name"]

#: ggml type name -> (type id, weights per block, bytes per block); F32, F16 and BF16 are
#: one weight a "block"
GGUF_TYPES: dict[str, tuple[int, int, int]] = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q2_K": (10, 256, 84),
    "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
    "BF16": (30, 1, 2),
}

#: the K-quant types with 6-bit or int8 sub-block scales (the int8 kernels' K mode)
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")

_BY_ID = {v[0]: (k, v[1], v[2]) for k, v in GGUF_TYPES.items()}


def type_name(type_id: int) -> str | None:
    """The name of ggml type id `type_id`, None if not in the table."""
    hit = _BY_ID.get(int(type_id))
    return hit[0] if hit else None


def block_of(type_id: int) -> tuple[int, int]:
    """(bytes, weights) of one block of ggml type id `type_id` (KeyError if unknown)."""
    _, per, nbytes = _BY_ID[int(type_id)]
    return nbytes, per
