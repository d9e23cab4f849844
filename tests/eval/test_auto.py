"""`method="auto"`: per field, by cross-validation, never worse than no change."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcd_tools.answers.calibration import Calibration, CalibrationError
from pcd_tools.eval.auto import CANDIDATES, NULL_QUANTILE, choose
from pcd_tools.eval.calibration import (
    calibrate,
    calibration_from_scores,
    content_free_offsets,
    fit_field,
    resolve_objective,
)
from pcd_tools.eval.fit_data import label_free_scores
from pcd_tools.eval.metrics import ece, ece_floor, ece_null_quantile
from pcd_tools.schema import compile_schema
from tests.eval.helpers import LABELS, SCHEMA, TEXTS, draw, softmax

pytestmark = pytest.mark.unit


def _never_worse(how):
    cv = how["cv"]
    chosen = cv[how["method"]]
    ident = cv["identity"]
    assert chosen["error"] <= ident["error"]
    assert chosen["correct"] >= ident["correct"]
    if how["method"] != "identity":
        assert chosen["error"] < ident["error"]  # a tie keeps the scores unchanged


@pytest.mark.parametrize("seed", range(6))
def test_already_calibrated_scores_are_left_alone(seed):
    # the labels are drawn from softmax(z): any fitted change can only add noise
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, size=(240, 4))
    g = draw(rng, z, 1.0, np.zeros(4))
    t, b, how = fit_field(z, g, "auto")
    _never_worse(how)
    assert how["method"] == "identity" and t == 1.0 and b is None
    assert set(how["cv"]) == {"identity", "temperature", "temperature_bias"}
    assert how["why"].startswith("no change")


@pytest.mark.parametrize("seed", range(4))
def test_overconfident_scores_get_a_temperature(seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 3.0, size=(400, 3))
    g = draw(rng, z, 3.0, np.zeros(3))  # the truth is softmax(z / 3): z is 3x too sharp
    t, b, how = fit_field(z, g, "auto")
    _never_worse(how)
    assert how["method"] == "temperature" and b is None
    assert 2.0 < t < 4.5
    assert how["cv"]["identity"]["error"] > 0.1 and how["cv"]["temperature"]["error"] == 0.0


def test_a_leaning_model_gets_biases_and_the_answers_it_was_missing():
    rng = np.random.default_rng(6)
    z = rng.normal(0.0, 3.0, size=(600, 3))
    g = draw(rng, z, 2.0, np.array([2.5, 0.0, -2.5]))
    _, b, how = fit_field(z, g, "auto")
    _never_worse(how)
    assert how["method"] == "temperature_bias" and b is not None and b[0] > 1.0 > -1.0 > b[2]
    assert how["cv"]["temperature_bias"]["accuracy"] > how["cv"]["identity"]["accuracy"] + 0.2
    assert how["bias_prior_sd"] > 0


def test_a_candidate_that_loses_answers_is_refused():
    # the model is right 80% of the time; the content-free offset would flip most answers
    rng = np.random.default_rng(3)
    n = 200
    g = rng.integers(0, 2, size=n)
    z = np.where(np.eye(2)[g] > 0, 1.5, 0.0)
    wrong = rng.uniform(size=n) < 0.2
    z[wrong] = z[wrong][:, ::-1]
    offsets = {"contextual": np.array([3.0, 0.0])}  # moves every answer to the second value
    _, _, how = fit_field(z, g, "auto", offsets=offsets)
    _never_worse(how)
    assert "contextual" in how["refused_lower_accuracy"]
    assert how["method"] not in ("contextual", "contextual_temperature")


def test_a_label_free_correction_is_chosen_and_stored_as_biases():
    # the model's lean is exactly what the content-free offset measures: removing it
    # restores answers a temperature cannot
    rng = np.random.default_rng(11)
    n, k = 300, 4
    clean = rng.normal(0.0, 2.0, size=(n, k))
    g = draw(rng, clean, 1.0, np.zeros(k))
    lean = np.array([3.0, 1.0, 0.0, -1.0])
    z = clean + lean
    t, b, how = choose(z, g, offsets={"contextual": lean, "pmi": lean + 0.5})
    _never_worse(how)
    # PMI's offset differs by a constant, so it is the same correction: the simpler wins
    assert how["method"] == "contextual" and how["label_free"] == "contextual"
    assert set(how["cv"]) == set(CANDIDATES)
    # softmax(z / T + b) with b = -offset / T is exactly softmax((z - offset) / T)
    want = softmax(z - lean, t, np.zeros(k))
    assert softmax(z, t, b) == pytest.approx(want, abs=1e-12)
    assert how["offset"] == pytest.approx(list(lean))


def test_too_few_items_change_nothing():
    z = np.array([[2.0, 0.0]] * 6)
    t, b, how = fit_field(z, np.zeros(6, dtype=int), "auto")
    assert (t, b, how["method"]) == (1.0, None, "identity")
    assert "too few" in how["why"]


def test_the_criterion_is_the_ece_above_its_calibrated_quantile():
    rng = np.random.default_rng(2)
    z = rng.normal(0.0, 3.0, size=(300, 3))
    g = draw(rng, z, 2.0, np.zeros(3))
    _, _, how = fit_field(z, g, "auto")
    ident = how["cv"]["identity"]
    p = softmax(z, 1.0, np.zeros(3))
    conf, ok = p.max(axis=1), p.argmax(axis=1) == g
    assert ident["ece"] == pytest.approx(ece(conf, ok), abs=1e-6)
    assert ident["ece_floor"] == pytest.approx(ece_floor(conf), abs=1e-6)
    q = ece_null_quantile(conf, NULL_QUANTILE)
    assert ident["ece_q90"] == pytest.approx(q, abs=1e-6) and q > ident["ece_floor"]
    assert ident["error"] == pytest.approx(max(0.0, ident["ece"] - q), abs=1e-6)


def test_auto_is_the_default_and_its_objective_is_top_label():
    assert resolve_objective("auto", None) == "top_label_nll"
    assert resolve_objective("temperature", None) == "nll"
    with pytest.raises(CalibrationError, match="unknown objective"):
        resolve_objective("auto", "ece")
    with pytest.raises(CalibrationError, match="unknown method"):
        fit_field(np.zeros((20, 2)), np.zeros(20, dtype=int), "isotonic")


def test_the_file_records_choice_candidates_and_reason(tmp_path):
    rng = np.random.default_rng(5)
    schema = compile_schema(SCHEMA)
    zc = rng.normal(0.0, 2.0, size=(240, 3))
    zu = rng.normal(0.0, 3.0, size=(240, 2))
    arrays = {
        "mood": (zc, draw(rng, zc, 1.0, np.zeros(3))),
        "urgent": (zu, draw(rng, zu, 3.0, np.zeros(2))),
    }
    cal = calibration_from_scores(schema, arrays, model_id="m")
    assert cal.method == "auto" and cal.objective == "top_label_nll"
    assert cal.metrics["mood"]["method"] == "identity" and cal.temperature("mood") == 1.0
    assert cal.metrics["urgent"]["method"] == "temperature" and cal.temperature("urgent") > 2
    back = Calibration.load(cal.save(tmp_path / "auto.json"))
    raw = json.loads((tmp_path / "auto.json").read_text())
    for name in ("mood", "urgent"):
        m = raw["metrics"][name]
        assert {"method", "cv", "why", "criterion"} <= set(m)
        assert {"error", "ece", "ece_floor", "accuracy", "top_label_nll", "nll"} <= set(
            m["cv"]["identity"]
        )
        assert back.metrics[name]["method"] == m["method"]
    assert back.probabilities("urgent", zu[:4]) == pytest.approx(
        cal.probabilities("urgent", zu[:4])
    )
    with pytest.raises(CalibrationError, match="offset must be 3"):
        calibration_from_scores(
            schema, arrays, model_id="m", offsets={"contextual": {"mood": [0.0, 1.0]}}
        )


def test_old_files_still_load(tmp_path):
    schema = compile_schema(SCHEMA)
    old = {
        "format": "pcd-tools.calibration/1",
        "model_id": "m",
        "schema_name": schema.name,
        "schema_fingerprint": schema.fingerprint(),
        "temperatures": {"mood": 2.0},
        "metrics": {"mood": {"n": 50, "method": "temperature", "cv_nll": {}}},
    }
    (tmp_path / "old.json").write_text(json.dumps(old))
    cal = Calibration.load(tmp_path / "old.json")
    assert (
        cal.method == "temperature" and cal.label_free == "none" and cal.temperature("mood") == 2.0
    )


# --- on the tiny model ----------------------------------------------------------------------


@pytest.mark.engine
def test_offsets_are_what_the_decider_subtracts(tiny):
    schema = compile_schema(SCHEMA)
    offsets = content_free_offsets(tiny, schema)
    assert set(offsets) == {"contextual", "pmi"}
    assert set(offsets["contextual"]) == {"mood", "urgent"}
    raw = tiny.decide_many(schema, TEXTS[:3], calibration="none")
    ctx = tiny.decide_many(schema, TEXTS[:3], calibration="contextual")
    pmi = tiny.decide_many(schema, TEXTS[:3], scoring="pmi")
    for r, c, p in zip(raw, ctx, pmi):
        for name in ("mood", "urgent"):
            z = np.array(r.fields[name].log_scores)
            assert np.array(c.fields[name].log_scores) == pytest.approx(
                z - offsets["contextual"][name], abs=1e-9
            )
            assert np.array(p.fields[name].log_scores) == pytest.approx(
                z - offsets["pmi"][name], abs=1e-9
            )
    arrays = {"mood": (np.array([r.fields["mood"].log_scores for r in raw]), np.zeros(3, int))}
    got = label_free_scores(arrays, offsets["contextual"])
    assert got["mood"][0] == pytest.approx(
        np.array([c.fields["mood"].log_scores for c in ctx]), abs=1e-9
    )
    assert content_free_offsets(tiny, schema, "constrained").keys() == {"contextual"}


@pytest.mark.engine
def test_calibrate_defaults_to_auto_with_label_free_candidates(tiny):
    items = list(zip(TEXTS * 3, LABELS * 3))
    cal = calibrate(SCHEMA, items, decider=tiny, batch_size=6)
    assert cal.method == "auto" and cal.fitted_on["label_free_candidates"] == ["contextual", "pmi"]
    for name in ("mood", "urgent"):
        how = cal.metrics[name]
        assert set(how["cv"]) == set(CANDIDATES)
        _never_worse(how)
    d = tiny.with_calibration(cal).decide(SCHEMA, TEXTS[0])
    assert d.calibrated and d.calibration_method == "none"
