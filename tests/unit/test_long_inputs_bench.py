"""The long-input sweep (`pcd_tools.bench.long_inputs`, run by `benchmarks/long_inputs.py` and
`pcd bench --lengths`): the input text of exactly N context tokens, the tables, the options."""

from __future__ import annotations

import pytest

from pcd_tools.bench.long_inputs import (
    LongThread,
    build_context,
    growth,
    parse_lengths,
    schema_of,
    summarize,
    table,
)
from pcd_tools.cli import long_inputs
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import compile_schema
from tests.conftest import ByteTokenizer


@pytest.mark.integration
@pytest.mark.parametrize("tokens", [1, 37, 256, 1024, 4096])
def test_the_text_has_exactly_the_tokens_asked_for_under_the_models_tokenizer(real, tokens):
    encode, decode = real.engine.encode_ids, real.loaded.tokenizer.decode
    for text in range(3):
        ctx, n = build_context(encode, decode, tokens, text, 0)
        assert n == tokens and len(encode(ctx)) == tokens, (tokens, text)


@pytest.mark.integration
def test_texts_and_rounds_differ_and_the_same_arguments_give_the_same_text(real):
    encode, decode = real.engine.encode_ids, real.loaded.tokenizer.decode
    texts = {build_context(encode, decode, 512, t, r)[0] for t in range(3) for r in range(3)}
    assert len(texts) == 9
    again = build_context(encode, decode, 512, 1, 2)
    assert again == build_context(encode, decode, 512, 1, 2)
    assert again[0].startswith("Ticket export LT-01-003")
    # the threads themselves differ, not only their leading lines
    bodies = {build_context(encode, decode, 512, t, 0)[0].split("\n", 2)[2] for t in range(3)}
    assert len(bodies) == 3
    assert "From: " in again[0] and "Subject: " in again[0]


@pytest.mark.unit
def test_a_byte_tokenizer_gets_exact_lengths_too():
    tk = ByteTokenizer()
    for tokens in (1, 100, 3000):
        ctx, n = build_context(tk.encode, tk.decode, tokens, 2, 5)
        assert n == tokens == len(ctx.encode())


def _round(warm: float, eval_: float, answer: dict, hit: bool = True) -> dict:
    return {
        "actual_tokens": 1024,
        "methods": {
            "pcd_warm": {"ms": warm, "hit": hit, "answer": answer, "peak_rss_mb": 800.0},
            "pcd_floor": {"ms": warm * 0.8, "peak_rss_mb": 790.0, "attention_ms": 12.0},
            "llama_eval": {"ms": eval_, "peak_rss_mb": 810.0},
        },
    }


@pytest.mark.unit
def test_summary_growth_and_tables():
    info = {
        "model": "m",
        "compute": "int8",
        "schema": "small",
        "fields": 2,
        "schema_tokens": 100,
        "tail_tokens": 7,
        "threads": {"pcd": 2, "llama_cpp": 2},
        "machine": {"processor": "x86_64", "model_name": "CPU X", "flags": {"avx2": True}},
        "commit": "abcdef1234567",
        "dirty": False,
        "when": "now",
        "rounds": 2,
        "texts": 1,
        "arithmetic": {
            "linear_per_token": 1e9,
            "attention_per_pair": 1e5,
            "head_per_position": 1e8,
            "layers": 2,
        },
        "int8_peak_gops": 1000.0,
        "lengths": [],
    }
    a = {"needs_reply_today": "True", "topic": "BILLING"}
    small = summarize(256, [_round(100.0, 150.0, a), _round(120.0, 150.0, a)], info)
    small["actual_tokens"] = [256]
    big = summarize(1024, [_round(400.0, 600.0, a), _round(500.0, 500.0, a)], info)
    info["lengths"] = [small, big, {"tokens": 8192, "skipped": "skipped: too long"}]
    growth(info["lengths"])
    assert big["ratios"]["llama_eval/pcd_warm"] == {"median": 1.25, "min": 1.0, "max": 1.5}
    assert big["growth"]["pcd_warm"] == pytest.approx(450 / 110)
    assert big["growth"]["tokens"] == 4.0
    floor = big["methods"]["pcd_floor"]
    ops = 1e9 * 1031 + 1e5 * (1031 * 100 + 1031 * 1032 / 2) + 1e8
    assert floor["gops"] == pytest.approx(ops / 1e9 / 0.36)
    assert floor["peak_share"] == pytest.approx(floor["gops"] / 1000.0)
    assert floor["attention_ms"] == 12.0
    assert big["methods"]["pcd_warm"]["tokens_per_s"] == pytest.approx(1024 / 0.45)
    assert "pcd_cold" not in big["methods"] and big["warm_hits"]
    text = table(info)
    assert "| 1,024 | 450 (400-500) | - | 360 (320-400) | 550 (500-600) | - |" in text
    assert "**1.25x** (1.00-1.50)" in text and "4.09x (4.00x)" in text
    assert "True/BILLING" in text
    assert "| 8,192 | skipped: too long |" in text
    assert f"| 1,024 | 2,276, 2,844, 1,862, - | {floor['gops']:,.0f} (" in text
    assert "abcdef1234, now" in text and "CPU X (avx2)" in text


@pytest.mark.unit
def test_lengths_are_checked():
    with pytest.raises(SystemExit):
        long_inputs.main(["--lengths", "1k"])
    with pytest.raises(SystemExit):
        long_inputs.main(["--lengths", "256", "--rounds", "0"])


@pytest.mark.unit
def test_lengths_parse_as_positive_whole_numbers():
    assert parse_lengths("256,1024, 2048") == [256, 1024, 2048]
    assert parse_lengths("64") == [64]
    for bad in ("", ",", "1k", "256,0", "-5", "2.5", "256;1024"):
        with pytest.raises(InvalidArgumentError, match=r"--lengths takes .* positive whole"):
            parse_lengths(bad)


@pytest.mark.unit
def test_the_triage_schema_comes_from_the_bench_scenarios(tmp_path):
    assert schema_of("small") is LongThread
    triage = compile_schema(schema_of("triage"))  # benchmarks/scenarios, as `pcd bench` reads
    assert len(triage.fields) == 28
    with pytest.raises(InvalidArgumentError, match="--scenarios-dir") as e:
        schema_of("triage", tmp_path, "--lengths-schema")
    assert "--lengths-schema triage" in str(e.value) and str(tmp_path) in str(e.value)
    with pytest.raises(InvalidArgumentError, match="accepted: small, triage"):
        schema_of("large")


@pytest.mark.unit
def test_the_script_refuses_triage_without_scenarios(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        long_inputs.main(["--schema", "triage", "--scenarios-dir", str(tmp_path)])
    assert e.value.code == 2
    assert "--scenarios-dir" in capsys.readouterr().err


@pytest.mark.unit
def test_pcd_bench_lengths_maps_its_options_and_prints_json(monkeypatch, capsys):
    import json

    import pcd_tools.bench.long_inputs as sweep
    from pcd_tools.cli import main

    seen = {}

    def fake_run(options, log):
        seen["options"] = options
        log("progress")
        return {"schema": options.schema, "lengths": list(options.lengths)}

    monkeypatch.setattr(sweep, "run", fake_run)
    argv = ["bench", "--lengths", "32, 64", "--runs", "2", "--warmup", "0", "--json"]
    assert main([*argv, "--methods", "pcd,greedy", "--lengths-schema", "triage"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"schema": "triage", "lengths": [32, 64]}  # stdout: JSON only
    assert err == "progress\n"
    o = seen["options"]
    assert (o.lengths, o.rounds, o.warmup, o.model, o.json) == ((32, 64), 2, 0, None, None)
    assert o.no_peer == "--methods has no llamacpp"
    # llamacpp asked for: the peer runs where `llama_cpp` imports, else the reason is kept
    monkeypatch.setattr("pcd_tools.baselines.llama_cpp.peer_available", lambda: "not here")
    assert main(["bench", "--lengths", "64", "--model", "embedded", "--json"]) == 0
    assert seen["options"].no_peer == "not here" and seen["options"].schema == "small"
    monkeypatch.setattr("pcd_tools.baselines.llama_cpp.peer_available", lambda: None)
    assert main(["bench", "--lengths", "64", "--json"]) == 0
    assert seen["options"].no_peer is None and seen["options"].rounds == 5


def test_a_shared_model_name_resolves_through_the_repositorys_model_table():
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    table = long_inputs._model_size(bench, "1.5b")  # it defines dataclasses: importable
    got = table.model_file("1.5b")
    if got is None:  # not fetched here: the name is refused, saying so
        with pytest.raises(InvalidArgumentError, match="fetch it first"):
            long_inputs.resolve_model("1.5b", bench)
    else:
        assert long_inputs.resolve_model("1.5b", bench) == str(got)
