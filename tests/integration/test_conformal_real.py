"""Prediction sets end to end on the embedded model: a small calibration fit on labelled
items stores conformal scores; decisions give sets from them; the cascade escalates on
them and the human stage receives them."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_tools.answers.calibration import Calibration
from pcd_tools.answers.conformal import TooFewCalibrationItemsError
from pcd_tools.eval.calibration import calibrate

pytestmark = pytest.mark.integration


class Review(BaseModel):
    """Classify a short product review."""

    sentiment: Literal["positive", "negative", "neutral"] = Field(
        description="The reviewer's overall opinion"
    )
    about_price: bool = Field(description="Whether the review talks about the price")


CAL = [
    ("Absolutely love it, works perfectly.", {"sentiment": "positive", "about_price": False}),
    ("Broke after two days. Terrible.", {"sentiment": "negative", "about_price": False}),
    ("It is a phone case. It fits.", {"sentiment": "neutral", "about_price": False}),
    ("Great value for the money!", {"sentiment": "positive", "about_price": True}),
    ("Way too expensive for what it does.", {"sentiment": "negative", "about_price": True}),
    ("Arrived on Tuesday.", {"sentiment": "neutral", "about_price": False}),
    ("Best purchase this year, highly recommend.", {"sentiment": "positive", "about_price": False}),
    ("Cheap plastic, waste of money.", {"sentiment": "negative", "about_price": True}),
    ("Does what the box says.", {"sentiment": "neutral", "about_price": False}),
    ("I am so happy with this blender.", {"sentiment": "positive", "about_price": False}),
    ("Stopped working and support ignored me.", {"sentiment": "negative", "about_price": False}),
    ("The price went up since last month.", {"sentiment": "neutral", "about_price": True}),
]
TESTS = ["Fantastic quality, I would buy it again.", "Overpriced junk.", "It is blue."]


@pytest.fixture(scope="module")
def fitted(real, tmp_path_factory):
    cal = calibrate(Review, CAL, decider=real, method="temperature")
    path = cal.save(tmp_path_factory.mktemp("conformal") / "cal.json")
    return real.with_calibration(str(path)), Calibration.load(path)


def test_calibrate_stores_scores_and_sets_follow_them(fitted):
    decider, cal = fitted
    assert set(cal.conformal) == {"sentiment", "about_price"}
    assert all(cal.conformal[n]["n"] == len(CAL) for n in cal.conformal)
    for d in decider.decide_many(Review, TESTS):
        for name in ("sentiment", "about_price"):
            f = d.fields[name]
            p = cal.probabilities(name, f.log_scores)  # what the scores were measured on
            for cov in (0.5, 0.8, 0.9):
                k = int(np.ceil((len(CAL) + 1) * cov - 1e-9))
                q = cal.conformal[name]["scores"][k - 1]
                got = f.prediction_set(cov)
                want = [c for c, pc in zip(f.distribution, p) if 1 - pc <= q + 1e-9]
                top = f.top_choices[0][0]
                assert got[0] == top
                assert set(got) == set(want) | {top}
                assert [f.distribution[c] for c in got] == sorted(
                    (f.distribution[c] for c in got), reverse=True
                )
            # 12 items certify at most 12 / 13 = 0.923
            with pytest.raises(TooFewCalibrationItemsError, match="n = 12"):
                f.prediction_set(0.95)


def test_cascade_escalates_on_sets_and_the_human_gets_them(fitted):
    from pcd_tools.agents import Cascade, DeciderStage, HumanStage

    decider, _ = fitted
    asked = []

    def person(request):
        asked.append(request)
        return {n: request.prediction_sets[n][-1] for n in request.fields}

    cascade = Cascade(
        Review,
        [DeciderStage(decider, name="small"), HumanStage(person)],
        escalate_when="set_size>1",
        coverage=0.5,  # the 135M is unsure of most answers at 0.9; at 0.5 some sets are one
    )
    kinds = set()
    for text, d in zip(TESTS, decider.decide_many(Review, TESTS)):
        res = cascade.invoke(text)
        wide = [n for n in ("sentiment", "about_price") if len(d.fields[n].prediction_set(0.5)) > 1]
        assert res.stages[0].escalated == wide
        for n in ("sentiment", "about_price"):
            want = "human" if n in wide else "small"
            assert res.decided_by[n] == want
            kinds.add(want)
        if wide:
            req = asked[-1]
            assert req.coverage == 0.5
            assert req.prediction_sets == {n: d.fields[n].prediction_set(0.5) for n in wide}
    assert kinds == {"human", "small"}  # both rules' outcomes were exercised
