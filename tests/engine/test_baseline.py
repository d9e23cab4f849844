"""Autoregressive baselines: parseable output, schema-exact constrained output, honest counts."""

from __future__ import annotations

import json

import pytest

from pcd_tools.baselines.generation import (
    GenerationResult,
    bare_prefill_ms,
    constrained_json,
    greedy_json,
    json_schema_of,
    warm_prefill_ms,
)
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import compile_schema
from tests.conftest import ByteTokenizer, make_tiny_model, tiny_decider
from tests.schemas import Sentiment, Ticket, wide_schema_dict

pytestmark = pytest.mark.engine

CONTEXT = "Our billing page charges customers twice since this morning. Please fix!"


def _biased_decider(token: int):
    """A tiny decider whose model always prefers `token` by a wide margin."""
    from pcd_tools.decide.decider import Decider
    from pcd_tools.engine.load.sources import LoadedModel

    loaded = LoadedModel(
        model=make_tiny_model(0, bias={token: 60.0}),
        tokenizer=ByteTokenizer(),
        model_id="tiny-biased",
        source="test",
        path="",
        model_type="llama",
        context_window=8192,
        dtype="float32",
        device="cpu",
        eos_token_ids=frozenset({257}),
    )
    return Decider(loaded)


def _check_counts(r: GenerationResult, *, head_cached: bool) -> None:
    # byte tokenizer: one token per byte of the generated text
    assert r.tokens == len(r.text.encode("utf-8"))
    assert r.json_text == "{" + r.text
    # one prefill call (plus the schema part on a cache miss), then one pass per later token
    assert r.passes == r.tokens + (0 if head_cached else 1)
    assert r.wall_ms >= r.prefill_ms > 0
    assert r.decode_ms >= 0
    assert abs(r.wall_ms - r.prefill_ms - r.decode_ms) < 1e-6


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "schema", [Ticket, Sentiment, wide_schema_dict(8)], ids=["ticket", "optional", "wide8"]
)
def test_constrained_always_matches_schema(seed, schema):
    decider = tiny_decider(seed)
    sch = compile_schema(schema)
    first = constrained_json(decider, sch, CONTEXT)
    again = constrained_json(decider, sch, CONTEXT)
    for r in (first, again):
        assert r.is_valid_json and r.schema_match
        obj = json.loads(r.json_text)
        assert list(obj) == [f.name for f in sch.fields]
        for f in sch.fields:
            assert any(obj[f.name] == lab and type(obj[f.name]) is type(lab) for lab in f.labels)
        assert r.values == obj
        assert set(r.value_probs) == set(obj)
        assert all(0.0 < p <= 1.0 for p in r.value_probs.values())
    _check_counts(first, head_cached=False)
    _check_counts(again, head_cached=True)
    assert again.text == first.text


def test_prompt_cache_does_not_change_output():
    decider = tiny_decider(3)
    cached = [constrained_json(decider, Ticket, c) for c in (CONTEXT, "short", CONTEXT)]
    fresh = [constrained_json(decider, Ticket, c, prompt_cache=False) for c in (CONTEXT, "short")]
    assert [r.text for r in cached] == [fresh[0].text, fresh[1].text, fresh[0].text]
    for c, f in zip(cached, fresh):
        assert c.value_probs == pytest.approx(f.value_probs, rel=1e-4)
    for r in fresh:
        _check_counts(r, head_cached=True)  # no cache: one plain prefill, no schema pass


def test_greedy_stops_when_the_object_closes():
    decider = _biased_decider(ord("}"))
    r = greedy_json(decider, Ticket, CONTEXT, prompt_cache=False)
    assert r.text == "}" and r.json_text == "{}"
    assert r.is_valid_json and not r.schema_match
    assert r.values is None and r.value_probs is None
    _check_counts(r, head_cached=True)


def test_greedy_stops_at_eos_and_tracks_strings():
    # a brace inside a string must not close the object; EOS ends generation unparsed
    decider = _biased_decider(257)
    r = greedy_json(decider, Ticket, CONTEXT)
    assert r.tokens == 0 and r.text == "" and not r.is_valid_json
    from pcd_tools.baselines.json_answer import ObjectScanner

    s = ObjectScanner()
    assert s.feed('\n  "a": "x}\\"}"') is None
    assert s.feed(',\n  "b": {}\n}  trailing') == len(',\n  "b": {}\n}')


def test_greedy_respects_max_tokens_and_counts():
    decider = tiny_decider(0)
    r = greedy_json(decider, Ticket, CONTEXT, max_tokens=7)
    assert r.tokens == 7  # random weights: never closes the object within 7 tokens
    assert r.passes == r.tokens + 1 and not r.schema_match
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        greedy_json(decider, Ticket, CONTEXT, max_tokens=0)


def test_json_schema_of_maps_kinds():
    js = json_schema_of(compile_schema(Sentiment))
    assert js["required"] == ["positive", "topic"]
    assert js["properties"]["positive"] == {"type": "boolean"}
    assert js["properties"]["topic"] == {"enum": ["food", "service", "price", None]}
    assert js["additionalProperties"] is False


def test_bare_prefill_is_timed():
    decider = tiny_decider(0)
    assert bare_prefill_ms(decider, Ticket, CONTEXT) > 0


def test_warm_prefill_runs_the_uncached_part_after_the_cached_schema_part(monkeypatch):
    import numpy as np

    decider = tiny_decider(0)
    engine = decider.engine
    plan = engine.plan(compile_schema(Ticket))
    row = engine.encode_ids(CONTEXT) + list(plan.tail_ids)
    calls = []
    real = engine.passes.prefill_with_logits

    def spy(tokens, prefix, last=True):
        out = real(tokens, prefix, last=last)
        calls.append((tokens, prefix, out[1]))
        return out

    monkeypatch.setattr(engine.passes, "prefill_with_logits", spy)
    engine.clear_cache()
    assert warm_prefill_ms(decider, Ticket, CONTEXT) > 0  # a miss: the schema part first
    assert plan.head_ids in engine.prefix_cache
    [(tokens, prefix, logits)] = [c for c in calls if c[1] is not None]
    assert tokens == [row] and prefix[0][0].shape[2] == len(plan.head_ids)
    # the same last-position logits as one prefill of the whole prompt
    whole = real([list(plan.head_ids) + row], None)[1]
    np.testing.assert_allclose(logits, whole, atol=1e-4)
    calls.clear()
    assert warm_prefill_ms(decider, Ticket, CONTEXT) > 0  # a hit: only the row runs
    assert [c[0] for c in calls] == [[row]]


@pytest.mark.integration
def test_real_model_baselines(real):
    sch = compile_schema(Ticket)
    ctx = "Our whole production cluster is down and customers cannot pay. Please help now!"
    g = greedy_json(real, sch, ctx)
    assert g.is_valid_json
    assert g.passes in (g.tokens, g.tokens + 1)
    c = constrained_json(real, sch, ctx)
    assert c.schema_match and set(c.values) == {f.name for f in sch.fields}
    # multi-token pieces: token spans still partition the generated text
    assert c.tokens < len(c.text)
    assert c.passes in (c.tokens, c.tokens + 1)


def test_bench_runs_on_a_tiny_model(monkeypatch, capsys):
    from pcd_tools import cli
    from pcd_tools.bench import run as bench
    from pcd_tools.decide.decider import Decider

    monkeypatch.setattr(Decider, "load", classmethod(lambda cls, *a, **k: tiny_decider(0)))
    argv = ["bench", "--scenario", "fraud", "--runs", "2", "--warmup", "0", "--no-rss"]
    assert cli.main([*argv, "--methods", "pcd,constrained", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["scenario"] == "fraud" and row["fields"] == 4 and row["runs"] == 2
    for key in (
        "pcd_ms",
        "prefill_ms",
        "suffix_eval_ms",
        "bare_prefill_ms",
        "warm_pcd_ms",
        "constrained_ms",
        "constrained_tokens",
        "speedup_vs_constrained",
    ):
        assert row[key] > 0, key
    assert row["constrained_schema_match"] is True
    assert "greedy_ms" not in row
    assert bench.load_scenarios()["tariff"].schema is not None
    # fraud's fields are small: nothing pruned, so nothing uncertified
    assert row["scoring"] == "auto" and row["certified"] is True
    assert "warm_exhaustive_ms" not in row
    # the cold request's phases as rates (engine.flops)
    from pcd_tools.bench.flops import arithmetic

    d = tiny_decider(0)
    ar = arithmetic(d.engine.passes.model)
    plan = d.engine.plan(compile_schema(bench.load_scenarios()["fraud"].schema))
    prompt = row["prompt_tokens"]
    assert row["prefill_gflop"] == pytest.approx(ar.prefill(prompt) / 1e9)
    assert row["fields_gflop"] == pytest.approx(ar.packed(plan.chunks, prompt) / 1e9)
    assert row["fields_gflops_per_s"] == pytest.approx(
        row["fields_gflop"] * 1e3 / row["suffix_eval_ms"]
    )
    assert row["fields_vs_prefill_rate"] == pytest.approx(
        row["fields_gflops_per_s"] / row["prefill_gflops_per_s"]
    )


CODED = """
from types import SimpleNamespace
from typing import Literal
from pydantic import BaseModel, Field

CODES = tuple(f"{a}{b}{c}" for a in "0123456789" for b in "abcdef" for c in "xyz")[:150]


class Coded(BaseModel):
    code: Literal[CODES] = Field(description="the code")


SCENARIOS = {
    "coded": SimpleNamespace(
        name="coded", title="coded", schema=Coded, context="some text", contexts=(),
        reference={},
    )
}
"""


def test_bench_times_a_pruned_field_against_the_exhaustive_pass(monkeypatch, capsys, tmp_path):
    from pcd_tools import cli
    from pcd_tools.decide.decider import Decider

    (tmp_path / "coded").mkdir()
    (tmp_path / "coded" / "__init__.py").write_text(CODED)
    monkeypatch.setattr(Decider, "load", classmethod(lambda cls, *a, **k: tiny_decider(0)))
    argv = ["bench", "--scenario", "coded", "--runs", "1", "--warmup", "0", "--no-rss"]
    argv += ["--scenarios-dir", str(tmp_path / "coded")]
    assert cli.main([*argv, "--methods", "pcd", "--scoring", "constrained", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["scoring"] == "constrained"
    assert row["warm_exhaustive_ms"] > 0 and row["pruned_vs_exhaustive"] > 0
    assert isinstance(row["certified"], bool) and isinstance(row["pruned_agrees"], bool)
    if row["certified"]:
        assert row["pruned_agrees"]
    assert "fields_gflops_per_s" not in row  # several pruned levels: no single-pass rate


def test_bench_scenarios_errors(tmp_path):
    from pcd_tools import cli
    from pcd_tools.bench import run as bench

    with pytest.raises(InvalidArgumentError, match="--scenarios-dir"):
        bench.load_scenarios(tmp_path)
    # bad options are usage errors (exit 2), found before any model loads
    assert cli.main(["bench", "--scenarios-dir", str(tmp_path), "--no-rss"]) == 2
    assert cli.main(["bench", "--scenario", "nope", "--no-rss"]) == 2


def test_scenarios_are_what_the_issue_promises():
    from pcd_tools.bench.run import load_scenarios

    sc = load_scenarios()
    assert sorted(sc) == ["fraud", "intake", "security_audit", "tariff", "triage"]
    shapes = {n: compile_schema(s.schema) for n, s in sc.items()}
    assert [f.cardinality for f in shapes["tariff"].fields] == [255]
    assert all(c.description for c in shapes["tariff"].fields[0].choices)
    assert all(len(c.label) == 6 and c.label.isdigit() for c in shapes["tariff"].fields[0].choices)
    triage = shapes["triage"]
    assert len(triage.fields) == 28
    assert {f.kind for f in triage.fields} == {"boolean", "enum"}
    assert len(shapes["fraud"].fields) == len(shapes["security_audit"].fields) == 4
    intake = shapes["intake"]  # the issue's support intake: every second-stage kind
    assert intake.field("category").cardinality == 8
    assert {len(a) for a in intake.field("subcategory").choices_by[1]} == {6}
    assert intake.field("team").depends_on == ("category", "subcategory")
    assert (intake.field("tags").kind, intake.field("tags").cardinality) == ("multilabel", 10)
    assert intake.field("severity").labels == [1, 2, 3, 4, 5]
    assert intake.field("request.kind").cardinality == 4
