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
    scoring=st.sampled_from(["full", "constrained"]),
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
