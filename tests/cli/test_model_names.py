"""One model-naming rule for every option and command (issue 52, item 5).

`pcd eval --cascade-wall embedded,<path>` took the word `embedded` while `pcd eval
--cascade embedded,<path>` tried to fetch a hub model called "embedded" and failed
offline. Every model name now goes through `pcd_tools.engine.load.sources.model_source`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcd_tools.engine.load import sources
from pcd_tools.engine.load.sources import EMBEDDED_MODEL_ID, model_source
from tests.eval.helpers import SCHEMA


@pytest.mark.unit
def test_model_source_names_the_embedded_model_one_way():
    for name in (None, "embedded", " Embedded ", "EMBEDDED"):
        assert model_source(name) is None
    assert model_source("/m/x.gguf") == "/m/x.gguf"
    assert model_source(Path("/m/x.gguf")) == "/m/x.gguf"
    assert model_source("mlx-community/Qwen2.5-1.5B-Instruct-4bit") == (
        "mlx-community/Qwen2.5-1.5B-Instruct-4bit"
    )
    assert model_source("./embedded") == "./embedded"  # a folder of that name


@pytest.mark.unit
def test_ray_names_none_and_embedded_the_same():
    from pcd_tools.ray.data import model_name

    assert model_name(None) == model_name("embedded") == model_name(" embedded ") == "embedded"


@pytest.fixture
def no_hub(monkeypatch):
    """Any attempt to reach the Hugging Face hub fails the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(source, *a, **kw):
        raise AssertionError(f"tried to load {source!r} from the hub")

    monkeypatch.setattr(sources, "_from_mlx", refuse)


@pytest.mark.integration
def test_decider_load_takes_the_word_embedded(no_hub):
    from pcd_tools import Decider

    assert Decider.load("embedded").model_id == EMBEDDED_MODEL_ID


@pytest.mark.integration
@pytest.mark.langchain
def test_a_cascade_stage_may_name_the_embedded_model(no_hub):
    from pcd_tools.agents.cascade import as_stage

    stage = as_stage("embedded")
    assert stage.decider.model_id == EMBEDDED_MODEL_ID


@pytest.mark.integration
@pytest.mark.langchain
def test_eval_cascade_embedded_twice_runs_offline(no_hub, tmp_path, capsys):
    from pcd_tools.cli import main

    rows = [
        {"text": t, "mood": m, "urgent": u}
        for t, m, u in [
            ("All good here, thanks.", "calm", False),
            ("This is broken again and I am furious!", "angry", True),
            ("I lost my job today.", "sad", False),
            ("Fine, nothing to report.", "calm", False),
            ("FIX IT NOW, the site is down!", "angry", True),
            ("My cat died this morning.", "sad", False),
        ]
        * 2
    ]
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    out = tmp_path / "c.json"
    argv = ["eval", "--data", str(data), "--schema", str(schema), "--n", "12", "--json"]
    argv += ["--out", str(out), "--cascade", "embedded,embedded", "--cascade-wall-n", "2"]
    assert main(argv) == 0
    capsys.readouterr()
    report = json.loads(out.read_text())
    assert report["small_only"]["accuracy"] == pytest.approx(report["large_only"]["accuracy"])
