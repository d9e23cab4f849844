"""Metrics against values computed by hand on small fixed arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pcd_tools.eval.metrics import (
    accuracy,
    aurc,
    brier,
    ece,
    ece_floor,
    field_metrics,
    macro_f1,
    nll,
    reliability_bins,
    risk_coverage,
)

pytestmark = pytest.mark.unit


def test_ece_one_item_per_bin():
    # bins of width 1/15: 0.95->14, 0.9->13, 0.62->9, 0.55->8, 0.21->3
    conf = [0.95, 0.9, 0.62, 0.55, 0.21]
    correct = [1, 1, 0, 1, 0]
    expected = (0.05 + 0.10 + 0.62 + 0.45 + 0.21) / 5
    assert ece(conf, correct) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(0.286)


def test_ece_items_sharing_a_bin_average_before_the_gap():
    # 0.91 and 0.93 both fall in bin 13: |0.5 - 0.92| = 0.42
    assert ece([0.91, 0.93], [True, False]) == pytest.approx(0.42, abs=1e-12)


def test_ece_perfectly_calibrated_and_worst_case():
    assert ece([1.0, 1.0], [1, 1]) == 0.0
    assert ece([1.0, 1.0], [0, 0]) == 1.0


def test_reliability_bins_edges_are_closed_on_the_right():
    b = reliability_bins([0.0, 1.0, 0.5], [0, 1, 1])
    assert b["count"][0] == 1  # 0 goes to the first bin
    assert b["count"][14] == 1  # 1.0 goes to the last bin
    assert b["count"][7] == 1  # 0.5 = 7.5/15 -> bin 7
    assert b["count"].sum() == 3
    assert math.isnan(b["accuracy"][1])


def test_brier_hand_computed():
    probs = [[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]]
    # row 0: 0.09 + 0.04 + 0.01 = 0.14; row 1: 0.25 + 0.25 + 0 = 0.5
    assert brier(probs, [0, 1]) == pytest.approx(0.32, abs=1e-12)
    assert brier([[1.0, 0.0]], [0]) == 0.0
    assert brier([[1.0, 0.0]], [1]) == 2.0


def test_nll_hand_computed_and_clipped():
    assert nll([[0.7, 0.3], [0.5, 0.5]], [0, 1]) == pytest.approx(
        (-math.log(0.7) - math.log(0.5)) / 2, abs=1e-12
    )
    assert nll([[1.0, 0.0]], [1]) == pytest.approx(-math.log(1e-12))


def test_aurc_without_ties_is_mean_risk_at_k():
    conf = [0.9, 0.8, 0.7, 0.6]
    correct = [1, 0, 1, 1]
    # risk@1..4 = 0, 1/2, 1/3, 1/4
    assert aurc(conf, correct) == pytest.approx((0 + 0.5 + 1 / 3 + 0.25) / 4, abs=1e-12)
    # shuffled input gives the same curve
    assert aurc(conf[::-1], correct[::-1]) == pytest.approx(aurc(conf, correct), abs=1e-12)


def test_aurc_with_ties_accepts_tied_items_together():
    # {0.9, 0.9}: coverage 2/3, risk 1/2; {0.5}: coverage 1, risk 1/3
    expected = (2 / 3) * 0.5 + (1 / 3) * (1 / 3)
    assert aurc([0.9, 0.9, 0.5], [1, 0, 1]) == pytest.approx(expected, abs=1e-12)
    assert aurc([0.9, 0.9, 0.5], [0, 1, 1]) == pytest.approx(expected, abs=1e-12)


def test_risk_coverage_points():
    thr, cov, risk = risk_coverage([0.9, 0.8, 0.7, 0.6], [1, 0, 1, 1])
    assert thr.tolist() == [0.9, 0.8, 0.7, 0.6]
    assert cov.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert risk.tolist() == pytest.approx([0.0, 0.5, 1 / 3, 0.25])


def test_accuracy_and_macro_f1():
    gold = ["a", "a", "b", "c"]
    pred = ["a", "b", "b", "b"]
    assert accuracy(gold, pred) == 0.5
    # a: 2/3, b: 2*1/(2+2+0) = 1/2, c: 0
    assert macro_f1(gold, pred) == pytest.approx((2 / 3 + 0.5 + 0.0) / 3, abs=1e-12)
    # a missing answer is wrong but is not a label of its own
    assert macro_f1(["a", "b"], ["a", None]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="differ in length"):
        accuracy([1], [1, 2])


def test_field_metrics_combines_everything():
    probs = np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0], [0.1, 0.3, 0.6]])
    gold = np.array([0, 1, 1])
    m = field_metrics(probs, gold)
    # answers: 0 (right), 0 (tie -> first; wrong), 2 (wrong)
    assert m.n == 3
    assert m.accuracy == pytest.approx(1 / 3)
    assert m.brier == pytest.approx((0.14 + 0.5 + (0.01 + 0.49 + 0.36)) / 3)
    assert m.nll == pytest.approx(-(math.log(0.7) + math.log(0.5) + math.log(0.3)) / 3)
    assert m.ece == pytest.approx(ece([0.7, 0.5, 0.6], [1, 0, 0]))
    assert m.aurc == pytest.approx(aurc([0.7, 0.5, 0.6], [1, 0, 0]))
    assert m.mean_confidence == pytest.approx(0.6)
    assert m.ece_floor == pytest.approx(ece_floor([0.7, 0.5, 0.6]))
    d = m.to_dict()
    assert "coverage" not in d and d["accuracy"] == pytest.approx(1 / 3)
    assert m.to_dict(curve=True)["coverage"] == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_ece_floor_matches_the_binomial_expectation():
    # four answers at 0.5, one bin: E|k/4 - 1/2| with k ~ Bin(4, 1/2) = 3/16
    assert ece_floor([0.5] * 4, draws=40_000) == pytest.approx(3 / 16, abs=0.004)
    # two bins: hits ~ Bin(2, 0.9) against 1.8 (E = 0.324) and Bern(0.2) against 0.2
    # (E = 0.32), over 3 items
    assert ece_floor([0.9, 0.9, 0.2], draws=40_000) == pytest.approx(0.644 / 3, abs=0.004)
    # certain answers cannot miss their confidence
    assert ece_floor([0.0, 1.0, 1.0]) == 0.0
    # the floor shrinks like 1/sqrt(n): four times the items, half the floor
    small, large = ece_floor([0.3] * 100), ece_floor([0.3] * 400)
    assert large == pytest.approx(small / 2, rel=0.1)
    assert ece_floor([0.3] * 100, seed=1) == pytest.approx(small, rel=0.05)
    assert math.isnan(ece_floor([]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ece_floor([1.5])
    with pytest.raises(ValueError, match="draws"):
        ece_floor([0.5], draws=0)


def test_field_metrics_with_invalid_answers():
    probs = np.full((2, 2), 0.5)
    m = field_metrics(probs, [0, 1], confidence=[0.0, 0.8], pred=[-1, 1])
    assert m.accuracy == 0.5
    assert m.macro_f1 == pytest.approx(0.5)  # label 0: F1 0, label 1: F1 1
    assert m.ece == pytest.approx((0.0 + 0.2) / 2)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match=r"\(n, K\)"):
        brier([0.5, 0.5], [0])
    with pytest.raises(ValueError, match="gold indices"):
        nll([[0.5, 0.5]], [2])
