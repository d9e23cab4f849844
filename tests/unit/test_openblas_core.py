"""Which kernels an OpenBLAS runs, and when they are too old for the CPU (`openblas_core`)."""

from __future__ import annotations

import pytest

from pcd_tools.engine.host import openblas_core as oc
from pcd_tools.errors import BlasSetupError

pytestmark = pytest.mark.unit

CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {}\n\nprocessor\t: 1\n"


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        ("fpu sse sse2 avx avx2 fma avx512f avx512bw", 3),
        ("fpu sse sse2 avx avx2 fma", 2),
        ("fpu sse sse2 avx avx2", 1),  # AVX2 without FMA: OpenBLAS's AVX2 kernels need both
        ("fpu sse sse2 avx", 1),
        ("fpu sse sse2 sse3", 0),
    ],
)
def test_the_cpu_level_comes_from_its_flags(flags, level):
    assert oc.isa_of(CPUINFO.format(flags)) == level


def test_a_cpuinfo_without_flags_is_unknown():
    assert oc.isa_of("processor\t: 0\nmodel name\t: some ARM core\n") is None
    assert oc.flags_of("processor\t: 0\nmodel name\t: some ARM core\n") == frozenset()


def test_the_flags_are_the_first_cpus():
    text = CPUINFO.format("fpu avx2 avx512_vnni") + "flags\t\t: fpu sse\n"
    assert oc.flags_of(text) == {"fpu", "avx2", "avx512_vnni"}


def test_the_peer_rebuild_keeps_avx512_only_where_the_cpu_has_vnni(monkeypatch):
    from pcd_tools.baselines import llama_cpp

    monkeypatch.setattr(oc, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512_vnni"}))
    hint = llama_cpp.rebuild_hint()
    assert "-DGGML_AVX512_VNNI=ON" in hint and "-DGGML_AMX_INT8=OFF" in hint
    monkeypatch.setattr(oc, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert llama_cpp.rebuild_hint() == llama_cpp.REBUILD
    assert "AVX512" not in llama_cpp.REBUILD and "--no-cache-dir" in llama_cpp.REBUILD


@pytest.mark.parametrize(
    ("core", "isa", "weak"),
    [
        ("Prescott", 3, True),  # what Debian 12's OpenBLAS 0.3.21 runs on a new Xeon
        ("Nehalem", 2, True),
        ("Sandybridge", 3, True),  # AVX kernels on an AVX-512 CPU
        ("Sandybridge", 1, False),  # the best an AVX CPU gets
        ("Haswell", 3, False),  # AVX2 kernels on AVX-512: good enough
        ("SkylakeX", 3, False),
        ("Zen", 2, False),
        ("Prescott", 0, False),  # an SSE-only CPU: nothing better exists
        ("Prescott", None, False),  # unknown CPU: never refuse
        ("Zen7", 3, False),  # a core this table does not list: a newer library
    ],
)
def test_weak_cores(core, isa, weak):
    assert oc.weak_core(core, isa) is weak


class FakeOpenBLAS:
    """Stands in for a loaded OpenBLAS: the two query functions, maybe prefixed."""

    def __init__(self, core: bytes, config: bytes, prefix: str = "") -> None:
        # plain functions: `describe` sets `restype` on them as on a ctypes function
        def name() -> bytes:
            return core

        def conf() -> bytes:
            return config

        setattr(self, f"{prefix}openblas_get_corename", name)
        setattr(self, f"{prefix}openblas_get_config", conf)


@pytest.mark.parametrize("prefix", ["", "scipy_"])
def test_describe_reads_the_core_and_the_build(prefix):
    lib = FakeOpenBLAS(b"SkylakeX", b"OpenBLAS 0.3.34 DYNAMIC_ARCH NO_AFFINITY", prefix)
    assert oc.describe(lib) == ("SkylakeX", "OpenBLAS 0.3.34 DYNAMIC_ARCH NO_AFFINITY")


def test_a_library_that_is_not_openblas_has_no_core():
    assert oc.describe(object()) is None
    assert oc.kernels_note(object(), "/x/libmkl_rt.so", check=True) == ""


def test_kernels_note_names_the_kernels_or_refuses_weak_ones(monkeypatch):
    monkeypatch.setattr(oc, "cpu_isa", lambda: 3)
    good = FakeOpenBLAS(b"SkylakeX", b"OpenBLAS 0.3.34 DYNAMIC_ARCH")
    assert oc.kernels_note(good, "/lib/a.so", check=True) == " (OpenBLAS 0.3.34, SkylakeX kernels)"
    old = FakeOpenBLAS(b"Prescott", b"OpenBLAS 0.3.21 DYNAMIC_ARCH")
    with pytest.raises(oc.WeakKernelsError) as err:
        oc.kernels_note(old, "/usr/lib/libopenblas.so.0", check=True)
    assert isinstance(err.value, BlasSetupError)
    msg = str(err.value)
    for part in ("/usr/lib/libopenblas.so.0", "0.3.21", "AVX-512", "Prescott", "OPENBLAS_CORETYPE"):
        assert part in msg, part
    # asked only to describe (a PCD_BLAS the user chose): named, not refused
    assert oc.kernels_note(old, "/usr/lib/libopenblas.so.0", check=False) == (
        " (OpenBLAS 0.3.21, Prescott kernels)"
    )
