"""Cross-fitted gate calibration (`pcd_tools.eval.cascade.cross_fit`): the thresholds of a
cascade are fitted on confidences of a calibration that never saw the item."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel

from pcd_tools.answers.calibration import Calibration
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.eval.auto import fit_candidate
from pcd_tools.eval.cascade import (
    CascadeEvalError,
    CrossFitted,
    ModelRun,
    cascade_report,
    cross_fit,
    fit_cascade,
    fitted_calibration,
    pair_runs,
)
from pcd_tools.eval.cascade_fit import fit_pair
from pcd_tools.eval.crossfit import run_arrays
from pcd_tools.eval.refit import out_of_fold
from pcd_tools.schema import compile_schema

LABELS = tuple(f"l{k}" for k in range(12))


class Intent(BaseModel):
    """One field of twelve labels."""

    intent: Literal[LABELS]  # type: ignore[valid-type]


SCHEMA = compile_schema(Intent)


def _runs(n: int = 120, seed: int = 0) -> tuple[ModelRun, ModelRun]:
    """A small model whose scores carry a per-label bias (so `auto` fits temperature and
    biases) and a weak signal, and a large model that is right 70% of the time."""
    rng = np.random.default_rng(seed)
    gold = rng.integers(len(LABELS), size=n)
    bias = rng.normal(0.0, 1.5, len(LABELS))
    small, large = [], []
    for g in gold:
        z = rng.normal(0.0, 1.0, len(LABELS)) + bias
        z[g] += 1.2
        small.append({"intent": (z * 2.0).tolist()})
        w = rng.normal(0.0, 0.3, len(LABELS))
        w[g if rng.random() < 0.7 else (g + 1) % len(LABELS)] += 3.0
        large.append({"intent": w.tolist()})
    ids = [f"i{k}" for k in range(n)]
    labels = [{"intent": LABELS[g]} for g in gold]
    fp = SCHEMA.fingerprint()

    def run(model: str, rows: list, ms: float) -> ModelRun:
        return ModelRun(model, fp, ids, labels, rows, np.full(n, 50.0), np.full(n, ms))

    return run("small", small, 1.0), run("large", large, 10.0)


def test_each_item_is_scored_by_the_same_choice_refitted_without_its_fold():
    small, _ = _runs()
    full = fitted_calibration(SCHEMA, small)
    how = full.metrics["intent"]
    assert how["method"] == "temperature_bias"  # the case the cross-fit is for
    crossed = cross_fit(SCHEMA, small, full, folds=4, seed=3)
    assert crossed.folds == 4 and set(crossed.by_id) == set(small.ids)
    copies = {id(c): c for c in crossed.by_id.values()}
    assert len(copies) == 4
    z_all, g_all = run_arrays(SCHEMA, small)["intent"]
    for copy in copies.values():
        fold = [i for i, c in crossed.by_id.items() if c is copy]
        assert 25 <= len(fold) <= 35  # 120 items in 4 folds of 30
        keep = np.array([i not in fold for i in small.ids])
        t, b = fit_candidate(
            "temperature_bias",
            z_all[keep],
            g_all[keep],
            None,
            full.objective,
            how["bias_prior_sd"],
        )
        assert copy.temperatures["intent"] == pytest.approx(t)
        assert copy.biases["intent"] == pytest.approx(list(b))
        assert copy.temperatures["intent"] != pytest.approx(full.temperatures["intent"])
        assert copy.metrics is full.metrics  # the choice itself is not redone
    # the same seed gives the same folds
    again = cross_fit(SCHEMA, small, full, folds=4, seed=3)
    groups = {frozenset(i for i, c in crossed.by_id.items() if c is k) for k in copies.values()}
    again_groups = {
        frozenset(i for i, c in again.by_id.items() if c is k)
        for k in {id(c): c for c in again.by_id.values()}.values()
    }
    assert groups == again_groups


def test_out_of_fold_confidences_show_the_overconfidence_in_sample_ones_hide():
    """The calibration fitted on the items flatters itself on them: right more often, and
    its confidence matches its accuracy there; refitted without each item it is
    overconfident by more, as it will be on new items."""
    small, large = _runs(120, seed=1)
    full = fitted_calibration(SCHEMA, small)
    inside = pair_runs(SCHEMA, small, large, small_calibration=full)
    crossed = pair_runs(
        SCHEMA, small, large, small_calibration=cross_fit(SCHEMA, small, full, folds=5)
    )
    gold = inside.gold["intent"]
    acc_in = float((inside.small["intent"].argmax(1) == gold).mean())
    acc_out = float((crossed.small["intent"].argmax(1) == gold).mean())
    assert acc_out < acc_in
    gap_in = inside.small["intent"].max(1).mean() - acc_in
    gap_out = crossed.small["intent"].max(1).mean() - acc_out
    assert gap_out > gap_in + 0.02


def test_fit_cascade_fits_the_calibration_and_the_thresholds_on_disjoint_folds():
    small, large = _runs(120, seed=2)
    fit = fit_cascade(Intent, small, large, max_accuracy_loss=0.01, calibration="fit", folds=4)
    assert fit.source == "fitted" and fit.folds == 4
    full = fit.small_calibration
    assert isinstance(full, Calibration)
    assert full.temperatures == fitted_calibration(SCHEMA, small).temperatures
    # the same thresholds as a fit on the cross-fitted pair, not on the in-sample one
    crossed = cross_fit(SCHEMA, small, full, folds=4)
    by_hand = fit_pair(
        pair_runs(SCHEMA, small, large, small_calibration=crossed), max_accuracy_loss=0.01
    )
    assert fit.thresholds == by_hand.thresholds
    inside = fit_pair(
        pair_runs(SCHEMA, small, large, small_calibration=full), max_accuracy_loss=0.01
    )
    assert fit.thresholds != inside.thresholds
    # attach() stores the fit in the calibration it fitted
    stored = fit.attach()
    assert stored is full and stored.cascade["cross_fitted_folds"] == 4


def test_bad_cross_fit_arguments_are_refused():
    small, large = _runs(20)
    full = fitted_calibration(SCHEMA, small)
    with pytest.raises(InvalidArgumentError, match="folds must be an int from 2 to"):
        cross_fit(SCHEMA, small, full, folds=1)
    with pytest.raises(InvalidArgumentError, match=r"number of items \(20\)"):
        cross_fit(SCHEMA, small, full, folds=21)
    with pytest.raises(CascadeEvalError, match="at least 2 items"):
        cross_fit(SCHEMA, small.subset(["i0"]), full, folds=2)
    crossed = cross_fit(SCHEMA, small, full, folds=2)
    with pytest.raises(CascadeEvalError, match="'zz' was not among the 20"):
        crossed.for_item("zz")
    with pytest.raises(InvalidArgumentError, match="'fit', a Calibration, a CrossFitted"):
        fit_cascade(Intent, small, large, max_escalation=0.3, calibration="refit")
    fit = fit_cascade(Intent, small, large, max_escalation=0.3)
    with pytest.raises(InvalidArgumentError, match="calibration='fit'"):
        fit.attach()
    assert isinstance(crossed, CrossFitted)


def test_the_report_fits_the_fitted_gate_on_cross_fitted_confidences():
    small, large = _runs(160, seed=5)
    rep = cascade_report(Intent, small, large, seed=0, points=5, folds=4)
    assert rep["fitted_thresholds_on"] == "4-fold cross-fitted confidences"
    assert rep["best_gate"] == "fitted/probability"  # the biased small model needs its calibration
    cal = small.subset(rep["calibration_ids"])
    full = fitted_calibration(SCHEMA, cal)
    large_cal = large.subset(rep["calibration_ids"])
    by_hand = fit_pair(
        pair_runs(SCHEMA, cal, large_cal, small_calibration=cross_fit(SCHEMA, cal, full, folds=4)),
        max_escalation=0.3,
    )
    got = rep["fits"]["max_escalation/best"]
    assert got["calibration"]["escalation"] == pytest.approx(by_hand.calibration["escalation"])
    assert got["thresholds"]["intent"][1] == pytest.approx(
        by_hand.thresholds["intent"][1], abs=1e-6
    )
    inside = fit_pair(pair_runs(SCHEMA, cal, large_cal, small_calibration=full), max_escalation=0.3)
    assert inside.thresholds["intent"][1] != pytest.approx(by_hand.thresholds["intent"][1])


def test_one_fields_out_of_fold_probabilities_match_the_cross_fit():
    """`out_of_fold` (the selective thresholds of `pcd calibrate --target-risk`) gives each
    item what `cross_fit` gives it, and no item the in-sample calibration's answer."""
    small, large = _runs(60, seed=7)
    full = fitted_calibration(SCHEMA, small)
    z, g = run_arrays(SCHEMA, small)["intent"]
    oof = out_of_fold(full, "intent", z, g, folds=3, seed=1)
    crossed = pair_runs(
        SCHEMA, small, large, small_calibration=cross_fit(SCHEMA, small, full, folds=3, seed=1)
    )
    np.testing.assert_allclose(oof, crossed.small["intent"], rtol=0, atol=1e-12)
    inside = np.stack([full.probabilities("intent", r) for r in z])
    assert not np.isclose(oof, inside, atol=1e-6).all(axis=1).any()


def test_auroc_is_the_mann_whitney_statistic_with_ties_counted_half():
    from pcd_tools.eval.metrics import auroc

    assert auroc([0.9, 0.8, 0.7, 0.6], [1, 1, 0, 0]) == 1.0
    assert auroc([0.1, 0.9], [1, 0]) == 0.0
    assert auroc([0.7, 0.7, 0.2], [1, 0, 0]) == 0.75  # one tie (half) and one win
    assert np.isnan(auroc([0.3, 0.4], [1, 1]))
    rng = np.random.default_rng(0)
    c, ok = rng.integers(0, 5, 120) / 4, rng.random(120) < 0.5
    pairs = [(a > b) + 0.5 * (a == b) for a in c[ok] for b in c[~ok]]
    assert auroc(c, ok) == pytest.approx(float(np.mean(pairs)))


def test_each_gate_reports_how_well_it_separates_right_from_wrong():
    from pcd_tools.eval.cascade_data import confidence
    from pcd_tools.eval.metrics import auroc

    small, large = _runs(160, seed=5)
    rep = cascade_report(Intent, small, large, seed=0, points=5, folds=4)
    test = pair_runs(SCHEMA, small.subset(rep["held_out_ids"]), large.subset(rep["held_out_ids"]))
    right = test.small["intent"].argmax(1) == test.gold["intent"]
    want = auroc(confidence(test.small["intent"], "margin"), right)
    assert rep["gates"]["raw/margin"]["separation"] == pytest.approx(want)
    assert 0.5 < want < 1.0  # the synthetic small model's confidence carries signal


def test_an_escalation_budget_can_be_held_to_an_upper_confidence_bound():
    import math
    import statistics

    small, large = _runs(120, seed=3)
    point = fit_cascade(Intent, small, large, max_escalation=0.3)
    bound = fit_cascade(Intent, small, large, max_escalation=0.3, confidence_level=0.9)
    e, n = bound.calibration["escalation"], 120
    z = statistics.NormalDist().inv_cdf(0.9)
    assert e + z * math.sqrt(e * (1 - e) / n) <= 0.3 + 1e-12
    assert point.calibration["escalation"] + 1e-12 >= e
    assert (
        point.calibration["escalation"]
        + z * math.sqrt(point.calibration["escalation"] * (1 - point.calibration["escalation"]) / n)
        > 0.3
    )  # the point estimate alone spends the budget to its edge
    assert bound.calibration["confidence_level"] == 0.9
    rep = cascade_report(Intent, small, large, seed=0, points=5, folds=4)
    held = rep["fits"]["max_escalation/best/bound"]
    assert held["confidence_level"] == 0.9 and held["target"] == "max_escalation"


def test_the_report_also_fits_against_a_calibrated_large_model():
    small, large = _runs(160, seed=5)
    rep = cascade_report(Intent, small, large, seed=0, points=5, folds=4)
    test_ids, cal_ids = rep["held_out_ids"], rep["calibration_ids"]
    large_fitted = fitted_calibration(SCHEMA, large.subset(cal_ids))
    both = pair_runs(
        SCHEMA,
        small.subset(test_ids),
        large.subset(test_ids),
        small_calibration=fitted_calibration(SCHEMA, small.subset(cal_ids)),
        large_calibration=large_fitted,
    )
    gold = both.gold["intent"]
    want = float((both.large["intent"].argmax(1) == gold).mean())
    assert rep["large_only_fitted"]["accuracy"] == pytest.approx(want)
    for target in ("max_escalation", "max_accuracy_loss"):
        fit = rep["fits"][f"{target}/both"]
        assert fit["gate"] == "both/probability"
        assert fit["held_out_large_accuracy"] == pytest.approx(want)
