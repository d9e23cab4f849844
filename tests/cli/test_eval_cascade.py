"""`pcd eval --cascade SMALL,LARGE` and `pcd calibrate --cascade LARGE`, through
`main(argv)` on two tiny random-weight models."""

from __future__ import annotations

import json

import pytest

from pcd_tools.agents import Cascade
from pcd_tools.answers.calibration import Calibration
from pcd_tools.cli import main
from tests.conftest import tiny_decider
from tests.eval.helpers import SCHEMA

MOODS = ("calm", "angry", "sad")


@pytest.fixture(scope="module")
def models():
    return {"small": tiny_decider(0), "large": tiny_decider(1)}


@pytest.fixture
def data(tmp_path, models, monkeypatch):
    from pcd_tools.decide.decider import Decider

    def load(cls, name=None, *, calibration=None, **kw):
        d = models[name or "small"]
        return d.with_calibration(calibration) if calibration else d

    monkeypatch.setattr(Decider, "load", classmethod(load))
    rows = [
        {
            "text": f"message {i}: {'!' * (i % 4)} {'help' * (i % 3)}",
            "mood": MOODS[i % 3],
            "urgent": i % 2 == 0,
        }
        for i in range(40)
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    return ["--data", str(path), "--schema", str(schema)]


@pytest.mark.engine
@pytest.mark.langchain
def test_a_wall_run_on_the_fitted_gate_loads_the_fitted_calibration(data, tmp_path, monkeypatch):
    """A fit gated on the small model's fitted calibration runs for real with that
    calibration (fitted on the report's calibration items); a raw fit runs raw."""
    import pcd_tools.agents.cascade as cascade_module
    import pcd_tools.eval.cascade as ec

    real_report, seen, best = ec.cascade_report, [], ["fitted/probability"]

    def with_best(*a, **kw):
        rep = real_report(*a, **kw)
        raw = rep["fits"]["max_accuracy_loss/raw/probability"]
        rep["fits"]["max_accuracy_loss/best"] = dict(raw, gate=best[0])
        return rep

    class Spy(Cascade):
        def __init__(self, schema, stages, **kw):
            seen.append(stages[0].calibration)
            super().__init__(schema, stages, **kw)

    monkeypatch.setattr(ec, "cascade_report", with_best)
    monkeypatch.setattr(cascade_module, "Cascade", Spy)
    out = tmp_path / "c.json"
    argv = ["eval", *data, "--n", "40", "--cascade", "small,large", "--json", "--out", str(out)]
    assert main(argv) == 0
    wall = json.loads(out.read_text())["wall"]
    assert wall["fit"] == "max_accuracy_loss/fitted/probability" and wall["small_calibration"]
    assert isinstance(seen[-1], Calibration)
    for gate in ("raw/probability", "contextual/margin"):  # both run raw
        best[0] = gate
        assert main(argv) == 0
        wall = json.loads(out.read_text())["wall"]
        assert seen[-1] is None and wall["small_calibration"] is False
        assert wall["fit"] == "max_accuracy_loss/raw/probability"


@pytest.mark.engine
@pytest.mark.langchain
def test_eval_cascade_from_models_and_from_saved_reports(
    data, models, tmp_path, capsys, monkeypatch
):
    rc = main(
        [
            "eval",
            *data,
            "--n",
            "40",
            "--cascade",
            "small,large",
            "--json",
            "--out",
            str(tmp_path / "c.json"),
            "--diagrams",
            str(tmp_path / "png"),
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    rep = json.loads((tmp_path / "c.json").read_text())
    assert printed["best_gate"] == rep["best_gate"] and "gates" in rep and "gates" not in printed
    assert rep["n_calibration"] == rep["n_held_out"] == 20
    # one real batched cascade run at the fitted thresholds, timed against large-only
    wall = rep["wall"]
    assert (
        wall["n"] == 20
        and wall["cascade_s"] > 0
        and wall["large_only_s"] > 0
        and wall["small_only_s"] > 0
    )
    assert 0.0 <= wall["escalation"] <= 1.0
    assert (tmp_path / "png" / "cascade-d.png").stat().st_size > 1000
    # the same sweep from two saved `pcd eval --out` reports, without loading a model
    for name in ("small", "large"):
        assert (
            main(
                [
                    "eval",
                    *data,
                    "--n",
                    "40",
                    "--no-baseline",
                    "--model",
                    name,
                    "--out",
                    str(tmp_path / f"{name}.json"),
                    "--json",
                ]
            )
            == 0
        )
    capsys.readouterr()
    monkeypatch.setattr("pcd_tools.decide.decider.Decider.load", None)
    rc = main(
        [
            "eval",
            *data,
            "--n",
            "40",
            "--json",
            "--out",
            str(tmp_path / "c2.json"),
            "--cascade",
            f"{tmp_path / 'small.json'},{tmp_path / 'large.json'}",
        ]
    )
    assert rc == 0
    rep2 = json.loads((tmp_path / "c2.json").read_text())
    assert "wall" not in rep2
    # the same reports with the two models named: `embedded` is the embedded default
    asked = []

    def named(cls, name=None, **kw):
        asked.append(name)
        return models["large" if name == "large" else "small"]

    monkeypatch.setattr("pcd_tools.decide.decider.Decider.load", classmethod(named))
    wall_argv = ["--cascade-wall", "embedded,large", "--cascade-wall-n", "5"]
    out3 = str(tmp_path / "c3.json")
    argv3 = ["eval", *data, "--n", "40", "--json", "--out", out3, "--cascade"]
    argv3 += [f"{tmp_path / 'small.json'},{tmp_path / 'large.json'}", *wall_argv]
    assert main(argv3) == 0
    assert asked == [None, "large"]
    wall3 = json.loads((tmp_path / "c3.json").read_text())["wall"]
    assert wall3["n"] == 5 and 0.0 <= wall3["large_accuracy"] <= 1.0
    # another fit timed: the budget one
    assert main([*argv3, "--cascade-wall-fit", "max_escalation/raw/probability"]) == 0
    wall4 = json.loads((tmp_path / "c3.json").read_text())["wall"]
    assert wall4["fit"] == "max_escalation/raw/probability"
    for key in ("small_only", "large_only"):
        assert rep2[key]["accuracy"] == pytest.approx(rep[key]["accuracy"], abs=1e-6)
    assert rep2["held_out_ids"] == rep["held_out_ids"]


@pytest.mark.engine
@pytest.mark.langchain
def test_calibrate_cascade_stores_thresholds_that_cascade_reads(data, tmp_path, capsys, models):
    out = tmp_path / "cal.json"
    rc = main(
        [
            "calibrate",
            *data,
            "--n",
            "20",
            "--eval-n",
            "10",
            "--out",
            str(out),
            "--cascade",
            "large",
            "--cascade-target",
            "max_escalation=0.25",
            "--json",
        ]
    )
    assert rc == 0
    capsys.readouterr()
    cal = Calibration.load(out)
    assert cal.cascade["target"] == {"max_escalation": 0.25}
    assert cal.cascade["source"] == "fitted" and cal.cascade["n"] == 20
    # the thresholds saw the calibration refitted without each item's fold
    assert cal.cascade["cross_fitted_folds"] == 5
    assert cal.cascade["calibration"]["escalation"] <= 0.25
    assert set(cal.cascade["thresholds"]) == {"mood", "urgent"}
    small = models["small"].with_calibration(cal)
    casc = Cascade(SCHEMA, [small, models["large"]], threshold="fitted")
    assert casc.thresholds == {n: tuple(v) for n, v in cal.cascade["thresholds"].items()}


BAD = [
    (
        ["calibrate", "--dataset", "sst2", "--cascade", "x", "--cascade-confidence", "1.2"],
        ["--cascade-confidence"],
    ),
    (
        ["eval", "--dataset", "sst2", "--cascade", "a,b", "--cascade-wall-n", "0"],
        ["--cascade-wall-n"],
    ),
    (["eval", "--dataset", "sst2", "--cascade", "a,b", "--cascade-wall", "m"], ["--cascade-wall"]),
    (["eval", "--dataset", "sst2", "--cascade", "only-one"], ["--cascade takes SMALL,LARGE"]),
    (
        ["eval", "--dataset", "sst2", "--cascade", "a,b", "--calibration", "contextual"],
        ["--cascade", "--calibration"],
    ),
    (
        ["eval", "--dataset", "sst2", "--cascade", "a,b", "--max-escalation", "2"],
        ["--max-escalation", "[0, 1]"],
    ),
    (
        ["eval", "--dataset", "sst2", "--cascade", "a,b", "--cascade-top-k", "0"],
        ["--cascade-top-k"],
    ),
    (
        ["calibrate", "--dataset", "sst2", "--cascade", "x", "--cascade-target", "most=1"],
        ["--cascade-target", "max_escalation"],
    ),
    (
        [
            "calibrate",
            "--dataset",
            "sst2",
            "--cascade",
            "x",
            "--cascade-target",
            "max_escalation=7",
        ],
        ["--cascade-target"],
    ),
    (
        ["calibrate", "--dataset", "sst2", "--cascade", "x", "--from-scores", "{f}"],
        ["--from-scores", "--cascade"],
    ),
]


@pytest.mark.unit
@pytest.mark.parametrize(("argv", "fragments"), BAD)
def test_bad_cascade_arguments_exit_2(argv, fragments, tmp_path, monkeypatch, capsys):
    def forbidden(*args, **kwargs):
        pytest.fail("a model was loaded before the arguments were checked")

    monkeypatch.setattr("pcd_tools.decide.decider.Decider.load", forbidden)
    f = tmp_path / "f.json"
    f.write_text("{}")
    assert main([a.format(f=f) for a in argv]) == 2
    err = capsys.readouterr().err
    for frag in fragments:
        assert frag in err, (frag, err)
