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
from functools import cached_property

import numpy as np

from ...answers.bounds import PartialScores

__all__ = ["FieldTrie", "build_trie", "groups_of", "log_normalised"]


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
        """Per-candidate log score from per-edge log-probabilities (NaN for a candidate
        with an unscored edge).

        Args:
            edge_logp: Full-vocabulary log p of every edge's token at its node.
            constrained: Renormalise over each node's allowed children first.
        """
        return self.cand_logp(self.edge_scores(edge_logp, constrained=constrained))

    def cand_logp(self, lp: np.ndarray) -> np.ndarray:
        """Per-candidate sum of its edges' scores `lp` (NaN if one is unscored)."""
        m = self.cand_matrix
        return np.where(m >= 0, lp[np.maximum(m, 0)], 0.0).sum(axis=1)

    def scores(
        self, edge_logp: np.ndarray, *, constrained: bool = False
    ) -> np.ndarray | PartialScores:
        """`score`, or for a pruned field (some edges unscored, NaN) its `PartialScores`:
        the scored candidates' log scores and the unexpanded prefixes that bound the rest."""
        lp = self.edge_scores(edge_logp, constrained=constrained)
        z = self.cand_logp(lp)
        if not np.isnan(z).any():
            return z
        front = self.frontier(lp)
        return PartialScores(
            z=z,
            frontier_logp=self.prefix_logp(lp)[front],
            frontier_members=tuple(self.node_members[n] for n in front),
            exact_prefixes=constrained,
        )

    def edge_scores(self, edge_logp: np.ndarray, *, constrained: bool = False) -> np.ndarray:
        """Each edge's log p in float64; with `constrained`, renormalised over its node's
        edges (a node not evaluated keeps NaN)."""
        lp = np.asarray(edge_logp, dtype=np.float64)
        if not constrained:
            return lp
        return log_normalised(lp, *self._edges_by_node)

    def prefix_logp(self, lp: np.ndarray) -> np.ndarray:
        """Each node's log-probability of being reached (root 0.0), from edge scores;
        NaN below a node that was not evaluated."""
        pre = np.zeros(self.n_nodes)
        edge, parent = self.node_edge, self.parents
        for nodes in self._nodes_by_depth:
            pre[nodes] = pre[parent[nodes]] + lp[edge[nodes]]
        return pre

    def frontier(self, lp: np.ndarray) -> np.ndarray:
        """The unexpanded prefixes: internal nodes not evaluated (their edges unscored)
        whose parent was, so their own probability is known."""
        evaluated = np.zeros(self.n_nodes, dtype=bool)
        evaluated[self.edge_node[~np.isnan(lp)]] = True
        parent = self.parents
        inner = np.arange(1, self.n_nodes)
        return inner[~evaluated[inner] & evaluated[parent[inner]]]

    @cached_property
    def parents(self) -> np.ndarray:
        """`node_parent` as an array (made once: a large trie's tuple is slow to convert
        on every level of a search)."""
        return np.asarray(self.node_parent, dtype=np.int64)

    @cached_property
    def node_edge(self) -> np.ndarray:
        """Per node, the edge that leads to it (-1 for the root)."""
        index = {
            (int(n), int(t)): e for e, (n, t) in enumerate(zip(self.edge_node, self.edge_token))
        }
        out = np.full(self.n_nodes, -1, dtype=np.int64)
        for n in range(1, self.n_nodes):
            out[n] = index[(self.node_parent[n], self.node_tokens[n])]
        return out

    @cached_property
    def cand_matrix(self) -> np.ndarray:
        """(candidates, longest path) edge indices, padded with -1."""
        width = max(len(e) for e in self.cand_edges)
        m = np.full((len(self.cand_edges), width), -1, dtype=np.int64)
        for c, edges in enumerate(self.cand_edges):
            m[c, : len(edges)] = edges
        return m

    def chain(self, node: int) -> list[int]:
        """`node` and the internal nodes below it down to the first that branches (or has
        no internal child): the tokens of a label read one after another."""
        out = [node]
        kids = self.node_children
        while len(kids[out[-1]]) == 1:
            out.append(kids[out[-1]][0])
        return out

    @cached_property
    def node_children(self) -> tuple[tuple[int, ...], ...]:
        """Per node, its internal child nodes."""
        kids: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for n in range(1, self.n_nodes):
            kids[self.node_parent[n]].append(n)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def node_members(self) -> tuple[np.ndarray, ...]:
        """Per node, the candidates whose path passes through it."""
        members: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for c, edges in enumerate(self.cand_edges):
            for e in edges:
                members[int(self.edge_node[e])].append(c)
        return tuple(np.array(m, dtype=np.int64) for m in members)

    @cached_property
    def subtree_nodes(self) -> tuple[np.ndarray, ...]:
        """Per node, itself and every internal node below it (ids grow with depth)."""
        below: list[list[int]] = [[n] for n in range(self.n_nodes)]
        for n in range(self.n_nodes - 1, 0, -1):
            below[self.node_parent[n]].extend(below[n])
        return tuple(np.sort(np.array(b, dtype=np.int64)) for b in below)

    @cached_property
    def _nodes_by_depth(self) -> list[np.ndarray]:
        depth = np.asarray(self.node_depth)
        return [np.nonzero(depth == d)[0] for d in range(1, int(depth.max()) + 1)]

    @cached_property
    def _edges_by_node(self) -> tuple[np.ndarray, np.ndarray]:
        return groups_of(self.edge_node)


def groups_of(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of `keys` in a stable order by key, and where each key's run starts
    in that order: the groups `log_normalised` reduces over."""
    order = np.argsort(keys, kind="stable")
    starts = np.searchsorted(keys[order], np.unique(keys))
    return order, starts


def log_normalised(x: np.ndarray, order: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """x less the log-sum-exp of its group, over the last axis (groups: `groups_of`): a
    node's edges renormalised over that node's own edges, as constrained scoring reads
    them (a group holding NaN stays NaN)."""
    v = x[..., order]
    cnt = np.diff(np.append(starts, v.shape[-1]))
    m = np.maximum.reduceat(v, starts, axis=-1)
    lse = m + np.log(np.add.reduceat(np.exp(v - np.repeat(m, cnt, axis=-1)), starts, axis=-1))
    out = np.empty_like(x)
    out[..., order] = v - np.repeat(lse, cnt, axis=-1)
    return out


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
