"""Temperature fitting, calibration files, thresholds, diagrams, order bias and the eval loop."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from pcd_tools.calibration import (
    BIAS_PRIOR_SDS,
    Calibration,
    CalibrationError,
    CalibrationMismatchError,
    calibrate,
    calibration_from_scores,
    choose_threshold,
    decide_orderings,
    fit_field,
    fit_temperature,
    fit_temperature_bias,
    order_bias,
    reliability_diagram,
)
from pcd_tools.errors import PcdToolsError
from pcd_tools.schema import compile_schema

SCHEMA = {
    "mood": {"type": "enum", "choices": ["calm", "angry", "sad"], "description": "Mood"},
    "urgent": {"type": "boolean", "description": "Whether it is urgent"},
}
TEXTS = ["hello there", "this is broken!!", "I lost it", "fine, thanks", "NOW please", "meh"]
LABELS = [
    {"mood": "calm", "urgent": False},
    {"mood": "angry", "urgent": True},
    {"mood": "sad", "urgent": False},
    {"mood": "calm", "urgent": False},
    {"mood": "angry", "urgent": True},
    {"mood": "sad"},  # a missing label is skipped for that field
]


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


# --- the Calibration object -----------------------------------------------------------------


def _cal(**kw: Any) -> Calibration:
    schema = compile_schema(SCHEMA)
    base = dict(
        model_id="tiny-llama-0",
        schema_name=schema.name,
        schema_fingerprint=schema.fingerprint(),
        temperatures={"mood": 2.0},
        fitted_on={"dataset": "toy", "n": 6, "seed": 1, "ids": ["a", "b"]},
    )
    base.update(kw)
    return Calibration(**base)


def _softmax(z, t, b):
    s = z / t + b
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def _draw(rng, z, t, b):
    s = z / t + b
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return (p.cumsum(axis=1) > rng.uniform(size=(len(z), 1))).argmax(axis=1)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("t_true", "b_true"),
    [(2.0, [1.0, -0.5, 0.0, -0.5]), (0.7, [0.0, 0.0, 0.0, 0.0]), (1.5, [1.2, -1.2])],
)
def test_fit_temperature_bias_recovers_known_parameters(t_true, b_true):
    rng = np.random.default_rng(3)
    b_true = np.array(b_true)
    z = rng.normal(0.0, 3.0, size=(20000, len(b_true)))
    t, b = fit_temperature_bias(z, _draw(rng, z, t_true, b_true), prior_sd=10.0)
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
    gold = _draw(rng, z, 1.0, np.array([2.0, 0.0, -2.0]))
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
    plain = _draw(rng, z, 2.0, np.zeros(3))
    leaning = _draw(rng, z, 2.0, np.array([2.5, 0.0, -2.5]))
    _t, b, how = fit_field(z, plain, "auto")
    assert b is None and how["method"] == "temperature"
    assert how["cv_nll"]["temperature"] <= min(how["cv_nll"].values())
    _t, b, how = fit_field(z, leaning, "auto")
    assert b is not None and how["method"] == "temperature_bias"
    assert b[0] > 1.0 > -1.0 > b[2]
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
    gold = _draw(rng, z, 1.0, np.linspace(1.0, -1.0, k))
    for i in np.flatnonzero(rng.uniform(size=n) < 0.3):
        gold[i] = (int(gold[i]) + 1 + rng.integers(k - 1)) % k
        z[i, gold[i]] -= 4.0
    t_nll, b_nll, _ = fit_field(z, gold, "temperature_bias")
    t_top, b_top, how = fit_field(z, gold, "temperature_bias", objective="top_label_nll")
    assert how["nll_temperature"] == pytest.approx(t_nll)
    assert t_top == pytest.approx(t_nll * how["rescale"])
    assert b_top == pytest.approx(b_nll / how["rescale"])
    p_nll = _softmax(z, t_nll, b_nll)
    p_top = _softmax(z, t_top, b_top)
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
    gold = _draw(rng, z, 1.0, np.array([0.0, 2.0, 0.0]))
    zu = rng.normal(0.0, 3.0, size=(400, 2))
    cal = calibration_from_scores(
        schema,
        {"mood": (z, gold), "urgent": (zu, _draw(rng, zu, 1.0, np.zeros(2)))},
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


@pytest.mark.unit
def test_calibration_round_trip(tmp_path):
    cal = _cal()
    path = cal.save(tmp_path / "cal.json")
    assert cal.path == str(path)
    raw = json.loads(path.read_text())
    assert raw["format"] == "pcd-tools.calibration/1"
    assert raw["schema_fingerprint"] == compile_schema(SCHEMA).fingerprint()
    assert raw["fitted_on"]["ids"] == ["a", "b"]
    back = Calibration.load(path)
    assert back.temperatures == {"mood": 2.0} and back.path == str(path)
    assert back.temperature("mood") == 2.0
    assert back.temperature("urgent") == 1.0  # not fitted: unchanged


@pytest.mark.unit
def test_calibration_refuses_another_model_or_schema():
    cal = _cal()
    with pytest.raises(CalibrationMismatchError, match=r"tiny-llama-0.*other-model") as e:
        cal.check_model("other-model")
    assert isinstance(e.value, PcdToolsError) and isinstance(e.value, ValueError)
    cal.check_model("tiny-llama-0")
    cal.check_schema(SCHEMA)
    other = dict(SCHEMA, urgent={"type": "boolean", "description": "Whether to page someone"})
    fp = compile_schema(other).fingerprint()
    with pytest.raises(CalibrationMismatchError, match=f"{cal.schema_fingerprint}.*{fp}"):
        cal.check_schema(other)


@pytest.mark.unit
def test_calibration_load_errors(tmp_path):
    with pytest.raises(CalibrationError, match="cannot read"):
        Calibration.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CalibrationError, match="not JSON"):
        Calibration.load(bad)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CalibrationError, match="not a pcd-tools calibration"):
        Calibration.load(bad)
    raw = _cal(temperatures={"mood": -1}).to_dict()
    bad.write_text(json.dumps(raw))
    with pytest.raises(CalibrationError, match="> 0"):
        Calibration.load(bad)


# --- thresholds -----------------------------------------------------------------------------

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


@pytest.mark.unit
def test_reliability_diagram_writes_a_png(tmp_path):
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.3, 1.0, 200)
    ok = rng.uniform(size=200) < conf
    p = reliability_diagram({"before": (conf, ok), "after": (conf, ok)}, tmp_path / "r.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.unit
def test_rotation_orders_spread_every_value_over_the_list():
    from pcd_tools.calibration import _orderings

    schema = compile_schema(
        {
            "intent": {"type": "enum", "choices": [f"c{i}" for i in range(77)]},
            "ok": {"type": "boolean"},
        }
    )
    for first in ("identity", "reverse"):
        orders = _orderings(schema, 4, 0, first, "rotations")
        assert len(orders) == 4
        lists = [o["intent"] for o in orders]
        assert all(sorted(x) == list(range(77)) for x in lists)  # each is a permutation
        assert len({tuple(x) for x in lists}) == 4
        mean_pos = np.mean([[x.index(c) for c in range(77)] for x in lists], axis=0)
        assert np.abs(mean_pos - 38).max() <= 10  # no value stays at the top or bottom
    fwd = {tuple(o["intent"]) for o in _orderings(schema, 4, 0, "identity", "rotations")}
    rev = {tuple(o["intent"]) for o in _orderings(schema, 4, 0, "reverse", "rotations")}
    assert not fwd & rev  # the averaged flip rate compares disjoint sets of orders
    # a boolean's two rotations are its two orders, whichever listing they start from
    assert [o["ok"] for o in _orderings(schema, 2, 0, "identity", "rotations")] == [[0, 1], [1, 0]]
    assert [o["ok"] for o in _orderings(schema, 2, 0, "reverse", "rotations")] == [[1, 0], [0, 1]]
    four = [o["ok"] for o in _orderings(schema, 4, 0, "identity", "rotations")]
    assert sorted(four) == [[0, 1], [0, 1], [1, 0], [1, 0]]  # balanced for any k
    rnd = _orderings(schema, 3, 5, "identity", "random")
    assert rnd[0]["intent"] == list(range(77)) and rnd == _orderings(
        schema, 3, 5, "identity", "random"
    )
    with pytest.raises(CalibrationError, match="unknown order design"):
        _orderings(schema, 2, 0, "identity", "latin")


# --- on the tiny model ----------------------------------------------------------------------


@dataclass
class FakeGeneration:
    values: dict[str, Any] | None
    value_probs: dict[str, float] | None
    is_valid_json: bool = True
    schema_match: bool = True
    wall_ms: float = 5.0
    passes: int = 9
    tokens: int = 9
    text: str = ""


def _stub_baseline(decider, schema, text):
    if text == "meh":
        return FakeGeneration(None, None, is_valid_json=False, schema_match=False, text="{")
    return FakeGeneration({"mood": "calm", "urgent": False}, {"mood": 0.9, "urgent": 0.6})


@pytest.mark.engine
def test_calibrate_and_apply(tiny, tmp_path):
    cal = calibrate(SCHEMA, zip(TEXTS, LABELS), decider=tiny, batch_size=4)
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
    assert {m["method"] for m in auto.metrics.values()} <= {"temperature", "temperature_bias"}
    assert set(auto.biases) <= {"mood", "urgent"}


@pytest.mark.engine
def test_evaluate_reports_both_methods(tiny):
    from pcd_tools.evaluate import evaluate

    cal = calibrate(SCHEMA, zip(TEXTS, LABELS), decider=tiny, batch_size=8)
    cal.thresholds = {"mood": {"threshold": 0.0, "target": "coverage"}}
    report = evaluate(
        SCHEMA,
        list(zip(TEXTS, LABELS)),
        decider=tiny.with_calibration(cal),
        baseline=_stub_baseline,
        batch_size=3,
        name="toy",
    )
    assert set(report.methods) == {"pcd", "pcd_calibrated", "baseline"}
    assert report.n == 6 and report.seed is None
    pcd, calm = report.methods["pcd"], report.methods["pcd_calibrated"]
    assert pcd.fields["mood"].n == 6 and pcd.fields["urgent"].n == 5
    assert calm.fields["mood"].accuracy == pcd.fields["mood"].accuracy
    assert pcd.latency_kind == "amortized over batches of 3"
    base = report.methods["baseline"]
    # 5 answers "calm" (2 right), 1 invalid output counted wrong with confidence 0
    assert base.invalid == 1
    assert base.fields["mood"].accuracy == pytest.approx(2 / 6)
    assert base.fields["urgent"].accuracy == pytest.approx(3 / 5)
    assert base.latency["median_ms"] == 5.0
    conf, _ = base.confidence_correct("mood")
    assert conf.tolist() == [0.9] * 5 + [0.0]
    assert report.thresholds["mood"]["eval_coverage"] == 1.0
    d = report.to_dict(items=True)
    json.dumps(d, allow_nan=False)  # strict JSON
    for key in ("accuracy", "macro_f1", "ece", "brier", "nll", "aurc"):
        assert key in d["methods"]["baseline"]["fields"]["mood"]
    assert d["items"][5]["baseline_text"] == "{"


@pytest.mark.engine
def test_a_fitted_bias_can_change_the_answer(tiny):
    raw = tiny.decide(SCHEMA, TEXTS[0])
    z = np.array(raw.fields["mood"].log_scores)
    loser = int(np.argmin(z))
    bias = [0.0, 0.0, 0.0]
    bias[loser] = float(z.max() - z.min() + 5.0)  # enough to overturn the raw ranking
    cal = Calibration(
        model_id=tiny.model_id,
        schema_name="x",
        schema_fingerprint=compile_schema(SCHEMA).fingerprint(),
        temperatures={"mood": 1.0},
        biases={"mood": bias},
        method="temperature_bias",
    )
    d = tiny.with_calibration(cal).decide(SCHEMA, TEXTS[0])
    assert d.calibrated
    assert d.fields["mood"].label == compile_schema(SCHEMA).fields[0].choices[loser].label
    assert d.fields["mood"].log_scores == raw.fields["mood"].log_scores  # raw scores kept
    assert d.fields["urgent"].distribution == pytest.approx(raw.fields["urgent"].distribution)


@pytest.mark.engine
def test_rescore_reproduces_a_report_and_applies_another_calibration(tiny):
    from pcd_tools.evaluate import EvalError, evaluate, rescore

    items = list(zip(TEXTS * 2, LABELS * 2))
    cal = calibrate(SCHEMA, items, decider=tiny, batch_size=6)
    report = evaluate(
        SCHEMA, items, decider=tiny.with_calibration(cal), baseline=_stub_baseline, name="toy"
    )
    saved = json.loads(json.dumps(report.to_dict(items=True)))
    again = rescore(saved, SCHEMA, cal)
    for m in ("pcd", "pcd_calibrated", "baseline"):
        for f in ("mood", "urgent"):
            a, b = report.methods[m].fields[f], again.methods[m].fields[f]
            assert b.accuracy == a.accuracy
            assert b.nll == pytest.approx(a.nll, abs=1e-3)  # stored log scores: 4 decimals
        assert again.methods[m].latency == report.methods[m].latency
    assert again.methods["baseline"].invalid == report.methods["baseline"].invalid
    biased = Calibration(
        model_id=tiny.model_id,
        schema_name="x",
        schema_fingerprint=compile_schema(SCHEMA).fingerprint(),
        temperatures={"mood": 1.0},
        biases={"mood": [0.0, 0.0, 1e3]},  # always "sad"
    )
    other = rescore(saved, SCHEMA, biased).methods["pcd_calibrated"]
    assert other._arrays["mood"]["pred"].tolist() == [2] * 12
    assert other.fields["mood"].mean_confidence == pytest.approx(1.0)
    assert "pcd_calibrated" not in rescore(saved, SCHEMA, None).methods
    with pytest.raises(EvalError, match="fingerprint"):
        rescore(saved, {"x": {"type": "boolean"}}, None)
    with pytest.raises(EvalError, match="items"):
        rescore({**saved, "items": []}, SCHEMA, None)


@pytest.mark.engine
def test_evaluate_samples_with_a_fixed_seed(tiny):
    from pcd_tools.evaluate import evaluate

    a = evaluate(SCHEMA, zip(TEXTS, LABELS), decider=tiny, baseline=False, n=3, seed=4)
    b = evaluate(SCHEMA, zip(TEXTS, LABELS), decider=tiny, baseline=False, n=3, seed=4)
    assert a.n == 3 and a.seed == 4 and "baseline" not in a.methods
    assert [r["id"] for r in a.items] == [r["id"] for r in b.items]


@pytest.mark.engine
def test_order_bias_and_averaging(tiny):
    rep = order_bias(SCHEMA, TEXTS[:3], decider=tiny, k=3, seed=0, batch_size=3)
    assert rep.n == 3 and rep.k == 3
    assert set(rep.flip_rate) == {"mood", "urgent"}
    assert all(0.0 <= v <= 1.0 for v in rep.flip_rate.values())
    assert set(rep.flip_rate_averaged) == {"mood", "urgent"}
    # each order costs its own prefill and field pass (more when its prefix is not cached)
    assert rep.passes_per_call["averaged"] >= 3 * 2
    assert rep.passes_per_call["averaged"] > 2 * rep.passes_per_call["single"]
    avg = decide_orderings(tiny, SCHEMA, TEXTS[:2], k=2, seed=0)
    one = tiny.decide_many(SCHEMA, TEXTS[:2])
    rev = tiny.decide_many(SCHEMA, TEXTS[:2], choice_order={"mood": [2, 1, 0], "urgent": [1, 0]})
    for i in range(2):
        for name in ("mood", "urgent"):
            p = avg[i].fields[name].distribution
            assert sum(p.values()) == pytest.approx(1.0)
        assert avg[i].sequential_forward_passes >= 2 * one[i].sequential_forward_passes
    # with explicit orders, the average is exactly the mean of the two runs
    both = decide_orderings(
        tiny, SCHEMA, TEXTS[:2], orderings=[{}, {"mood": [2, 1, 0], "urgent": [1, 0]}]
    )
    for i in range(2):
        for c in ("calm", "angry", "sad"):
            mean = (
                one[i].fields["mood"].distribution[c] + rev[i].fields["mood"].distribution[c]
            ) / 2
            assert both[i].fields["mood"].distribution[c] == pytest.approx(mean, abs=1e-12)


def _fake_load(tiny):
    """`Decider.load` returning the tiny model, calibrated when asked."""
    return classmethod(
        lambda cls, *a, calibration=None, **k: (
            tiny.with_calibration(calibration) if calibration else tiny
        )
    )


@pytest.mark.engine
def test_cli_calibrate_then_eval(tiny, tmp_path, monkeypatch, capsys):
    from pcd_tools.cli import main
    from pcd_tools.decider import Decider

    monkeypatch.setattr(Decider, "load", _fake_load(tiny))
    data = tmp_path / "d.jsonl"
    rows = [{"text": t, **lab} for t, lab in zip(TEXTS * 3, LABELS * 3)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    common = ["--data", str(data), "--schema", str(schema)]
    cal_path = tmp_path / "cal.json"
    rc = main(
        [
            "calibrate",
            *common,
            "--n",
            "6",
            "--eval-n",
            "9",
            "--out",
            str(cal_path),
            "--target-risk",
            "0.5",
            "--diagrams",
            str(tmp_path / "png"),
            "--scores",
            str(tmp_path / "scores.json"),
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fitted_on"]["n"] == 6 and out["fitted_on"]["excluded_eval_sample"]["n"] == 9
    assert set(out["thresholds"]) == {"mood", "urgent"}
    assert (tmp_path / "png" / "d_mood_calibration_split.png").exists()
    rc = main(
        [
            "eval",
            *common,
            "--n",
            "9",
            "--no-baseline",
            "--calibration",
            str(cal_path),
            "--order-bias",
            "2",
            "--order-bias-n",
            "2",
            "--json",
            "--diagrams",
            str(tmp_path / "png"),
            "--out",
            str(tmp_path / "report.json"),
        ]
    )
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["n"] == 9 and rep["seed"] == 0
    assert set(rep["methods"]) == {"pcd", "pcd_calibrated"}
    assert rep["order_bias"]["k"] == 2
    assert (tmp_path / "png" / "d_urgent.png").exists()
    # refit from the saved scores with another method, without the model...
    monkeypatch.setattr(Decider, "load", None)  # any model load would now fail
    cal2 = tmp_path / "cal2.json"
    rc = main(
        [
            "calibrate",
            *common,
            "--from-scores",
            str(tmp_path / "scores.json"),
            "--method",
            "temperature_bias",
            "--out",
            str(cal2),
            "--json",
        ]
    )
    assert rc == 0
    out2 = json.loads(capsys.readouterr().out)
    assert out2["method"] == "temperature_bias" and set(out2["biases"]) == {"mood", "urgent"}
    assert out2["fitted_on"]["ids"] == out["fitted_on"]["ids"]
    # ...and recompute the saved report under it
    rc = main(
        [
            "eval",
            *common,
            "--from-report",
            str(tmp_path / "report.json"),
            "--calibration",
            str(cal2),
            "--json",
        ]
    )
    assert rc == 0
    rep2 = json.loads(capsys.readouterr().out)
    for f in ("mood", "urgent"):  # the same metrics, from log scores stored to 4 decimals
        a, b = rep["methods"]["pcd"]["fields"][f], rep2["methods"]["pcd"]["fields"][f]
        assert b["accuracy"] == a["accuracy"] and b["nll"] == pytest.approx(a["nll"], abs=1e-3)
    assert rep2["calibration_file"] == str(cal2) and rep2["order_bias"] == rep["order_bias"]
    rc = main(["calibrate", *common, "--from-scores", str(tmp_path / "report.json")])
    assert rc == 1
    assert "lacks" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setattr(Decider, "load", _fake_load(tiny))
    # evaluating on the very items the calibration was fitted on is refused
    rc = main(["eval", *common, "--n", "18", "--no-baseline", "--calibration", str(cal_path)])
    assert rc == 1
    assert "fitted on" in capsys.readouterr().err
