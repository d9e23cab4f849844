"""A taxonomy answer's path: each level's probability given the levels above it.

A taxonomy field's candidates are a tree's leaves, written as their paths
(`pcd_tools.schema.labels`). A node's probability is the mass of the leaves under it, so
the conditional probabilities along the answer's path telescope to the leaf's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..schema import FieldSpec

__all__ = ["PathStep", "taxonomy_path"]


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
    steps: list[PathStep] = []
    above = float(np.sum(probs))
    members = np.arange(len(probs))
    for depth, node in enumerate(path):
        members = np.array(
            [i for i in members if len(tree.paths[i]) > depth and tree.paths[i][depth] == node],
            dtype=np.int64,
        )
        mass = float(np.sum(probs[members])) if len(members) else 0.0
        steps.append(PathStep(node, mass / above if above > 0 else 0.0, mass))
        above = mass
    return tuple(steps)
