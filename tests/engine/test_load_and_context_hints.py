"""First-hour edges (issue 34): a folder of several GGUFs is refused with the list, not
loaded by name order; `decide` given a list points at `decide_many`."""

from __future__ import annotations

import pytest

from pcd_tools import Decider
from pcd_tools.errors import InvalidContextError, ModelLoadError
from tests.conftest import tiny_decider
from tests.engine import test_gguf as g
from tests.engine.test_load_paths import SCHEMA

pytestmark = pytest.mark.engine


def test_a_folder_with_several_ggufs_is_refused_with_their_names(tmp_path):
    weights = g.hf_weights("qwen2", tied=False, seed=1)
    for name in ("qwen2.5-coder-0.5b.gguf", "qwen2.5-coder-1.5b.gguf"):
        g.write_gguf(tmp_path / name, "qwen2", weights)
    with pytest.raises(ModelLoadError) as e:
        Decider.load(str(tmp_path))
    msg = str(e.value)
    assert "holds 2 .gguf files (qwen2.5-coder-0.5b.gguf, qwen2.5-coder-1.5b.gguf)" in msg
    assert f"Decider.load('{tmp_path / 'qwen2.5-coder-1.5b.gguf'}')" in msg
    assert e.value.source == str(tmp_path)
    # naming the file loads it; a folder with exactly one GGUF loads that one
    assert Decider.load(str(tmp_path / "qwen2.5-coder-1.5b.gguf")).loaded.source == "gguf"
    (tmp_path / "qwen2.5-coder-0.5b.gguf").unlink()
    one = Decider.load(str(tmp_path))
    assert one.loaded.source == "gguf" and one.loaded.path.endswith("qwen2.5-coder-1.5b.gguf")


@pytest.mark.parametrize("contexts", [["hello", "world"], ("hello",)])
def test_decide_given_a_list_points_at_decide_many(contexts):
    d = tiny_decider(0)
    with pytest.raises(InvalidContextError, match=r"must be a str; got (list|tuple)\.") as e:
        d.decide(SCHEMA, contexts)
    assert "pass the list to decide_many(schema, contexts) (adecide_many in async code)" in str(
        e.value
    )
    assert len(d.decide_many(SCHEMA, list(contexts))) == len(contexts)


def test_other_non_strings_get_no_decide_many_hint():
    with pytest.raises(InvalidContextError) as e:
        tiny_decider(0).decide(SCHEMA, {"text": "hello"})
    assert "decide_many" not in str(e.value) and "json.dumps" in str(e.value)
