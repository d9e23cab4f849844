"""The built wheel ships every C source the package compiles on first use.

`make` installs with `-e`, so a source left out of the package data goes unnoticed by
the rest of the suite; after `pip install` it broke every generated field (issue 34). The
sources are found by reading the code for the names it loads, not from a list kept here.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import pcd_tools

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(pcd_tools.__file__).resolve().parent


def loaded_c_sources() -> set[str]:
    """Every `*.c` name a module of the package spells as a string (a `with_name(...)`,
    a path), as its path in the wheel: the one file of that name in the package (the C
    sources live in `engine/kernels/`, spelled in `kernels/bindings.py`; the BLAS shim in
    `engine/host/`, beside `host/blas.py`)."""
    found = set()
    for module in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.endswith(".c")
                and "/" not in node.value
                and " " not in node.value
            ):
                hits = sorted(PACKAGE.rglob(node.value))
                assert len(hits) == 1, (module, node.value, hits)  # one source of each name
                found.add(hits[0].relative_to(PACKAGE.parent).as_posix())
    return found


def test_the_scan_finds_the_sources_the_native_modules_load():
    found = loaded_c_sources()
    # Not vacuous: the native modules' own sources are among what the scan finds, and
    # each name found is a file in the checkout.
    from pcd_tools.engine.host import blas as platform
    from pcd_tools.engine.kernels import bindings

    sources = (bindings._DECODE_SOURCE, bindings._KERNELS_SOURCE, bindings._QGEMM_SOURCE)
    for src in (*sources, bindings._QWEIGHTS_SOURCE, platform._SHIM_SOURCE):
        assert src.relative_to(PACKAGE.parent).as_posix() in found
    for rel in found:
        assert (PACKAGE.parent / rel).is_file(), rel


def test_the_wheel_holds_every_c_source_the_code_loads(tmp_path):
    # Built from a copy of the tracked tree: a stale build/ in the checkout cannot hide a
    # source the package data misses.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "out"
        ),
    )
    out = tmp_path / "wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("pcd_tools-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(loaded_c_sources() - names)
    assert missing == [], f"the wheel lacks {missing}; add them to package-data"
    for ext in (".c", ".h"):  # the sources and the headers they include
        shipped = {n for n in names if n.endswith(ext)}
        in_tree = {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob(f"*{ext}")}
        assert shipped == in_tree, ext
    assert "pcd_tools/engine/kernels/gguf_blocks.h" in names
    assert "pcd_tools/py.typed" in names
