"""The label-free grid's tables (console and EVAL.md markdown), from synthetic grids."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rich.console import Console

from pcd_tools.errors import InvalidArgumentError
from pcd_tools.eval.datasets import Dataset, Split
from pcd_tools.eval.label_free import label_free_grid
from pcd_tools.eval.report import grid_rows, label_free_markdown, print_label_free_grid
from tests.eval.helpers import SCHEMA

pytestmark = pytest.mark.unit

METHODS = ("raw", "contextual", "pmi", "fitted")


def _f(acc, ece=0.1, floor=0.04):
    return {"accuracy": acc, "macro_f1": acc / 2, "ece": ece, "ece_floor": floor, "n": 100}


def _grid(name, accs, ms, fitted_ece=0.03, baseline=None):
    rows = []
    for k, per in accs.items():
        row = {
            "shots": k,
            "shot_ids": [f"val:{i}" for i in range(k)],
            "fields": {
                m: {"mood": _f(a, ece=fitted_ece if m == "fitted" else 0.2)}
                for m, a in zip(METHODS, per)
            },
            "latency_ms": dict.fromkeys(METHODS, ms[k]),
            "calibration": {"mood": {"method": "temperature_bias"}},
        }
        if baseline and k in baseline:
            row["baseline"] = {
                "n": 50,
                "method": {"fields": {"mood": _f(baseline[k])}},
                "pcd": {m: {"mood": _f(a)} for m, a in zip(METHODS, per)},
            }
        rows.append(row)
    return {
        "dataset": name,
        "main_field": "mood",
        "model_id": "m",
        "n": 100,
        "seed": 0,
        "cal_n": 120,
        "cal_split": "val",
        "methods": list(METHODS),
        "rows": rows,
        "elapsed_s": 12.0,
    }


def test_markdown_has_the_summary_then_a_table_per_dataset():
    a = _grid(
        "a",
        {0: (0.2, 0.3, 0.25, 0.3), 8: (0.35, 0.45, 0.4, 0.5)},
        {0: 100, 8: 110},
        baseline={8: 0.3},
    )
    b = _grid(
        "b", {0: (0.6, 0.55, 0.5, 0.7), 8: (0.7, 0.75, 0.6, 0.8)}, {0: 50, 8: 70}, fitted_ece=0.2
    )
    lines = list(label_free_markdown([a, b]))
    text = "\n".join(lines)
    assert lines[0] == "| shots | method | a | b | mean |"
    assert "| 8 | contextual | 0.450 | 0.750 | 0.600 |" in text
    # best label-free: 8 shots + contextual, mean 0.600 vs 0.400 zero-shot raw
    assert "Best label-free setting: 8 shots + contextual" in text
    assert "+20.0 points" in text and "in points: a +25.0, b +15.0; the lowest is b" in text
    assert "a: warm request with 8 shots 110 ms against 100 ms zero-shot: 1.10x" in text
    assert "b: warm request with 8 shots 70 ms against 50 ms zero-shot: 1.40x" in text
    assert (
        "on 2 of 4 field × shot cells; above it: b mood 0-shot 0.200; b mood 8-shot 0.200" in text
    )
    assert "ECE above raw's on 0" in text
    # the interleaved ratio, when the grid has it, is the one reported
    a["warm_ratio"] = {"over_shots": 0, "8": {"median": 1.05, "min": 0.98, "max": 1.3, "n": 10}}
    text = "\n".join(label_free_markdown([a, b]))
    assert (
        "a: warm request with 8 shots over zero-shot, interleaved on 10 texts: 1.05x (0.98-1.30)"
        in text
    )
    assert "a: warm request with 8 shots 110 ms" not in text
    assert "b: warm request with 8 shots 70 ms against 50 ms zero-shot: 1.40x" in text
    assert "**a** (`mood`; n = 100, seed 0; fitted on 120 items of `val`)" in text
    assert "| 8 | fitted | 0.500 | 0.250 | 0.030 (0.040) | 110 | T+b |" in text
    assert "| 8 | 50 | 0.300 | 0.350 | 0.450 | 0.400 | 0.500 |" in text  # baseline beside PCD
    assert [r[:2] for r in grid_rows(a)][:4] == [(0, m) for m in METHODS]


def test_console_table_lists_the_shots_and_the_baseline():
    a = _grid(
        "a",
        {0: (0.2, 0.3, 0.25, 0.3), 4: (0.3, 0.4, 0.35, 0.45)},
        {0: 100, 4: 104},
        baseline={4: 0.25},
    )
    console = Console(record=True, width=150)
    print_label_free_grid(console, a)
    out = console.export_text()
    assert "a `mood`: n=100" in out and "contextual" in out and "T+b" in out
    assert "4 shots: val:0, val:1, val:2, val:3" in out
    assert (
        "4 shots, 50 items: constrained generation acc 0.250; PCD raw / contextual / PMI / " in out
    )


def test_the_grid_refuses_a_calibrated_decider_and_bad_sizes():
    split = Split("all", [("x", {"mood": "calm", "urgent": True})], ["r:0"], ["calm"])
    ds = Dataset("toy", SCHEMA, split, split)
    calibrated = SimpleNamespace(calibration=object(), label_free="none")
    with pytest.raises(InvalidArgumentError, match="without a fitted calibration"):
        label_free_grid(ds, decider=calibrated)  # type: ignore[arg-type]
    plain = SimpleNamespace(calibration=None, label_free="none")
    with pytest.raises(InvalidArgumentError, match="bad grid sizes"):
        label_free_grid(ds, decider=plain, shots=(-1,))  # type: ignore[arg-type]
