"""Certified pruned scoring: a large field's trie expanded level by level, branch and bound.

Scoring every path of a 255-way trie is exact, but it reads more positions than the
prompt has. Pruned scoring reads only what can change the answer:

1. The first fields pass evaluates a pruned field's root (its stem) and the root's
   children beside the other fields, which gives each two-token prefix's probability.
2. Each later level is one packed pass for every pruned field and every context at once,
   on the same KV cache. It evaluates the most probable unexpanded prefixes: a prefix
   with few nodes below it is expanded whole, a bigger one one token deeper. When the
   subtrees that may still win fit in one level, or hold most of what is left to read
   (an unsure model), the level reads them all and the search ends.
3. A prefix whose probability is not above the best complete candidate's is never
   expanded: the candidates under it hold at most its probability, so none can win.
4. The search stops when no prefix can win (the answer is certified; with `top_k`, no
   prefix can beat the k-th best scored candidate, so the k best are certified in
   order), or after `max_levels` levels. A context still uncertified then falls back to
   the exhaustive pass: one more level reads every position of its trie not yet read,
   so its answer is exact, and the search's report says it fell back
   (`SearchReport.fallback`). An answer is never uncertified because the budget ran out.

What was scored, and the prefixes that bound the rest, become `PartialScores`
(`FieldTrie.scores`); `pcd_tools.answers.bounds` turns them into the answer, its probability
bounds and the `certified` flag.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ...answers.bounds import PartialScores, SearchReport
from ...answers.ranked import RankedGoal
from ...answers.taxonomy import TreeIndex, top_down, tree_index
from ...prompt import Question
from ...schema import Schema
from .pack import Chunk, Edges, Plan, make_chunks
from .trie import FieldTrie

__all__ = [
    "AUTO_NODES",
    "PruneMode",
    "Pruning",
    "SearchReport",
    "auto_constrained",
    "expansions",
    "first_chunks",
    "pruned_pass",
    "search",
]

PruneMode = Literal["auto", "on", "off"]

# Under `pruning="auto"` (and `scoring="constrained"` or `"auto"`) a field is pruned when
# its trie has more internal nodes than this: each is one position whose full-vocabulary
# logits the exhaustive pass reads.
AUTO_NODES = 96


@dataclass(frozen=True)
class Pruning:
    """Which questions of a request are scored by pruned search, and how.

    Args:
        select: Given a question and its trie, whether to prune it.
        constrained: Whether the request scores with `scoring="constrained"` (the bound
            then holds over each node's allowed tokens).
        auto_scoring: Whether the request scores with `scoring="auto"`: a pruned field
            with more than `AUTO_NODES` trie positions is then scored (and bounded) as
            under `"constrained"`, every other one as under `"full"` (`auto_constrained`).
        level_nodes: Trie nodes one level may evaluate per field, over all contexts (at
            least `subtree_nodes` per context). Small: a node read after a long prompt
            costs most of a prompt token (the tariff field's 5,100 tokens: 0.64 GFLOP),
            and best-first levels of 32 certify its answer after reading about 40 of
            1,423 nodes, where levels of 192 read 198 (1.1 s against 1.65 s a request).
        subtree_nodes: A kept prefix with at most this many internal nodes below it
            (itself included) is expanded whole in one level.
        max_levels: Levels after the first pass; a context still uncertified after them
            reads the rest of its trie in one more level (the exhaustive fallback).
        finish_share: Once a candidate is scored, when the subtrees that may still win
            hold at least this share of the nodes not yet read (or fit in one level), the
            next level reads them all and the search ends: pruning further would save
            less than its extra passes cost.
        first_nodes: The first pass reads a pruned root's children with the root when
            they are fewer than this.
        top_k: The search runs until this many best candidates are certified, in order
            (1: the answer alone).
        ranked: Per ranked multi-label field (by name), what its search must settle
            (`pcd_tools.answers.ranked.RankedGoal`): it runs until the exhaustive pass
            would choose the same labels in the same order.
        searches: What each pruned question's search did, filled by `pruned_pass`: per
            returned edge array (by `id`), its `SearchReport`. The request's own.
    """

    select: Callable[[Question, FieldTrie], bool]
    constrained: bool = False
    auto_scoring: bool = False
    level_nodes: int = 32
    subtree_nodes: int = 24
    max_levels: int = 12
    finish_share: float = 0.5
    first_nodes: int = 192
    top_k: int = 1
    ranked: Mapping[str, RankedGoal] = field(default_factory=dict)
    searches: dict[int, SearchReport] = field(default_factory=dict, repr=False, compare=False)

    def report(self, edge_logp: np.ndarray) -> SearchReport | None:
        """The search report of an edge array `pruned_pass` returned, if it was pruned."""
        return self.searches.get(id(edge_logp))

    def constrained_for(self, trie: FieldTrie) -> bool:
        """Whether a pruned question with this trie is scored constrained: always under
        `scoring="constrained"`, under `"auto"` when the trie is large (every pruned
        question is one `auto_constrained` may choose)."""
        return self.constrained or (self.auto_scoring and trie.n_nodes > AUTO_NODES)


def _single_choice(schema: Schema) -> set[str]:
    """The fields whose whole distribution one question scores: enum and bool fields and
    ranked multi-label fields, not a `choices_by` child (its questions are per parent
    value) nor a union's discriminator (its branches compare whole distributions)."""
    kinds = {f.branch[0] for f in schema.fields if f.branch is not None}
    return {
        f.name
        for f in schema.fields
        if (f.kind in ("enum", "boolean") or f.reading == "ranked")
        and f.choices_by is None
        and f.name not in kinds
    }


def auto_constrained(schema: Schema) -> Callable[[Question, FieldTrie], bool]:
    """Under `scoring="auto"`, whether a question is scored constrained: one that asks a
    whole single-choice field whose trie has more than `AUTO_NODES` internal nodes (the
    fields `pruning="auto"` prunes). Every other question is scored full.

    Which fields are constrained depends on the schema and the tokenizer only, never on
    `pruning`: pruned and exhaustive scoring give the same distribution.
    """
    single = _single_choice(schema)

    def constrained(q: Question, trie: FieldTrie) -> bool:
        return (
            q.field in single
            and q.label is None
            and q.choices is None
            and trie.n_nodes > AUTO_NODES
        )

    return constrained


def pruning_for(
    schema: Schema,
    mode: str,
    *,
    constrained: bool = False,
    auto_scoring: bool = False,
    whole: frozenset[str] = frozenset(),
) -> Pruning | None:
    """The pruning of a request, or None when it prunes nothing.

    A question may be pruned when it asks a whole single-choice field: not a multi-label
    label, not a `choices_by` field (its questions are per parent value), not a union's
    discriminator (its branches compare whole distributions), and not a field in
    `whole` (those whose calibration needs every score). Then the field's own
    `pruning` decides when it is not `"auto"`, else the request's `mode`; `"auto"`
    prunes a trie with more than `AUTO_NODES` internal nodes under
    `scoring="constrained"`, and under `scoring="auto"`, which scores exactly those
    fields constrained. Under full scoring a model leaves probability on tokens outside
    the field at every step, so a prefix's bound is loose and the search reads most of
    the trie (the embedded model's tariff field: 1,404 of its 1,423 nodes); `"on"`
    prunes it all the same.

    Args:
        schema: The compiled schema.
        mode: The request's `"auto"`, `"on"` or `"off"`.
        constrained: Whether the request scores with `scoring="constrained"`.
        auto_scoring: Whether it scores with `scoring="auto"`.
        whole: Fields to score whole whatever their setting.
    """
    if mode == "off":
        return None
    single = _single_choice(schema)
    can = {
        f.name: f.pruning
        for f in schema.fields
        if f.name in single and f.name not in whole and f.pruning != "off"
    }
    if not can:
        return None

    def select(q: Question, trie: FieldTrie) -> bool:
        own = can.get(q.field)
        if own is None or q.label is not None or q.choices is not None:
            return False
        if own == "on" or mode == "on":
            return True
        return (constrained or auto_scoring) and trie.n_nodes > AUTO_NODES

    return Pruning(select, constrained=constrained, auto_scoring=auto_scoring)


def expansions(
    trie: FieldTrie,
    edge_logp: np.ndarray,
    pruning: Pruning,
    quota: int,
    goal: RankedGoal | None = None,
) -> set[int]:
    """The trie nodes one context needs evaluated next: the unexpanded prefixes that may
    still hold a better answer than the best scored one, most probable first, up to
    about `quota` nodes; empty when the answer is certified. For a ranked multi-label
    field (`goal`), the prefixes that may still change its chosen labels."""
    constrained = pruning.constrained_for(trie)
    lp = trie.edge_scores(edge_logp, constrained=constrained)
    front = trie.frontier(lp)
    if not len(front):
        return set()
    z = trie.cand_logp(lp)
    done = z[~np.isnan(z)]
    if goal is not None:
        best = goal.cut(done, constrained)
    else:  # the k-th best scored candidate: a prefix below it cannot change the top k
        k = max(1, pruning.top_k)
        best = (
            float(np.partition(done, len(done) - k)[len(done) - k]) if len(done) >= k else -np.inf
        )
    pre = trie.prefix_logp(lp)[front]
    open_ = pre >= best  # a prefix at exactly the best could still tie it
    if goal is not None and not open_.any():
        partial = trie.scores(edge_logp, constrained=constrained)
        if not isinstance(partial, PartialScores) or goal.certified(partial):
            return set()
        open_[:] = True  # the bounds cannot settle a share near the threshold: read on
    below_open = [trie.subtree_nodes[int(n)] for n in front[open_]]
    total = sum(len(b) for b in below_open)
    unread = trie.n_nodes - len(np.unique(trie.edge_node[~np.isnan(lp)]))
    if quota > 1 and len(done) and (total <= quota or total >= pruning.finish_share * unread):
        # Finishing now costs no more than the next level would, or the model is unsure
        # and pruning cannot save much: every subtree that may still win, whole, now.
        return {int(x) for b in below_open for x in b}
    chosen: set[int] = set()
    for n in front[open_][np.argsort(-pre[open_], kind="stable")]:
        below = trie.subtree_nodes[int(n)]
        chosen.update(int(x) for x in (below if len(below) <= pruning.subtree_nodes else [n]))
        if len(chosen) >= quota:
            break
    return chosen


def tree_expansions(
    trie: FieldTrie, edge_logp: np.ndarray, pruning: Pruning, quota: int, index: TreeIndex
) -> set[int]:
    """`expansions` for a taxonomy decided level by level: empty once every level's
    choice is certified (`answers.taxonomy.top_down`: its node's floor beats each
    sibling's ceiling; under constrained scoring an unread prefix inside one node counts
    at its exact probability) and the chosen leaf is scored; else the unread prefixes
    inside the first uncertified level's parent, most probable first, each with the chain
    of single children below it (a title's tokens in one level), up to about `quota`
    nodes."""
    lp = trie.edge_scores(edge_logp, constrained=pruning.constrained_for(trie))
    front = trie.frontier(lp)
    if not len(front):
        return set()
    z = trie.cand_logp(lp)
    pre = trie.prefix_logp(lp)[front]
    # under constrained scoring a prefix's probability is its candidates' exact total
    exact = pruning.constrained_for(trie)
    groups = [
        (float(u), float(u) if exact else -np.inf, trie.node_members[int(n)])
        for u, n in zip(pre, front)
    ]
    _, certified, unsure = top_down(index, np.where(np.isnan(z), -np.inf, z), groups)
    if certified or unsure is None:
        return set()
    inside = np.zeros(len(trie.cand_edges), dtype=bool)
    inside[index.members[unsure[:-1]]] = True
    chosen: set[int] = set()
    for i in np.argsort(-pre, kind="stable"):
        if not inside[groups[i][2]].any():
            continue
        below = trie.subtree_nodes[int(front[i])]
        if len(below) <= pruning.subtree_nodes:
            chosen.update(int(x) for x in below)
        else:  # the prefix, and the chain of single children under it (a label's words)
            chosen.update(trie.chain(int(front[i])))
        if len(chosen) >= quota:
            break
    return chosen


def search(
    tries: Sequence[FieldTrie],
    pruned: Sequence[int],
    acc: list[np.ndarray],
    run_level: Callable[[dict[int, list[int]]], None],
    pruning: Pruning,
    fell_back: set[tuple[int, int]] | None = None,
    trees: dict[int, TreeIndex] | None = None,
    goals: Mapping[int, RankedGoal] | None = None,
) -> int:
    """Expands the pruned fields level by level until each context's answers are
    certified or the levels run out; returns the levels run.

    Args:
        tries: Every question's trie.
        pruned: The indices of the pruned ones.
        acc: Per question, (contexts, edges) log p so far (NaN where unscored); the
            first pass filled the pruned fields' root edges. `run_level` fills more.
        run_level: Evaluates the given nodes of each field for every context.
        pruning: The request's pruning.
        fell_back: Collects (question, context) of the searches that fell back to the
            exhaustive pass.
        trees: Per pruned question that is a taxonomy decided level by level, its
            index: its search stops when each level is certified (`tree_expansions`).
        goals: Per pruned question of a ranked multi-label field, its `RankedGoal`.
    """
    trees = trees or {}
    goals = goals or {}
    levels = 0
    while True:
        fallback = levels >= pruning.max_levels
        want: dict[int, list[int]] = {}
        for fi in pruned:
            rows = acc[fi].shape[0]
            quota = max(pruning.subtree_nodes, pruning.level_nodes // max(1, rows))
            nodes: set[int] = set()
            for r in range(rows):
                q = 1 if fallback else quota
                more = (
                    tree_expansions(tries[fi], acc[fi][r], pruning, q, trees[fi])
                    if fi in trees
                    else expansions(tries[fi], acc[fi][r], pruning, q, goals.get(fi))
                )
                if more and fallback:  # out of levels, uncertified: read the rest
                    more = set(_unread(tries[fi], acc[fi][r]).tolist())
                    if fell_back is not None:
                        fell_back.add((fi, r))
                nodes |= more
            if nodes:
                want[fi] = sorted(nodes)
        if not want:
            return levels
        run_level(want)
        levels += 1


def _unread(trie: FieldTrie, edge_logp: np.ndarray) -> np.ndarray:
    """The trie's positions whose logits were not read for this context."""
    read = np.zeros(trie.n_nodes, dtype=bool)
    read[trie.edge_node[~np.isnan(edge_logp)]] = True
    return np.nonzero(~read)[0]


# Runs chunks on the engine's stream workers: their scored edges, and the passes that
# ran one after another.
RunChunks = Callable[[list[Chunk]], tuple[list[Edges], int]]


def first_chunks(
    plan: Plan, pruned: Sequence[int], *, pack_budget: int, streams: int, pruning: Pruning
) -> list[Chunk]:
    """The chunks of a pruned fields pass's first pass: the other questions whole, each
    pruned root and its children (`_top`). Made once per plan and pruned set."""
    narrow = _narrow(plan, pruned, pruning)
    key = ("pruned", tuple(pruned), narrow)
    first = plan.variants.get(key)
    if first is None:
        first = plan.variants[key] = make_chunks(
            plan.tries,
            pack_budget,
            streams,
            nodes={fi: _top(plan.tries[fi], pruning) for fi in pruned},
            narrow=narrow,
        )
    return first


def _narrow(plan: Plan, pruned: Sequence[int], pruning: Pruning) -> frozenset[int]:
    """The pruned questions scored constrained: their nodes' logits are read at their
    allowed tokens only (`Chunk.narrow`), each level's output head over a few tokens
    instead of the vocabulary (tariff on a 1.5B: 11 rows of 151,936)."""
    return frozenset(fi for fi in pruned if pruning.constrained_for(plan.tries[fi]))


def pruned_pass(
    plan: Plan,
    pruned: Sequence[int],
    rows: int,
    run_chunks: RunChunks,
    *,
    pack_budget: int,
    streams: int,
    pruning: Pruning,
    first_done: list[Edges] | None = None,
    stem_cached: bool = False,
) -> tuple[list[list[np.ndarray]], int]:
    """A fields pass with some questions pruned: the first pass scores the other
    questions whole and the pruned ones' roots, then `search` runs the levels.

    Args:
        first_done: The first pass's edges where it already ran (with the prefill,
            `Passes.prefill_and_pack`); it is then not run again.
        stem_cached: `run_chunks` runs after the one pruned field's stem (kept by the
            first pass, which then must be `first_done`): the levels pack no stem.

    Returns:
        Per context, per question edge log p (NaN where a pruned trie was not expanded);
        and the passes that ran one after another.
    """
    tries = plan.tries
    acc = [np.full((rows, len(t.edge_node)), np.nan) for t in tries]
    passes = 0

    def take(outs: list[Edges]) -> None:
        for found in outs:
            for fi, sel, logp in found:
                acc[fi][:, sel] = logp

    def run(chunks: list[Chunk]) -> None:
        nonlocal passes
        outs, n = run_chunks(chunks)
        passes += n
        take(outs)

    if stem_cached and (first_done is None or len(tries) != 1):
        raise ValueError("a cached stem needs one field and its first pass done")
    if first_done is None:
        run(first_chunks(plan, pruned, pack_budget=pack_budget, streams=streams, pruning=pruning))
    else:
        take(first_done)
    fell_back: set[tuple[int, int]] = set()
    levels = search(
        tries,
        pruned,
        acc,
        lambda want: run(
            make_chunks(
                tries,
                pack_budget,
                streams,
                nodes={fi: want.get(fi, []) for fi in range(len(tries))},
                stem_cached=stem_cached,
                narrow=_narrow(plan, pruned, pruning),
            )
        ),
        pruning,
        fell_back,
        _trees(plan, pruned),
        _goals(plan, pruned, pruning),
    )
    whole = [fi for fi in range(len(tries)) if fi not in set(pruned)]
    if any(np.isnan(acc[fi]).any() for fi in whole):  # pragma: no cover - a packing bug
        raise RuntimeError("internal error: a trie edge was not evaluated")
    out = [[acc[fi][r] for fi in range(len(tries))] for r in range(rows)]
    for fi in pruned:
        t = tries[fi]
        for r in range(rows):
            read = t.n_nodes - len(_unread(t, acc[fi][r]))
            pruning.searches[id(out[r][fi])] = SearchReport(
                levels, read, t.n_nodes, (fi, r) in fell_back
            )
    return out, passes


def _trees(plan: Plan, pruned: Sequence[int]) -> dict[int, TreeIndex]:
    """The pruned questions of `plan` that ask a taxonomy decided level by level."""
    out: dict[int, TreeIndex] = {}
    for fi in pruned:
        tree = plan.schema.field(plan.questions[fi].field).tree if plan.questions else None
        if tree is not None and tree.decide == "path":
            out[fi] = tree_index(tree)
    return out


def _goals(plan: Plan, pruned: Sequence[int], pruning: Pruning) -> dict[int, RankedGoal]:
    """The pruned questions of `plan` that ask a ranked multi-label field: their goals."""
    if not pruning.ranked or not plan.questions:
        return {}
    found = {fi: pruning.ranked.get(plan.questions[fi].field) for fi in pruned}
    return {fi: g for fi, g in found.items() if g is not None}


def _top(trie: FieldTrie, pruning: Pruning) -> list[int]:
    """The nodes a pruned field's first pass reads: its root, and the root's children
    when they fit in one level."""
    children = (np.nonzero(trie.parents == 0)[0]).tolist()
    return [0, *children] if len(children) < pruning.first_nodes else [0]
