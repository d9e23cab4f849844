"""The CPU code paths of the engine's C libraries, by name: one table for all of them.

Every C source dispatches the same way (`cpu_paths.h`): a kernel family is a table indexed
by a path id, with the portable C reference at ``scalar``; an entry point takes
``PATHS["auto"]`` (0, the best this CPU runs) or a path id to force (tests). The ids are
`cpu_paths.h`'s ``PCD_PATH_*`` (a test reads the header and checks this table against it).
"""

from __future__ import annotations

import os

from pcd_tools.errors import InvalidArgumentError

__all__ = ["BITS", "PATHS", "decode_isa", "path_name"]

#: path name -> its ``PCD_PATH_*`` id in cpu_paths.h
PATHS: dict[str, int] = {
    "auto": 0,
    "scalar": 1,
    "avx2": 2,
    "avxvnni": 3,
    "avx512vnni": 4,
    "avx512bf16": 5,
    "avx512": 6,
    "amx": 7,
}

#: vector width in bits of the float paths (1: portable C), as the native decode and the
#: CPU kernels report their path
BITS: dict[int, int] = {PATHS["scalar"]: 1, PATHS["avx2"]: 256, PATHS["avx512"]: 512}

_NAMES = {v: k for k, v in PATHS.items()}


def path_name(path: int) -> str:
    """The name of path id `path` (``auto`` for 0)."""
    return _NAMES[int(path)]


# `PCD_DECODE_ISA` / `isa=` values (and the widths the native decode reports) -> path names
_ISAS = {"auto": "auto", "avx512": "avx512", "512": "avx512", "avx2": "avx2", "256": "avx2"}
_ISAS.update({"scalar": "scalar", "1": "scalar"})


def decode_isa(isa: str | int | None = None) -> int:
    """The native decode's instruction set: `isa`, else `$PCD_DECODE_ISA` (`auto`, `avx512`,
    `avx2`, `scalar`), as the library's path id (0 = pick at run time)."""
    if isa is None:
        isa = os.environ.get("PCD_DECODE_ISA", "auto")
    key = str(isa).strip().lower()
    if key not in _ISAS:
        raise InvalidArgumentError(
            f"decode ISA {isa!r} is not known; accepted: {sorted(set(_ISAS) - {'512', '256', '1'})}"
        )
    return PATHS[_ISAS[key]]
