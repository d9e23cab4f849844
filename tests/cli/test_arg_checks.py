"""Bad arguments fail fast: exit 2 and `error: ...` naming the flag, before any model loads."""

from __future__ import annotations

import json

import pytest

from pcd_tools.cli import main

pytestmark = pytest.mark.unit

MODEL_LOADERS = (
    "pcd_tools.decide.decider.Decider.load",
    "pcd_tools.serve.serve",
)


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if anything tries to load a model (or start the server)."""

    def forbidden(*args, **kwargs):
        pytest.fail("a model was loaded before the arguments were checked")

    for target in MODEL_LOADERS:
        monkeypatch.setattr(target, forbidden)
    monkeypatch.delenv("PCD_API_KEY", raising=False)


DECIDE = ["decide", "--schema", "{schema}", "--context", "x"]
DATA = ["--dataset", "sst2"]

# (argv with {schema}/{missing}/{badcal} placeholders, fragments the error must contain)
CASES = [
    ([*DECIDE, "--temperature", "0"], ["--temperature", "> 0", "0.0"]),
    ([*DECIDE, "--temperature", "nan"], ["--temperature", "> 0"]),
    (["demo", "--temperature", "-1"], ["--temperature", "> 0", "-1.0"]),
    (["decide", "--schema", "{missing}", "--context", "x"], ["--schema", "missing.json"]),
    ([*DECIDE, "--scoring", "bogus"], ["--scoring", "'full'", "'constrained'"]),
    ([*DECIDE, "--calibration", "{missing}"], ["--calibration", "missing.json", "no such"]),
    ([*DECIDE, "--calibration", "{badcal}"], ["--calibration", "not a pcd-tools calibration"]),
    (["demo", "--calibration", "{missing}"], ["--calibration", "missing.json"]),
    (["eval", *DATA, "--temperature", "0"], ["--temperature", "> 0"]),
    (["eval", *DATA, "--n", "0"], ["--n", ">= 1", "got 0"]),
    (["eval", *DATA, "--batch-size", "0"], ["--batch-size", ">= 1"]),
    (["eval", *DATA, "--order-bias", "-1"], ["--order-bias", ">= 0"]),
    (["eval", *DATA, "--order-bias-n", "0"], ["--order-bias-n", ">= 1"]),
    (["eval", *DATA, "--calibration", "{missing}"], ["--calibration", "missing.json"]),
    (["eval", *DATA, "--from-report", "{missing}"], ["--from-report", "missing.json"]),
    (["calibrate", *DATA, "--n", "0"], ["--n", ">= 1"]),
    (["calibrate", *DATA, "--batch-size", "0"], ["--batch-size", ">= 1"]),
    (["calibrate", *DATA, "--target-risk", "1.5"], ["--target-risk", "[0, 1]", "1.5"]),
    (["calibrate", *DATA, "--target-coverage", "0"], ["--target-coverage", "(0, 1]"]),
    (
        ["calibrate", *DATA, "--target-risk", "0.1", "--target-coverage", "0.9"],
        ["--target-risk", "--target-coverage", "one of"],
    ),
    (["calibrate", *DATA, "--from-scores", "{missing}"], ["--from-scores", "missing.json"]),
    (["calibrate", *DATA, "--conformal-folds", "1"], ["--conformal-folds", "at least 2", "1"]),
    (["serve", "--port", "70000"], ["--port", "0 to 65535", "70000"]),
    (["serve", "--max-batch", "0"], ["--max-batch", ">= 1"]),
    (["serve", "--max-batch-tokens", "0"], ["--max-batch-tokens", ">= 1"]),
    (["serve", "--batch-wait-ms", "-1"], ["--batch-wait-ms", ">= 0"]),
    (["serve", "--log-level", "loud"], ["--log-level", "'info'", "'debug'"]),
    (["serve", "--calibration", "{missing}"], ["--calibration", "missing.json"]),
    (["bench", "--runs", "0"], ["--runs", ">= 1"]),
    (["bench", "--methods", "pcd,fast"], ["--methods", "'fast'", "'greedy'"]),
    (["bench", "--throughput", "-1"], ["--throughput", ">= 0"]),
    (["bench", "--lengths", "1k"], ["--lengths", "positive whole numbers", "'1k'"]),
    (["bench", "--lengths", "256,0"], ["--lengths", "positive whole numbers", "'256,0'"]),
    (["bench", "--lengths", "64", "--scenario", "fraud"], ["--lengths", "--scenario", "one of"]),
    (["bench", "--lengths", "64", "--runs", "0"], ["--runs", ">= 1"]),
    (["bench", "--lengths", "64", "--methods", "greedy"], ["--methods", "must include pcd"]),
    (["bench", "--lengths", "64", "--methods", "pcd,fast"], ["--methods", "'fast'"]),
    (["bench", "--lengths-schema", "triage"], ["--lengths-schema", "give --lengths too"]),
    (
        ["bench", "--lengths", "64", "--lengths-schema", "triage", "--scenarios-dir", "{missing}"],
        ["--lengths-schema triage", "--scenarios-dir"],
    ),
]


@pytest.mark.parametrize(
    ("argv", "fragments"),
    CASES,
    ids=[" ".join(a).replace("{", "").replace("}", "") for a, _ in CASES],
)
def test_bad_arguments_exit_2_before_the_model_loads(argv, fragments, tmp_path, no_model, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"p": {"type": "boolean", "description": "Is it?"}}))
    badcal = tmp_path / "cal.json"
    badcal.write_text(json.dumps({"format": "something-else"}))
    paths = {
        "schema": str(schema),
        "missing": str(tmp_path / "missing.json"),
        "badcal": str(badcal),
    }
    argv = [a.format(**paths) for a in argv]
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.startswith("error: ") or "error: " in err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in err, (argv, frag, err)


def test_serve_help_shows_the_numeric_defaults(capsys):
    assert main(["serve", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for text in (
        "before 429 (default 256)",
        "requests per model batch (default 16)",
        "prompt tokens per model batch (default 8192)",
        "arriving together (default 2.0)",
        "413 above; default 1048576)",
        "413 above; default 64)",
        "(default info)",
    ):
        assert text in out, text


def test_models_doctor_prints_whole_paths_on_a_narrow_terminal(monkeypatch, capsys):
    import pcd_tools.engine.doctor as platform

    long_dir = "/opt/some/rather/long/install/prefix/with/[brackets]/and-more"
    fake = {
        "device": "cpu",
        "blas_path": f"{long_dir}/lib/libscipy_openblas.so",
        "blas_note": f"bound {long_dir}/lib/libscipy_openblas.so via shim",
        "cache_dir": f"{long_dir}/cache/pcd-tools",
    }
    monkeypatch.setattr(platform, "doctor", lambda: fake)
    monkeypatch.setenv("COLUMNS", "40")
    assert main(["models", "--doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    from pcd_tools.engine.load.sources import embedded_model_path

    for path in (*[fake[k] for k in ("blas_path", "cache_dir")], str(embedded_model_path())):
        assert any(path in line for line in lines), (path, lines)
    assert any(fake["blas_note"] in line for line in lines)
