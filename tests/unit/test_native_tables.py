"""The Python twins of the C headers cannot drift: `kernels.gguf_types` against
`gguf_blocks.h` (type ids, block sizes and bytes) and `kernels.paths` against
`cpu_paths.h` (the path ids). The headers are read as text; nothing is compiled."""

from __future__ import annotations

import re
from pathlib import Path

from pcd_tools.engine.kernels.gguf_types import GGUF_TYPES, block_of, type_name
from pcd_tools.engine.kernels.paths import BITS, PATHS, path_name

KERNELS = Path(__file__).resolve().parents[2] / "pcd_tools" / "engine" / "kernels"


def _enum(text: str, prefix: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(rf"\b{prefix}(\w+)\s*=\s*(\d+)", text)}


def _header_blocks(text: str) -> dict[int, tuple[int, int]]:
    """gguf_block_bytes's switch: type id -> (weights, bytes), each case under the *per
    set before its switch."""
    ids = _enum(text, "GGUF_")
    body = text[text.index("static inline int gguf_block_bytes") :]
    body = body[: body.index("\n}\n")]
    out: dict[int, tuple[int, int]] = {}
    per = 0
    for line in body.splitlines():
        if m := re.search(r"\*per = (\w+);", line):
            per = {"GGUF_QK_K": 256, "GGUF_QK": 32}.get(m[1], 0)
        if m := re.search(r"case GGUF_(\w+): return (\d+);", line):
            out[ids[m[1]]] = (per, int(m[2]))
    return out


def test_gguf_types_equal_gguf_blocks_h():
    text = (KERNELS / "gguf_blocks.h").read_text()
    ids = _enum(text, "GGUF_")
    assert "QK" not in ids  # the enum, not the #defines
    assert {n: v[0] for n, v in GGUF_TYPES.items()} == ids
    blocks = _header_blocks(text)
    quantized = {v[0]: (v[1], v[2]) for v in GGUF_TYPES.values() if v[1] > 1}
    assert quantized == blocks
    assert len(blocks) == 10
    for name, (tid, per, nbytes) in GGUF_TYPES.items():
        assert type_name(tid) == name
        assert block_of(tid) == (nbytes, per)


def test_gguf_types_equal_gguf_py():
    gguf = __import__("pytest").importorskip("gguf")
    for name, (tid, per, nbytes) in GGUF_TYPES.items():
        t = gguf.GGMLQuantizationType[name]
        assert int(t) == tid, name
        assert gguf.GGML_QUANT_SIZES[t] == (per, nbytes), name


def test_path_names_equal_cpu_paths_h():
    ids = _enum((KERNELS / "cpu_paths.h").read_text(), "PCD_PATH_")
    assert {n.lower(): v for n, v in ids.items()} == PATHS
    assert all(path_name(v) == n for n, v in PATHS.items())
    assert set(BITS) <= set(PATHS.values())


def test_every_c_source_dispatches_through_cpu_paths_h():
    """One dispatch style: each C source with SIMD kernels includes cpu_paths.h, and none
    asks the CPU about a feature itself."""
    for src in sorted(KERNELS.glob("_*.c")):
        text = src.read_text()
        assert '#include "cpu_paths.h"' in text, src.name
        assert "__builtin_cpu_supports" not in text, src.name
