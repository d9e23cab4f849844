"""Reliability diagrams (matplotlib)."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools.eval.plots import reliability_diagram


@pytest.mark.unit
def test_reliability_diagram_writes_a_png(tmp_path):
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.3, 1.0, 200)
    ok = rng.uniform(size=200) < conf
    p = reliability_diagram({"before": (conf, ok), "after": (conf, ok)}, tmp_path / "r.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
