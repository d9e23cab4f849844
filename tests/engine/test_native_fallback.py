"""Native libraries that cannot be had: every failure is a `NativeBuildError`, and the
paths with a pure-MLX route (`decode="auto"`, the CPU kernels) fall back after one warning.

The failures are made for real: a source missing from the install (as in a wheel built
without `engine/*.c`), a compiler that fails, and a library that does not load.
"""

from __future__ import annotations

import warnings

import pytest

from pcd_tools.engine.decode.native_steps import decoder_for
from pcd_tools.engine.doctor import decode_status
from pcd_tools.engine.host import build as native
from pcd_tools.engine.kernels import bindings
from pcd_tools.errors import DecodeUnavailableError, NativeBuildError
from tests.conftest import tiny_decider
from tests.engine.test_exactness import CONTEXT
from tests.engine.test_hybrid import Reasoned

pytestmark = pytest.mark.engine


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty build cache and no fallbacks recorded yet in this process."""
    monkeypatch.setenv("PCD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PCD_DECODE", raising=False)
    monkeypatch.setattr(native, "_FALLBACKS", {})
    return tmp_path


def _fallback_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, native.NativeFallbackWarning)]


def test_a_missing_source_is_a_native_build_error_naming_it(fresh):
    with pytest.raises(NativeBuildError, match=r"_gone\.c is missing from .*engine/\*\.c"):
        native.compile_c(fresh / "_gone.c", "gone")


def test_a_header_is_part_of_the_build_key_and_a_missing_one_a_native_build_error(fresh):
    src = fresh / "uses.c"
    src.write_text('#include "blocks.h"\nint pcd_one(void) { return ONE; }\n')
    with pytest.raises(NativeBuildError, match=r"blocks\.h that uses\.c includes is missing"):
        native.compile_c(src, "uses")
    (fresh / "blocks.h").write_text("#define ONE 1\n")
    first, note = native.compile_c(src, "uses")
    assert note.startswith("compiled") and native.compile_c(src, "uses")[0] == first
    (fresh / "blocks.h").write_text("#define ONE 2\n")  # an edited header: a new build
    second, note = native.compile_c(src, "uses")
    assert note.startswith("compiled") and second != first


def test_no_compiler_and_a_failed_compile_are_native_build_errors(fresh, monkeypatch):
    src = fresh / "ok.c"
    src.write_text("int pcd_one(void) { return 1; }\n")
    monkeypatch.setenv("CC", "/bin/false")
    with pytest.raises(NativeBuildError, match=r"compiling ok\.c with /bin/false failed"):
        native.compile_c(src, "ok")
    monkeypatch.setenv("CC", str(fresh / "no-such-cc"))
    with pytest.raises(NativeBuildError, match=r"ok\.c"):
        native.compile_c(src, "ok")
    monkeypatch.delenv("CC")
    bad = fresh / "bad.c"
    bad.write_text("this is not C\n")
    with pytest.raises(NativeBuildError, match=r"compiling bad\.c with .* failed"):
        native.compile_c(bad, "bad")


def test_a_library_that_does_not_load_is_a_native_build_error(fresh, monkeypatch):
    junk = fresh / "junk.so"
    junk.write_bytes(b"not an ELF file")
    monkeypatch.setattr(bindings, "compile_c", lambda *a, **k: (junk, "reused"))
    with pytest.raises(NativeBuildError, match=r"cannot load .*junk\.so"):
        bindings.load_decode_kernels()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib, note = bindings.load_cpu_kernels(fast_blas=True)
    assert lib is False and note.startswith("off: cannot load")
    assert len(_fallback_warnings(caught)) == 1


def test_cpu_kernels_without_their_source_fall_back_with_one_warning(fresh, monkeypatch):
    monkeypatch.setattr(bindings, "_KERNELS_SOURCE", fresh / "_cpu_kernels.c")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            lib, note = bindings.load_cpu_kernels(fast_blas=True)
            assert lib is False
            assert "off: the C source _cpu_kernels.c is missing" in note
    got = _fallback_warnings(caught)
    assert len(got) == 1
    assert "_cpu_kernels.c (native CPU kernels) is unavailable" in got[0]
    assert "run in numpy and RoPE in MLX" in got[0]
    assert set(native.fallbacks()) == {"_cpu_kernels.c (native CPU kernels)"}


def test_auto_decode_without_its_source_decides_through_mlx_after_one_warning(fresh, monkeypatch):
    """The issue's failure: a generated `str` field after an install without `_decode.c`."""
    reference = tiny_decider(0, decode="mlx").decide(Reasoned, CONTEXT)
    monkeypatch.setattr(bindings, "_DECODE_SOURCE", fresh / "_decode.c")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = tiny_decider(0)  # decode="auto"
        assert decoder_for(first.engine) is None
        d1 = first.decide(Reasoned, CONTEXT)
        d2 = tiny_decider(0).decide(Reasoned, CONTEXT)  # another engine: no second warning
    got = _fallback_warnings(caught)
    assert len(got) == 1, got
    assert "_decode.c (native int8 decode) is unavailable" in got[0]
    assert "_decode.c is missing" in got[0]
    for d in (d1, d2):
        assert d.value == reference.value
        assert d.fields["reasoning"].value == reference.fields["reasoning"].value
    assert "_decode.c (native int8 decode)" in native.fallbacks()
    assert decode_status().startswith("auto: MLX float32 steps (native int8 decode unavailable")


def test_int8_decode_without_its_source_raises_and_does_not_warn(fresh, monkeypatch):
    monkeypatch.setattr(bindings, "_DECODE_SOURCE", fresh / "_decode.c")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DecodeUnavailableError, match=r"_decode\.c is missing"):
            tiny_decider(0, decode="int8")
    assert _fallback_warnings(caught) == []
    monkeypatch.setenv("PCD_DECODE", "int8")
    assert decode_status().startswith("int8: unavailable, decode='int8' raises")


def test_the_doctor_reports_the_decode_path_and_the_fallbacks(fresh, monkeypatch, capsys):
    import json

    from pcd_tools.cli import main

    assert main(["models", "--doctor", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["doctor"]
    assert doc["decode"].startswith("auto: native int8 steps (")
    assert "weights=auto: a GGUF kept encoded read from its file blocks with 8-bit" in doc["decode"]
    assert "_decode.c (native int8 decode)" not in doc["fallbacks"]
    monkeypatch.setenv("PCD_DECODE_WEIGHTS", "file")
    assert "weights=file: a GGUF kept encoded read from its file blocks;" in decode_status()
    monkeypatch.setenv("PCD_DECODE_WEIGHTS", "disk")
    assert decode_status().startswith("error: PCD_DECODE_WEIGHTS='disk'")
    monkeypatch.delenv("PCD_DECODE_WEIGHTS")
    monkeypatch.setattr(bindings, "_DECODE_SOURCE", fresh / "_decode.c")
    monkeypatch.setenv("PCD_DECODE", "auto")
    assert main(["models", "--doctor", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["doctor"]
    assert doc["decode"].startswith("auto: MLX float32 steps (native int8 decode unavailable")
    assert "_decode.c is missing" in doc["fallbacks"]["_decode.c (native int8 decode)"]
    monkeypatch.setenv("PCD_DECODE", "mlx")
    assert main(["models", "--doctor", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["doctor"]
    assert doc["decode"] == "mlx: MLX float32 steps (PCD_DECODE=mlx)"
