"""Labelled examples, splits and datasets, stratified sampling, and label lookup.

An example is `(text, {field: label})` with JSON labels (`str`/`int` for enums, `bool` for
booleans). A field missing from an example's labels is not scored for that example (e.g.
CLINC-150's `intent` on out-of-scope queries).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, create_model

from ...errors import PcdToolsError
from ...schema import FieldSpec, compile_schema

__all__ = [
    "DataNotFoundError",
    "Dataset",
    "DatasetError",
    "Example",
    "Split",
    "label_index",
    "restrict_schema",
    "stratified_sample",
]

Example = tuple[str, dict[str, Any]]


class DatasetError(PcdToolsError, ValueError):
    """A dataset, its schema or its column mapping cannot be used."""


class DataNotFoundError(DatasetError, FileNotFoundError):
    """The labelled data is not where it was looked for."""


# --- sampling -------------------------------------------------------------------------------


def stratified_sample(
    strata: Sequence[Any], n: int | None, seed: int = 0, *, exclude: Sequence[int] = ()
) -> list[int]:
    """Indices of a fixed-seed sample whose strata keep their proportions.

    Each stratum gets `floor(n * share)` items and the remaining slots go to the largest
    remainders (ties broken by the seeded generator); items within a stratum are drawn
    without replacement.

    Args:
        strata: One stratum key per item.
        n: Sample size; `None` or at least the pool size returns the whole pool.
        seed: Seed of `numpy.random.default_rng`.
        exclude: Indices that may not be drawn.

    Returns:
        Sorted indices into `strata`.
    """
    banned = set(exclude)
    pool = [i for i in range(len(strata)) if i not in banned]
    if n is None or n >= len(pool):
        return pool
    if n < 0:
        raise DatasetError(f"sample size must be >= 0; got {n}.")
    rng = np.random.default_rng(seed)
    groups: dict[Any, list[int]] = {}
    for i in pool:
        groups.setdefault(strata[i], []).append(i)
    keys = list(groups)
    quota = np.array([n * len(groups[k]) / len(pool) for k in keys])
    take = np.floor(quota).astype(int)
    rest = n - int(take.sum())
    if rest:
        tiebreak = rng.random(len(keys))
        order = sorted(range(len(keys)), key=lambda j: (-(quota[j] - take[j]), tiebreak[j]))
        for j in order[:rest]:
            take[j] += 1
    out: list[int] = []
    for k, t in zip(keys, take):
        members = groups[k]
        out.extend(int(i) for i in rng.choice(members, size=int(t), replace=False))
    return sorted(out)


@dataclass
class Split:
    """Labelled examples with stable ids and sampling strata.

    Args:
        name: Where they came from (e.g. `"test"`).
        examples: `(text, {field: label})` pairs.
        ids: One stable id per example (recorded in calibration files).
        strata: One stratum key per example (stratified sampling).
    """

    name: str
    examples: list[Example]
    ids: list[str]
    strata: list[Any]

    def __len__(self) -> int:
        return len(self.examples)

    def sample(self, n: int | None, seed: int = 0, *, exclude_ids: Sequence[str] = ()) -> Split:
        """A stratified, fixed-seed subsample (see `stratified_sample`)."""
        banned = set(exclude_ids)
        idx = stratified_sample(
            self.strata, n, seed, exclude=[i for i, x in enumerate(self.ids) if x in banned]
        )
        return Split(
            self.name,
            [self.examples[i] for i in idx],
            [self.ids[i] for i in idx],
            [self.strata[i] for i in idx],
        )


@dataclass
class Dataset:
    """A labelled dataset and the decision schema it is evaluated with.

    Args:
        name: Dataset name.
        schema: The schema (a Pydantic model class or `StructuredSchema`).
        eval_split: Pool the evaluation sample is drawn from.
        calibration_split: Pool the calibration sample is drawn from (may be the same
            object as `eval_split`; then samples are kept disjoint by id).
        source: Files it was read from.
    """

    name: str
    schema: Any
    eval_split: Split
    calibration_split: Split
    source: list[str] = field(default_factory=list)

    def eval_sample(self, n: int | None, seed: int = 0) -> Split:
        """The stratified evaluation sample."""
        return self.eval_split.sample(n, seed)

    def calibration_sample(
        self, n: int | None, seed: int = 0, *, eval_n: int | None = None, eval_seed: int = 0
    ) -> Split:
        """A calibration sample disjoint from `eval_sample(eval_n, eval_seed)`."""
        if self.calibration_split is not self.eval_split:
            return self.calibration_split.sample(n, seed)
        held = self.eval_sample(eval_n, eval_seed).ids
        if len(held) >= len(self.eval_split):
            raise DatasetError(
                f"{self.name}: the evaluation sample (n={eval_n}) uses the whole pool of "
                f"{len(self.eval_split)} examples, so no disjoint calibration data is left; "
                "lower --eval-n."
            )
        return self.calibration_split.sample(n, seed, exclude_ids=held)

    def restrict(self, fields: Sequence[str]) -> Dataset:
        """The same data scored on some fields only (a narrower schema)."""
        schema = restrict_schema(self.schema, fields)

        def keep(s: Split) -> Split:
            # examples left with no label for any kept field cannot be scored: drop them
            rows = [
                (t, {k: v for k, v in lab.items() if k in fields}, i, st)
                for (t, lab), i, st in zip(s.examples, s.ids, s.strata)
            ]
            rows = [r for r in rows if r[1]]
            return Split(
                s.name,
                [(t, lab) for t, lab, _, _ in rows],
                [r[2] for r in rows],
                [r[3] for r in rows],
            )

        ev = keep(self.eval_split)
        cal = ev if self.calibration_split is self.eval_split else keep(self.calibration_split)
        return Dataset(self.name, schema, ev, cal, self.source)


def restrict_schema(schema: Any, fields: Sequence[str]) -> type[BaseModel]:
    """A Pydantic model with only `fields` of `schema` (same descriptions and docstring)."""
    compiled = compile_schema(schema)
    model = compiled.model
    unknown = [f for f in fields if f not in model.model_fields]
    if unknown or not fields:
        raise DatasetError(
            f"{compiled.name}: cannot restrict to {list(fields)!r}; accepted: a non-empty "
            f"subset of {compiled.field_names}."
        )
    kept = {f: (model.model_fields[f].annotation, model.model_fields[f]) for f in fields}
    return create_model(  # type: ignore[call-overload]
        model.__name__, __doc__=compiled.instructions or None, **kept
    )


def label_index(spec: FieldSpec, label: Any) -> int:
    """The index of the candidate whose JSON value is `label`.

    Raises:
        DatasetError: naming the field, the label and the accepted labels.
    """
    lit = json.dumps(label, ensure_ascii=False)
    for i, c in enumerate(spec.choices):
        if c.literal == lit:
            return i
    raise DatasetError(
        f"label {label!r} is not a choice of field {spec.name!r}; accepted: {spec.labels}."
    )
