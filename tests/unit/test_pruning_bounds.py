"""Certified pruned scoring without a model: the search and the bounds on random tries.

Each node of a random trie gets a random distribution over a small vocabulary, so an
edge's log p is exactly what a full-vocabulary model pass would give, and the exhaustive
answer is known. The search (`pcd_tools.engine.passes.prune.search`) reads edges from it level
by level; `pcd_tools.answers.bounds` must then never certify a wrong answer, and its bounds must
always hold the exhaustive probability.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcd_tools.answers.bounds import PartialScores, bounded
from pcd_tools.engine.passes.prune import Pruning, expansions, search
from pcd_tools.engine.passes.trie import build_trie

pytestmark = pytest.mark.unit

VOCAB = 12
END = VOCAB  # the terminator token: makes the candidate set prefix-free


def random_field(seed: int, n: int, depth: int, peak: float):
    """A trie over `n` distinct random token sequences and its true edge log p."""
    rng = np.random.default_rng(seed)
    n = min(n, sum(VOCAB**k for k in range(1, depth + 1)) // 2)
    seqs: set[tuple[int, ...]] = set()
    while len(seqs) < n:
        k = int(rng.integers(1, depth + 1))
        seqs.add(tuple(int(t) for t in rng.integers(0, VOCAB, size=k)))
    trie = build_trie([(99, *s, END) for s in sorted(seqs)])
    # one distribution per node over VOCAB + 1 tokens (full vocabulary: children hold < 1)
    probs = rng.dirichlet(np.full(VOCAB + 1, peak), size=trie.n_nodes)
    edge = np.log(np.maximum(probs[trie.edge_node, trie.edge_token], 1e-30) * 0.9)  # 10% elsewhere
    return trie, edge


def run_search(trie, edge, pruning, fell=None):
    """The search over one context whose levels read `edge`: (its edges read, levels);
    `fell` collects a fallback."""
    acc = [np.full((1, len(edge)), np.nan)]
    root = trie.edge_node == 0
    acc[0][0, root] = edge[root]

    def level(want):
        for fi, nodes in want.items():
            sel = np.isin(trie.edge_node, nodes)
            acc[fi][0, sel] = edge[sel]

    levels = search([trie], [0], acc, level, pruning, fell)
    return acc[0][0], levels


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(2, 120),
    depth=st.integers(1, 5),
    peak=st.sampled_from([0.05, 0.3, 1.0]),
    temperature=st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0]),
    constrained=st.booleans(),
    levels=st.integers(0, 6),
    biased=st.booleans(),
)
def test_a_certified_answer_is_the_argmax_and_the_bounds_hold(
    seed, n, depth, peak, temperature, constrained, levels, biased
):
    trie, edge = random_field(seed, n, depth, peak)
    pruning = Pruning(
        select=lambda q, t: True,
        constrained=constrained,
        level_nodes=8,
        subtree_nodes=3,
        max_levels=levels,
    )
    got, _ = run_search(trie, edge, pruning)
    scores = trie.scores(got, constrained=constrained)
    if isinstance(scores, np.ndarray):
        scores = PartialScores.whole(scores)
    k = len(trie.cand_edges)
    bias = np.random.default_rng(seed + 1).normal(0, 1, k) if biased else None
    result = bounded(scores, temperature, scale=1.3, bias=bias)
    exact_z = trie.score(edge, constrained=constrained)
    s = 1.3 * exact_z + (0 if bias is None else bias)
    p = np.exp((s - s.max()) / temperature)
    p /= p.sum()
    lo, hi = result.probability_bounds
    assert lo - 1e-9 <= p[result.best] <= hi + 1e-9
    assert p[~scores.scored].sum() <= result.unscored_mass + 1e-9
    # every scored candidate's score is exact
    np.testing.assert_allclose(scores.z[scores.scored], exact_z[scores.scored], atol=1e-12)
    if result.certified:
        assert result.best == int(np.argmax(p))


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(2, 150),
    depth=st.integers(1, 5),
    constrained=st.booleans(),
)
def test_the_search_certifies_when_it_may_run_to_the_end(seed, n, depth, constrained):
    trie, edge = random_field(seed, n, depth, 0.3)
    pruning = Pruning(select=lambda q, t: True, constrained=constrained, max_levels=10**6)
    got, levels = run_search(trie, edge, pruning)
    scores = trie.scores(got, constrained=constrained)
    z = scores if isinstance(scores, np.ndarray) else scores.z
    result = bounded(PartialScores.whole(z) if isinstance(scores, np.ndarray) else scores, 1.0)
    assert result.certified
    assert result.best == int(np.argmax(trie.score(edge, constrained=constrained)))
    assert levels <= trie.n_nodes


def test_a_peaked_field_scores_only_a_few_paths():
    # A model that is sure: one candidate holds most of the mass. The search expands
    # its path and stops; most of a 1,000-candidate trie is never read.
    trie, edge = random_field(7, 1000, 4, 0.02)
    got, levels = run_search(trie, edge, Pruning(select=lambda q, t: True, max_levels=50))
    scores = trie.scores(got)
    assert isinstance(scores, PartialScores)
    result = bounded(scores, 1.0)
    assert result.certified
    assert result.best == int(np.argmax(trie.score(edge)))
    read = np.unique(trie.edge_node[~np.isnan(got)])
    assert len(read) < trie.n_nodes / 4, (len(read), trie.n_nodes)
    assert levels >= 1


def test_expansions_skip_prefixes_that_cannot_win():
    # Root children: token 1 (p = 0.6; its candidate needs one more token), token 2
    # (0.3, a subtree of three nodes) and token 3 (0.05, two nodes).
    trie = build_trie([(99, 1, END), (99, 2, 5, END), (99, 2, 6, END), (99, 3, 7, END)])
    edge = np.full(len(trie.edge_node), np.nan)
    p = {(0, 1): 0.6, (0, 2): 0.3, (0, 3): 0.05}
    for e, (node, tok) in enumerate(zip(trie.edge_node, trie.edge_token)):
        if (node, tok) in p:
            edge[e] = np.log(p[(node, tok)])
    # Nothing is complete yet, so every prefix may still win. With room for 2 nodes, the
    # most probable prefixes go first: a subtree of one node whole, a bigger one one
    # token deeper ("c" does not fit).
    pick = Pruning(select=lambda q, t: True, subtree_nodes=1)
    want = expansions(trie, edge, pick, 2)
    assert {trie.node_tokens[n] for n in want} == {1, 2}
    assert all(trie.node_depth[n] == 1 for n in want)
    assert {trie.node_tokens[n] for n in expansions(trie, edge, pick, 1)} == {1}
    # Until a candidate is scored, a level stays best-first even with room for more.
    assert {trie.node_tokens[n] for n in expansions(trie, edge, pick, 10)} == {1, 2, 3}
    # Token 1's candidate scored at 0.6 * 0.1: token 3's prefix (0.05) cannot win any more,
    # and token 2's whole subtree fits in the level, so the level reads it and the search
    # can end.
    a_node = next(n for n in range(trie.n_nodes) if trie.node_tokens[n] == 1 and n)
    sel = trie.edge_node == a_node
    edge[sel] = np.log(0.1)
    two = next(n for n in range(trie.n_nodes) if trie.node_tokens[n] == 2 and n)
    assert expansions(trie, edge, pick, 10) == set(trie.subtree_nodes[two].tolist())
    edge[sel] = np.nan
    # once "a" + END is scored at 0.6 * 0.9, "b" (0.3) and "c" (0.05) cannot win
    a_node = next(n for n in range(trie.n_nodes) if trie.node_tokens[n] == 1 and n)
    for e in np.nonzero(trie.edge_node == a_node)[0]:
        edge[e] = np.log(0.9)
    assert expansions(trie, edge, Pruning(select=lambda q, t: True), 10) == set()
    result = bounded(trie.scores(edge), 1.0)
    assert result.certified and result.best == 0
    assert 0 < result.unscored_mass < 0.41


def test_bounds_of_a_field_scored_whole_are_exact():
    z = np.log(np.array([0.5, 0.3, 0.2]))
    got = bounded(PartialScores.whole(z), 1.0)
    assert got.certified and got.unscored_mass == 0.0
    assert got.probability_bounds == pytest.approx((0.5, 0.5))


def test_bounded_refuses_a_field_with_nothing_scored():
    with pytest.raises(ValueError, match="no scored candidate"):
        bounded(PartialScores(np.full(3, np.nan), np.zeros(1), (np.arange(3),)), 1.0)
