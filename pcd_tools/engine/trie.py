"""Candidate token tries: which positions to evaluate and how to score candidates from them.

For one field, every candidate is the token sequence of `suffix + literal + terminator`.
Their longest common token prefix is the field's *stem*; the rest forms a trie. Every
trie node that has children needs one evaluated position (its logits score all its
children); the root's position is the stem's last token. The terminator makes the set
prefix-free (`"BILLING",` vs `"BILLING_DISPUTE",`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["FieldTrie", "build_trie"]


@dataclass(frozen=True)
class FieldTrie:
    """The evaluation plan for one field.

    Args:
        stem: Shared token prefix of all candidates (non-empty); its last token is the root.
        node_tokens: Token id of each internal node; node 0 is the root (`stem[-1]`).
        node_parent: Parent node index (-1 for the root).
        node_depth: Depth below the root (0 for the root).
        edge_node: For every edge, the internal node whose logits score it.
        edge_token: For every edge, the token id it emits.
        cand_edges: For every candidate, the indices of its edges in order.
    """

    stem: tuple[int, ...]
    node_tokens: tuple[int, ...]
    node_parent: tuple[int, ...]
    node_depth: tuple[int, ...]
    edge_node: np.ndarray
    edge_token: np.ndarray
    cand_edges: tuple[tuple[int, ...], ...]

    @property
    def n_nodes(self) -> int:
        """Internal nodes, the root included: the positions whose logits are read."""
        return len(self.node_tokens)

    @property
    def pack_tokens(self) -> list[int]:
        """Tokens the field contributes to a pass: the stem, then non-root internal nodes."""
        return list(self.stem) + list(self.node_tokens[1:])

    def ancestors(self, node: int) -> list[int]:
        """Non-root ancestors of `node` (excluding itself), nearest last."""
        out = []
        p = self.node_parent[node]
        while p > 0:
            out.append(p)
            p = self.node_parent[p]
        return out[::-1]

    def paths(self) -> list[list[int]]:
        """Minimal set of root-to-node token paths (after the stem) covering every node.

        Each path is one row in the batched layout: the stem plus these tokens.
        """
        has_internal_child = {p for p in self.node_parent[1:]}
        rows = []
        for n in range(self.n_nodes):
            if n in has_internal_child:
                continue
            chain = [*self.ancestors(n), n] if n > 0 else []
            rows.append(chain)
        return rows

    def score(self, edge_logp: np.ndarray, *, constrained: bool = False) -> np.ndarray:
        """Per-candidate log score from per-edge log-probabilities.

        Args:
            edge_logp: Full-vocabulary log p of every edge's token at its node.
            constrained: Renormalise over each node's allowed children first.
        """
        lp = edge_logp.astype(np.float64)
        if constrained:
            lp = lp.copy()
            for node in range(self.n_nodes):
                sel = self.edge_node == node
                vals = lp[sel]
                m = vals.max()
                lp[sel] = vals - (m + np.log(np.exp(vals - m).sum()))
        return np.array([lp[list(e)].sum() for e in self.cand_edges])


def build_trie(sequences: Sequence[Sequence[int]], *, what: str = "field") -> FieldTrie:
    """Builds the evaluation plan from each candidate's full token sequence.

    Raises:
        ValueError: if two candidates tokenize identically, one is a prefix of another, or
            no token is shared (the suffix must be common to all candidates).
    """
    seqs = [tuple(s) for s in sequences]
    if len(set(seqs)) != len(seqs):
        raise ValueError(f"{what}: two candidates have the same token sequence")
    k = 0
    shortest = min(len(s) for s in seqs)
    while k < shortest and all(s[k] == seqs[0][k] for s in seqs):
        k += 1
    if len(seqs) == 1:  # one allowed value (after a parent's answer): score its last token
        k = shortest - 1
    if k == 0:
        raise ValueError(f"{what}: candidates share no token prefix; the field suffix is missing")
    if k == shortest:
        raise ValueError(f"{what}: a candidate's tokens are a prefix of another's")
    stem = seqs[0][:k]
    node_tokens = [stem[-1]]
    node_parent = [-1]
    node_depth = [0]
    children: list[dict[int, int]] = [{}]  # node -> token -> child node (internal only)
    edge_node: list[int] = []
    edge_token: list[int] = []
    edge_index: dict[tuple[int, int], int] = {}
    cand_edges: list[tuple[int, ...]] = []
    for s in seqs:
        node = 0
        edges: list[int] = []
        rest = s[k:]
        for i, tok in enumerate(rest):
            key = (node, tok)
            if key not in edge_index:
                edge_index[key] = len(edge_node)
                edge_node.append(node)
                edge_token.append(tok)
            edges.append(edge_index[key])
            if i == len(rest) - 1:
                break
            nxt = children[node].get(tok)
            if nxt is None:
                nxt = len(node_tokens)
                node_tokens.append(tok)
                node_parent.append(node)
                node_depth.append(node_depth[node] + 1)
                children.append({})
                children[node][tok] = nxt
            node = nxt
        cand_edges.append(tuple(edges))
    # prefix-freeness: a candidate's last edge must not lead to an internal node
    for cand in cand_edges:
        last = cand[-1]
        if edge_token[last] in children[edge_node[last]]:
            raise ValueError(f"{what}: a candidate's tokens are a prefix of another's")
    return FieldTrie(
        stem=stem,
        node_tokens=tuple(node_tokens),
        node_parent=tuple(node_parent),
        node_depth=tuple(node_depth),
        edge_node=np.array(edge_node, dtype=np.int64),
        edge_token=np.array(edge_token, dtype=np.int64),
        cand_edges=tuple(cand_edges),
    )
