"""Multi-label fields read ranked: any number of labels, one question over all of them,
exact against one prompt per candidate, certified by pruned search like a large field."""

from __future__ import annotations

import enum
from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from pcd_tools.answers.bounds import PartialScores
from pcd_tools.answers.ranked import RankedGoal, _read, rank_labels
from pcd_tools.baselines.json_answer import _fits
from pcd_tools.baselines.json_guide import json_schema_of
from pcd_tools.engine.passes.prune import Pruning, search
from pcd_tools.errors import InvalidFieldOptionError, TooManyChoicesError, UnsupportedFieldError
from pcd_tools.prompt import questions, render_system
from pcd_tools.schema import StructuredSchema, compile_schema
from pcd_tools.schema.json_schema import compile_json_schema
from tests.engine.test_properties import decider  # the tiny model, numpy kernels off
from tests.oracle import oracle_log_scores, softmax
from tests.unit.test_pruning_bounds import random_field

CODES = tuple(f"{a}{b}{c}" for a in "abcdefghij" for b in "klmnopqrst" for c in "uvwx")[:400]
CONTEXT = "a context about codes"


class Tagged(BaseModel):
    """Tag the text."""

    tags: list[Literal[CODES]] = Field(description="the codes that apply")  # type: ignore[valid-type]


def _tagged(**extra):
    class T(BaseModel):
        tags: list[Literal[CODES]] = Field(  # type: ignore[valid-type]
            description="the codes that apply", **extra
        )

    return T


# --- the schema -----------------------------------------------------------------------------


def test_more_than_255_labels_are_read_ranked_with_their_own_default_threshold():
    f = compile_schema(Tagged).field("tags")
    assert (f.kind, f.reading, f.threshold, len(f.choices)) == ("multilabel", "ranked", 0.1, 400)
    small = compile_schema(_tagged_small()).field("tags")
    assert (small.reading, small.threshold) == ("each", 0.5)
    forced = compile_schema(_tagged_small(json_schema_extra={"reading": "ranked"})).field("tags")
    assert (forced.reading, forced.threshold) == ("ranked", 0.1)


def _tagged_small(**extra):
    class S(BaseModel):
        tags: list[Literal["a", "b", "c"]] = Field(description="tags", **extra)

    return S


def test_reading_each_past_255_labels_and_unknown_readings_are_refused():
    with pytest.raises(
        TooManyChoicesError,
        match=r"400 labels.*1 to 255 labels in a multi-label field read 'each'.*reading 'ranked'",
    ):
        compile_schema(_tagged(json_schema_extra={"reading": "each"}))
    with pytest.raises(
        InvalidFieldOptionError, match=r"reading 'rank'.*accepted: \['each', 'ranked'\]"
    ):
        compile_schema(_tagged_small(json_schema_extra={"reading": "rank"}))


def test_a_ranked_field_takes_string_labels_only():
    Num = enum.Enum("Num", {f"n{i}": i for i in range(300)})

    class M(BaseModel):
        nums: list[Num] = Field(description="numbers")  # type: ignore[valid-type]

    with pytest.raises(
        UnsupportedFieldError, match=r"ranked multi-label field takes string labels.*\[0, 1, 2\]"
    ):
        compile_schema(M)


def test_every_form_takes_a_large_multi_label_field():
    labels = list(CODES)
    d = StructuredSchema({"tags": {"type": "multilabel", "choices": labels, "description": "x"}})
    assert compile_schema(d).field("tags").reading == "ranked"
    small = StructuredSchema(
        {
            "tags": {
                "type": "multilabel",
                "choices": ["a", "b"],
                "reading": "ranked",
                "threshold": 0.2,
            }
        }
    )
    assert (
        compile_schema(small).field("tags").reading,
        compile_schema(small).field("tags").threshold,
    ) == ("ranked", 0.2)
    js = compile_json_schema(
        {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"enum": labels}, "maxItems": 3}},
            "required": ["tags"],
        }
    )
    f = js.field("tags")
    assert (f.reading, f.max_labels, len(f.choices)) == ("ranked", 3, 400)
    with pytest.raises(Exception, match="declared twice"):
        StructuredSchema({"tags": {"type": "multilabel", "choices": ["a", "a"]}})


def test_the_prompt_asks_for_a_ranked_list_without_listing_every_label():
    s = compile_schema(Tagged)
    text = render_system(s)
    assert "a list of the labels that apply, the most relevant first" in text
    assert "400 labels, not all listed here" in text and '"jtx"' not in text
    (q,) = questions(s)
    assert q.label is None and len(q.texts) == 400
    assert q.texts[0] == '\n  "tags": ["aku"'


# --- the reading rule -----------------------------------------------------------------------


def test_rank_labels_takes_the_top_over_the_threshold_within_the_limits():
    p = np.array([0.05, 0.4, 0.3, 0.15, 0.1])
    assert rank_labels(p, 0.1) == [1, 2, 3, 4]
    assert rank_labels(p, 0.2) == [1, 2]
    assert rank_labels(p, 0.1, max_labels=2) == [1, 2]
    assert rank_labels(p, 0.5) == []
    assert rank_labels(p, 0.5, min_labels=2) == [1, 2]
    assert rank_labels(np.array([0.3, 0.3, 0.4]), 0.3) == [2, 0, 1]  # ties: declared order


# --- exact and certified on the tiny model --------------------------------------------------


@pytest.mark.engine
def test_a_ranked_field_equals_one_prompt_per_candidate():
    d = decider().decide(Tagged, CONTEXT, scoring="full", pruning="off")
    f = d.fields["tags"]
    (q,) = questions(compile_schema(Tagged))
    want = oracle_log_scores(decider(), compile_schema(Tagged), CONTEXT, "tags", texts=q.texts)
    # float32 sums of ~50 nats: equal to 1e-5 of their size; the probabilities to 1e-4
    np.testing.assert_allclose(np.array(f.log_scores), want, rtol=1e-5, atol=1e-4)
    p = softmax(want)
    np.testing.assert_allclose(list(f.distribution.values()), p, atol=1e-4)
    chosen = rank_labels(p, 0.1)
    assert f.label == [CODES[i] for i in chosen]
    assert f.probability == pytest.approx(sum(p[i] for i in chosen), abs=1e-4)


@pytest.mark.engine
@pytest.mark.parametrize(
    "extra",
    [
        {},  # the default threshold
        {"json_schema_extra": {"threshold": 0.9}},  # none clears it: an empty answer
        {"min_length": 2, "json_schema_extra": {"threshold": 0.9}},
        {"max_length": 3, "json_schema_extra": {"threshold": 0.004}},
        {"json_schema_extra": {"threshold": 0.003}},
    ],
)
def test_the_pruned_reading_chooses_what_the_exhaustive_one_does_certified(extra):
    model = _tagged(**extra)
    auto = decider().decide(model, CONTEXT).fields["tags"]
    whole = decider().decide(model, CONTEXT, pruning="off").fields["tags"]
    assert auto.scoring == "constrained" == whole.scoring
    assert auto.certified is True and auto.label == whole.label
    assert auto.search is not None and auto.search.read < auto.search.positions
    assert auto.probability == pytest.approx(whole.probability, abs=1e-4)
    lo, hi = auto.probability_bounds
    assert lo - 1e-5 <= whole.probability <= hi + 1e-5  # float32 sums, other packings


@pytest.mark.engine
def test_a_field_after_a_ranked_one_sees_its_labels_written_as_a_list():
    class Then(BaseModel):
        tags: list[Literal[CODES]] = Field(  # type: ignore[valid-type]
            description="codes", min_length=2
        )
        sure: bool = Field(description="sure?", json_schema_extra={"depends_on": ["tags"]})

    d = decider().decide(Then, CONTEXT)
    tags = d.fields["tags"].label
    assert len(tags) == 2
    from pcd_tools.answers.waves import written
    from pcd_tools.prompt import answer_text

    s = compile_schema(Then)
    text = answer_text(s.field("tags"), written(s.field("tags"), d.fields["tags"]))
    assert text == f'\n  "tags": ["{tags[0]}", "{tags[1]}"],'
    assert isinstance(d.value.sure, bool) and d.value.tags == tags


# --- the search's rule, against the exhaustive reading --------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(2, 150),
    peak=st.sampled_from([0.05, 0.3, 1.0]),
    threshold=st.sampled_from([0.01, 0.05, 0.1, 0.3]),
    low=st.integers(0, 2),
    high=st.sampled_from([None, 1, 3]),
    temperature=st.sampled_from([0.5, 1.0, 2.0]),
    constrained=st.booleans(),
    levels=st.integers(0, 8),
)
def test_a_certified_ranked_answer_is_the_exhaustive_one(
    seed, n, peak, threshold, low, high, temperature, constrained, levels
):
    trie, edge = random_field(seed, n, 4, peak)
    high = None if high is None else max(high, low, 1)
    goal = RankedGoal(threshold, low, high, 1.0, temperature)
    acc = [np.full((1, len(edge)), np.nan)]
    acc[0][0, trie.edge_node == 0] = edge[trie.edge_node == 0]

    def level(want):
        for fi, nodes in want.items():
            sel = np.isin(trie.edge_node, nodes)
            acc[fi][0, sel] = edge[sel]

    pruning = Pruning(lambda q, t: True, constrained=constrained, max_levels=levels)
    search([trie], [0], acc, level, pruning, set(), None, {0: goal})
    got = trie.scores(acc[0][0], constrained=constrained)
    partial = got if isinstance(got, PartialScores) else PartialScores.whole(got)
    chosen, certified, _ = _read(partial, goal)
    assert certified  # out of levels, the search reads the rest: never uncertified
    z = trie.scores(edge, constrained=constrained)
    p = softmax(np.asarray(z) / temperature)
    assert chosen == rank_labels(p, threshold, low, high)


# --- the generation baseline's layout -------------------------------------------------------


def test_the_baselines_write_a_ranked_field_as_a_list_of_labels():
    s = compile_schema(_tagged(max_length=3))
    prop = json_schema_of(s)["properties"]["tags"]
    assert prop == {"type": "array", "items": {"enum": list(CODES)}, "maxItems": 3}
    f = s.field("tags")
    assert _fits(f, ["aku", "akv"]) and _fits(f, [])
    assert not _fits(f, ["aku", "aku"]) and not _fits(f, ["zzz"]) and not _fits(f, list(CODES[:4]))
