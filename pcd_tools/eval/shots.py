"""Few-shot examples drawn from a dataset's calibration split, for `pcd eval --shots K`.

`draw_shots(dataset, k)` takes `k` labelled items from the calibration split (never from
the evaluation sample: when both come from one pool, its ids are excluded), stratified
over the labels of the schema's first field (its main field), with a fixed seed. Only
items labelled on every field can be examples (an example answers every field), so
CLINC-150's out-of-scope queries, which have no `domain` or `intent`, are never drawn.
The drawn items are listed in a seeded random order: a dataset sorted by label would
otherwise put every example of one label last, where a small model copies it most.

`Shots.examples` are in the `{"input": text, "output": answer}` form that
`decide(..., examples=)` takes; `Shots.ids` are recorded in the report.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..schema import Schema, compile_schema
from .datasets import Dataset, DatasetError, stratified_sample

__all__ = ["Shots", "draw_shots"]


@dataclasses.dataclass
class Shots:
    """Few-shot examples drawn from a dataset.

    Args:
        k: How many.
        seed: Seed of the draw.
        field: The field whose labels the draw is stratified over.
        ids: The drawn items' ids, in prompt order.
        examples: `{"input": text, "output": answer}` per item, in prompt order.
        split: The split they were drawn from.
    """

    k: int
    seed: int
    field: str
    ids: list[str]
    examples: list[dict[str, Any]] = dataclasses.field(repr=False)
    split: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (what reports record)."""
        return {
            "k": self.k,
            "seed": self.seed,
            "field": self.field,
            "split": self.split,
            "ids": list(self.ids),
            "examples": list(self.examples),
        }


def _answer(schema: Schema, labels: Mapping[str, Any]) -> dict[str, Any] | None:
    """A dataset item's labels as an example's answer (nested keys for nested fields),
    or None when a field that must be answered is unlabelled."""
    out: dict[str, Any] = {}
    for f in schema.fields:
        if f.name not in labels:
            if f.optional and f.kind != "multilabel":
                continue
            return None
        node = out
        *parents, leaf = f.key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = labels[f.name]
    return out


def draw_shots(
    dataset: Dataset,
    k: int,
    *,
    seed: int = 1,
    eval_ids: Sequence[str] = (),
) -> Shots:
    """`k` stratified examples from the calibration split, none of them evaluated.

    Args:
        dataset: The dataset.
        k: How many examples (0 for none).
        seed: Seed of the draw (and of their order in the prompt).
        eval_ids: The evaluation sample's ids: never drawn.

    Raises:
        DatasetError: for a negative `k`, or fewer than `k` usable items.
    """
    compiled = compile_schema(dataset.schema)
    main = compiled.fields[0].name
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise DatasetError(f"shots must be an int >= 0; got {k!r}.")
    split = dataset.calibration_split
    if k == 0:
        return Shots(0, seed, main, [], [], split.name)
    banned = set(eval_ids)
    answers = [_answer(compiled, lab) for _, lab in split.examples]
    usable = [i for i, a in enumerate(answers) if a is not None and split.ids[i] not in banned]
    if len(usable) < k:
        raise DatasetError(
            f"{dataset.name}: {k} shots asked, but the {split.name!r} split has only "
            f"{len(usable)} items labelled on every field outside the evaluation sample; "
            f"accepted: --shots 0 to {len(usable)}."
        )
    strata = [json.dumps(split.examples[i][1][main], sort_keys=True) for i in usable]
    picked = [usable[j] for j in stratified_sample(strata, k, seed)]
    order = np.random.default_rng(seed).permutation(len(picked))
    picked = [picked[int(j)] for j in order]
    examples = [{"input": split.examples[i][0], "output": answers[i]} for i in picked]
    return Shots(k, seed, main, [split.ids[i] for i in picked], examples, split.name)
