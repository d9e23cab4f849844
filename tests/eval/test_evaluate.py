"""The eval loop on the tiny model: both methods, rescoring a saved report, sampling."""

from __future__ import annotations

import json

import pytest

from pcd_tools.answers.calibration import Calibration
from pcd_tools.eval.calibration import calibrate
from pcd_tools.schema import compile_schema
from tests.eval.helpers import LABELS, SCHEMA, TEXTS
from tests.eval.helpers import stub_baseline as _stub_baseline


@pytest.mark.engine
def test_evaluate_reports_both_methods(tiny):
    from pcd_tools.eval.evaluate import evaluate

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
def test_rescore_reproduces_a_report_and_applies_another_calibration(tiny):
    from pcd_tools.eval.evaluate import EvalError, evaluate, rescore

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
    from pcd_tools.eval.evaluate import evaluate

    a = evaluate(SCHEMA, zip(TEXTS, LABELS), decider=tiny, baseline=False, n=3, seed=4)
    b = evaluate(SCHEMA, zip(TEXTS, LABELS), decider=tiny, baseline=False, n=3, seed=4)
    assert a.n == 3 and a.seed == 4 and "baseline" not in a.methods
    assert [r["id"] for r in a.items] == [r["id"] for r in b.items]
