"""Few-shot examples drawn for `pcd eval --shots K`: from the calibration split only,
stratified over the main field, never an evaluated item."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pcd_tools.eval.datasets import Dataset, DatasetError, Split
from pcd_tools.eval.evaluate import EvalError, evaluate
from pcd_tools.eval.shots import draw_shots
from pcd_tools.schema import compile_schema, with_examples
from tests.eval.helpers import SCHEMA

pytestmark = pytest.mark.unit

MOODS = ("calm", "angry", "sad")


def _split(name: str, n: int, prefix: str) -> Split:
    ex = []
    for i in range(n):
        lab = {"mood": MOODS[i % 3], "urgent": i % 2 == 0}
        if i % 10 == 9:
            del lab["urgent"]  # not labelled on every field: it cannot be an example
        ex.append((f"{prefix} text {i}", lab))
    return Split(name, ex, [f"{prefix}:{i}" for i in range(n)], [lab["mood"] for _, lab in ex])


def test_shots_never_come_from_the_evaluation_sample_of_a_shared_pool():
    pool = _split("all", 60, "row")
    ds = Dataset("toy", SCHEMA, pool, pool)
    ev = ds.eval_sample(45, 0)
    for seed in range(5):
        shots = draw_shots(ds, 9, seed=seed, eval_ids=ev.ids)
        assert len(shots.ids) == 9 and not set(shots.ids) & set(ev.ids)
        assert all(not i.endswith("9") for i in shots.ids)  # every one fully labelled
        # stratified over the main field's labels: three of each mood
        assert Counter(e["output"]["mood"] for e in shots.examples) == dict.fromkeys(MOODS, 3)
        with_examples(compile_schema(SCHEMA), shots.examples)  # valid examples
    with pytest.raises(DatasetError, match="--shots 0 to"):
        draw_shots(ds, 16, eval_ids=ev.ids)


def test_shots_come_from_the_calibration_split():
    ds = Dataset("toy", SCHEMA, _split("test", 30, "test"), _split("val", 30, "val"))
    shots = draw_shots(ds, 3, seed=4)
    assert shots.split == "val" and all(i.startswith("val:") for i in shots.ids)
    assert sorted(e["output"]["mood"] for e in shots.examples) == sorted(MOODS)
    assert shots.field == "mood" and shots.k == 3
    assert draw_shots(ds, 3, seed=4).ids == shots.ids  # fixed by the seed
    d = shots.to_dict()
    assert d["ids"] == shots.ids and d["examples"] == shots.examples
    assert json.loads(json.dumps(d)) == d
    assert draw_shots(ds, 0).examples == []
    with pytest.raises(DatasetError, match="int >= 0"):
        draw_shots(ds, -1)


def test_evaluate_refuses_shots_from_the_evaluated_sample():
    pool = _split("all", 30, "row")
    ds = Dataset("toy", SCHEMA, pool, pool)
    shots = draw_shots(ds, 3)  # drawn without excluding the sample
    with pytest.raises(EvalError, match="few-shot example"):
        evaluate(SCHEMA, pool, decider=object(), baseline=False, shots=shots)  # type: ignore[arg-type]
