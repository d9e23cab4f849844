"""From a pass's logits to each trie edge's log-probability.

A packed chunk's slots give full-vocabulary logits (`chunk_edges`, log p over the whole
vocabulary), or for a field read narrow (`Chunk.narrow`: scored constrained) logits at
its allowed tokens only, normalised over each node's own edges. The reference passes
give one node's logits at a time (`edge_logp`).
"""

from __future__ import annotations

import numpy as np

from .pack import Chunk, Edges, Plan
from .trie import FieldTrie, groups_of, log_normalised

__all__ = ["chunk_edges", "edge_logp", "logsumexp", "packed_result"]


def chunk_edges(
    plan: Plan, ch: Chunk, logits: np.ndarray | None, narrow: np.ndarray | None = None
) -> Edges:
    """(field, edge indices, (B, edges) log p) for every trie edge scored by `ch`.

    Args:
        logits: Full-vocabulary logits (B, rows, V) at the chunk's slots, in `ch.slots`
            order; for a chunk with narrow fields, at the rows the other fields read
            (`Chunk.slot_split`), None if there are none.
        narrow: For a chunk with narrow fields, their rows' logits at
            `ch.narrow_tokens`, (B, rows, U). Their edges' log p are then normalised
            over each node's own edges: the constrained scores they are read as.
    """
    full_rows, narrow_rows = ch.slot_split() if ch.narrow else (None, None)
    lse = logsumexp(logits) if logits is not None else None  # (B, rows)
    found = []
    for fi, nodes, rows in zip(ch.fields, ch.part_nodes, ch.node_rows):
        trie = plan.tries[fi]
        row_of = np.full(trie.n_nodes, -1)
        row_of[nodes] = rows
        sel = np.nonzero(row_of[trie.edge_node] >= 0)[0]
        r = row_of[trie.edge_node[sel]]
        tok = trie.edge_token[sel]
        if fi in ch.narrow:
            assert narrow is not None and narrow_rows is not None
            i = np.searchsorted(narrow_rows, r)
            lg = narrow[:, i, np.searchsorted(ch.narrow_tokens, tok)].astype(np.float64)
            found.append((fi, sel, log_normalised(lg, *groups_of(r))))
            continue
        assert logits is not None and lse is not None
        i = r if full_rows is None else np.searchsorted(full_rows, r)
        found.append((fi, sel, logits[:, i, tok] - lse[:, i]))
    return found


def packed_result(plan: Plan, outs: list[Edges], b: int) -> list[list[np.ndarray]]:
    """Per row, per field edge log-probabilities from the chunks' scored edges."""
    acc = [np.full((b, len(t.edge_node)), np.nan) for t in plan.tries]
    for found in outs:
        for fi, sel, logp in found:
            acc[fi][:, sel] = logp
    if any(np.isnan(a).any() for a in acc):  # pragma: no cover - a packing bug
        raise RuntimeError("internal error: a trie edge was not evaluated")
    return [[acc[fi][r] for fi in range(len(plan.tries))] for r in range(b)]


def logsumexp(logits: np.ndarray, block_bytes: int = 4 << 20) -> np.ndarray:
    """Log-sum-exp over the last axis, returned in float64 (numpy's exp is vectorised,
    MLX's CPU exp is not). Works through about `block_bytes` of rows at a time, so the
    temporaries stay small next to the (B, slots, V) logits (33 MB per triage chunk)."""
    lg = logits.astype(np.float32, copy=False)
    flat = lg.reshape(-1, lg.shape[-1])
    out = np.empty(flat.shape[0], dtype=np.float64)
    step = max(1, block_bytes // max(1, flat.shape[1] * 4))
    for i in range(0, flat.shape[0], step):
        rows = flat[i : i + step]
        m = rows.max(axis=-1, keepdims=True)
        tmp = rows - m
        np.exp(tmp, out=tmp)
        out[i : i + step] = np.log(tmp.sum(axis=-1)) + m[:, 0]
    return out.reshape(lg.shape[:-1])


def edge_logp(logits: np.ndarray, trie: FieldTrie) -> np.ndarray:
    """(rows, nodes, V) logits -> (rows, edges) full-vocabulary log p, in numpy.

    numpy's vectorised exp is several times faster than MLX's CPU exp for this reduction.
    """
    lse = logsumexp(logits)
    return logits[:, trie.edge_node, trie.edge_token].astype(np.float64) - lse[:, trie.edge_node]
