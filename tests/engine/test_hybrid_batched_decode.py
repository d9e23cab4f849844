"""`decide_many` on schemas with generated fields: the contexts of a batch decode in
lockstep through native int8 steps (`decode="int8"`), or one after the other on MLX
(`decode="mlx"`). Both give what `decide` gives context by context, and the scored
fields after generated text stay exact against one full prompt per candidate."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_tools.engine.decode.native_steps import decoder_for
from pcd_tools.errors import GenerationLimitError
from tests.conftest import tiny_decider
from tests.engine.test_exactness import CONTEXT
from tests.engine.test_hybrid import Reasoned, _check_scored_after

pytestmark = pytest.mark.engine

TEXTS = [CONTEXT, "short", "Please cancel my plan today, it is too expensive.", "x" * 40]


@pytest.fixture(scope="module", params=["int8", "mlx"])
def decider(request):
    d = tiny_decider(0, decode=request.param)
    assert (decoder_for(d.engine) is not None) == (request.param == "int8")
    return d


def test_decide_many_equals_decide_context_by_context(decider):
    many = decider.decide_many(Reasoned, TEXTS, batch_size=4)
    assert {d.batch.size for d in many} == {4}
    for text, m in zip(TEXTS, many):
        one = decider.decide(Reasoned, text)
        assert m.json_text == one.json_text
        for name in ("reasoning", "reply"):
            assert m.fields[name].tokens == one.fields[name].tokens
            assert m.fields[name].mean_logprob == pytest.approx(one.fields[name].mean_logprob)
        for name in ("decision", "urgent", "tier"):
            a = np.array(list(m.fields[name].distribution.values()))
            b = np.array(list(one.fields[name].distribution.values()))
            assert np.abs(a - b).max() < 1e-4


def test_scored_fields_after_lockstep_generation_equal_full_prompts(decider):
    # the batch's other contexts decode alongside; CONTEXT's cache must be exact anyway
    d = decider.decide_many(Reasoned, TEXTS, batch_size=4)[0]
    for name in ("decision", "urgent", "tier"):
        assert _check_scored_after(decider, Reasoned, d, name) < 1e-4


def test_lockstep_steps_once_per_token_for_the_whole_batch():
    native = tiny_decider(0, decode="int8").decide_many(Reasoned, TEXTS, batch_size=4)
    one = [tiny_decider(0, decode="int8").decide(Reasoned, t) for t in TEXTS]
    steps = sum(d.sequential_forward_passes for d in one)
    # each context's calls in sequence, against one step per token for all contexts
    assert native[0].sequential_forward_passes < steps
    assert {d.sequential_forward_passes for d in native} == {native[0].sequential_forward_passes}
    longest = max(d.fields["reasoning"].tokens for d in native)
    assert native[0].sequential_forward_passes >= longest + 4  # 4 keys, then the steps


def test_the_token_limit_names_the_same_context_on_both_paths():
    texts = ["a much longer context than the other one, about a refund", "x"]
    got = []
    for mode in ("int8", "mlx"):
        with pytest.raises(GenerationLimitError) as e:
            tiny_decider(0, decode=mode).decide_many(Reasoned, texts, max_new_tokens=2)
        got.append((e.value.field, e.value.limit, e.value.context_index))
    # every context reaches the limit at its second token: the first in the batch (the
    # shortest, contexts are batched by length) is named, as row by row
    assert got == [("reasoning", 2, 1), ("reasoning", 2, 1)]
