"""Native code built on this machine: the compile cache and the record of fallbacks.

`compile_c` builds a C file into a shared library once per source (with the local headers
it includes), flags and machine, in the pcd-tools cache. The libraries are loaded, with
their C signatures declared, in one place: `engine/kernels/bindings.py`. This module
imports neither mlx nor the other engine modules, so all of them can use it.

Every failure to get a library (a source missing from the install, no compiler, an
unwritable cache, a failed compile or load) is a `NativeBuildError`. Where a slower path
exists (the CPU kernels, `decode="auto"`), the caller falls back through `fall_back`, which
warns once per library and process (`NativeFallbackWarning`) and records the reason for
`pcd models --doctor` (`fallbacks`).
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

from pcd_tools.errors import NativeBuildError

__all__ = [
    "NativeFallbackWarning",
    "cache_dir",
    "compile_c",
    "fall_back",
    "fallbacks",
]

_FALLBACKS: dict[str, str] = {}  # library -> why it fell back, in this process
_FALLBACK_LOCK = threading.Lock()


class NativeFallbackWarning(UserWarning):
    """A native library could not be built or loaded, so a slower path (numpy or MLX) runs."""


def fall_back(library: str, instead: str, exc: BaseException) -> None:
    """Record that `library` is unavailable and warn about it once per process.

    Args:
        library: The native library, e.g. `"_decode.c (native int8 decode)"`.
        instead: What runs instead, e.g. `"generated fields decode through MLX"`.
        exc: Why (usually a `NativeBuildError`).
    """
    with _FALLBACK_LOCK:
        first = library not in _FALLBACKS
        _FALLBACKS[library] = f"{exc}; {instead}"
    if first:
        warnings.warn(
            NativeFallbackWarning(
                f"pcd-tools: {library} is unavailable, so {instead} (slower, same results "
                f"within float32 rounding): {exc}. `pcd models --doctor` shows what was found."
            ),
            stacklevel=3,
        )


def fallbacks() -> dict[str, str]:
    """The native libraries that fell back in this process, and why (for the doctor)."""
    with _FALLBACK_LOCK:
        return dict(_FALLBACKS)


def cache_dir() -> Path:
    """Return `$PCD_CACHE_DIR`, else `$XDG_CACHE_HOME/pcd-tools`, else `~/.cache/pcd-tools`."""
    if os.environ.get("PCD_CACHE_DIR"):
        return Path(os.environ["PCD_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "pcd-tools"
    return Path.home() / ".cache" / "pcd-tools"


_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def _local_headers(source: Path, text: bytes, seen: set[Path] | None = None) -> bytes:
    """The bytes of every `#include "..."` header beside `source` (recursively, each once),
    so that an edited header keys a new build of each source that includes it."""
    seen = set() if seen is None else seen
    out = b""
    for name in _INCLUDE.findall(text):
        path = source.parent / name.decode()
        if path in seen:
            continue
        seen.add(path)
        try:
            header = path.read_bytes()
        except OSError as exc:
            raise NativeBuildError(
                f"the C header {path.name} that {source.name} includes is missing from "
                f"{path.parent} ({exc.strerror}): this install of pcd-tools lacks its native "
                "sources; reinstall it from a wheel built with the package data `engine/*.h`"
            ) from exc
        out += b"\0" + name + b"\0" + header + _local_headers(path, header, seen)
    return out


def compile_c(
    source: Path,
    name: str,
    flags: tuple[str, ...] = (),
    libs: tuple[str, ...] = (),
    subdir: str = "native",
) -> tuple[Path, str]:
    """Compile a C file into a shared library in the cache once (atomically).

    The cached file is keyed by the source, the local headers it includes (`#include
    "x.h"`, beside it), the flags and the machine, so an edited source or header or
    another architecture gets its own build.

    Args:
        source: The C file.
        name: Stem of the cached library (`<cache>/<subdir>/<name>-<digest>.so`).
        flags: Extra compiler flags.
        libs: Libraries to link, as `-l` arguments.
        subdir: Folder under the cache directory.

    Returns:
        The library's path and a note saying whether it was compiled or reused.

    Raises:
        NativeBuildError: A missing source or header, no C compiler, an unwritable cache,
            or a failed compile.
    """
    try:
        text = source.read_bytes()
    except OSError as exc:
        raise NativeBuildError(
            f"the C source {source.name} is missing from {source.parent} ({exc.strerror}): "
            "this install of pcd-tools lacks its native sources; reinstall it from a wheel "
            "built with the package data `engine/*.c`"
        ) from exc
    key = (
        text
        + _local_headers(source, text)
        + "\0".join([*flags, *libs, platform.machine()]).encode()
    )
    digest = hashlib.sha256(key).hexdigest()[:16]
    out = cache_dir() / subdir / f"{name}-{digest}.so"
    if out.exists():
        return out, f"reused cached {name} {out}"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeBuildError(f"no C compiler (cc/gcc) on PATH, so {source.name} cannot be built")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=out.parent)
        os.close(fd)
    except OSError as exc:
        raise NativeBuildError(
            f"cannot write {source.name}'s build under {out.parent}: {exc}"
        ) from exc
    try:
        cmd = [cc, "-O2", *flags, "-shared", "-fPIC", str(source), "-o", tmp, *libs]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            err = proc.stderr.strip()[-300:]
            raise NativeBuildError(f"compiling {source.name} with {cc} failed: {err}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)  # atomic: a concurrent process sees no or a whole library
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"compiling {source.name} with {cc} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out, f"compiled {name} {out}"
