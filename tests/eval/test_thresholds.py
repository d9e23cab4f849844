"""Choosing a confidence threshold for a target risk or coverage."""

from __future__ import annotations

import pytest

from pcd_tools.answers.calibration import CalibrationError
from pcd_tools.eval.thresholds import choose_threshold

CONF = [0.9, 0.8, 0.7, 0.6]
OK = [1, 0, 1, 1]  # risk at thresholds 0.9, 0.8, 0.7, 0.6: 0, 1/2, 1/3, 1/4


@pytest.mark.unit
@pytest.mark.parametrize(
    ("target", "threshold", "coverage", "risk"),
    [(0.3, 0.6, 1.0, 0.25), (0.25, 0.6, 1.0, 0.25), (0.2, 0.9, 0.25, 0.0), (0.0, 0.9, 0.25, 0.0)],
)
def test_choose_threshold_for_a_target_risk(target, threshold, coverage, risk):
    c = choose_threshold(CONF, OK, target_risk=target)
    assert (c.threshold, c.coverage, c.risk, c.achieved) == (threshold, coverage, risk, True)
    assert c.target == "risk" and c.n == 4


@pytest.mark.unit
def test_choose_threshold_when_no_threshold_meets_the_risk():
    c = choose_threshold([0.9, 0.8], [0, 1], target_risk=0.1)
    assert not c.achieved and c.coverage == 0.0 and c.threshold > 0.9


@pytest.mark.unit
@pytest.mark.parametrize(
    ("target", "threshold", "coverage"), [(0.5, 0.8, 0.5), (0.6, 0.7, 0.75), (1.0, 0.6, 1.0)]
)
def test_choose_threshold_for_a_target_coverage(target, threshold, coverage):
    c = choose_threshold(CONF, OK, target_coverage=target)
    assert (c.threshold, c.coverage) == (threshold, coverage)
    assert c.to_dict()["target"] == "coverage"


@pytest.mark.unit
def test_choose_threshold_needs_exactly_one_target():
    with pytest.raises(CalibrationError, match="exactly one"):
        choose_threshold(CONF, OK)
    with pytest.raises(CalibrationError, match="exactly one"):
        choose_threshold(CONF, OK, target_risk=0.1, target_coverage=0.5)
    with pytest.raises(CalibrationError, match=r"\[0, 1\]"):
        choose_threshold(CONF, OK, target_risk=1.5)
