"""`pcd eval --shots/--calibration contextual/--scoring pmi/--label-free-grid` and `pcd
calibrate --shots`, through `main(argv)` on the tiny model."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pcd_tools.cli import main
from tests.eval.helpers import SCHEMA, stub_baseline
from tests.eval.helpers import fake_load as _fake_load

MOODS = ("calm", "angry", "sad")


@pytest.fixture
def data(tmp_path):
    rows = [
        {"text": f"message number {i}: {'!' * (i % 4)}", "mood": MOODS[i % 3], "urgent": i % 2 == 0}
        for i in range(36)
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    return ["--data", str(path), "--schema", str(schema)]


@pytest.mark.engine
def test_eval_shots_come_from_outside_the_sample_and_are_listed(
    tiny, data, tmp_path, monkeypatch, capsys
):
    from pcd_tools.decide.decider import Decider

    monkeypatch.setattr(Decider, "load", _fake_load(tiny))
    out = tmp_path / "r.json"
    argv = ["eval", *data, "--n", "12", "--no-baseline", "--shots", "6", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rep = json.loads(out.read_text())
    shots = rep["shots"]
    assert shots["k"] == 6 and shots["field"] == "mood" and len(shots["ids"]) == 6
    evaluated = {it["id"] for it in rep["items"]}
    assert not set(shots["ids"]) & evaluated  # never an evaluated item
    assert Counter(e["output"]["mood"] for e in shots["examples"]) == dict.fromkeys(MOODS, 2)
    assert "6 shots (seed 1, stratified on mood" in printed
    assert all(i in printed for i in shots["ids"])
    assert rep["label_free"] == "none"
    # the saved report rescored: its fingerprint includes the shots
    assert main(["eval", *data, "--from-report", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["fingerprint"] == rep["fingerprint"] and again["shots"]["ids"] == shots["ids"]
    # a calibration fitted with the same shots applies to the evaluation with them
    cal = tmp_path / "cal.json"
    assert (
        main(
            [
                "calibrate",
                *data,
                "--n",
                "12",
                "--eval-n",
                "12",
                "--shots",
                "6",
                "--out",
                str(cal),
                "--json",
            ]
        )
        == 0
    )
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["method"] == "auto"
    assert fitted["fitted_on"]["shots"]["ids"] == shots["ids"]
    assert not set(fitted["fitted_on"]["ids"]) & (set(shots["ids"]) | evaluated)
    argv = [
        "eval",
        *data,
        "--n",
        "12",
        "--no-baseline",
        "--shots",
        "6",
        "--calibration",
        str(cal),
        "--json",
    ]
    assert main(argv) == 0
    assert set(json.loads(capsys.readouterr().out)["methods"]) == {"pcd", "pcd_calibrated"}


@pytest.mark.engine
@pytest.mark.parametrize(
    ("flags", "label_free"),
    [(["--calibration", "contextual"], "contextual"), (["--scoring", "pmi"], "pmi")],
)
def test_eval_runs_the_label_free_methods(tiny, data, monkeypatch, capsys, flags, label_free):
    from pcd_tools.decide.decider import Decider

    monkeypatch.setattr(Decider, "load", _fake_load(tiny))
    assert main(["eval", *data, "--n", "6", "--no-baseline", *flags, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["label_free"] == label_free and rep["shots"] is None


@pytest.mark.engine
def test_label_free_grid_from_the_cli(tiny, data, tmp_path, monkeypatch, capsys):
    from pcd_tools.decide.decider import Decider
    from pcd_tools.eval.report import label_free_markdown

    monkeypatch.setattr(Decider, "load", _fake_load(tiny))
    out = tmp_path / "grid.json"
    argv = [
        "eval", *data, "--label-free-grid", "--grid-shots", "0,3", "--n", "9", "--cal-n", "12",
        "--latency-n", "2", "--baseline-n", "3", "--out", str(out),
    ]  # fmt: skip
    monkeypatch.setattr("pcd_tools.baselines.generation.constrained_json", stub_baseline)
    assert main(argv) == 0
    printed = capsys.readouterr().out
    grid = json.loads(out.read_text())
    assert [r["shots"] for r in grid["rows"]] == [0, 3]
    for row in grid["rows"]:
        assert set(row["fields"]) == {"raw", "contextual", "pmi", "fitted", "auto"}
        assert set(row["latency_ms"]) == {"raw", "contextual", "pmi", "fitted", "auto"}
        assert row["consistency"]["contextual"] < 1e-6 and row["consistency"]["pmi"] < 1e-6
        auto = row["auto"]  # the recipe calibration="auto" chose, by LOO over the shots
        assert row["fields"]["auto"] == row["fields"][auto["grid_method"]]
        assert auto["examples"] == row["shots"] and (auto["accuracy"] == {}) == (not row["shots"])
    assert "baseline" in grid["rows"][1] and "baseline" not in grid["rows"][0]
    ratio = grid["warm_ratio"]
    assert ratio["over_shots"] == 0 and set(ratio) == {"over_shots", "3"}
    assert (
        ratio["3"]["n"] == 2 and 0 < ratio["3"]["min"] <= ratio["3"]["median"] <= ratio["3"]["max"]
    )
    assert grid["rows"][1]["baseline"]["n"] == 3
    assert "shots" in printed and "fitted" in printed and "constrained generation" in printed
    md = "\n".join(label_free_markdown([grid]))
    assert "| 3 | contextual |" in md and "Best label-free setting" in md
    assert "warm request with 3 shots over zero-shot, interleaved on 2 texts" in md


ARG_CASES = [
    (
        ["--calibration", "contextual", "--scoring", "pmi"],
        ["--scoring pmi", "--calibration contextual"],
    ),
    (["--label-free-grid", "--scoring", "pmi"], ["--label-free-grid", "pmi"]),
    (["--grid-shots", "0,x"], ["--grid-shots", "0,x"]),
    (["--baseline-shots", "-4"], ["--baseline-shots"]),
    (["--shots", "-1"], ["--shots", ">= 0"]),
    (["--cal-n", "0"], ["--cal-n", ">= 1"]),
    (["--from-report", "{report}", "--shots", "2"], ["--from-report", "--shots 2"]),
]


@pytest.mark.unit
@pytest.mark.parametrize(("flags", "fragments"), ARG_CASES)
def test_bad_label_free_arguments_exit_2(flags, fragments, tmp_path, monkeypatch, capsys):
    def forbidden(*args, **kwargs):
        pytest.fail("a model was loaded before the arguments were checked")

    monkeypatch.setattr("pcd_tools.decide.decider.Decider.load", forbidden)
    report = tmp_path / "r.json"
    report.write_text("{}")
    flags = [f.format(report=report) for f in flags]
    assert main(["eval", "--dataset", "sst2", *flags]) == 2
    err = capsys.readouterr().err
    for frag in fragments:
        assert frag in err, (frag, err)
