"""`pcd calibrate` then `pcd eval` through `main(argv)`, on the tiny model."""

from __future__ import annotations

import json

import pytest

from tests.eval.helpers import LABELS, SCHEMA, TEXTS
from tests.eval.helpers import fake_load as _fake_load


@pytest.mark.engine
def test_cli_calibrate_then_eval(tiny, tmp_path, monkeypatch, capsys):
    from pcd_tools.cli import main
    from pcd_tools.decide.decider import Decider

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
            "--target-risk",
            "0.3",
            "--out",
            str(cal2),
            "--json",
        ]
    )
    assert rc == 0
    out2 = json.loads(capsys.readouterr().out)
    assert out2["method"] == "temperature_bias" and set(out2["biases"]) == {"mood", "urgent"}
    assert out2["fitted_on"]["ids"] == out["fitted_on"]["ids"]
    # each threshold was chosen on cross-fitted confidences of the saved scores
    import numpy as np

    from pcd_tools.answers.calibration import Calibration
    from pcd_tools.eval.refit import out_of_fold
    from pcd_tools.eval.thresholds import choose_threshold

    cal = Calibration.load(cal2)
    saved = json.loads((tmp_path / "scores.json").read_text())["fields"]
    differs = []
    for name in ("mood", "urgent"):
        z, g = np.array(saved[name]["log_scores"]), np.array(saved[name]["gold"])
        p = out_of_fold(cal, name, z, g, folds=5)
        want = choose_threshold(p.max(axis=1), p.argmax(axis=1) == g, target_risk=0.3)
        assert out2["thresholds"][name] == pytest.approx(want.to_dict(), abs=1e-4)
        inside = cal.probabilities(name, z)
        got = choose_threshold(inside.max(axis=1), inside.argmax(axis=1) == g, target_risk=0.3)
        differs.append(got.to_dict() != want.to_dict())
    assert any(differs)  # in-sample confidences would have chosen otherwise
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
