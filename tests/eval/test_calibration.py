"""Fitting calibrations: temperatures, biases, `auto`, and `calibrate` on the tiny model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pcd_tools.answers.calibration import Calibration, CalibrationError, CalibrationMismatchError
from pcd_tools.eval.calibration import (
    BIAS_PRIOR_SDS,
    calibrate,
    calibration_from_scores,
    fit_field,
    fit_temperature,
    fit_temperature_bias,
)
from pcd_tools.schema import compile_schema
from tests.eval.helpers import LABELS, SCHEMA, TEXTS, draw, softmax

# --- temperature fitting --------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("t_true", [0.5, 1.0, 2.5])
def test_fit_temperature_recovers_a_known_temperature(t_true):
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 3.0, size=(4000, 5))
    p = np.exp(z / t_true)
    p /= p.sum(axis=1, keepdims=True)
    gold = np.array([rng.choice(5, p=row) for row in p])
    t = fit_temperature(z, gold)
    assert abs(t - t_true) / t_true < 0.08


@pytest.mark.unit
@pytest.mark.parametrize("t_true", [0.5, 2.5])
def test_top_label_objective_also_recovers_a_known_temperature(t_true):
    rng = np.random.default_rng(1)
    z = rng.normal(0.0, 3.0, size=(6000, 4))
    p = np.exp(z / t_true)
    p /= p.sum(axis=1, keepdims=True)
    gold = np.array([rng.choice(4, p=row) for row in p])
    t = fit_temperature(z, gold, objective="top_label_nll")
    assert abs(t - t_true) / t_true < 0.12


@pytest.mark.unit
def test_top_label_objective_ignores_how_low_the_gold_scores():
    # right half the time at margin 4; when wrong, the gold candidate is far below
    z = np.array([[4.0, 0.0, -40.0]] * 50 + [[4.0, 0.0, -40.0]] * 50)
    gold = np.array([0] * 50 + [2] * 50)
    t = fit_temperature(z, gold, objective="top_label_nll")
    p = np.exp(z[0] / t) / np.exp(z[0] / t).sum()
    assert p.max() == pytest.approx(0.5, abs=1e-3)  # confidence = accuracy
    # the multi-class NLL is dominated by the far-off gold and flattens everything
    t_nll = fit_temperature(z, gold)
    q = np.exp(z[0] / t_nll) / np.exp(z[0] / t_nll).sum()
    assert t_nll > t and q.max() < 0.45
    with pytest.raises(CalibrationError, match="unknown objective"):
        fit_temperature(z, gold, objective="ece")


@pytest.mark.unit
def test_fit_temperature_minimises_nll_and_rejects_bad_input():
    z = np.array([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    gold = np.array([0, 0, 0, 0])  # right 3 of 4 at margin 2: optimum where p = 0.75
    t = fit_temperature(z, gold)
    assert 1 / (1 + math.exp(-2 / t)) == pytest.approx(0.75, abs=1e-4)
    with pytest.raises(CalibrationError, match=r"\(n, K\)"):
        fit_temperature(np.zeros((0, 2)), np.zeros(0))


# --- temperature and biases -----------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("t_true", "b_true"),
    [(2.0, [1.0, -0.5, 0.0, -0.5]), (0.7, [0.0, 0.0, 0.0, 0.0]), (1.5, [1.2, -1.2])],
)
def test_fit_temperature_bias_recovers_known_parameters(t_true, b_true):
    rng = np.random.default_rng(3)
    b_true = np.array(b_true)
    z = rng.normal(0.0, 3.0, size=(20000, len(b_true)))
    t, b = fit_temperature_bias(z, draw(rng, z, t_true, b_true), prior_sd=10.0)
    assert abs(t - t_true) / t_true < 0.05
    assert np.abs(b - (b_true - b_true.mean())).max() < 0.08
    assert abs(b.sum()) < 1e-9  # reported with mean zero


@pytest.mark.unit
def test_fit_temperature_bias_is_platt_scaling_for_a_boolean():
    # the scores carry no information and the labels are 80% the second value: T runs to
    # its bound and the bias difference becomes the log prior odds, log(0.8 / 0.2)
    rng = np.random.default_rng(4)
    z = rng.normal(0.0, 1.0, size=(5000, 2))
    gold = (rng.uniform(size=5000) < 0.8).astype(int)
    t, b = fit_temperature_bias(z, gold, prior_sd=10.0)
    assert t == pytest.approx(50.0)
    assert b[1] - b[0] == pytest.approx(math.log(4.0), abs=0.1)


@pytest.mark.unit
def test_the_prior_shrinks_biases_fitted_on_few_items():
    rng = np.random.default_rng(5)
    z = rng.normal(0.0, 2.0, size=(40, 3))
    gold = draw(rng, z, 1.0, np.array([2.0, 0.0, -2.0]))
    wide = fit_temperature_bias(z, gold, prior_sd=10.0)[1]
    narrow = fit_temperature_bias(z, gold, prior_sd=0.1)[1]
    assert np.abs(narrow).max() < 0.2 * np.abs(wide).max()
    with pytest.raises(CalibrationError, match="prior_sd"):
        fit_temperature_bias(z, gold, prior_sd=0)
    with pytest.raises(CalibrationError, match="need"):
        fit_temperature_bias(z[:, :, None], gold)


@pytest.mark.unit
def test_auto_picks_temperature_alone_or_with_biases_by_cross_validation():
    rng = np.random.default_rng(6)
    z = rng.normal(0.0, 3.0, size=(600, 3))
    plain = draw(rng, z, 2.0, np.zeros(3))
    leaning = draw(rng, z, 2.0, np.array([2.5, 0.0, -2.5]))
    _t, b, how = fit_field(z, plain, "auto")
    assert b is None and how["method"] == "temperature"
    # tied on the error, biases do not earn their place: within one SE of the best NLL
    assert how["cv"]["temperature"]["error"] == how["cv"]["temperature_bias"]["error"]
    _t, b, how = fit_field(z, leaning, "auto")
    assert b is not None and how["method"] == "temperature_bias"
    assert b[0] > 1.0 > -1.0 > b[2]
    # `temperature_bias` alone still picks its prior's width by cross-validated NLL
    _t, _b, how = fit_field(z, leaning, "temperature_bias")
    assert str(how["bias_prior_sd"]) == min(how["cv_nll"], key=how["cv_nll"].get)
    with pytest.raises(CalibrationError, match="unknown method"):
        fit_field(z, plain, "isotonic")
    with pytest.raises(CalibrationError, match="unknown objective"):
        fit_field(z, plain, "auto", objective="ece")


@pytest.mark.unit
def test_top_label_objective_refits_the_temperature_after_the_biases():
    # a leaning model; on 30% of the items the gold value is one it scores 4 nats lower.
    # NLL must spread mass onto those, so the answers come out underconfident; the
    # top-label refit brings confidence back to accuracy, keeps every answer, and keeps
    # the biases' direction.
    rng = np.random.default_rng(8)
    n, k = 3000, 20
    z = rng.normal(0.0, 2.0, size=(n, k))
    gold = draw(rng, z, 1.0, np.linspace(1.0, -1.0, k))
    for i in np.flatnonzero(rng.uniform(size=n) < 0.3):
        gold[i] = (int(gold[i]) + 1 + rng.integers(k - 1)) % k
        z[i, gold[i]] -= 4.0
    t_nll, b_nll, _ = fit_field(z, gold, "temperature_bias")
    t_top, b_top, how = fit_field(z, gold, "temperature_bias", objective="top_label_nll")
    assert how["nll_temperature"] == pytest.approx(t_nll)
    assert t_top == pytest.approx(t_nll * how["rescale"])
    assert b_top == pytest.approx(b_nll / how["rescale"])
    p_nll = softmax(z, t_nll, b_nll)
    p_top = softmax(z, t_top, b_top)
    assert np.array_equal(p_nll.argmax(axis=1), p_top.argmax(axis=1))
    acc = float((p_top.argmax(axis=1) == gold).mean())
    assert p_nll.max(axis=1).mean() < acc - 0.1  # NLL: underconfident
    assert p_top.max(axis=1).mean() == pytest.approx(acc, abs=0.03)
    # with temperature alone, the objective is the temperature's own (as fit_temperature)
    t_alone, b_alone, _ = fit_field(z, gold, "temperature", objective="top_label_nll")
    assert b_alone is None
    assert t_alone == pytest.approx(fit_temperature(z, gold, objective="top_label_nll"))


@pytest.mark.unit
def test_biases_apply_save_load_and_are_validated(tmp_path):
    rng = np.random.default_rng(7)
    schema = compile_schema(SCHEMA)
    z = rng.normal(0.0, 3.0, size=(400, 3))
    gold = draw(rng, z, 1.0, np.array([0.0, 2.0, 0.0]))
    zu = rng.normal(0.0, 3.0, size=(400, 2))
    cal = calibration_from_scores(
        schema,
        {"mood": (z, gold), "urgent": (zu, draw(rng, zu, 1.0, np.zeros(2)))},
        model_id="m",
        method="temperature_bias",
    )
    assert cal.method == "temperature_bias" and set(cal.biases) == {"mood", "urgent"}
    m = cal.metrics["mood"]
    assert m["method"] == "temperature_bias" and m["bias_prior_sd"] in BIAS_PRIOR_SDS
    assert m["nll_after"] < m["nll_before"] and m["accuracy_after"] > m["accuracy_before"]
    row = np.array([1.0, 0.5, -1.0])
    s = row / cal.temperature("mood") + np.array(cal.biases["mood"])
    want = np.exp(s / 0.5 - (s / 0.5).max())
    assert cal.probabilities("mood", row, 0.5) == pytest.approx(want / want.sum(), abs=1e-12)
    back = Calibration.load(cal.save(tmp_path / "c.json"))
    assert back.biases == cal.biases and back.method == "temperature_bias"
    assert back.probabilities("mood", z[:5]) == pytest.approx(cal.probabilities("mood", z[:5]))
    with pytest.raises(CalibrationMismatchError, match="3 biases"):
        cal.probabilities("mood", np.zeros(4))
    raw = json.loads((tmp_path / "c.json").read_text())
    raw["biases"]["mood"] = [0.0, "x", 1.0]
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(CalibrationError, match="biases"):
        Calibration.load(tmp_path / "bad.json")
    raw["biases"] = {}
    raw["method"] = "isotonic"
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(CalibrationError, match="unknown method"):
        Calibration.load(tmp_path / "bad.json")
    with pytest.raises(CalibrationError, match=r"\(400, 3\)"):
        calibration_from_scores(schema, {"mood": (zu, gold)}, model_id="m")


# --- on the tiny model ----------------------------------------------------------------------


@pytest.mark.engine
def test_calibrate_and_apply(tiny, tmp_path):
    cal = calibrate(SCHEMA, zip(TEXTS, LABELS), decider=tiny, batch_size=4, method="temperature")
    assert cal.model_id == "tiny-llama-0"
    assert set(cal.temperatures) == {"mood", "urgent"}
    assert cal.metrics["mood"]["n"] == 6 and cal.metrics["urgent"]["n"] == 5
    assert cal.metrics["mood"]["nll_after"] <= cal.metrics["mood"]["nll_before"] + 1e-9
    path = cal.save(tmp_path / "cal.json")
    calibrated = tiny.with_calibration(str(path))
    raw = tiny.decide(SCHEMA, TEXTS[0])
    d = calibrated.decide(SCHEMA, TEXTS[0])
    assert d.calibrated and d.calibration_file == str(path)
    assert d.to_response()["mode"] == "parallel_constrained_calibrated"
    z = np.array(raw.fields["mood"].log_scores) / cal.temperature("mood")
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert d.fields["mood"].probability == pytest.approx(p.max(), abs=1e-9)
    assert d.fields["mood"].label == raw.fields["mood"].label  # temperature never flips
    with pytest.raises(CalibrationMismatchError, match="fingerprint"):
        calibrated.decide({"x": {"type": "boolean"}}, "hi")
    auto = calibrate(SCHEMA, zip(TEXTS, LABELS), decider=tiny, batch_size=4, method="auto")
    assert auto.method == "auto"
    # six items are too few to cross-validate: auto leaves every field unchanged
    assert {m["method"] for m in auto.metrics.values()} == {"identity"}
    assert set(auto.temperatures.values()) == {1.0} and not auto.biases
