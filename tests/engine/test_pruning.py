"""Certified pruned scoring through the engine and the decider (tiny model).

The pruned search reads the same logits as the exhaustive pass, in other packed passes:
every edge it scores equals the exhaustive one, a certified answer is the exhaustive
argmax, and the exhaustive answer's probability lies within `probability_bounds`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, create_model

from pcd_tools import FieldDefinition, StructuredSchema
from pcd_tools.engine.passes.prune import AUTO_NODES, pruning_for
from pcd_tools.errors import InvalidArgumentError, InvalidFieldOptionError
from pcd_tools.schema import compile_schema
from tests.engine.test_properties import decider  # the tiny model, numpy kernels off

pytestmark = pytest.mark.engine

CODES = tuple(f"{a}{b}{c}" for a in "0123456789" for b in "abcdef" for c in "xyz")[:150]
CONTEXTS = ["some text here", "other text", "a third one, longer than the others"]


class Coded(BaseModel):
    code: Literal[CODES] = Field(description="the code")  # type: ignore[valid-type]
    flag: bool = Field(description="a flag")


def check_against_whole(schema, contexts, **kw):
    """Pruned decisions against exhaustive ones: returns the pruned decisions."""
    whole = decider().decide_many(schema, contexts, pruning="off", **kw)
    pruned = decider().decide_many(schema, contexts, pruning="on", **kw)
    for w, p in zip(whole, pruned):
        for name, fp in p.fields.items():
            fw = w.fields[name]
            assert fw.certified is None
            assert fp.certified is not None, name
            lo, hi = fp.probability_bounds
            assert lo - 1e-4 <= fw.probability <= hi + 1e-4, (name, lo, fw.probability, hi)
            assert lo <= fp.probability <= hi + 1e-12
            assert 0.0 <= fp.unscored_mass <= 1.0
            if fp.certified:
                assert fp.label == fw.label, name
            # every scored candidate's log score is the exhaustive one
            zp, zw = np.array(fp.log_scores), np.array(fw.log_scores)
            seen = np.isfinite(zp)
            np.testing.assert_allclose(zp[seen], zw[seen], rtol=1e-5, atol=1e-4)
            assert (np.array(list(fp.distribution.values()))[~seen] == 0.0).all()
    return pruned


@pytest.mark.parametrize("scoring", ["full", "constrained", "auto"])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_pruned_answers_match_the_exhaustive_pass(scoring, temperature):
    pruned = check_against_whole(Coded, CONTEXTS, scoring=scoring, temperature=temperature)
    assert all(d.fields["code"].certified for d in pruned)


def test_the_edges_the_search_scores_equal_the_exhaustive_ones():
    engine = decider().engine
    schema = compile_schema(Coded)
    engine.score(schema, CONTEXTS)  # both below find the schema part cached
    whole = engine.score(schema, CONTEXTS)
    pruned = engine.score(schema, CONTEXTS, pruning=pruning_for(schema, "on"))
    assert whole.prefix_cache_hit and pruned.prefix_cache_hit
    # the search's levels are passes of their own (this unsure model reads every edge);
    # its first level runs in the prefill's call, the exhaustive pass in two streams' calls
    assert whole.sequential_forward_passes == 3
    assert pruned.sequential_forward_passes >= 3
    for r in range(len(CONTEXTS)):
        for a, b in zip(whole.edge_logp[r], pruned.edge_logp[r]):
            seen = ~np.isnan(b)
            assert seen.any()
            # float32 passes of other shapes: the same logits to about 1e-4 (1e-5 relative)
            np.testing.assert_allclose(b[seen], a[seen], rtol=1e-5, atol=1e-4)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    codes=st.lists(
        st.text(alphabet="abcxyz019", min_size=1, max_size=4), min_size=2, max_size=40, unique=True
    ),
    context=st.sampled_from(CONTEXTS),
    scoring=st.sampled_from(["full", "constrained"]),
)
def test_random_tries_on_the_tiny_model(codes, context, scoring):
    model = create_model(
        "Random",
        code=(Literal[tuple(codes)], Field(description="pick one")),  # type: ignore[call-overload]
    )
    check_against_whole(model, [context], scoring=scoring)


def test_auto_prunes_only_large_tries_under_constrained_scoring():
    schema = compile_schema(Coded)
    plan = decider().engine.plan(schema)
    auto = pruning_for(schema, "auto", constrained=True)
    assert auto is not None
    picked = [auto.select(q, t) for q, t in zip(plan.questions, plan.tries)]
    assert [t.n_nodes > AUTO_NODES for t in plan.tries] == picked == [True, False]
    d = decider().decide(Coded, CONTEXTS[0], scoring="constrained")
    assert d.fields["code"].certified is not None and d.fields["flag"].certified is None
    assert d.certified is d.fields["code"].certified
    # full scoring: "auto" scores whole, "on" prunes
    full = pruning_for(schema, "auto")
    assert full is not None and not any(
        full.select(q, t) for q, t in zip(plan.questions, plan.tries)
    )
    d = decider().decide(Coded, CONTEXTS[0], scoring="full")
    assert d.certified is None and d.fields["code"].certified is None
    assert pruning_for(schema, "off") is None
    # auto scoring (the default) prunes what constrained scoring prunes
    auto = pruning_for(schema, "auto", auto_scoring=True)
    assert auto is not None
    assert [auto.select(q, t) for q, t in zip(plan.questions, plan.tries)] == [True, False]
    d = decider().decide(Coded, CONTEXTS[0])
    assert d.fields["code"].certified is True and d.fields["flag"].certified is None


def _dist(d, name):
    return np.array(list(d.fields[name].distribution.values()))


def test_auto_scoring_is_constrained_on_large_fields_only_and_says_so():
    ctx = CONTEXTS[2]
    auto = decider().decide(Coded, ctx)  # the default
    assert auto.scoring == "auto"
    assert auto.fields["code"].scoring == "constrained"
    assert auto.fields["flag"].scoring == "full"
    assert auto.certified is True
    con = decider().decide(Coded, ctx, scoring="constrained", pruning="off")
    full = decider().decide(Coded, ctx, scoring="full", pruning="off")
    assert {f.scoring for f in con.fields.values()} == {"constrained"}
    assert {f.scoring for f in full.fields.values()} == {"full"}
    # the pruned large field: the exhaustive constrained argmax, inside its bounds
    code = auto.fields["code"]
    assert code.label == con.fields["code"].label
    lo, hi = code.probability_bounds
    assert lo - 1e-4 <= con.fields["code"].probability <= hi + 1e-4
    # the small field is scored full, as before
    np.testing.assert_allclose(_dist(auto, "flag"), _dist(full, "flag"), atol=1e-5)
    # pruning never changes what the probabilities mean: auto scored whole is the
    # exhaustive constrained distribution on the large field and the full one elsewhere
    whole = decider().decide(Coded, ctx, pruning="off")
    assert whole.fields["code"].scoring == "constrained"
    assert whole.fields["code"].certified is None
    np.testing.assert_allclose(_dist(whole, "code"), _dist(con, "code"), atol=1e-5)
    np.testing.assert_allclose(_dist(whole, "flag"), _dist(full, "flag"), atol=1e-5)
    assert auto.to_response()["field_telemetry"]["code"]["scoring"] == "constrained"
    # and so do listing orders, which score every field whole
    two = decider().decide(Coded, ctx, orders=2)
    assert two.fields["code"].scoring == "constrained"
    assert two.fields["flag"].scoring == "full"


def test_auto_scoring_is_full_where_it_cannot_prune_or_was_fitted_otherwise():
    from pcd_tools.decide.methods import CONTEXTUAL, PMI, RAW, Method

    ctx = CONTEXTS[0]
    cc = decider().decide(Coded, ctx, calibration="contextual")
    assert cc.scoring == "full" and cc.fields["code"].scoring == "full"
    full = decider().decide(Coded, ctx, scoring="full", calibration="contextual")
    np.testing.assert_allclose(_dist(cc, "code"), _dist(full, "code"), atol=1e-6)

    class Fitted:
        scoring = "constrained"

    assert Method.resolve("auto", "none", None, Fitted()) == Method("constrained", RAW)
    assert Method.resolve("auto", "contextual") == Method("full", CONTEXTUAL)
    assert Method.resolve("auto", "none") == Method("auto", RAW)
    assert Method.resolve("full", "none", None, Fitted()) == Method("full", RAW)
    Fitted.scoring = "pmi"  # a calibration fitted on PMI scores: "auto" is PMI
    assert Method.resolve("auto", "none", None, Fitted()) == Method("full", PMI)
    with pytest.raises(InvalidArgumentError, match="accepted: 'auto', 'full'"):
        decider().decide(Coded, ctx, scoring="exact")  # type: ignore[arg-type]


def test_a_field_can_turn_pruning_on_or_off():
    class Own(BaseModel):
        code: Literal[CODES] = Field(description="c", json_schema_extra={"pruning": "off"})  # type: ignore[valid-type]
        flag: bool = Field(description="f", json_schema_extra={"pruning": "on"})

    auto = decider().decide(Own, CONTEXTS[0])
    assert auto.fields["code"].certified is None and auto.fields["flag"].certified is not None
    on = decider().decide(Own, CONTEXTS[0], pruning="on")
    assert on.fields["code"].certified is None  # the field's own "off" wins
    off = decider().decide(Own, CONTEXTS[0], pruning="off")
    assert off.fields["flag"].certified is None  # the request's "off" turns everything off
    telemetry = auto.to_response()["field_telemetry"]
    assert set(telemetry["flag"]) >= {"certified", "unscored_mass", "probability_bounds"}
    assert "certified" not in telemetry["code"]


def test_the_dict_form_takes_pruning():
    schema = StructuredSchema(
        [FieldDefinition("code", "enum", "the code", choices=list(CODES[:10]), pruning="on")]
    )
    assert compile_schema(schema).fields[0].pruning == "on"
    d = decider().decide(schema, CONTEXTS[0])
    assert d.fields["code"].certified is not None


def test_bad_pruning_options_raise_clear_errors():
    with pytest.raises(InvalidArgumentError, match="pruning='maybe'; accepted: 'auto'"):
        decider().decide(Coded, "x", pruning="maybe")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="orders=2"):
        decider().decide(Coded, "x", pruning="on", orders=2)
    with pytest.raises(InvalidArgumentError, match="scoring='pmi'"):
        decider().decide(Coded, "x", pruning="on", scoring="pmi")
    with pytest.raises(InvalidArgumentError, match="calibration='contextual'"):
        decider().decide(Coded, "x", pruning="on", calibration="contextual")
    with pytest.raises(InvalidArgumentError, match="mode='batched'"):
        decider().decide(Coded, "x", pruning="on", mode="batched")
    # "auto" with the same options scores whole, without an error
    d = decider().decide(Coded, "x", orders=2)
    assert d.fields["code"].certified is None
    with pytest.raises(InvalidFieldOptionError, match="pruning='sometimes'"):
        compile_schema(
            create_model("Bad", x=(bool, Field(json_schema_extra={"pruning": "sometimes"})))  # type: ignore[call-overload]
        )
    with pytest.raises(InvalidFieldOptionError, match="not a single choice"):
        compile_schema(
            create_model(
                "BadMulti",
                x=(set[Literal["a", "b"]], Field(json_schema_extra={"pruning": "on"})),  # type: ignore[call-overload]
            )
        )


class Small(BaseModel):
    level: Literal["low", "medium", "high"] = Field(description="how bad")
    flag: bool = Field(description="a flag")


@pytest.mark.parametrize(
    ("model", "pruning", "rows"), [(Coded, "on", (1, 3)), (Small, "off", (1,))]
)
def test_the_first_fields_chunk_runs_in_the_prefills_call_with_the_same_scores(
    monkeypatch, model, pruning, rows
):
    """With the schema part cached, a fields pass whose first model call is one chunk
    runs that chunk in the prefill's call (`Passes.prefill_and_pack`): one model call
    less, every edge the same as after a prefill of its own (float32 passes of other
    shapes: 1e-4), and the K/V the later levels read unchanged."""
    engine = decider().engine
    schema = compile_schema(model)
    prune = pruning_for(schema, pruning)
    engine.score(schema, CONTEXTS[:1])  # the schema part cached
    merged_calls = []
    real = engine.passes.prefill_and_pack
    monkeypatch.setattr(
        engine.passes, "prefill_and_pack", lambda *a: merged_calls.append(1) or real(*a)
    )
    first = engine._first_chunks(engine.plan(schema), "packed", prune)
    assert first is not None and len(first) == 1
    # one row, and rows of different lengths (an unpruned pass spreads several rows over
    # the streams in calls of their own)
    for contexts in (CONTEXTS[:n] for n in rows):
        merged = engine.score(schema, contexts, pruning=prune)
        assert merged_calls, "the first chunk did not run with the prefill"
        merged_calls.clear()
        with monkeypatch.context() as m:
            m.setattr(engine, "_first_chunks", lambda *a: None)
            apart = engine.score(schema, contexts, pruning=prune)
        assert not merged_calls
        assert merged.prefix_cache_hit and apart.prefix_cache_hit
        assert merged.sequential_forward_passes == apart.sequential_forward_passes - 1
        for r in range(len(contexts)):
            for a, b in zip(apart.edge_logp[r], merged.edge_logp[r]):
                assert np.array_equal(np.isnan(a), np.isnan(b))
                seen = ~np.isnan(a)
                np.testing.assert_allclose(b[seen], a[seen], rtol=1e-5, atol=1e-4)


class OneCode(BaseModel):
    code: Literal[CODES] = Field(description="the code")  # type: ignore[valid-type]


def test_a_single_field_keeps_its_stem_for_the_levels(monkeypatch):
    """A warm single-field request with one context keeps the field's stem K/V from the
    prefill's call, and each pruned level runs after it, its stem not packed again; the
    scores are the levels' own to 1e-4 (float32 passes of other shapes), the same answer,
    certified. With several contexts (right-padded rows) nothing is kept."""
    engine = decider().engine
    schema = compile_schema(OneCode)
    prune = pruning_for(schema, "on")
    engine.score(schema, CONTEXTS[:1])  # the schema part cached
    plan = engine.plan(schema)
    stem = len(plan.tries[0].stem)
    seen = []
    real = engine.passes.packed

    def packs_stem(c):
        return list(c.tokens[:stem]) == list(plan.tries[0].stem)

    def spy(plan_, kv, valid, chunks):
        seen.append((int(kv[0][0].shape[2]), list(valid), [packs_stem(c) for c in chunks]))
        return real(plan_, kv, valid, chunks)

    monkeypatch.setattr(engine.passes, "packed", spy)
    kept = engine.score(schema, CONTEXTS[2:], pruning=prune)
    assert seen, "no pruned level ran"
    width = seen[0][1][0]
    assert all(w == width and v == [width] for w, v, _ in seen)
    assert not any(p for *_, ps in seen for p in ps)  # no level packs the stem
    seen.clear()
    with monkeypatch.context() as m:
        m.setattr(engine, "_stem_to_keep", lambda *a: 0)
        again = engine.score(schema, CONTEXTS[2:], pruning=prune)
    assert seen[0][1][0] == width - stem  # the levels ran after the rows alone
    assert all(p for *_, ps in seen for p in ps)  # each chunk packs it again
    assert kept.sequential_forward_passes == again.sequential_forward_passes
    a, b = kept.edge_logp[0][0], again.edge_logp[0][0]
    assert np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=1e-5, atol=1e-4)
    seen.clear()
    engine.score(schema, CONTEXTS, pruning=prune)  # three rows: levels after the rows
    assert all(len(v) == 3 for _, v, _ in seen)
    assert engine._stem_to_keep(plan, "packed", prune, 3) == 0


def test_level_chunks_below_a_cached_stem():
    """`make_chunks(stem_cached=True)` packs a level's nodes without the field's stem,
    the root's children at position 0; the root itself, or two fields, are refused."""
    from pcd_tools.engine.passes.pack import make_chunks

    plan = decider().engine.plan(compile_schema(OneCode))
    trie = plan.tries[0]
    kids = [n for n in range(1, trie.n_nodes) if trie.node_parent[n] == 0][:3]
    grand = [n for n in range(1, trie.n_nodes) if trie.node_parent[n] in kids]
    for nodes in (kids, grand):
        whole = make_chunks(plan.tries, 256, 1, nodes={0: nodes})
        cached = make_chunks(plan.tries, 256, 1, nodes={0: nodes}, stem_cached=True)
        assert len(whole) == len(cached) == 1
        w, c = whole[0], cached[0]
        assert len(w.tokens) == len(c.tokens) + len(trie.stem)
        assert list(w.tokens[len(trie.stem) :]) == list(c.tokens)
        assert list(c.rel_pos) == [p - len(trie.stem) for p in w.rel_pos[len(trie.stem) :]]
        assert c.rel_pos.min() == 0
    with pytest.raises(ValueError, match="below one field's root"):
        make_chunks(plan.tries, 256, 1, nodes={0: [0, *kids]}, stem_cached=True)
    two = decider().engine.plan(compile_schema(Coded))
    with pytest.raises(ValueError, match="below one field's root"):
        make_chunks(two.tries, 4096, 1, nodes={0: kids, 1: [1]}, stem_cached=True)
