"""`benchmarks/prefill.py`: which peak a compute mode is held to, and the printed table."""

from __future__ import annotations

import pytest

from benchmarks import prefill

pytestmark = pytest.mark.unit

PEAKS = {"fma": 100.0, "avx2-int8": 200.0, "avxvnni": 0.0, "avx512vnni": 400.0}


@pytest.mark.parametrize(
    ("isa", "mode", "want"),
    [
        ("avx2", "int8", ("avx2-int8", 200.0)),
        ("avx512vnni", "int8", ("avx512vnni", 400.0)),
        ("avx2", "float32", ("fma", 100.0)),
        ("avx512vnni", "bf16", ("fma", 100.0)),
    ],
)
def test_a_mode_is_held_to_the_peak_of_the_arithmetic_it_runs(isa, mode, want):
    assert prefill.mode_peak(PEAKS, isa, mode) == want


def test_table_gives_rates_peaks_and_the_ratio_to_llama_cpp():
    out = {
        "model": "m.gguf",
        "threads": 2,
        "machine": {"isa": "avx2"},
        "peaks_gops_per_thread": PEAKS,
        "scenarios": {
            "fraud": {
                "tokens": 533,
                "gflop": 1400.0,
                "methods": {
                    "auto": {
                        "ms_median": 7000.0,
                        "ms_min": 6900.0,
                        "ms_max": 7400.0,
                        "gops": 200.0,
                        "compute": "int8",
                        "arithmetic": "avx2-int8",
                        "peak_gops": 400.0,
                        "of_peak": 0.5,
                        "vs_llama": {"median": 1.2, "min": 1.1, "max": 1.3},
                    },
                    "llama.cpp": {
                        "ms_median": 8400.0,
                        "ms_min": 8300.0,
                        "ms_max": 9000.0,
                        "gops": 167.0,
                    },
                },
            }
        },
    }
    text = prefill.table(out)
    assert (
        "| fraud | 533 | auto | int8 | 7,000 (6,900-7,400) | 200 | 50% of 400 (avx2-int8) | **1.20x** (1.10-1.30) |"
        in text
    )
    assert "| fraud | 533 | llama.cpp | - | 8,400 (8,300-9,000) | 167 | - | - |" in text
    assert "avx2-int8 200" in text and "avxvnni" not in text  # peaks the CPU lacks are left out
