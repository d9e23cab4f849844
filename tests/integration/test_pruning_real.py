"""Certified pruned scoring on the embedded model: random sets of real tariff codes.

Each example draws a subset of the tariff scenario's 6-digit HS codes (six digit tokens
each, a deep shared trie) and decides it pruned and whole. A certified answer must be
the exhaustive argmax, and the exhaustive probability must lie inside the bounds.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import Field, create_model

from benchmarks.scenarios.tariff import HS_CODES

pytestmark = pytest.mark.integration

TEXTS = [
    "Invoice line: 400 kg of frozen boneless beef, chilled in transit.",
    "Shipment of natural honey in 25 kg drums.",
    "Two pure-bred breeding horses, live, with papers.",
]


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    picked=st.lists(st.sampled_from(range(len(HS_CODES))), min_size=20, max_size=60, unique=True),
    text=st.sampled_from(TEXTS),
    scoring=st.sampled_from(["full", "constrained", "auto"]),
)
def test_random_code_sets_pruned_against_whole(real, picked, text, scoring):
    codes = tuple(HS_CODES[i][0] for i in sorted(picked))
    model = create_model(
        "Tariff",
        hs_code=(Literal[codes], Field(description="The 6-digit HS subheading")),  # type: ignore[call-overload]
    )
    pruned = real.decide(model, text, scoring=scoring, pruning="on").fields["hs_code"]
    whole = real.decide(model, text, scoring=scoring, pruning="off").fields["hs_code"]
    assert pruned.certified is not None and whole.certified is None
    lo, hi = pruned.probability_bounds
    assert lo - 1e-4 <= whole.probability <= hi + 1e-4
    if pruned.certified:
        assert pruned.label == whole.label
    zp, zw = np.array(pruned.log_scores), np.array(whole.log_scores)
    seen = np.isfinite(zp)
    np.testing.assert_allclose(zp[seen], zw[seen], rtol=1e-5, atol=1e-4)


def test_the_tariff_scenario_at_defaults_is_pruned_and_certified(real):
    """255 codes, 1,423 trie positions: the default (`scoring="auto"`) scores the field
    constrained and prunes it; the answer is the exhaustive argmax, inside its bounds."""
    from benchmarks.scenarios.tariff import CONTEXT, SCHEMA

    d = real.decide(SCHEMA, CONTEXT)
    whole = real.decide(SCHEMA, CONTEXT, pruning="off")
    con = real.decide(SCHEMA, CONTEXT, scoring="constrained", pruning="off")
    (name,) = d.fields
    f, w = d.fields[name], whole.fields[name]
    assert d.scoring == "auto" and f.scoring == "constrained" and w.scoring == "constrained"
    assert f.certified is True and d.certified is True
    assert f.label == w.label == con.fields[name].label
    lo, hi = f.probability_bounds
    assert lo - 1e-4 <= w.probability <= hi + 1e-4
    np.testing.assert_allclose(
        list(w.distribution.values()), list(con.fields[name].distribution.values()), atol=1e-6
    )
    # it read a small part of the trie, in fewer passes' time than the exhaustive one
    assert np.isfinite(f.log_scores).sum() < len(f.log_scores) / 2
