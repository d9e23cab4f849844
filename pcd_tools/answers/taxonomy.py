"""Taxonomy answers: decided level by level, and each level's probability.

A taxonomy field's candidates are a tree's leaves, written as their paths
(`pcd_tools.schema.labels`). A node's probability is the mass of the leaves under it, so
the conditional probabilities along a path telescope to its leaf's own.

**Level by level** (`Taxonomy.decide == "path"`, the default): the answer takes the most
probable top-level node, then the most probable child of it, and so on down to a leaf;
`"leaf"` takes the most probable leaf over the whole tree instead. With some leaves
unscored (a pruned search), each node's mass lies between the sum of its scored leaves and
that plus the bounds of the unread prefixes that reach into it (`top_down`); a level is
certified when its chosen node's lower bound beats every sibling's upper bound.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..schema import FieldSpec
from ..schema.spec import Taxonomy

__all__ = ["PathStep", "TreeIndex", "taxonomy_path", "top_down", "tree_index"]


@dataclass(frozen=True)
class PathStep:
    """One level of a taxonomy answer's path (`FieldResult.path`).

    Args:
        value: The label at this level (the leaf's label last).
        probability: The probability of this label given the levels above it: the mass
            of its subtree over its parent's. The steps' probabilities multiply to the
            answer's.
        reached: The probability of the path down to here (the product so far).
    """

    value: Any
    probability: float
    reached: float


def taxonomy_path(spec: FieldSpec, probs: np.ndarray, best: int) -> tuple[PathStep, ...]:
    """The answer's path with each level's conditional probability, from the field's
    distribution over its leaves (a subtree's probability is the sum of its leaves')."""
    tree = spec.tree
    assert tree is not None
    path = tree.paths[best]
    members = tree_index(tree).members
    steps: list[PathStep] = []
    above = total = float(np.sum(probs))
    for depth, node in enumerate(path):
        mass = float(np.sum(probs[members[tuple(path[: depth + 1])]]))
        reached = mass / total if total > 0 else 0.0
        steps.append(PathStep(node, mass / above if above > 0 else 0.0, reached))
        above = mass
    return tuple(steps)


@dataclass(frozen=True)
class TreeIndex:
    """A taxonomy's nodes as sets of candidates.

    Args:
        children: Per node (its path prefix; `()` the root), its child nodes in order.
        members: Per node, the candidate indices under it (a leaf: itself).
        leaf: Per leaf node (a whole path), its candidate index.
    """

    children: dict[tuple[Any, ...], list[tuple[Any, ...]]]
    members: dict[tuple[Any, ...], np.ndarray]
    leaf: dict[tuple[Any, ...], int]


_INDEXES: dict[int, tuple[Any, TreeIndex]] = {}


def tree_index(tree: Taxonomy) -> TreeIndex:
    """The index of `tree`, built once per tree object."""
    hit = _INDEXES.get(id(tree))
    if hit is not None and hit[0]() is tree:
        return hit[1]
    children: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {(): []}
    members: dict[tuple[Any, ...], list[int]] = {(): []}
    leaf: dict[tuple[Any, ...], int] = {}
    for c, path in enumerate(tree.paths):
        if not path:  # an optional field's null: under no node
            continue
        members[()].append(c)
        for d in range(1, len(path) + 1):
            node = tuple(path[:d])
            if node not in members:
                members[node] = []
                children[node] = []
                children[tuple(path[: d - 1])].append(node)
            members[node].append(c)
        leaf[tuple(path)] = c
    index = TreeIndex(children, {k: np.array(v, dtype=np.int64) for k, v in members.items()}, leaf)
    key = id(tree)

    def gone(ref: Any, key: int = key) -> None:
        hit = _INDEXES.get(key)
        if hit is not None and hit[0] is ref:
            del _INDEXES[key]

    _INDEXES[key] = (weakref.ref(tree, gone), index)
    return index


def top_down(
    index: TreeIndex,
    log_w: np.ndarray,
    groups: Sequence[tuple[float, float, np.ndarray]] = (),
) -> tuple[int, bool, tuple[Any, ...] | None]:
    """The leaf chosen level by level, whether every level is certified, and the first
    node whose level is not (None when all are).

    Args:
        index: The taxonomy's index.
        log_w: Per candidate, its log weight (`-inf` where unscored); a node's mass is the
            sum of its candidates' weights.
        groups: `(log upper, log lower, members)` of each unread prefix: bounds of the
            total weight its candidates hold (lower `-inf` where only the upper is
            known). A prefix inside one node adds its lower bound to that node's floor.

    At each level the child with the highest floor is taken (ties: the first in order);
    the level is certified when that floor beats every other child's ceiling (its scored
    weight plus the upper bounds of the prefixes reaching into it). A chosen leaf that
    is not scored is not certified: its score is still to be read.
    """
    finite = log_w[np.isfinite(log_w)]
    top = max([float(finite.max()) if len(finite) else 0.0, *(float(g[0]) for g in groups)])
    w = np.where(np.isfinite(log_w), np.exp(log_w - top), 0.0)
    node: tuple[Any, ...] = ()
    unsure: tuple[Any, ...] | None = None
    while node not in index.leaf:
        kids = index.children[node]
        lo = np.array([w[index.members[k]].sum() for k in kids])
        hi = lo.copy()
        if groups and len(kids) > 1:
            which = np.full(len(w), -1, dtype=np.int64)
            for j, k in enumerate(kids):
                which[index.members[k]] = j
            for upper, lower, mem in groups:
                touched = np.unique(which[mem])
                touched = touched[touched >= 0]
                for j in touched:
                    hi[j] += float(np.exp(upper - top))
                if len(touched) == 1 and np.isfinite(lower):
                    lo[touched[0]] += float(np.exp(lower - top))
        best = int(np.argmax(lo))
        if unsure is None and any(hi[j] >= lo[best] for j in range(len(kids)) if j != best):
            unsure = kids[best]
        node = kids[best]
    leaf = index.leaf[node]
    if unsure is None and not np.isfinite(log_w[leaf]):
        unsure = node
    return leaf, unsure is None, unsure
