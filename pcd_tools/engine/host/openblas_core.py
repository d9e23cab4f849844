"""Which kernels an OpenBLAS library runs on this CPU, and whether they are too old for it.

An OpenBLAS built with `DYNAMIC_ARCH` picks its kernels when it loads, from the CPU's
family and model. A library older than the CPU does not know its model and falls back to
a generic x86-64 core. Measured here: Debian 12's `libopenblas0-pthread` 0.3.21 runs its
`Prescott` (SSE3) kernels on a Xeon with AVX-512 (family 6, model 207), while pip
`scipy-openblas32` 0.3.34 runs `SkylakeX` ones on the same machine; every PCD pass was
about 3x slower through the first. So a candidate library is asked which core it chose
(`openblas_get_corename`) before it is bound, and one that runs kernels below what the CPU
can do (SSE-era kernels on an AVX2 CPU, say) is passed over for the next candidate.

Core names OpenBLAS does not list here are taken as good: a newer library may name newer
cores.
"""

from __future__ import annotations

import ctypes
import platform
from functools import lru_cache
from pathlib import Path
from typing import Any

from pcd_tools.errors import BlasSetupError

__all__ = [
    "ISA_NAMES",
    "WeakKernelsError",
    "core_level",
    "cpu_flags",
    "cpu_isa",
    "describe",
    "flags_of",
    "isa_of",
    "kernels_note",
    "weak_core",
]

# The vector instruction sets a level stands for, for messages.
ISA_NAMES = {0: "SSE", 1: "AVX", 2: "AVX2", 3: "AVX-512"}

# OpenBLAS core names (lower case) by the widest vector unit their kernels use.
_CORE_LEVELS = {
    **dict.fromkeys(("skylakex", "cooperlake", "sapphirerapids"), 3),
    **dict.fromkeys(("haswell", "zen", "excavator"), 2),
    **dict.fromkeys(("sandybridge", "bulldozer", "piledriver", "steamroller"), 1),
    **dict.fromkeys(
        (
            "prescott",
            "core2",
            "penryn",
            "dunnington",
            "nehalem",
            "atom",
            "opteron",
            "opteron_sse3",
            "barcelona",
            "bobcat",
            "katmai",
            "coppermine",
            "northwood",
            "banias",
            "athlon",
            "nano",
            "generic",
        ),
        0,
    ),
}


def flags_of(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first CPU in a `/proc/cpuinfo` text (empty: none listed)."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's flags, as `flags_of` (`avx512_vnni`, `amx_int8`, ...); empty where
    `/proc/cpuinfo` cannot be read or lists none (off Linux, off x86)."""
    try:
        return flags_of(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def isa_of(cpuinfo: str) -> int | None:
    """The widest vector unit named in a `/proc/cpuinfo` text: 3 (AVX-512), 2 (AVX2 and
    FMA), 1 (AVX) or 0; None when it lists no flags."""
    return _level(flags_of(cpuinfo))


def _level(flags: frozenset[str]) -> int | None:
    """`isa_of`'s level of a flag set."""
    if not flags:
        return None
    if "avx512f" in flags:
        return 3
    if "avx2" in flags and "fma" in flags:
        return 2
    return 1 if "avx" in flags else 0


@lru_cache(maxsize=1)
def cpu_isa() -> int | None:
    """This CPU's level, as `isa_of`; None off x86-64 Linux or when `/proc/cpuinfo`
    cannot be read."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    return _level(cpu_flags())


def core_level(core: str) -> int | None:
    """The level (as `cpu_isa`) of an OpenBLAS core name; None for a name not listed."""
    return _CORE_LEVELS.get(core.strip().lower())


def weak_core(core: str, isa: int | None) -> bool:
    """True when OpenBLAS's `core` kernels are below what a CPU of level `isa` runs well:
    below AVX2 on an AVX2 or AVX-512 CPU, below AVX on an AVX one. Unknown names and
    unknown CPUs are never weak."""
    level = core_level(core)
    if level is None or isa is None:
        return False
    return level < min(isa, 2)


def describe(lib: Any) -> tuple[str, str] | None:
    """(core name, build configuration) of a loaded OpenBLAS, e.g. ("SkylakeX",
    "OpenBLAS 0.3.34 DYNAMIC_ARCH ..."); None when the library is not an OpenBLAS.

    Args:
        lib: A `ctypes.CDLL` of the library (plain or `scipy_`-prefixed symbols).
    """
    for prefix in ("", "scipy_"):
        name_fn = getattr(lib, f"{prefix}openblas_get_corename", None)
        if name_fn is None:
            continue
        name_fn.restype = ctypes.c_char_p
        config_fn = getattr(lib, f"{prefix}openblas_get_config", None)
        config = b""
        if config_fn is not None:
            config_fn.restype = ctypes.c_char_p
            config = config_fn() or b""
        core = name_fn() or b""
        return core.decode(errors="replace").strip(), config.decode(errors="replace").strip()
    return None


class WeakKernelsError(BlasSetupError):
    """An OpenBLAS that would run kernels below what this CPU can do."""


def kernels_note(lib: Any, path: str, check: bool) -> str:
    """What a loaded library runs, for `BlasInfo.note`: " (OpenBLAS 0.3.34, SkylakeX
    kernels)" for an OpenBLAS, "" for anything else.

    Args:
        lib: The library, loaded (`ctypes.CDLL`).
        path: Its path, for the message.
        check: Raise when its kernels are too old for this CPU.

    Raises:
        WeakKernelsError: `check` is set and `weak_core` holds for its core.
    """
    found = describe(lib)
    if found is None:
        return ""
    core, config = found
    version = " ".join(config.split()[:2]) or "OpenBLAS"
    isa = cpu_isa()
    if check and weak_core(core, isa):
        raise WeakKernelsError(
            f"{path}: {version} does not know this {ISA_NAMES[isa or 0]} CPU and runs its "
            f"{core} kernels, several times slower than this CPU allows; set "
            "OPENBLAS_CORETYPE to force its kernels, or install a newer OpenBLAS (pip install "
            "scipy-openblas32)"
        )
    return f" ({version}, {core} kernels)"
