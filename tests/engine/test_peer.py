"""The llama.cpp peer of `pcd bench`: skipped with a message without its extra; with it
(when `llama-cpp-python` is installed), the same prompt ids under the schema's grammar
give a valid answer, warm and cold alike."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from tests.conftest import tiny_decider


class Ticket(BaseModel):
    """Route a support ticket."""

    team: Literal["billing", "tech", "sales"] = Field(description="Team that should handle it")
    urgent: bool = Field(description="Does it need an answer today?")


TEXT = "I was charged twice for my subscription this month. Please refund me."


@pytest.mark.unit
def test_a_missing_peer_is_skipped_with_a_message(monkeypatch):
    from pcd_tools.bench import run as bench

    monkeypatch.setattr(
        "pcd_tools.baselines.llama_cpp.peer_available", lambda: "not installed; pip install x"
    )
    plan = bench.plan_bench(scenarios=["fraud"], rss=False)
    assert plan.methods == bench.METHODS
    assert plan.skipped == "llama.cpp peer skipped: not installed; pip install x"
    with pytest.raises(bench.InvalidArgumentError, match=r"llama\.cpp peer skipped"):
        bench.plan_bench(scenarios=["fraud"], methods=["llamacpp"], rss=False)


@pytest.mark.engine
def test_bench_without_the_peer_still_runs_and_says_why(monkeypatch, capsys):
    from pcd_tools import cli
    from pcd_tools.decide.decider import Decider

    monkeypatch.setattr("pcd_tools.baselines.llama_cpp.peer_available", lambda: "not installed")
    monkeypatch.setattr(Decider, "load", classmethod(lambda cls, *a, **k: tiny_decider(0)))
    argv = ["bench", "--scenario", "fraud", "--runs", "1", "--warmup", "0", "--no-rss"]
    assert cli.main([*argv, "--methods", "pcd,llamacpp", "--json"]) == 0
    out = capsys.readouterr()
    [row] = json.loads(out.out)
    assert "llama.cpp peer skipped: not installed" in out.err
    assert row["warm_pcd_ms"] > 0 and not any(k.startswith("llamacpp") for k in row)


@pytest.mark.unit
def test_the_peer_needs_a_gguf_model():
    pytest.importorskip("llama_cpp")
    from pcd_tools.baselines.llama_cpp import LlamaCppPeer, PeerUnavailableError

    with pytest.raises(PeerUnavailableError, match="needs a GGUF model file"):
        LlamaCppPeer(tiny_decider(0))


@pytest.mark.unit
def test_the_grammar_continues_after_the_prompts_brace():
    pytest.importorskip("llama_cpp")
    from pcd_tools.baselines.generation import json_schema_of
    from pcd_tools.baselines.llama_cpp import after_brace
    from pcd_tools.schema import compile_schema

    gbnf = after_brace(json.dumps(json_schema_of(compile_schema(Ticket))))
    root = next(ln for ln in gbnf.splitlines() if ln.startswith("root ::="))
    assert root.startswith("root ::= space ") and '"{"' not in root
    assert "space ::= ([\\n ] ([\\n ] [\\n ]?)?)?" in gbnf


@pytest.mark.engine
def test_the_peer_answers_validly_warm_and_cold_on_the_embedded_model(real):
    pytest.importorskip("llama_cpp")
    from pcd_tools.baselines.llama_cpp import LlamaCppPeer, probe_model

    broken = probe_model(real.loaded.path)
    if broken is not None:
        pytest.skip(broken)
    peer = LlamaCppPeer(real)
    cold = peer.run(Ticket, TEXT, warm=False)
    warm = peer.run(Ticket, TEXT, warm=True)
    again = peer.run(Ticket, TEXT, warm=True)
    for r in (cold, warm, again):
        assert r.result.schema_match, r.text
        assert set(r.result.values) == {"team", "urgent"} and r.tokens > 0
    assert warm.text == cold.text == again.text  # greedy: the cache changes nothing
    from pcd_tools.schema import compile_schema

    plan = real.engine.plan(compile_schema(Ticket))
    assert list(peer.llama.input_ids[: len(plan.head_ids)]) == list(plan.head_ids)
    # the cold prefill column: the whole prompt evaluated from an empty cache, as PCD's
    # bare prefill; the next warm run puts the schema part back and answers the same
    prompt = len(plan.head_ids) + len(real.engine.encode_ids(TEXT)) + len(plan.tail_ids)
    assert peer.eval_ms(Ticket, TEXT) > 0 and peer.llama.n_tokens == 0
    assert peer.run(Ticket, TEXT, warm=True).text == cold.text
    assert prompt > len(plan.head_ids)


def test_the_bench_reports_both_sides_cold_prefill_alike():
    """`pcd bench`'s llama.cpp keys: the warm and cold first-token times and the bare
    evaluation of the whole prompt, set against PCD's bare prefill."""
    from pcd_tools.baselines.llama_cpp import peer_keys

    rec = {
        "llamacpp": [100.0, 120.0],
        "llamacpp_cold": [300.0, 320.0],
        "llamacpp_prefill": [40.0, 44.0],
        "llamacpp_cold_prefill": [200.0, 210.0],
        "llamacpp_bare": [180.0, 190.0, 170.0],
        "llamacpp_tokens": [9, 9],
        "llamacpp_match": [True, True],
        "llamacpp_text": ["{}", "{}"],
        "llamacpp_values": [{"a": 1}, {"a": 1}],
    }
    keys = peer_keys(rec, {"bare_prefill_ms": 90.0, "pcd_answer": {"a": 1}})
    assert keys["llamacpp_prefill_ms"] == 42.0 and keys["llamacpp_cold_prefill_ms"] == 205.0
    assert keys["llamacpp_bare_prefill_ms"] == 180.0
    assert (keys["llamacpp_bare_prefill_ms_min"], keys["llamacpp_bare_prefill_ms_max"]) == (
        170.0,
        190.0,
    )
    assert keys["bare_prefill_vs_llamacpp"] == 2.0 and keys["llamacpp_agreement"] == 1.0


@pytest.mark.engine
def test_a_llama_cpp_build_that_dies_is_reported_not_fatal(monkeypatch, real, capsys):
    pytest.importorskip("llama_cpp")
    from pcd_tools.baselines import llama_cpp as peer_mod

    monkeypatch.setattr(
        "pcd_tools.baselines.llama_cpp.probe_model", lambda path: "died of SIGILL; rebuild"
    )
    peer_mod._PEERS.clear()
    assert peer_mod.bench_peer(real) is None
    assert "llama.cpp peer skipped: died of SIGILL; rebuild" in capsys.readouterr().err
    peer_mod._PEERS.clear()
