"""The tables: console reports, EVAL.md's markdown table and the paired comparison."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from pcd_tools.eval.metrics import field_metrics
from pcd_tools.eval.report import (
    eval_markdown_table,
    paired_comparison,
    print_calibration,
    print_eval_report,
    sign_test,
)
from pcd_tools.eval.scoring import MethodReport
from tests.eval.helpers import toy_calibration

pytestmark = pytest.mark.unit


def _fields(ece: float, n: int = 10) -> dict:
    return {
        "n": n,
        "accuracy": 0.8,
        "macro_f1": 0.7,
        "ece": ece,
        "ece_floor": 0.05,
        "brier": 0.3,
        "aurc": 0.1,
    }


def test_sign_test_is_exact():
    assert sign_test(0, 0) == 1.0
    assert sign_test(3, 3) == 1.0
    assert sign_test(0, 5) == pytest.approx(2 / 32)
    assert sign_test(6, 1) == pytest.approx(2 * 8 / 128)


def test_markdown_table_reads_the_run_files(tmp_path):
    lat = {"latency": {"median_ms": 1234.4}}
    rep = {
        "methods": {
            "pcd": {"fields": {"x": _fields(0.2)}, **lat},
            "pcd_calibrated": {"fields": {"x": _fields(0.1)}},
            "baseline": {"fields": {"x": _fields(0.3)}, **lat},
        }
    }
    auto = {"methods": {"pcd_calibrated": {"fields": {"x": _fields(0.05)}}}}
    cal = {"metrics": {"x": {"method": "temperature_bias"}}}
    for name, obj in (("eval_d", rep), ("eval_d_auto", auto), ("cal_d_auto", cal)):
        (tmp_path / f"{name}.json").write_text(json.dumps(obj))
    lines = list(eval_markdown_table(tmp_path, ["d"]))
    assert len(lines) == 3 and lines[1] == "|" + "---|" * 11
    assert lines[2] == (
        "| d | x | 10 | 0.800 / 0.800 / 0.800 | 0.700 / 0.700 / 0.700 "
        "| 0.200 → 0.100 → 0.050 (T+b) | 0.050 / 0.050 | 0.300 | 0.300 / 0.300 / 0.300 "
        "| 0.100 / 0.100 / 0.100 | 1,234 / 1,234 |"
    )


def test_paired_comparison_counts_and_shows_examples():
    def item(text, gold, pcd, base):
        return {
            "text": text,
            "gold": {"f": gold},
            "pcd": {"f": [pcd, 0.9]},
            "baseline": {"f": [base, 0.6]},
            "pcd_log_scores": {"f": [0.0, -1e9]},
        }

    report = {
        "items": [
            item("a", "x", "x", "x"),
            item("b", "x", "x", "y"),
            item("c", "x", "y", "x"),
            item("d", "x", "y", "y"),
            {"text": "e", "gold": {}},  # not labelled for this field: skipped
        ]
    }
    assert list(paired_comparison(report, "f", 1)) == [
        "f: n=4  both right 1, neither 1, only PCD 1, only baseline 1; exact McNemar p = 1.000",
        "  only the baseline right:",
        "    'c'  gold='x'  PCD='y' (1.00)  baseline='x' (0.60)",
        "  only PCD right:",
        "    'b'  gold='x'  PCD='x' (1.00)  baseline='y' (0.60)",
    ]


def test_console_tables():
    console = Console(record=True, width=150)
    cal = toy_calibration(
        metrics={"mood": {"nll_before": 1.0, "nll_after": 0.5, "ece_before": 0.2, "ece_after": 0.1}}
    )
    print_calibration(console, cal, dataset="toy")
    text = console.export_text()
    assert "Calibration of toy on 6 items (?, seed 1)" in text
    assert "2.000" in text and "temperature" in text
    from pcd_tools.eval.evaluate import EvalReport

    m = field_metrics([[0.9, 0.1], [0.4, 0.6]], [0, 0])
    lat = {"median_ms": 10.0, "p95_ms": 20.0, "mean_ms": 12.0, "total_s": 0.02}
    report = EvalReport("toy", "S", "fp", "m", 2, 0, {"pcd": MethodReport("pcd", {"f": m}, lat)})
    print_eval_report(console, report)
    text = console.export_text()
    assert "toy: n=2, seed=0, model=m" in text
    assert "pcd: median 10 ms, p95 20 ms per item (per item); passes nan; invalid 0" in text
