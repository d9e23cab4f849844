"""Candidate tries: stems, shared prefixes, prefix-freeness and scoring arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools.engine.passes.trie import build_trie

pytestmark = pytest.mark.unit


def test_shared_prefix_candidates_build_one_node_per_branching_position():
    # stem [1, 2]; candidates diverge after it; BILLING=[5, 9] vs BILLING_DISPUTE=[5, 7, 9]
    t = build_trie([[1, 2, 5, 9], [1, 2, 5, 7, 9], [1, 2, 6, 9]])
    assert t.stem == (1, 2)
    # every non-final token is a node whose logits score its children; "5" is shared
    assert t.node_tokens == (2, 5, 7, 6)
    assert t.node_parent == (-1, 0, 1, 0)
    assert t.node_depth == (0, 1, 2, 1)
    assert t.pack_tokens == [1, 2, 5, 7, 6]
    assert [len(e) for e in t.cand_edges] == [2, 3, 2]
    assert len(t.edge_node) == 6  # 5 and 6 from the root, 9 and 7 from "5", 9 from 7 and 6
    # batched rows: the fewest root paths covering every node
    assert t.paths() == [[1, 2], [3]]


def test_scores_sum_edges_and_constrained_renormalises():
    t = build_trie([[1, 3], [1, 4, 5], [1, 4, 6]])
    # edges: (0,3) (0,4) (1,5) (1,6)
    lp = np.log(np.array([0.2, 0.3, 0.5, 0.25]))
    full = t.score(lp)
    np.testing.assert_allclose(np.exp(full), [0.2, 0.15, 0.075])
    con = t.score(lp, constrained=True)
    np.testing.assert_allclose(np.exp(con), [0.4, 0.6 * 2 / 3, 0.6 / 3])
    assert abs(np.exp(con).sum() - 1) < 1e-12


@pytest.mark.parametrize(
    ("seqs", "fragment"),
    [
        ([[1, 2], [1, 2]], "same token sequence"),
        ([[1, 2], [1, 2, 3]], "prefix of another"),
        ([[1, 2, 3], [1, 2, 3, 4]], "prefix of another"),
        ([[1, 2], [3, 2]], "share no token prefix"),
    ],
)
def test_invalid_candidate_sets_are_refused(seqs, fragment):
    with pytest.raises(ValueError, match=fragment):
        build_trie(seqs)
