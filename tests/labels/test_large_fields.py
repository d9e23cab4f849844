"""Fields beyond 255 values on the tiny model: exact against one prompt per candidate,
certified by default, the search's report and its exhaustive fallback, taxonomies."""

from __future__ import annotations

import json
import math
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools import Labels
from pcd_tools.answers.payload import DISTRIBUTION_TOP, decision_payload
from pcd_tools.engine.passes.prune import Pruning
from pcd_tools.schema import compile_schema
from tests.engine.test_properties import decider  # the tiny model, numpy kernels off
from tests.oracle import oracle_log_scores, softmax
from tests.unit.test_pruning_bounds import random_field, run_search

pytestmark = pytest.mark.engine

# 400 distinct codes of 2-4 bytes (the tiny model's tokens are bytes)
CODES = tuple(f"{a}{b}{c}" for a in "abcdefghij" for b in "klmnopqrst" for c in "uvwx")[:400]
CONTEXT = "a context about codes"


class Coded(BaseModel):
    """Pick the code."""

    code: Literal[CODES] = Field(description="the code")  # type: ignore[valid-type]


def test_a_400_value_field_equals_one_prompt_per_candidate():
    d = decider().decide(Coded, CONTEXT, scoring="full", pruning="off")
    f = d.fields["code"]
    assert f.search is None and f.certified is None
    want = oracle_log_scores(decider(), compile_schema(Coded), CONTEXT, "code")
    np.testing.assert_allclose(np.array(f.log_scores), want, atol=1e-4)
    np.testing.assert_allclose(list(f.distribution.values()), softmax(want), atol=1e-4)


def test_the_default_reads_a_large_field_certified_and_says_what_it_read():
    auto = decider().decide(Coded, CONTEXT)  # scoring="auto", pruning="auto"
    whole = decider().decide(Coded, CONTEXT, pruning="off")
    fa, fw = auto.fields["code"], whole.fields["code"]
    assert fa.scoring == "constrained" == fw.scoring
    assert fa.certified is True and fa.label == fw.label
    assert fa.search is not None and 0 < fa.search.read <= fa.search.positions
    assert fa.search.positions == decider().engine.plan(compile_schema(Coded)).tries[0].n_nodes
    assert fa.search.share == fa.search.read / fa.search.positions
    lo, hi = fa.probability_bounds
    assert lo - 1e-6 <= fw.probability <= hi + 1e-6
    # constrained scoring knows the unread prefixes' totals: the bounds meet, and the
    # answer's probability (and every read candidate's) is the exhaustive pass's
    assert abs(hi - lo) < 1e-9 and abs(fa.probability - fw.probability) < 1e-4
    read = [k for k, p in fa.distribution.items() if p > 0]
    assert max(abs(fa.distribution[k] - fw.distribution[k]) for k in read) < 1e-4
    seen = np.isfinite(fa.log_scores)
    np.testing.assert_allclose(
        np.array(fa.log_scores)[seen], np.array(fw.log_scores)[seen], rtol=1e-5, atol=1e-4
    )


def test_out_of_levels_the_search_falls_back_to_the_exhaustive_pass():
    # A flat field (the model is unsure everywhere) and no levels: the first uncertified
    # context reads the rest of its trie in one more level; its answer is exact.
    trie, edge = random_field(11, 300, 4, 1.0)
    fell = set()
    got, levels = run_search(trie, edge, Pruning(lambda q, t: True, max_levels=0), fell)
    assert fell == {(0, 0)} and levels == 1
    assert not np.isnan(got).any()  # every position read
    z = trie.cand_logp(got)
    assert int(np.argmax(z)) == int(np.argmax(trie.score(edge)))


def test_the_fallback_is_reported_through_the_decider(monkeypatch):
    import dataclasses

    from pcd_tools.decide import methods

    real = methods.pruning_for

    def no_levels(*a, **kw):  # no levels, and a first pass that reads the root alone
        p = real(*a, **kw)
        return p if p is None else dataclasses.replace(p, max_levels=0, first_nodes=1)

    monkeypatch.setattr(methods, "pruning_for", no_levels)
    d = decider().decide(Coded, CONTEXT)
    f = d.fields["code"]
    whole = decider().decide(Coded, CONTEXT, pruning="off").fields["code"]
    assert f.search.fallback and f.search.read == f.search.positions
    assert f.certified is True and f.label == whole.label
    np.testing.assert_allclose(f.log_scores, whole.log_scores, rtol=1e-5, atol=1e-4)


def test_top_k_certifies_the_k_best_in_order():
    trie, edge = random_field(5, 600, 4, 0.05)
    exact = trie.score(edge)
    for k in (1, 3):
        got, _ = run_search(trie, edge, Pruning(lambda q, t: True, max_levels=50, top_k=k))
        z = trie.cand_logp(got)
        best = np.argsort(-np.where(np.isnan(z), -np.inf, z), kind="stable")[:k]
        assert list(best) == list(np.argsort(-exact, kind="stable")[:k])


def test_a_taxonomy_path_multiplies_to_the_leafs_probability():
    values, parents = [], {}
    for top in "PQR":
        values.append(top)
        for mid in "stu":
            values.append(top + mid)
            parents[top + mid] = top
            for leaf in "vwxyz":
                values.append(top + mid + leaf)
                parents[top + mid + leaf] = top + mid
    labels = Labels(tuple(values), parents=parents)

    class Tax(BaseModel):
        t: labels.type = Field(description="the class")  # type: ignore[name-defined]

    for pruning in ("off", "on"):
        f = decider().decide(Tax, CONTEXT, scoring="full", pruning=pruning).fields["t"]
        assert [s.value for s in f.path] == [f.label[0], f.label[:2], f.label]
        assert math.isclose(math.prod(s.probability for s in f.path), f.probability, rel_tol=1e-9)
        assert math.isclose(f.path[-1].reached, f.probability, rel_tol=1e-9)
        dist = f.distribution
        top_mass = sum(p for k, p in dist.items() if k[0] == f.label[0])
        assert math.isclose(f.path[0].probability, top_mass / sum(dist.values()), rel_tol=1e-9)
        level = f.unsure_level(1.0)
        assert level is not None and f.unsure_level(0.0) is None


def test_the_json_answer_of_a_large_field_is_short_and_says_what_was_read():
    d = decider().decide(Coded, CONTEXT)
    out = decision_payload(d, 0.5)["fields"]["code"]
    json.dumps(out)
    assert out["candidates"] == 400 and len(out["distribution"]) <= DISTRIBUTION_TOP
    assert out["value"] in out["distribution"] and out["certified"] is True
    assert set(out["search"]) == {"read", "positions", "levels", "fallback"}


def test_a_field_may_depend_on_a_large_field_and_be_one():
    class Chain(BaseModel):
        """Pick two codes."""

        first: Literal[CODES] = Field(description="the first code")  # type: ignore[valid-type]
        second: Literal[CODES] = Field(  # type: ignore[valid-type]
            description="the second code", json_schema_extra={"depends_on": ["first"]}
        )

    d = decider().decide(Chain, CONTEXT)
    whole = decider().decide(Chain, CONTEXT, pruning="off")
    for name in ("first", "second"):
        f = d.fields[name]
        assert f.certified is True and f.label == whole.fields[name].label, name
        assert f.search is not None and f.search.read <= f.search.positions


def _tree(tops: str, mids: str, leaves: str, decide: str = "path") -> Labels:
    values, parents = [], {}
    for top in tops:
        values.append(top)
        for mid in mids:
            values.append(top + mid)
            parents[top + mid] = top
            for leaf in leaves:
                values.append(top + mid + leaf)
                parents[top + mid + leaf] = top + mid
    return Labels(tuple(values), parents=parents, decide=decide)


@pytest.mark.parametrize("scoring", ["full", "constrained"])
def test_a_taxonomy_is_decided_level_by_level_and_certified_when_pruned(scoring):
    labels = _tree("PQRSTUVW", "abcdefgh", "mnopqrst")  # 512 leaves

    class Tax(BaseModel):
        t: labels.type = Field(description="the class")  # type: ignore[name-defined]

    for context in ("first text", "a second, rather different text"):
        whole = decider().decide(Tax, context, scoring=scoring, pruning="off").fields["t"]
        pruned = decider().decide(Tax, context, scoring=scoring, pruning="on").fields["t"]
        # level by level: at each level the child with the most mass under the chosen node
        node, dist = "", whole.distribution
        for depth in range(3):
            kids = sorted({k[: depth + 1] for k in dist if k.startswith(node)})
            mass = {k: sum(p for lab, p in dist.items() if lab.startswith(k)) for k in kids}
            node = max(kids, key=lambda k: (mass[k], -kids.index(k)))
        assert whole.label == node
        assert pruned.certified is True and pruned.label == whole.label
        if scoring == "constrained":  # full scoring's prefix bounds are loose: it may fall back
            assert not pruned.search.fallback
            assert pruned.search.read < pruned.search.positions / 2, pruned.search


def test_decide_leaf_takes_the_most_probable_leaf():
    for decide in ("leaf", "path"):
        labels = _tree("PQR", "stu", "vwxyz", decide)

        class Tax(BaseModel):
            t: labels.type = Field(description="the class")  # type: ignore[name-defined]

        f = decider().decide(Tax, CONTEXT, scoring="full").fields["t"]
        if decide == "leaf":
            assert f.label == max(f.distribution, key=f.distribution.get)
        assert math.isclose(math.prod(s.probability for s in f.path), f.probability, rel_tol=1e-9)


@pytest.mark.parametrize("q", [0.2, 0.6, 0.9, 0.99])
def test_a_pruned_fields_prediction_set_holds_the_exhaustive_one(q):
    from pcd_tools.answers.calibration import Calibration

    schema = compile_schema(Coded)
    cal = Calibration(
        model_id=decider().model_id,
        schema_name=schema.name,
        schema_fingerprint=schema.fingerprint(),
        temperatures={"code": 1.3},
        scoring="auto",
        conformal={"code": {"score": "lac", "n": 19, "scores": [q] * 19}},
    )
    calibrated = decider().with_calibration(cal)
    pruned = calibrated.decide(Coded, CONTEXT).fields["code"]
    whole = calibrated.decide(Coded, CONTEXT, pruning="off").fields["code"]
    assert pruned.search is not None and whole.search is None
    got, want = pruned.prediction_set(0.9), whole.prediction_set(0.9)
    assert set(want) <= set(got), (want, got)
    assert got[0] == pruned.label and want[0] == whole.label
    # every answer it adds could hold 1 - q: its upper bound says so
    p_whole = dict(zip(whole.spec.labels, whole.conformal.probs))
    extra = set(got) - set(want)
    assert all(p_whole[x] < 1 - q + 1e-9 for x in extra)
    # the answer's upper bound counts the unread prefixes' known totals: above the
    # exhaustive probability (0.179 here), but near it (its share of what was read: 0.278)
    p_pruned = dict(zip(pruned.spec.labels, pruned.conformal.probs))
    assert p_whole[whole.label] - 1e-4 <= p_pruned[pruned.label] <= p_whole[whole.label] + 0.01


def test_the_certified_top_ranks_equal_the_exhaustive_ranking():
    for context in (CONTEXT, "another context", "codes codes codes"):
        pruned = decider().decide(Coded, context).fields["code"]
        whole = decider().decide(Coded, context, pruning="off").fields["code"]
        k = pruned.certified_top
        assert pruned.certified and k >= 1 and whole.certified_top is None
        assert [c for c, _ in pruned.top_choices[:k]] == [c for c, _ in whole.top_choices[:k]]
        if k < len(CODES):  # the next rank is not vouched for: an unread label may beat it
            assert pruned.unscored_mass > 0


def test_a_pruned_taxonomys_path_counts_the_unread_mass_it_knows():
    labels = _tree("PQRSTUVW", "abcdefgh", "mnopqrst")

    class Tax(BaseModel):
        t: labels.type = Field(description="the class")  # type: ignore[name-defined]

    whole = decider().decide(Tax, CONTEXT, scoring="constrained", pruning="off").fields["t"]
    pruned = decider().decide(Tax, CONTEXT, scoring="constrained", pruning="on").fields["t"]
    assert pruned.label == whole.label and pruned.search.read < pruned.search.positions
    # each level's conditional probability is the exhaustive pass's (prefix totals are exact)
    for a, b in zip(pruned.path, whole.path):
        assert a.value == b.value and abs(a.probability - b.probability) < 1e-4, (a, b)
    product = math.prod(s.probability for s in pruned.path)
    assert abs(product - pruned.probability_bounds[0]) < 1e-6
    assert abs(product - whole.probability) < 1e-4
    assert abs(pruned.path[-1].reached - product) < 1e-9 and pruned.path[0].reached <= 1.0


def test_a_trie_with_few_root_children_is_cut_into_chunks_of_the_budget():
    from pcd_tools.engine.passes.pack import make_chunks
    from pcd_tools.engine.passes.trie import build_trie

    # two root children, each over a thousand nodes below: no root subtree fits a chunk
    seqs = [
        [1, 2, 10 + a, 100 + b, 200 + c, 9] for a in range(2) for b in range(40) for c in range(30)
    ]
    trie = build_trie(seqs)
    chunks = make_chunks([trie], 256, 2)
    assert len(chunks) > 4 and max(len(c.tokens) for c in chunks) <= 2 * 256
    read = np.unique(np.concatenate([nodes for c in chunks for nodes in c.part_nodes]))
    assert list(read) == list(range(trie.n_nodes))  # every position read
