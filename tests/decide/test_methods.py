"""`pcd_tools.decide.methods`: a call's scoring resolved once into a side and a label-free
correction, each correction declaring what it needs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools.decide.generated import check_hybrid_options
from pcd_tools.decide.loo import recipe_options
from pcd_tools.decide.methods import (
    CONTEXTUAL,
    CORRECTIONS,
    PMI,
    RAW,
    Method,
    label_free_of,
)
from pcd_tools.decide.options import DecideOptions
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import compile_schema


class Note(BaseModel):
    urgent: bool = Field(description="urgent?")
    summary: str = Field(description="one line")


def test_each_correction_declares_what_it_reads():
    cache = SimpleNamespace(inputs=("N/A", "[MASK]"))
    assert RAW.texts(cache) == () and not RAW.needs_every_score  # type: ignore[arg-type]
    assert PMI.texts(cache) == ("",) and PMI.needs_every_score  # type: ignore[arg-type]
    assert CONTEXTUAL.texts(cache) == ("N/A", "[MASK]")  # type: ignore[arg-type]
    assert PMI.sides == ("full",) and "constrained" in CONTEXTUAL.sides
    assert set(CORRECTIONS) == {"none", "pmi", "contextual"}
    with pytest.raises(NotImplementedError):
        RAW.offsets({}, [], (), constrained=False, mean="geometric")


def test_offsets_pmi_subtracts_the_empty_context_and_contextual_the_mean_prior():
    q = object()
    z1, z2 = np.log([0.7, 0.2, 0.1]), np.log([0.2, 0.3, 0.5])
    con = np.log([0.5, 0.25, 0.25])
    entry = {"": {q: (z1, con)}, "N/A": {q: (z1, con)}, "[MASK]": {q: (z2, con)}}
    (pmi,) = PMI.offsets(entry, [q], ("",), constrained=False, mean="geometric")  # type: ignore[list-item]
    np.testing.assert_array_equal(pmi, z1)
    texts = ("N/A", "[MASK]")
    (geo,) = CONTEXTUAL.offsets(entry, [q], texts, constrained=False, mean="geometric")  # type: ignore[list-item]
    mean = (z1 + z2) / 2
    np.testing.assert_allclose(geo, mean - np.log(np.exp(mean).sum()), atol=1e-12)
    (ari,) = CONTEXTUAL.offsets(entry, [q], texts, constrained=False, mean="arithmetic")  # type: ignore[list-item]
    np.testing.assert_allclose(ari, np.log([0.45, 0.25, 0.3]), atol=1e-12)
    # the "" text (PMI's) in the same plan entry is not read by contextual calibration
    (side,) = CONTEXTUAL.offsets(entry, [q], texts, constrained=True, mean="geometric")  # type: ignore[list-item]
    np.testing.assert_allclose(side, con, atol=1e-12)


@pytest.mark.parametrize(
    ("scoring", "default", "requested", "fitted", "want"),
    [
        ("auto", "none", None, None, Method("auto", RAW)),
        ("full", "none", None, None, Method("full", RAW)),
        ("constrained", "contextual", None, None, Method("constrained", CONTEXTUAL)),
        ("auto", "contextual", None, None, Method("full", CONTEXTUAL)),  # it cannot prune
        ("auto", "none", "contextual", None, Method("full", CONTEXTUAL)),
        ("auto", "contextual", "none", None, Method("auto", RAW)),
        ("pmi", "none", None, None, Method("full", PMI)),
        ("pmi", "contextual", "none", None, Method("full", PMI)),
        ("auto", "none", None, "constrained", Method("constrained", RAW)),  # as fitted
        ("auto", "none", None, "pmi", Method("full", PMI)),
        ("auto", "none", None, "auto", Method("auto", RAW)),  # fitted under auto: auto
        ("full", "none", None, "constrained", Method("full", RAW)),  # asked for wins
    ],
)
def test_resolve(scoring, default, requested, fitted, want):
    cal = SimpleNamespace(scoring=fitted) if fitted is not None else None
    got = Method.resolve(scoring, default, requested, cal)
    assert got == want
    assert got.scoring == ("pmi" if want.correction is PMI else want.side)
    assert got.method == ("contextual" if want.correction is CONTEXTUAL else "none")
    assert got.label_free == want.correction.name


def test_pmi_with_contextual_calibration_is_refused_naming_who_asked():
    with pytest.raises(InvalidArgumentError, match=r"asked by this call.*accepted: scoring='pmi'"):
        Method.resolve("pmi", "none", "contextual")
    with pytest.raises(InvalidArgumentError, match="asked by the decider"):
        Method.resolve("pmi", "contextual")


def test_field_scoring_and_sides():
    schema = compile_schema(Note)
    assert Method("full", PMI).field_scoring(False) == "pmi"
    assert Method("full", CONTEXTUAL).field_scoring(False) == "full"
    assert Method("auto", RAW).field_scoring(True) == "constrained"
    side = Method("constrained", RAW).constrained_side(schema)
    assert side(None, None) is True
    assert Method("full", RAW).constrained_side(schema)(None, None) is False


def test_pruning_needs_a_raw_packed_call():
    schema = compile_schema(Note)
    for kind in (PMI, CONTEXTUAL):
        assert (
            Method("full", kind).pruning(schema, "auto", mode="packed", whole=frozenset()) is None
        )
    with pytest.raises(InvalidArgumentError, match="calibration='contextual': the correction"):
        Method("full", CONTEXTUAL).pruning(schema, "on", mode="packed", whole=frozenset())
    with pytest.raises(InvalidArgumentError, match="mode='batched'"):
        Method("auto", RAW).pruning(schema, "on", mode="batched", whole=frozenset())
    assert Method("auto", RAW).pruning(schema, "auto", mode="batched", whole=frozenset()) is None


def test_a_correction_that_needs_every_score_refuses_generated_fields():
    schema = compile_schema(Note)
    check_hybrid_options(schema, orders=1)  # raw is fine
    for kind, said in ((PMI, r"scoring='pmi' \(its empty-context"), (CONTEXTUAL, "calibration=")):
        with pytest.raises(InvalidArgumentError, match=rf"\['summary'\]: {said}"):
            check_hybrid_options(schema, orders=1, method=Method("full", kind))


def test_each_recipe_sets_its_own_options_and_decisions_read_back():
    base = DecideOptions(scoring="auto")
    assert recipe_options(base, "pmi").scoring == "pmi"
    assert recipe_options(base, "pmi").calibration == "none"
    assert recipe_options(base, "contextual").calibration == "contextual"
    assert recipe_options(base, "none") == DecideOptions(scoring="auto", calibration="none")
    assert label_free_of("none", "pmi") == "pmi"
    assert label_free_of("auto:contextual", "full") == "contextual"
    assert label_free_of("none", "auto") == "none"
