"""`pcd_tools.eval.cascade`: sweeps, fits and reports from two models' saved results."""

from __future__ import annotations

import json
import math
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel

from pcd_tools.answers.calibration import Calibration, CalibrationError
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.eval.cascade import (
    CascadeEvalError,
    CascadeFit,
    ModelRun,
    cascade_report,
    confidence,
    evaluate_policy,
    fit_cascade,
    pair_runs,
    sweep,
)
from pcd_tools.eval.cascade_data import to_threshold
from pcd_tools.schema import compile_schema


class Two(BaseModel):
    """Two fields."""

    mood: Literal["good", "bad", "meh"]
    spam: bool


FP = compile_schema(Two).fingerprint()


def _run(model, mood_p, spam_p, gold, tokens=100.0, ms=10.0):
    """A ModelRun whose softmax gives exactly the probabilities `mood_p`/`spam_p`."""
    rows = []
    for m, s in zip(mood_p, spam_p):
        rows.append({"mood": np.log(np.asarray(m)).tolist(), "spam": np.log([s, 1 - s]).tolist()})
    n = len(rows)
    return ModelRun(
        model_id=model,
        fingerprint=FP,
        ids=[f"i{k}" for k in range(n)],
        gold=[dict(g) for g in gold],
        log_scores=rows,
        prompt_tokens=np.full(n, tokens),
        ms=np.full(n, ms),
    )


def _random_pair(n=60, seed=0):
    rng = np.random.default_rng(seed)
    moods = ["good", "bad", "meh"]
    gold = [{"mood": moods[rng.integers(3)], "spam": bool(rng.integers(2))} for _ in range(n)]
    small_m, small_s, large_m, large_s = [], [], [], []
    for g in gold:
        gi = moods.index(g["mood"])
        # the small model is right when it is sure, a coin when it is not
        sure = rng.random()
        pm = rng.dirichlet([1, 1, 1])
        if sure > 0.5:
            pm = np.full(3, (1 - sure) / 2)
            pm[gi] = sure
        small_m.append(pm)
        ps = rng.uniform(0.05, 0.95)
        small_s.append(ps)
        lm = np.full(3, 0.1)
        lm[gi] = 0.8
        large_m.append(lm if rng.random() < 0.9 else np.roll(lm, 1))
        large_s.append(0.9 if g["spam"] else 0.1)
    return _run("small", small_m, small_s, gold, ms=1.0), _run(
        "large", large_m, large_s, gold, ms=10.0
    )


def test_policy_metrics_on_a_hand_made_case():
    gold = [{"mood": "good", "spam": True}, {"mood": "bad", "spam": False}]
    small = _run("s", [[0.5, 0.3, 0.2], [0.9, 0.05, 0.05]], [0.9, 0.6], gold, tokens=10, ms=1)
    large = _run("l", [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1]], [0.8, 0.2], gold, tokens=30, ms=4)
    pair = pair_runs(Two, small, large)
    # mood escalates below 0.6 (item 0 only); spam never
    got = evaluate_policy(pair, {"mood": ("probability", 0.6), "spam": ("probability", 0.0)})
    assert got["field_escalation"] == {"mood": 0.5, "spam": 0.0}
    assert got["escalation"] == 0.5
    # mood: item 0 from large (good, right), item 1 small (good, wrong); spam: small
    # (True right, True wrong)
    assert got["fields"]["mood"]["accuracy"] == 0.5
    assert got["fields"]["spam"]["accuracy"] == 0.5
    assert got["accuracy"] == 0.5
    assert got["large_tokens"] == pytest.approx(30 / 60)
    assert got["est_time"] == pytest.approx((1 + 1 + 4) / 8)


def test_the_sweep_runs_from_small_only_to_large_only():
    small, large = _random_pair()
    pair = pair_runs(Two, small, large)
    rows = sweep(pair, "probability", points=11)
    assert rows[0]["escalation"] == 0.0 and rows[-1]["escalation"] == 1.0
    never = {"mood": ("probability", 0.0), "spam": ("probability", 0.0)}
    always = {"mood": ("probability", 1.0), "spam": ("probability", 1.0)}
    assert rows[0]["accuracy"] == evaluate_policy(pair, never)["accuracy"]
    assert rows[-1]["accuracy"] == evaluate_policy(pair, always)["accuracy"]
    esc = [r["escalation"] for r in rows]
    assert esc == sorted(esc)


@pytest.mark.parametrize("signal", ["probability", "margin", "entropy"])
def test_never_and_always_are_the_single_models(signal):
    small, large = _random_pair(40, seed=2)
    pair = pair_runs(Two, small, large)
    rows = sweep(pair, signal, points=5)
    assert rows[0]["escalation"] == 0.0 and rows[-1]["escalation"] == 1.0
    for cut, rate in ((-math.inf, 0.0), (math.inf, 1.0)):
        th = {f: (signal, to_threshold(signal, cut, pair.small[f].shape[1])) for f in pair.fields}
        assert evaluate_policy(pair, th)["escalation"] == rate
    fit = fit_cascade(Two, small, large, max_escalation=0.3, signal=signal)
    assert fit.calibration["escalation"] <= 0.3


def test_signals_order_the_items():
    p = np.array([[0.6, 0.3, 0.1], [0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    assert confidence(p, "probability").tolist() == [0.6, 0.5, 1.0]
    assert confidence(p, "margin").tolist() == pytest.approx([0.3, 0.0, 1.0])
    ent = -np.array(
        [-(0.6 * math.log(0.6) + 0.3 * math.log(0.3) + 0.1 * math.log(0.1)), math.log(2), 0.0]
    )
    assert confidence(p, "entropy").tolist() == pytest.approx(ent.tolist())
    with pytest.raises(InvalidArgumentError, match="accepted"):
        confidence(p, "vibes")


def _brute_one_field(pair, field):
    """Accuracy after escalating the k least confident items of one field, k = 0..n."""
    c = confidence(pair.small[field], "probability")
    order = np.argsort(c, kind="stable")
    g = pair.gold[field]
    out = []
    for k in range(pair.n + 1):
        esc = np.zeros(pair.n, bool)
        esc[order[:k]] = True
        final = np.where(esc[:, None], pair.large[field], pair.small[field]).argmax(1)
        out.append((k / pair.n, float((final == g).mean())))
    return out


class One(BaseModel):
    """One field."""

    mood: Literal["good", "bad", "meh"]


def test_fits_match_brute_force_on_one_field():
    small, large = _random_pair(80, seed=3)
    fp = compile_schema(One).fingerprint()
    strip = lambda r: ModelRun(  # noqa: E731
        r.model_id,
        fp,
        r.ids,
        [{"mood": g["mood"]} for g in r.gold],
        [{"mood": z["mood"]} for z in r.log_scores],
        r.prompt_tokens,
        r.ms,
    )
    small, large = strip(small), strip(large)
    pair = pair_runs(One, small, large)
    brute = _brute_one_field(pair, "mood")
    fit = fit_cascade(One, small, large, max_escalation=0.3)
    best = max(a for e, a in brute if e <= 0.3 + 1e-12)
    assert fit.calibration["accuracy"] == pytest.approx(best)
    assert fit.calibration["escalation"] <= 0.3
    large_acc = brute[-1][1]
    fit2 = fit_cascade(One, small, large, max_accuracy_loss=0.01)
    least = min(e for e, a in brute if a >= large_acc - 0.01 - 1e-12)
    assert fit2.calibration["escalation"] == pytest.approx(least)
    assert fit2.calibration["accuracy"] >= large_acc - 0.01 - 1e-12
    assert fit2.reached
    # with a bound: the least escalation whose 90% lower bound on the paired accuracy
    # difference is within the loss
    fit3 = fit_cascade(One, small, large, max_accuracy_loss=0.01, confidence_level=0.9)
    c = confidence(pair.small["mood"], "probability")
    order = np.argsort(c, kind="stable")
    g = pair.gold["mood"]
    large_ok = (pair.large["mood"].argmax(1) == g).astype(float)
    z = 1.2815515655446004  # NormalDist().inv_cdf(0.9)
    first = None
    for k in range(pair.n + 1):
        esc = np.zeros(pair.n, bool)
        esc[order[:k]] = True
        ok = np.where(esc[:, None], pair.large["mood"], pair.small["mood"]).argmax(1) == g
        d = ok.astype(float) - large_ok
        if d.mean() - z * d.std(ddof=1) / np.sqrt(pair.n) >= -0.01 - 1e-12:
            first = k / pair.n
            break
    assert first is not None and first >= least
    assert fit3.calibration["escalation"] == pytest.approx(first)
    assert fit3.calibration["confidence_level"] == 0.9


def test_fits_on_two_fields_meet_their_targets():
    small, large = _random_pair(120, seed=1)
    fit = fit_cascade(Two, small, large, max_escalation=0.25, signal="margin")
    assert fit.calibration["escalation"] <= 0.25
    assert all(s == "margin" for s, _ in fit.thresholds.values())
    never = evaluate_policy(
        pair_runs(Two, small, large), {"mood": ("margin", 0.0), "spam": ("margin", 0.0)}
    )
    assert fit.calibration["accuracy"] >= never["accuracy"]
    fit2 = fit_cascade(Two, small, large, max_accuracy_loss=0.0)
    assert fit2.calibration["accuracy"] >= fit2.calibration["large_accuracy"] - 1e-12


def test_fit_errors_are_typed():
    small, large = _random_pair(20)
    with pytest.raises(InvalidArgumentError, match="exactly one target"):
        fit_cascade(Two, small, large)
    with pytest.raises(InvalidArgumentError, match="exactly one target"):
        fit_cascade(Two, small, large, max_escalation=0.3, max_accuracy_loss=0.01)
    with pytest.raises(InvalidArgumentError, match=r"in \[0, 1\]"):
        fit_cascade(Two, small, large, max_escalation=1.5)
    with pytest.raises(InvalidArgumentError, match="confidence_level"):
        fit_cascade(Two, small, large, max_accuracy_loss=0.01, confidence_level=1.0)
    with pytest.raises(InvalidArgumentError, match="unknown signal"):
        fit_cascade(Two, small, large, max_escalation=0.3, signal="loudness")
    other = ModelRun(
        "x", "deadbeef", small.ids, small.gold, small.log_scores, small.prompt_tokens, small.ms
    )
    with pytest.raises(CascadeEvalError, match="fingerprint"):
        fit_cascade(Two, small, other, max_escalation=0.3)
    apart = ModelRun(
        "y",
        FP,
        [f"z{i}" for i in range(20)],
        large.gold,
        large.log_scores,
        large.prompt_tokens,
        large.ms,
    )
    with pytest.raises(CascadeEvalError, match="share no item"):
        fit_cascade(Two, small, apart, max_escalation=0.3)
    with pytest.raises(CascadeEvalError, match="pcd eval --out"):
        ModelRun.from_report({"items": [{"id": "a"}]})


def test_a_fit_is_stored_in_the_calibration_file_and_read_back(tmp_path):
    small, large = _random_pair(60)
    fit = fit_cascade(Two, small, large, max_escalation=0.3)
    cal = Calibration("small", "Two", FP, {"mood": 1.0})
    path = fit.attach(cal).save(tmp_path / "cal.json")
    back = Calibration.load(path)
    got = CascadeFit.from_dict(back.cascade)
    assert got.target == "max_escalation" and got.value == 0.3
    assert set(got.thresholds) == set(fit.thresholds) == {"mood", "spam"}
    for f, (s, t) in fit.thresholds.items():
        assert got.thresholds[f][0] == s
        assert got.thresholds[f][1] == pytest.approx(t, abs=1e-6)
    raw = json.loads(path.read_text())
    raw["cascade"]["thresholds"]["mood"] = ["loudness", 0.3]
    path.write_text(json.dumps(raw))
    with pytest.raises(CalibrationError, match="probability, margin or entropy"):
        Calibration.load(path)


def test_the_report_splits_compares_gates_and_checks_the_fits():
    small, large = _random_pair(200, seed=5)
    rep = cascade_report(Two, small, large, seed=0, points=11)
    assert rep["n_calibration"] + rep["n_held_out"] == 200
    assert not set(rep["calibration_ids"]) & set(rep["held_out_ids"])
    assert set(rep["gates"]) == {
        f"{s}/{g}" for s in ("raw", "fitted") for g in ("probability", "margin", "entropy")
    }
    assert rep["best_gate"] == max(rep["gates"], key=lambda g: rep["gates"][g]["area"])
    fit = rep["fits"]["max_escalation/raw/probability"]
    assert fit["calibration"]["escalation"] <= 0.3
    assert fit["met"] == (fit["held_out"]["escalation"] <= 0.33)
    json.dumps(rep)  # serialisable
    # top-k narrowing only ever renormalises the large model over the small one's top k
    narrowed = cascade_report(Two, small, large, seed=0, points=5, top_k=1)
    assert narrowed["escalated_scoring"] == "top 1 (simulated)"
    # with one candidate kept, escalating never changes the small model's answer
    assert narrowed["large_only"]["accuracy"] == narrowed["small_only"]["accuracy"]
