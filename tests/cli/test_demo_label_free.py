"""`pcd demo` decides with its few-shot examples and says so (on the tiny model)."""

from __future__ import annotations

import json

import pytest

from pcd_tools.cli import main
from pcd_tools.cli.demo import DEMO_EXAMPLES, demo_examples, demo_schema, label_free_line
from pcd_tools.schema import compile_schema, with_examples
from tests.eval.helpers import fake_load as _fake_load

LINE = (
    "label-free: 4 examples in the cached prefix; contextual calibration off (it hurt this schema)"
)


@pytest.mark.unit
def test_the_examples_answer_every_field_and_the_line_says_what_was_used():
    shown = with_examples(compile_schema(demo_schema()), DEMO_EXAMPLES, "DEMO_EXAMPLES")
    assert len(shown.examples) == 4
    assert [e["output"]["priority"] for e in DEMO_EXAMPLES][-1] == "P0_CRITICAL"
    assert label_free_line(4, "none") == LINE
    assert label_free_line(0, "contextual") == "label-free: no examples; contextual calibration on"


@pytest.mark.unit
def test_a_calibration_fitted_without_the_examples_turns_them_off():
    from types import SimpleNamespace

    schema = demo_schema()
    plain = compile_schema(schema).fingerprint()
    shown = with_examples(compile_schema(schema), DEMO_EXAMPLES, "x").fingerprint()
    assert demo_examples(schema) == DEMO_EXAMPLES
    assert demo_examples(schema, SimpleNamespace(schema_fingerprint=shown)) == DEMO_EXAMPLES
    assert demo_examples(schema, SimpleNamespace(schema_fingerprint=plain)) == []


@pytest.mark.engine
def test_demo_prints_the_label_free_line_and_json_says_it_too(monkeypatch, capsys):
    from pcd_tools.decide.decider import Decider
    from tests.conftest import tiny_decider

    monkeypatch.setattr(Decider, "load", _fake_load(tiny_decider(0)))  # its own prefix cache
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert LINE in out and out.index("value: ") < out.index(LINE)
    assert "prefix_cache_hit=False" in out and "prefix_cache_hit=True" in out
    monkeypatch.setattr(Decider, "load", _fake_load(tiny_decider(0)))
    assert main(["demo", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["label_free"] == {"examples": 4, "calibration": "none"}
    assert data["warm"]["prefix_cache_hit"] is True and data["cold"]["prefix_cache_hit"] is False
