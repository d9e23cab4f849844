"""The BLAS shim's failures are typed: a missing `_blas_shim.c` (an install without its C
sources) or a cached shim that does not load is a `BlasSetupError` naming it, never a bare
`FileNotFoundError` / `OSError` out of the first `import_mlx()` (issue 34)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tests.unit.test_platform import linux_only, run_py

pytestmark = [pytest.mark.unit, linux_only]

CODE = """
    import json
    from pathlib import Path
    from pcd_tools.engine.host import blas as p
    from pcd_tools.errors import BlasSetupError
    {patch}
    try:
        p.setup_blas()
        out = {{"raised": None}}
    except BlasSetupError as e:
        out = {{"raised": "BlasSetupError", "message": str(e)}}
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def scipy_lib() -> str:
    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("needs scipy-openblas32 and a C compiler")
    return str(Path(next(iter(spec.submodule_search_locations))) / "lib" / "libscipy_openblas.so")


def test_a_missing_shim_source_is_a_blas_setup_error(tmp_path: Path, scipy_lib: str) -> None:
    patch = f"p._SHIM_SOURCE = Path({str(tmp_path / '_blas_shim.c')!r})"
    out = run_py(CODE.format(patch=patch), tmp_path, PCD_BLAS=scipy_lib)
    assert out["raised"] == "BlasSetupError"
    assert "the C source _blas_shim.c is missing" in out["message"]


def test_a_shim_that_does_not_load_is_a_blas_setup_error(tmp_path: Path, scipy_lib: str) -> None:
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF file")
    patch = f"p._build_shim = lambda: (Path({str(junk)!r}), 'reused')"
    out = run_py(CODE.format(patch=patch), tmp_path, PCD_BLAS=scipy_lib)
    assert out["raised"] == "BlasSetupError"
    assert f"cannot load the BLAS shim {junk}" in out["message"]
