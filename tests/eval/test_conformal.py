"""Split conformal prediction sets: the quantile, the set, the file, the fit, coverage."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcd_tools.answers.calibration import Calibration, CalibrationError
from pcd_tools.answers.conformal import (
    ConformalScores,
    CoverageError,
    NoConformalScoresError,
    PredictionSetError,
    TooFewCalibrationItemsError,
    conformal_entry,
    conformal_quantile,
    prediction_set_indices,
)
from pcd_tools.answers.joint import answers
from pcd_tools.answers.softmax import softmax
from pcd_tools.errors import InvalidArgumentError, PcdToolsError
from pcd_tools.eval.calibration import calibration_from_scores
from pcd_tools.prompt import Question
from pcd_tools.schema import compile_schema
from tests.eval.helpers import SCHEMA, toy_calibration

# --- the quantile ---------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("n", "coverage", "k"),
    [
        (9, 0.9, 9),  # (n+1)(1-a) = 9 exactly: the largest score (the float is 9.000...02)
        (10, 0.9, 10),  # ceil(9.9) = 10
        (19, 0.9, 18),  # ceil(18.0) = 18
        (20, 0.8, 17),  # ceil(16.8) = 17
        (4, 0.5, 3),  # ceil(2.5) = 3
        (1, 0.5, 1),  # ceil(1.0) = 1
        (99, 0.95, 95),  # ceil(95.0) = 95
    ],
)
def test_quantile_is_the_ceil_n_plus_1_times_coverage_th_smallest_score(n, coverage, k):
    scores = [i / 100 for i in range(1, n + 1)]  # 0.01, 0.02, ... ascending
    assert conformal_quantile(scores, coverage) == pytest.approx(k / 100)


@pytest.mark.unit
@pytest.mark.parametrize(("n", "coverage"), [(8, 0.9), (1, 0.51), (18, 0.95), (0, 0.5)])
def test_too_few_items_for_the_coverage_is_a_typed_error(n, coverage):
    # coverage > n / (n + 1): the quantile index would be n + 1
    with pytest.raises(TooFewCalibrationItemsError, match=r"needs at least \d+ calibration"):
        conformal_quantile([0.1] * n, coverage, "team")
    assert issubclass(TooFewCalibrationItemsError, PcdToolsError)


@pytest.mark.unit
def test_n_at_the_bound_is_enough():
    assert conformal_quantile([0.1] * 19, 0.95) == 0.1  # 0.95 == 19 / 20
    assert conformal_quantile([0.1], 0.5) == 0.1  # 0.5 == 1 / 2


@pytest.mark.unit
@pytest.mark.parametrize("bad", [0, 0.0, 1, 1.0, -0.1, 1.5, 90, float("nan"), True, "0.9", None])
def test_coverage_outside_0_1_is_a_typed_error(bad):
    with pytest.raises(CoverageError, match="coverage"):
        conformal_quantile([0.1] * 100, bad)
    assert issubclass(CoverageError, InvalidArgumentError)
    assert issubclass(CoverageError, PredictionSetError)


# --- the set ----------------------------------------------------------------------------------


@pytest.mark.unit
def test_set_keeps_answers_with_1_minus_p_at_most_the_threshold_most_probable_first():
    p = [0.1, 0.5, 0.3, 0.1]
    assert prediction_set_indices(p, 0.5) == [1]  # only 1 - 0.5 <= 0.5
    assert prediction_set_indices(p, 0.7) == [1, 2]  # 0.3: 1 - 0.3 = 0.7
    assert prediction_set_indices(p, 0.9) == [1, 2, 0, 3]  # ties in declared order
    assert prediction_set_indices(p, 1.0) == [1, 2, 0, 3]


@pytest.mark.unit
def test_set_is_never_empty_it_keeps_the_most_probable_answer():
    assert prediction_set_indices([0.2, 0.45, 0.35], 0.1) == [1]


@pytest.mark.unit
def test_conformal_scores_exact_small_case():
    # 9 calibration scores; at 0.8 the index is ceil(10 * 0.8) = 8 -> 0.6
    c = ConformalScores("team", (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9), (0.45, 0.42, 0.13))
    assert c.n == 9
    assert c.quantile(0.8) == 0.6  # ceil(10 * 0.8) = 8th
    assert c.indices(0.8) == [0, 1]  # 1 - 0.45 and 1 - 0.42 <= 0.6 < 1 - 0.13
    assert c.quantile(0.5) == 0.3  # ceil(5.0) = 5th
    assert c.indices(0.5) == [0]  # nothing has 1 - p <= 0.3: the top answer is kept
    assert c.quantile(0.9) == 0.9  # ceil(9.0) = 9th
    assert c.indices(0.9) == [0, 1, 2]
    with pytest.raises(TooFewCalibrationItemsError, match="n = 9"):
        c.indices(0.91)


@pytest.mark.unit
def test_conformal_entry_sorts_1_minus_p_true():
    probs = np.array([[0.7, 0.3], [0.2, 0.8], [0.6, 0.4]])
    e = conformal_entry(probs, [0, 0, 1])
    assert e == {"score": "lac", "n": 3, "scores": [0.3, 0.6, 0.8]}


# --- empirical coverage on exchangeable data --------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("coverage", [0.8, 0.9, 0.95])
def test_coverage_holds_on_exchangeable_synthetic_data(coverage):
    """A miscalibrated 5-way model (probabilities from scores at the wrong temperature):
    sets from 1000 calibration draws cover 2000 fresh draws at the target, within a few
    points, and are smaller than the whole label set."""
    rng = np.random.default_rng(7)
    n_cal, n_test, k = 1000, 2000, 5
    z = rng.normal(0.0, 2.0, size=(n_cal + n_test, k))
    truth = softmax(z, 1.0)
    gold = np.array([rng.choice(k, p=row) for row in truth])
    model = softmax(z, 0.4)  # overconfident
    cal = conformal_entry(model[:n_cal], gold[:n_cal])
    hits, sizes = [], []
    for p, g in zip(model[n_cal:], gold[n_cal:]):
        s = ConformalScores("f", tuple(cal["scores"]), tuple(p)).indices(coverage)
        hits.append(g in s)
        sizes.append(len(s))
    got = float(np.mean(hits))
    assert coverage - 0.025 <= got <= coverage + 0.035, got
    assert 1.0 < np.mean(sizes) < k
    # the top-1 answer alone covers only its accuracy, far below 0.8
    assert float(np.mean(model[n_cal:].argmax(axis=1) == gold[n_cal:])) < 0.7


# --- the calibration file ---------------------------------------------------------------------


def _fitted(n=40, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, size=(n, 3))
    g = np.array([rng.choice(3, p=row) for row in softmax(z, 1.0)])
    zb = rng.normal(0.0, 1.0, size=(n, 2))
    gb = rng.integers(0, 2, size=n)
    schema = compile_schema(SCHEMA)
    return schema, {"mood": (z, g), "urgent": (zb, gb)}


@pytest.mark.unit
def test_fit_stores_sorted_scores_under_the_stored_calibration(tmp_path):
    schema, arrays = _fitted()
    cal = calibration_from_scores(schema, arrays, model_id="m", method="temperature")
    for name, (z, g) in arrays.items():
        entry = cal.conformal[name]
        p = cal.probabilities(name, z)  # the calibration as the decider applies it
        want = np.sort(1.0 - p[np.arange(len(g)), g])
        assert entry["n"] == len(g) and entry["score"] == "lac"
        np.testing.assert_allclose(entry["scores"], want, atol=1e-8)
    back = Calibration.load(cal.save(tmp_path / "cal.json"))
    assert back.conformal == cal.conformal


@pytest.mark.unit
def test_cross_fitted_scores_are_each_items_score_under_its_folds_refit(tmp_path):
    from pcd_tools.eval.refit import out_of_fold

    schema, arrays = _fitted()
    inside = calibration_from_scores(schema, arrays, model_id="m", method="temperature_bias")
    cal = calibration_from_scores(
        schema, arrays, model_id="m", method="temperature_bias", conformal_folds=4
    )
    assert cal.temperatures == inside.temperatures  # only the scores change
    for name, (z, g) in arrays.items():
        entry = cal.conformal[name]
        p = out_of_fold(cal, name, np.asarray(z), np.asarray(g), folds=4)
        want = np.sort(1.0 - p[np.arange(len(g)), g])
        np.testing.assert_allclose(entry["scores"], want, atol=1e-8)
        assert entry["fitted"] == "4-fold cross-fitted" and entry["n"] == len(g)
        assert entry["scores"] != pytest.approx(inside.conformal[name]["scores"])
    back = Calibration.load(cal.save(tmp_path / "cal.json"))
    assert back.conformal == cal.conformal
    few = {n: (np.asarray(z)[:5], np.asarray(g)[:5]) for n, (z, g) in arrays.items()}
    small = calibration_from_scores(
        schema, few, model_id="m", method="temperature", conformal_folds=4
    )
    assert all(e["fitted"].startswith("in-sample") for e in small.conformal.values())
    with pytest.raises(CalibrationError, match="conformal_folds must be an int >= 2"):
        calibration_from_scores(schema, arrays, model_id="m", conformal_folds=1)


@pytest.mark.unit
def test_older_files_without_conformal_still_load(tmp_path):
    path = tmp_path / "old.json"
    d = toy_calibration().to_dict()
    d.pop("conformal")
    path.write_text(json.dumps(d))
    assert Calibration.load(path).conformal == {}


@pytest.mark.unit
@pytest.mark.parametrize(
    "bad",
    [
        [0.1],
        {"mood": {"score": "aps", "n": 1, "scores": [0.1]}},
        {"mood": {"score": "lac", "n": 2, "scores": [0.3, 0.1]}},  # not ascending
        {"mood": {"score": "lac", "n": 3, "scores": [0.1, 0.3]}},  # wrong n
        {"mood": {"score": "lac", "n": 1, "scores": ["x"]}},
    ],
)
def test_bad_conformal_entries_are_refused_on_load(tmp_path, bad):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**toy_calibration().to_dict(), "conformal": bad}))
    with pytest.raises(CalibrationError, match="conformal"):
        Calibration.load(path)


# --- FieldResult.prediction_set through `answers` ---------------------------------------------


def _answers(cal, temperature=1.0):
    schema = compile_schema(SCHEMA)
    qs = [Question("mood", None, ()), Question("urgent", None, ())]
    z = [np.array([2.0, 1.5, -1.0]), np.array([0.3, 0.0])]
    return answers(schema, qs, z, temperature, cal)[0]


@pytest.mark.unit
def test_prediction_set_from_answers_uses_the_calibration_at_temperature_1():
    # calibrated mood: softmax([2, 1.5, -1] / 2) = [0.4995, 0.389, 0.1115]
    scores = [0.05 * i for i in range(1, 20)]  # n = 19: 0.05 ... 0.95
    cal = toy_calibration(
        conformal={
            "mood": {"score": "lac", "n": 19, "scores": scores},
            "urgent": {"score": "lac", "n": 19, "scores": scores},
        }
    )
    fields = _answers(cal)
    p = softmax(np.array([2.0, 1.5, -1.0]), 2.0)
    assert fields["mood"].conformal is not None
    np.testing.assert_allclose(fields["mood"].conformal.probs, p)
    # 0.6: the ceil(12) = 12th score, 0.6: keeps p >= 0.4, calm alone
    assert fields["mood"].prediction_set(0.6) == ["calm"]
    # 0.7: the 14th, 0.7: keeps p >= 0.3
    assert fields["mood"].prediction_set(0.7) == ["calm", "angry"]
    assert fields["mood"].prediction_set(0.95) == ["calm", "angry", "sad"]  # 19th -> 0.95
    # the caller's temperature changes the distribution, not the set
    hot = _answers(cal, temperature=5.0)
    assert hot["mood"].distribution != fields["mood"].distribution
    assert hot["mood"].prediction_set(0.7) == ["calm", "angry"]
    with pytest.raises(TooFewCalibrationItemsError):
        fields["mood"].prediction_set(0.96)
    with pytest.raises(CoverageError):
        fields["mood"].prediction_set(1.0)


@pytest.mark.unit
def test_no_conformal_scores_is_a_typed_error_that_says_how_to_fit():
    fields = _answers(toy_calibration())  # a calibration without conformal scores
    with pytest.raises(NoConformalScoresError, match="pcd calibrate"):
        fields["mood"].prediction_set(0.9)
    bare = _answers(None)  # no calibration at all
    with pytest.raises(NoConformalScoresError, match=r"Decider.load\(\.\.\., calibration="):
        bare["urgent"].prediction_set()


# --- held-out coverage in eval reports --------------------------------------------------------


@pytest.mark.unit
def test_set_coverage_counts_hits_sizes_and_plain_lac_sets():
    from pcd_tools.eval.conformal import set_coverage

    scores = [0.05 * i for i in range(1, 20)]  # n = 19; 0.8 -> the 16th, 0.8
    cal = toy_calibration(
        temperatures={}, conformal={"mood": {"score": "lac", "n": 19, "scores": scores}}
    )
    schema = compile_schema(SCHEMA)
    z = [
        {"mood": np.log([0.7, 0.2, 0.1])},  # set at 0.8 (p >= 0.2): calm, angry
        {"mood": np.log([0.1, 0.85, 0.05])},  # angry
        {"mood": np.log([0.15, 0.15, 0.7])},  # sad
        {"mood": np.log([0.5, 0.1, 0.4])},  # calm, sad
    ]
    gold = [{"mood": "angry"}, {"mood": "calm"}, {"mood": "sad"}, {"mood": "sad", "urgent": True}]
    got = set_coverage(schema, cal, z, gold, coverages=(0.8, 0.96))
    assert set(got) == {"mood"}  # `urgent` has no conformal scores
    r = got["mood"]["0.8"]
    assert r["threshold"] == pytest.approx(0.8)
    assert r["coverage"] == 0.75 and r["lac_coverage"] == 0.75
    assert r["mean_size"] == pytest.approx(6 / 4)
    assert r["singleton_rate"] == 0.5 and r["lac_empty_rate"] == 0.0
    assert (r["n"], r["n_cal"]) == (4, 19)
    assert "needs at least" in got["mood"]["0.96"]["error"]
