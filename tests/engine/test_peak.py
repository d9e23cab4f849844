"""The int8 peak probe: a loop of dot products on each path this CPU runs."""

from __future__ import annotations

import ctypes

import pytest

from pcd_tools.engine.doctor import doctor
from pcd_tools.engine.kernels.bindings import qgemm_library
from pcd_tools.engine.kernels.paths import PATHS
from pcd_tools.engine.kernels.peak import int8_peak
from pcd_tools.engine.kernels.qgemm import available_paths, column_path
from pcd_tools.errors import InvalidArgumentError

pytestmark = pytest.mark.engine

# int8 operations per iteration: 12 chains of 64 (zmm) or 32 (ymm) multiply-adds, 8 of 32 on
# AVX2; AMX: six 16 x 16 x 64 tile products
OPS = {"avx512vnni": 12 * 64 * 2, "avxvnni": 12 * 32 * 2, "avx2": 8 * 32 * 2, "amx": 6 * 16384 * 2}


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_path_this_cpu_runs_counts_its_operations(name):
    lib = qgemm_library()
    sink = ctypes.c_int32()
    runs = name in available_paths() or (name == "amx" and column_path() == "amx-cols")
    got = lib.pcd_int8_peak(PATHS[name], 1000, 5, ctypes.byref(sink))
    assert got == (1000 * OPS[name] if runs else 0)
    peak = int8_peak(path=name, seconds=0.01, rounds=1)
    if runs:
        assert peak is not None and peak.path == name and peak.one_thread > 1.0
        assert peak.all_threads > 0 and name in peak.text()
    else:
        assert peak is None


def test_the_portable_path_has_no_probe_and_bad_names_are_refused():
    assert int8_peak(path="scalar", seconds=0.01, rounds=1) is None
    with pytest.raises(InvalidArgumentError, match="accepted: auto, "):
        int8_peak(path="avx9000")


def test_the_doctor_shows_the_peak():
    line = doctor()["int8_peak"]
    if qgemm_library().pcd_int8_peak_path(0):
        assert "GOP/s on 1 thread" in line
    else:
        assert line.startswith("not measured")
