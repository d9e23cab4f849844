"""The `pcd` command through `main(argv)`, on the real embedded model."""

from __future__ import annotations

import json

import pytest

from pcd_tools.cli import main

pytestmark = pytest.mark.integration


def test_demo_prints_a_real_decision_with_timings(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for needle in (
        "priority",
        "requires_escalation",
        "department",
        "prefill_ms=",
        "suffix_eval_ms=",
        "elapsed_ms=",
        "SmolLM2-135M-Instruct",
        "device=cpu",
        "BLAS:",
    ):
        assert needle in out, needle
    # Under the table: what the embedded model is, and what to load for real work.
    note = out[out.index("value: ") :]
    assert "135M model for trying pcd-tools offline" in note
    assert "Qwen2.5 or Llama 3.x instruct model" in note
    assert 'Decider.load("mlx-community/Qwen2.5-7B-Instruct-4bit")' in note
    assert "calibration=" in note


def test_demo_json(capsys):
    assert main(["demo", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cold"]["prefix_cache_hit"] is False
    assert data["warm"]["prefix_cache_hit"] is True
    assert set(data["warm"]["parsed_json"]) == {"priority", "requires_escalation", "department"}


def test_decide_dict_schema_from_file_and_stdin(tmp_path, capsys, monkeypatch):
    spec = {
        "priority": {"type": "enum", "choices": ["HIGH", "LOW"], "description": "Urgency"},
        "refund": {"type": "boolean", "description": "Whether the customer asks for money back"},
    }
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(spec))
    assert (
        main(["decide", "--schema", str(path), "--context", "I want my money back now!", "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert set(data["parsed_json"]) == {"priority", "refund"}
    assert data["parsed_json"]["refund"]["value"] in (True, False)
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("Just a question about invoices."))
    assert (
        main(
            [
                "decide",
                "--schema",
                str(path),
                "--context",
                "-",
                "--json",
                "--scoring",
                "constrained",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["scoring"] == "constrained"


def test_decide_reports_schema_errors_cleanly(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"p": {"type": "enum", "choices": []}}))
    assert main(["decide", "--schema", str(path), "--context", "x"]) == 1
    err = capsys.readouterr().err
    assert "TooFewChoicesError" in err and "StructuredSchema.p" in err
    path.write_text("{not json")
    assert main(["decide", "--schema", str(path), "--context", "x"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["decide", "--schema", str(tmp_path / "missing.json"), "--context", "x"]) == 2


def test_models_and_doctor(capsys):
    assert main(["models", "--doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    doc = data["doctor"]
    assert doc["device"] == "cpu"
    # a real BLAS is bound before mlx loads (its speed is a benchmark figure, not a test)
    assert doc["blas"] != "reference" and doc["blas_path"]
    assert doc["blas_bound_before_import"] is True
    assert doc["blas_gflops"] > 0 and isinstance(doc["blas_fast"], bool)
    assert doc["native_kernels"].startswith(("on (", "off: "))
    assert doc["cache_dir"]
    assert data["embedded"]["path"].endswith(".gguf")


def test_usage_errors_exit_2(capsys):
    assert main(["no-such-command"]) == 2
    assert main([]) == 2
    assert main(["decide"]) == 2  # missing required options


def test_bench_lengths_sweeps_the_embedded_model(capsys, monkeypatch):
    from pcd_tools.engine.host.threads import thread_budget

    monkeypatch.setenv("PCD_THREADS", str(thread_budget()))  # the sweep fixes it; put back after
    argv = ["bench", "--lengths", "64", "--runs", "1", "--warmup", "0", "--methods", "pcd"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "schema small (2 fields" in out and "1 text(s) x 1 round(s) per length" in out
    assert "| context tokens | PCD warm | PCD cold | PCD floor |" in out
    row = next(line for line in out.splitlines() if line.startswith("| 64 |"))
    assert row.count(" - |") >= 4  # no llama.cpp columns: --methods has no llamacpp
    assert "llama.cpp left out: --methods has no llamacpp" in captured.err  # progress: stderr
    assert "64 tokens (text 0, round 1) pcd_warm:" in captured.err
    # a bad --lengths is a usage error naming the option, before the model loads
    assert main(["bench", "--lengths", "64,x"]) == 2
    err = capsys.readouterr().err
    assert "--lengths takes context token counts, positive whole numbers" in err
    assert "'64,x'" in err and "Traceback" not in err
