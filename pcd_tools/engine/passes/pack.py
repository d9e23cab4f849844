"""The plan of a schema and the pack of its fields pass.

A `Plan` holds what a (schema, tokenizer) pair needs, computed once: the prompt's token
pieces, one candidate trie per question (a field, or a multi-label field's label), and
the fields pass cut into chunks. A later wave's pass has its own plan (`question_plan`). A `Chunk` is
one packed sequence: every field stem and trie node it evaluates, inserted into one token
prefix tree, with the block mask (each token sees its tree ancestors and itself) and the
per-token positions (`P + depth`) that make the pack exact (DESIGN §2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...errors import LabelSetTooLargeError
from ...prompt import Question, build_prompt, questions
from ...schema import Schema
from .trie import FieldTrie, build_trie

__all__ = [
    "SPLIT_TOKENS",
    "Chunk",
    "Edges",
    "Plan",
    "build_plan",
    "make_chunks",
    "narrowed",
    "pack_parts",
    "plan_key",
    "question_plan",
    "split_trie",
]

# Below about this many pack tokens a pass is bound by reading the weights, not by
# compute: one chunk on one stream beats two (measured: 50 tokens, 162 vs 240 ms).
SPLIT_TOKENS = 160


@dataclass
class Chunk:
    """A group of field parts packed into one sequence.

    A part is a field's trie, or (for a big field) a subset of its root's subtrees.

    Args:
        fields: Per part, the field index.
        part_nodes: Per part, the trie nodes it evaluates.
        tokens: The packed tokens, (T,).
        rel_pos: Each token's position after the prompt, (T,).
        allow: Which packed token each token attends to, (T, T).
        node_index: Per part, the pack index of each of its nodes.
        slots: The pack indices whose logits are read, sorted and unique.
        node_rows: Per part, the row in `slots` of each of its nodes.
        narrow: The fields of this chunk whose logits are read at their nodes' allowed
            tokens only (`narrowed`): a field scored constrained normalises each node
            over its own tokens, so the rest of the vocabulary changes none of its
            scores, and the output head runs over `narrow_tokens` alone for them.
        narrow_tokens: The tokens of the narrow fields' edges here, sorted and unique.
    """

    fields: list[int]
    part_nodes: list[np.ndarray]
    tokens: np.ndarray
    rel_pos: np.ndarray
    allow: np.ndarray
    node_index: list[np.ndarray]
    slots: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    node_rows: list[np.ndarray] = field(default_factory=list)
    narrow: frozenset[int] = frozenset()
    narrow_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        self.slots = np.unique(np.concatenate(self.node_index)).astype(np.int32)
        self.node_rows = [np.searchsorted(self.slots, idx) for idx in self.node_index]

    def slot_split(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows of `slots` that fields outside `narrow` read over the whole
        vocabulary, and those the `narrow` fields read at `narrow_tokens`, each sorted
        (a row two fields share may be in both)."""
        rows: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        for fi, r in zip(self.fields, self.node_rows):
            rows[fi in self.narrow].append(r)
        return tuple(  # type: ignore[return-value]
            np.unique(np.concatenate(x)) if x else np.zeros(0, dtype=np.int64) for x in rows
        )


def narrowed(chunk: Chunk, tries: list[FieldTrie], narrow: frozenset[int]) -> Chunk:
    """`chunk` with the fields of `narrow` it holds read at their allowed tokens only
    (`Chunk.narrow`); the chunk itself when it holds none."""
    mine = frozenset(fi for fi in chunk.fields if fi in narrow)
    if not mine:
        return chunk
    toks = [
        tries[fi].edge_token[np.isin(tries[fi].edge_node, nodes)]
        for fi, nodes in zip(chunk.fields, chunk.part_nodes)
        if fi in mine
    ]
    return replace(
        chunk, narrow=mine, narrow_tokens=np.unique(np.concatenate(toks)).astype(np.int64)
    )


# What a chunk scored: per field part, (field, edge indices, (B, edges) log p).
Edges = list[tuple[int, np.ndarray, np.ndarray]]


@dataclass
class Plan:
    """Everything a (schema, tokenizer) pair needs, computed once and cached.

    Args:
        schema: The compiled schema.
        head_ids: Prompt tokens before the context (the cached schema prefix).
        tail_ids: Prompt tokens after the context, up to the answer's opening `{`.
        tries: One candidate trie per question, in order.
        chunks: The fields pass, cut into packed sequences.
        questions: What the pass asks: one question per field that depends on nothing
            (one per label for a multi-label field), in schema order.
        variants: Other chunkings of the same pass, by key (a pruned first pass).
    """

    schema: Schema
    head_ids: list[int]
    tail_ids: list[int]
    tries: list[FieldTrie]
    chunks: list[Chunk] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    variants: dict[Any, list[Chunk]] = field(default_factory=dict, repr=False)

    @property
    def extra_tokens(self) -> int:
        """Longest field stem plus trie depth: positions needed beyond the prompt."""
        return max((len(t.stem) + max(t.node_depth) for t in self.tries), default=0)


def plan_key(schema: Schema, choice_order: dict[str, Sequence[int]] | None) -> Any:
    """The key a plan is cached under: the schema and the prompt's choice order."""
    order = None
    if choice_order:
        order = tuple(sorted((k, tuple(v)) for k, v in choice_order.items()))
    return (schema.fingerprint(), order)


def build_plan(
    tokenizer: Any,
    schema: Schema,
    choice_order: dict[str, Sequence[int]] | None,
    *,
    bos_token_id: int | None,
    pack_budget: int,
    streams: int,
) -> Plan:
    """Tokenizes the prompt pieces and every candidate, and packs the fields pass.

    Args:
        tokenizer: A `TextTokenizer`.
        schema: The compiled schema.
        choice_order: Per-field listing order of allowed values in the prompt.
        bos_token_id: Prepended to the prompt unless it already starts with it; None
            when the model takes no BOS.
        pack_budget: Tokens per packed chunk.
        streams: CPU streams the chunks are spread over (1 off CPU).
    """

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text))

    parts = build_prompt(tokenizer, schema, choice_order=choice_order)
    head = encode(parts.head)
    if bos_token_id is not None and (not head or head[0] != bos_token_id):
        head = [bos_token_id, *head]
    tail = encode(parts.tail)
    base = Plan(schema, head, tail, [])
    return question_plan(
        tokenizer, base, questions(schema), pack_budget=pack_budget, streams=streams
    )


def question_plan(
    tokenizer: Any, base: Plan, qs: Sequence[Question], *, pack_budget: int, streams: int
) -> Plan:
    """The plan of a pass over `qs` after `base`'s prompt: one trie per question (its
    candidates tokenized as whole texts), packed into chunks.

    A first pass asks the schema's independent fields; a later wave asks dependent
    fields with their parents' answers written into the texts.
    """
    tries = []
    for q in qs:
        seqs = [list(tokenizer.encode(t)) for t in q.texts]
        check_trie_memory(base.schema.name, q.field, seqs)
        tries.append(build_trie(seqs, what=f"{base.schema.name}.{q.key}"))
    plan = Plan(base.schema, base.head_ids, base.tail_ids, tries, questions=list(qs))
    plan.chunks = make_chunks(tries, pack_budget, streams)
    return plan


# What one trie position costs once its field is planned: the trie's arrays and indexes
# (members, subtrees, edges) and its packed chunks' masks. Measured with tracemalloc on
# 5,010 region names (36,203 positions): 960 bytes at the peak.
TRIE_BYTES_PER_POSITION = 1024
# A field's trie may take at most this share of the memory available when it is planned.
TRIE_MEMORY_SHARE = 0.5


def check_trie_memory(
    schema: str, name: str, seqs: Sequence[Sequence[int]], available: int | None = None
) -> None:
    """Refuses a field whose candidates' trie would not fit in memory, with the numbers.

    The bound counts every candidate token as a position (shared prefixes make the real
    trie smaller), so a field that passes it fits.

    Raises:
        LabelSetTooLargeError: when the bound exceeds `TRIE_MEMORY_SHARE` of `available`
            (the memory available now, `host.cgroups.available_memory`).
    """
    positions = sum(len(s) for s in seqs)
    need = positions * TRIE_BYTES_PER_POSITION
    if available is None:
        from ..host.cgroups import available_memory

        available = available_memory()
    if need <= TRIE_MEMORY_SHARE * available:
        return
    raise LabelSetTooLargeError(
        f"{schema}.{name}: {len(seqs):,} labels ({positions:,} candidate tokens) need up to "
        f"{need / 2**30:.1f} GiB for their token trie, over {TRIE_MEMORY_SHARE:.0%} of the "
        f"{available / 2**30:.1f} GiB available now; accepted: a label set whose trie fits "
        f"(about {TRIE_BYTES_PER_POSITION} bytes per candidate token). Shorten the labels, "
        "or split the field in two (a coarse field, then a fine one that `depends_on` it).",
        model=schema,
        field=name,
    )


def make_chunks(
    tries: list[FieldTrie],
    pack_budget: int,
    streams: int,
    nodes: dict[int, Sequence[int]] | None = None,
    stem_cached: bool = False,
    narrow: frozenset[int] = frozenset(),
) -> list[Chunk]:
    """Splits the fields pass into about `pack_budget`-token chunks.

    With several CPU streams and enough work there are a whole number of chunks per
    stream, so the streams finish together; big fields are split by root subtrees.

    Args:
        tries: One trie per field.
        pack_budget: Tokens per chunk.
        streams: CPU streams the chunks are spread over (1 off CPU).
        nodes: Per field, only these trie nodes are evaluated (a pruned field's level;
            their ancestors' tokens are packed too); a field not named here is evaluated
            whole, and a field named with no nodes is left out.
        stem_cached: The one field's stem is already in the K/V the chunks run after
            (`pack_parts`); then `nodes` names that field alone, without its root.
        narrow: Fields read at their allowed tokens only (`narrowed`).
    """
    nodes = nodes or {}

    def head(t: FieldTrie) -> int:  # the stem tokens a part of a named field packs
        return 0 if stem_cached else len(t.stem)

    def size(fi: int) -> int:
        t = tries[fi]
        return len(t.pack_tokens) if fi not in nodes else head(t) + len(nodes[fi])

    total = sum(size(fi) for fi in range(len(tries)) if fi not in nodes or len(nodes[fi]))
    n = max(1, math.ceil(total / pack_budget))
    if streams > 1 and total >= SPLIT_TOKENS:
        n = math.ceil(n / streams) * streams
    target = math.ceil(total / n)
    parts: list[tuple[int, list[int], int]] = []  # (field, nodes, size)
    for fi, t in enumerate(tries):
        if fi in nodes:
            chosen = sorted(int(x) for x in nodes[fi])
            step = max(1, target - head(t))
            for i in range(0, len(chosen), step):
                parts.append((fi, chosen[i : i + step], head(t) + len(chosen[i : i + step])))
            continue
        for group in split_trie(t, target):
            parts.append((fi, group, len(t.stem) + len(group) - 1))
    if not parts:
        return []
    n = min(n, len(parts))
    bins: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(parts)), key=lambda i: -parts[i][2]):
        j = int(np.argmin(load))
        bins[j].append(i)
        load[j] += parts[i][2]
    return [
        narrowed(
            pack_parts(tries, [parts[i][:2] for i in sorted(b)], stem_cached=stem_cached),
            tries,
            narrow,
        )
        for b in bins
        if b
    ]


def split_trie(trie: FieldTrie, target: int) -> list[list[int]]:
    """The trie's nodes in parts of about `target` pack tokens, by root subtrees.

    Every part holds the root (node 0) and whole subtrees of the root's children, so it
    is closed under ancestors.
    """
    size = len(trie.stem) + trie.n_nodes - 1
    if size <= target or trie.n_nodes <= 2:
        return [list(range(trie.n_nodes))]
    top = [0] * trie.n_nodes  # each node's ancestor among the root's children
    for n in range(1, trie.n_nodes):
        p = trie.node_parent[n]
        top[n] = n if p == 0 else top[p]
    subtrees: dict[int, list[int]] = {}
    for n in range(1, trie.n_nodes):
        subtrees.setdefault(top[n], []).append(n)
    if max(len(v) for v in subtrees.values()) + len(trie.stem) > 2 * target:
        return _preorder_runs(trie, target)  # a whole root subtree would overfill a chunk
    k = min(len(subtrees), math.ceil(size / target))
    if k <= 1:
        return [list(range(trie.n_nodes))]
    groups: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for nodes in sorted(subtrees.values(), key=len, reverse=True):
        j = int(np.argmin(load))
        groups[j].extend(nodes)
        load[j] += len(nodes)
    return [[0, *sorted(g)] for g in groups if g]


def _preorder_runs(trie: FieldTrie, target: int) -> list[list[int]]:
    """A trie with a root subtree too big for one chunk (a large label set's first
    tokens are often few: 5,010 region names have 3 root children, under a 36,203-node trie):
    its nodes in depth-first order, cut into runs of about `target` pack tokens. A run
    packs its nodes and, once, the ancestors its first node hangs from (a later node's
    ancestors are in the run or among those), so every run costs its length plus a path.
    """
    children = trie.node_children
    order: list[int] = []
    stack = list(children[0][::-1])
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(children[n][::-1])
    depth = trie.node_depth
    runs: list[list[int]] = []
    run: list[int] = []
    for n in order:
        if run and len(trie.stem) + len(run) + depth[run[0]] >= target:
            runs.append([0, *sorted(run)])
            run = []
        run.append(n)
    if run:
        runs.append([0, *sorted(run)])
    return runs


def pack_parts(
    tries: list[FieldTrie], parts: list[tuple[int, list[int]]], stem_cached: bool = False
) -> Chunk:
    """Packs field parts into one sequence: a prefix tree over every evaluated path.

    Every path the parts need (a stem, or a stem plus trie nodes) is inserted into one
    token prefix tree, so tokens shared by several fields (`\\n `, ` "`...) are evaluated
    once. Each tree node is one slot; it sits at position `P + depth` and attends to the
    prompt, its tree ancestors and itself, exactly as in its own full prompt.

    Args:
        tries: One trie per field.
        parts: (field index, trie nodes) per part; the tokens of their ancestors are
            packed too, and only the listed nodes' logits are read.
        stem_cached: The parts' one field's stem, root included, is already in the
            K/V the chunk runs after (P counts it): its paths start below the root,
            whose logits cannot be read here.

    Raises:
        ValueError: `stem_cached` with parts of several fields, or with the root.
    """
    if stem_cached and (len({fi for fi, _ in parts}) > 1 or any(0 in n for _, n in parts)):
        raise ValueError("a cached stem serves the nodes below one field's root only")
    slot_of: dict[tuple[int, ...], int] = {}
    tokens: list[int] = []
    depth: list[int] = []
    parent: list[int] = []

    def slot(path: tuple[int, ...]) -> int:
        hit = slot_of.get(path)
        if hit is not None:
            return hit
        up = slot(path[:-1]) if len(path) > 1 else -1
        slot_of[path] = len(tokens)
        tokens.append(path[-1])
        depth.append(len(path) - 1)
        parent.append(up)
        return slot_of[path]

    node_index = []
    for fi, nodes in parts:
        trie = tries[fi]
        paths: dict[int, tuple[int, ...]] = {0: () if stem_cached else trie.stem}

        def path(n: int, trie: FieldTrie = trie, paths: dict = paths) -> tuple[int, ...]:
            hit = paths.get(n)
            if hit is None:  # an ancestor not evaluated here still has its token packed
                hit = paths[n] = (*path(trie.node_parent[n]), trie.node_tokens[n])
            return hit

        node_index.append(np.array([slot(path(n)) for n in nodes]))
    t = len(tokens)
    allow = np.zeros((t, t), dtype=bool)
    for i in range(t):  # a slot's parent was made before it: its row is already done
        if parent[i] >= 0:
            allow[i] = allow[parent[i]]
        allow[i, i] = True
    return Chunk(
        [fi for fi, _ in parts],
        [np.array(nodes) for _, nodes in parts],
        np.array(tokens, dtype=np.int32),
        np.array(depth, dtype=np.int32),
        allow,
        node_index,
    )
