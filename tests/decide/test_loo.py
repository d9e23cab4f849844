"""`calibration="auto"`: raw, PMI or contextual chosen by leave-one-out over the examples."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest
from pydantic import BaseModel

from pcd_tools.decide import loo
from pcd_tools.decide.loo import MIN_GAIN, RECIPES, pick
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import compile_schema, with_examples


class Review(BaseModel):
    """Classify the sentiment of the review."""

    sentiment: Literal["positive", "negative", "neutral"]


# On the embedded model, leave-one-out over these three gives raw 2/3, PMI 3/3 and
# contextual 2/3: PMI leads raw by one answer, short of MIN_GAIN, so raw is kept.
EXAMPLES = [
    ("I loved it, wonderful film.", {"sentiment": "positive"}),
    ("Terrible, a waste of time.", {"sentiment": "negative"}),
    ("The package arrived on Tuesday.", {"sentiment": "neutral"}),
]


class Note(BaseModel):
    sentiment: Literal["positive", "negative"]
    summary: str


@pytest.mark.parametrize(
    ("accuracy", "answers", "chosen"),
    [
        ({"none": 0.5, "pmi": 0.5, "contextual": 0.5}, 4, "none"),  # a tie with raw keeps raw
        ({"none": 0.75, "pmi": 0.5, "contextual": 0.25}, 4, "none"),  # losers never win
        ({"none": 0.5, "pmi": 0.75, "contextual": 0.5}, 4, "none"),  # one answer: a flip
        ({"none": 0.5, "pmi": 1.0, "contextual": 1.0}, 4, "pmi"),  # PMI listed first
        ({"none": 0.25, "pmi": 0.5, "contextual": 0.75}, 4, "contextual"),
        ({"none": 0.5, "pmi": 0.5625, "contextual": 0.0}, 32, "pmi"),  # 2 of 32 answers
        ({"none": 0.5, "pmi": 0.53125, "contextual": 0.0}, 32, "none"),  # 1 of 32
    ],
)
def test_pick_keeps_raw_unless_a_recipe_beats_it_by_two_answers(accuracy, answers, chosen):
    assert MIN_GAIN == 2
    assert pick(accuracy, answers) == chosen
    assert accuracy[chosen] == max(accuracy.values()) or chosen == "none"
    assert accuracy[chosen] >= accuracy["none"]


def _recomputed(decider, schema):
    """Each recipe's leave-one-out accuracy, recomputed here with plain decide calls."""
    how = {
        "none": {"calibration": "none"},
        "pmi": {"calibration": "none", "scoring": "pmi"},
        "contextual": {"calibration": "contextual"},
    }
    right = dict.fromkeys(RECIPES, 0)
    for i, (text, answer) in enumerate(EXAMPLES):
        others = EXAMPLES[:i] + EXAMPLES[i + 1 :]
        for recipe in RECIPES:
            d = decider.decide(Review, text, examples=others, **how[recipe])
            right[recipe] += d.fields["sentiment"].label == answer["sentiment"]
    return {r: right[r] / len(EXAMPLES) for r in RECIPES}


def test_auto_choice_on_the_embedded_model(real):
    decider = real.with_calibration("none")  # shares the model; a fresh choice cache
    decider.loo_choices = loo.LooChoices()
    text = "What a great experience"
    got = decider.decide(Review, text, examples=EXAMPLES, calibration="auto")
    choice = got.calibration_choice
    assert choice is not None and decider.loo_choices.stats["runs"] == 1
    want = _recomputed(decider, compile_schema(Review))
    assert choice.accuracy == pytest.approx(want, abs=1e-12)
    assert want["pmi"] > want["none"] == want["contextual"], want  # what the examples give
    # the argmax of the recomputed accuracies when it leads raw by MIN_GAIN answers, else raw
    best = max(RECIPES, key=lambda r: (want[r], r == "none"))
    lead = round((want[best] - want["none"]) * len(EXAMPLES))
    assert choice.method == (best if lead >= MIN_GAIN else "none") == "none"
    assert want[choice.method] >= want["none"]  # never one that loses to raw
    assert got.calibration_method == f"auto:{choice.method}"
    assert (choice.examples, choice.answers) == (3, 3)
    assert "leave-one-out over 3 examples" in choice.reason
    resp = got.to_response()
    assert resp["calibration_method"] == got.calibration_method
    assert resp["calibration_choice"]["method"] == choice.method
    # the decision is the chosen recipe's own
    fixed = {
        "none": {"calibration": "none"},
        "pmi": {"calibration": "none", "scoring": "pmi"},
        "contextual": {"calibration": "contextual"},
    }[choice.method]
    same = decider.decide(Review, text, examples=EXAMPLES, **fixed)
    assert got.fields["sentiment"].log_scores == pytest.approx(
        same.fields["sentiment"].log_scores, abs=1e-4
    )
    assert got.scoring == same.scoring
    assert "calibration_choice" not in same.to_response()  # the old shape when not asked

    # cached: the second call (another text, decide_many) runs no leave-one-out
    def boom(*a, **k):
        raise AssertionError("leave-one-out ran again")

    orig = loo.loo_accuracies
    loo.loo_accuracies = boom
    try:
        again = decider.decide_many(
            Review, ["Lovely day!", "Noted."], examples=EXAMPLES, calibration="auto"
        )
    finally:
        loo.loo_accuracies = orig
    assert [d.calibration_choice for d in again] == [choice, choice]
    assert decider.loo_choices.stats == {"hits": 1, "misses": 1, "runs": 1}


def test_auto_without_examples_keeps_the_decider_setting(tiny):
    decider = tiny.with_calibration("contextual")
    decider.loo_choices = loo.LooChoices()
    d = decider.decide(Review, "hello", calibration="auto")
    assert d.calibration_method == "auto:contextual"
    assert d.calibration_choice.accuracy == {}
    assert "no examples to choose on" in d.calibration_choice.reason
    assert decider.loo_choices.stats["runs"] == 0


def test_auto_refuses_bad_combinations(tiny):
    with pytest.raises(InvalidArgumentError, match="calibration='auto' with scoring='pmi'"):
        tiny.decide(Review, "hi", examples=EXAMPLES, calibration="auto", scoring="pmi")
    with pytest.raises(InvalidArgumentError, match="calibration='auto' with pruning='on'"):
        tiny.decide(Review, "hi", calibration="auto", pruning="on")
    with pytest.raises(InvalidArgumentError, match=r"generated fields \['summary'\]"):
        tiny.decide(Note, "hi", calibration="auto")
    with pytest.raises(InvalidArgumentError, match="or 'auto'"):
        tiny.decide(Review, "hi", calibration="loo")


def test_auto_refuses_generated_fields_before_queueing(tiny):
    import asyncio

    with pytest.raises(InvalidArgumentError, match="generated fields"):
        asyncio.run(tiny.adecide(Note, "hi", calibration="auto"))


def test_the_cache_key_covers_the_examples(tiny):
    a = with_examples(compile_schema(Review), EXAMPLES[:2])
    b = with_examples(compile_schema(Review), EXAMPLES[1:3])
    assert a.fingerprint() != b.fingerprint()
    assert dataclasses.replace(a, examples=()).fingerprint() == compile_schema(Review).fingerprint()


def test_async_calls_choose_once_on_the_worker(tiny):
    import asyncio

    decider = tiny.with_calibration("none")
    decider.loo_choices = loo.LooChoices()

    async def both():
        return await asyncio.gather(
            decider.adecide(Review, "good", examples=EXAMPLES, calibration="auto"),
            decider.adecide(Review, "bad", examples=EXAMPLES, calibration="auto"),
        )

    a, b = asyncio.run(both())
    assert a.calibration_choice == b.calibration_choice is not None
    assert a.calibration_method == f"auto:{a.calibration_choice.method}"
    assert decider.loo_choices.stats["runs"] == 1
