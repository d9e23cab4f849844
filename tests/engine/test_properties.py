"""Property-based invariants of the engine on the tiny model (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcd_tools import StructuredSchema
from pcd_tools.engine.passes.pack import pack_parts, split_trie
from pcd_tools.schema import compile_schema
from tests.conftest import tiny_decider

pytestmark = pytest.mark.engine

SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

_DECIDER = None


def decider():
    global _DECIDER
    if _DECIDER is None:
        # numpy kernels off: small passes use MLX's own ops and large ones would not, and
        # the random tiny model amplifies the ~1e-7 difference (cpu_kernels has its own tests)
        _DECIDER = tiny_decider(seed=3, cpu_kernels=False)
    return _DECIDER


choice_text = st.text(alphabet="ABCD_xy01", min_size=1, max_size=6).filter(
    lambda s: s.strip() != ""
)


@st.composite
def schemas(draw):
    n = draw(st.integers(1, 4))
    spec = {}
    for i in range(n):
        if draw(st.booleans()):
            spec[f"f{i}"] = {
                "type": "boolean",
                "description": draw(st.sampled_from(["", "flag", "Is it so?"])),
            }
        else:
            base = draw(st.lists(choice_text, min_size=2, max_size=6, unique=True))
            # add choices that extend others (shared prefixes, e.g. BILLING / BILLING_DISPUTE)
            extra = [c + "_X" for c in base[:2] if c + "_X" not in base]
            spec[f"f{i}"] = {
                "type": "enum",
                "choices": base + extra,
                "optional": draw(st.booleans()),
            }
    return StructuredSchema(spec).schema


contexts = st.text(min_size=0, max_size=40)  # empty text too: decided with allow_empty=True


@SETTINGS
@given(schema=schemas(), context=contexts, temperature=st.floats(0.05, 20.0))
def test_probabilities_are_finite_sum_to_one_and_values_are_declared(schema, context, temperature):
    d = decider().decide(schema, context, temperature=temperature, allow_empty=True)
    for f in schema.fields:
        r = d.fields[f.name]
        probs = np.array(list(r.distribution.values()))
        assert np.all(np.isfinite(probs)) and np.all(probs >= 0)
        assert abs(probs.sum() - 1.0) < 1e-9
        assert list(r.distribution) == f.labels
        assert r.label in f.labels
        assert r.value in [c.value for c in f.choices]
        assert math.isfinite(r.entropy) and 0.0 <= r.margin <= 1.0
    # the built value validates against the model
    assert type(d.value).model_validate(d.value.model_dump()) == d.value


@SETTINGS
@given(schema=schemas(), context=contexts, t1=st.floats(0.01, 50.0), t2=st.floats(0.01, 50.0))
def test_argmax_does_not_depend_on_temperature(schema, context, t1, t2):
    decider().decide(
        schema, context, allow_empty=True
    )  # warm the prefix cache: both calls then run the same graph
    a = decider().decide(schema, context, temperature=t1, allow_empty=True)
    b = decider().decide(schema, context, temperature=t2, allow_empty=True)
    for f in schema.fields:
        assert a.fields[f.name].label == b.fields[f.name].label
        np.testing.assert_allclose(
            a.fields[f.name].log_scores, b.fields[f.name].log_scores, atol=1e-9
        )


def _dists(d):
    return {n: np.array(list(f.distribution.values())) for n, f in d.fields.items()}


@SETTINGS
@given(schema=schemas(), context=contexts, seed=st.integers(0, 1000))
def test_result_does_not_depend_on_pass_arrangement(schema, context, seed):
    dec = decider()
    ref = _dists(dec.decide(schema, context, mode="sequential", allow_empty=True))
    for mode in ("packed", "batched"):
        got = _dists(dec.decide(schema, context, mode=mode, allow_empty=True))
        for n in ref:
            np.testing.assert_allclose(got[n], ref[n], atol=1e-4)
    # packed with the fields in a random order, and split one chunk per field
    plan = dec.engine.plan(schema)
    saved = plan.chunks
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(len(plan.tries))]
    try:
        whole = [[(i, list(range(plan.tries[i].n_nodes)))] for i in order]
        split = [[(i, part)] for i in order for part in split_trie(plan.tries[i], 3)]
        one_chunk = [[p for g in whole for p in g]]
        one_chunk_split = [[p for g in split for p in g]]
        for layout in (one_chunk, whole, split, one_chunk_split):
            plan.chunks = [pack_parts(plan.tries, g) for g in layout]
            got = _dists(dec.decide(schema, context, mode="packed", allow_empty=True))
            for n in ref:
                np.testing.assert_allclose(got[n], ref[n], atol=1e-4)
    finally:
        plan.chunks = saved
    # inside decide_many, next to other contexts of other lengths
    many = dec.decide_many(
        schema, ["other", context, "a longer neighbour " * 3], batch_size=3, allow_empty=True
    )
    got = _dists(many[1])
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], atol=1e-4)


def test_ties_go_to_the_first_declared_candidate():
    from pcd_tools.decide.decider import Decider
    from pcd_tools.engine.host.blas import import_mlx
    from pcd_tools.engine.load.sources import LoadedModel
    from tests.conftest import ByteTokenizer, make_tiny_model

    mx = import_mlx()
    model = make_tiny_model(seed=5)
    model.lm_head.weight = mx.zeros_like(model.lm_head.weight)  # every logit 0: exact ties
    dec = Decider(
        LoadedModel(model, ByteTokenizer(), "flat", "test", "", "llama", 4096, "float32", "cpu")
    )
    for choices in (["b", "a", "c"], ["c", "a", "b"]):
        d = dec.decide(compile_schema({"p": {"type": "enum", "choices": choices}}), "x")
        assert len(set(d.fields["p"].log_scores)) == 1
        assert d.fields["p"].label == choices[0]
        assert d.fields["p"].probability == pytest.approx(1 / 3)
    flag = dec.decide(compile_schema({"ok": {"type": "boolean"}}), "x")
    # "true" and "false" differ in length, so no tie: each byte costs log(1/V)
    assert flag.fields["ok"].label is True
