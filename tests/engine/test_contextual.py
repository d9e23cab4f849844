"""Label-free calibration on the tiny model: contextual calibration and PMI equal brute
force, remove an injected answer prior, are cached per plan, and combine with the rest."""

from __future__ import annotations

import asyncio
import json
from typing import ClassVar

import numpy as np
import pytest

from pcd_tools import StructuredSchema
from pcd_tools.answers.calibration import Calibration, CalibrationError, CalibrationMismatchError
from pcd_tools.decide.contextual import CONTENT_FREE
from pcd_tools.decide.decider import Decider
from pcd_tools.decide.orders import orderings
from pcd_tools.engine.load.sources import LoadedModel
from pcd_tools.errors import InvalidArgumentError
from pcd_tools.schema import compile_schema, with_examples
from tests.conftest import ByteTokenizer, make_tiny_model, tiny_decider
from tests.engine.test_exactness import CONTEXT
from tests.engine.test_exactness_kinds import SUBS, Routed, Tagged, Triage
from tests.oracle import oracle_log_scores, softmax
from tests.schemas import Ticket

pytestmark = pytest.mark.engine

EXAMPLES = [
    (
        "Everything is broken!",
        {"priority": "P0_CRITICAL", "requires_escalation": True, "department": "TECHNICAL"},
    )
]


def _p(d, name):
    return np.array(list(d.fields[name].distribution.values()))


def _log_softmax(z):
    return np.log(softmax(z))


def contextual_ref(decider, sch, ctx, field, texts=None, inputs=CONTENT_FREE):
    """Brute force: one full prompt per candidate, for the context and each content-free
    input; `log p_cf` is the mean of the inputs' log-probabilities (geometric mean)."""
    z = oracle_log_scores(decider, sch, ctx, field, texts=texts)
    cf = [_log_softmax(oracle_log_scores(decider, sch, t, field, texts=texts)) for t in inputs]
    return softmax(z - np.mean(cf, axis=0))


def pmi_ref(decider, sch, ctx, field, texts=None):
    z = oracle_log_scores(decider, sch, ctx, field, texts=texts)
    return softmax(z - oracle_log_scores(decider, sch, "", field, texts=texts))


@pytest.fixture(scope="module")
def ctxl():
    return tiny_decider(0).with_calibration("contextual")


def test_contextual_and_pmi_equal_full_prompts(tiny):
    sch = with_examples(compile_schema(Ticket), EXAMPLES)
    con = tiny.decide(sch, CONTEXT, calibration="contextual")
    pmi = tiny.decide(sch, CONTEXT, scoring="pmi")
    raw = tiny.decide(sch, CONTEXT)
    for f in sch.fields:
        want = contextual_ref(tiny, sch, CONTEXT, f.name)
        assert np.abs(_p(con, f.name) - want).max() < 1e-4, f.name
        assert con.fields[f.name].label == f.choices[int(np.argmax(want))].label
        assert np.abs(_p(pmi, f.name) - pmi_ref(tiny, sch, CONTEXT, f.name)).max() < 1e-4
    assert (con.calibration_method, con.scoring, pmi.calibration_method, pmi.scoring) == (
        "contextual",
        "full",
        "none",
        "pmi",
    )
    assert max(np.abs(_p(con, n) - _p(raw, n)).max() for n in con.fields) > 1e-3
    resp = con.to_response()
    assert resp["calibration_method"] == "contextual" and resp["examples"] == 1
    json.dumps(resp)


def test_the_arithmetic_mean_is_the_papers_rule(tiny):
    sch = compile_schema(Ticket)
    d = tiny.with_content_free(CONTENT_FREE, mean="arithmetic").decide(
        sch, CONTEXT, calibration="contextual"
    )
    for f in sch.fields:
        z = oracle_log_scores(tiny, sch, CONTEXT, f.name)
        p_cf = np.mean([softmax(oracle_log_scores(tiny, sch, t, f.name)) for t in CONTENT_FREE], 0)
        assert np.abs(_p(d, f.name) - softmax(z - np.log(p_cf))).max() < 1e-4


def test_constrained_contextual_uses_constrained_content_free_scores(tiny):
    sch = compile_schema(Ticket)
    d = tiny.decide(sch, CONTEXT, scoring="constrained", calibration="contextual", temperature=0.7)
    raw = tiny.decide(sch, CONTEXT, scoring="constrained")
    cf = [tiny.decide(sch, t, scoring="constrained", allow_empty=True) for t in CONTENT_FREE]
    for f in sch.fields:
        log_cf = np.mean([_log_softmax(c.fields[f.name].log_scores) for c in cf], axis=0)
        want = softmax(np.array(raw.fields[f.name].log_scores) - log_cf, 0.7)
        assert np.abs(_p(d, f.name) - want).max() < 1e-5


# --- an injected answer prior ------------------------------------------------------------

WORDS = ["true,", "false,", '"red",', '"green",', '"blue",']
LIGHT = StructuredSchema(
    {
        "ok": {"type": "boolean", "description": "Whether it works"},
        "color": {"type": "enum", "choices": ["red", "green", "blue"], "description": "Colour"},
    }
)


class WordTokenizer(ByteTokenizer):
    """Bytes, except that each candidate's literal and comma is one token: every
    candidate of `LIGHT` is then a single token after its field's stem."""

    vocab_size = 259 + len(WORDS)
    ids: ClassVar[dict[str, int]] = {w: 259 + i for i, w in enumerate(WORDS)}

    def encode(self, text):
        out, i = [], 0
        while i < len(text):
            for w in WORDS:
                if text.startswith(w, i):
                    out.append(self.ids[w])
                    i += len(w)
                    break
            else:
                out.extend(text[i].encode())
                i += 1
        return out

    def decode(self, ids):
        words = {v: k for k, v in self.ids.items()}
        return "".join(words.get(i, chr(i) if i < 256 else "") for i in ids)


def _word_decider(bias):
    model = make_tiny_model(0, vocab=WordTokenizer.vocab_size, bias=bias)
    loaded = LoadedModel(
        model=model,
        tokenizer=WordTokenizer(),
        model_id="tiny-words",
        source="test",
        path="",
        model_type="llama",
        context_window=8192,
        dtype="float32",
        device="cpu",
    )
    return Decider(loaded)


@pytest.fixture(scope="module")
def prior_pair():
    ids = WordTokenizer.ids
    bias = {ids["true,"]: 3.0, ids['"red",']: -2.5, ids['"blue",']: 2.0}
    return _word_decider(None), _word_decider(bias)


TEXTS = ["The sky was clear and everything worked.", "Nothing works; it is all red.", "ok"]


def test_contextual_calibration_removes_an_injected_logit_prior(prior_pair):
    plain, biased = prior_pair
    for i, text in enumerate(TEXTS):
        a, b = plain.decide(LIGHT, text), biased.decide(LIGHT, text)
        if i == 0:  # the prior moves the raw distributions
            assert max(np.abs(_p(a, n) - _p(b, n)).max() for n in a.fields) > 0.05
        for kw in ({"calibration": "contextual"}, {"scoring": "pmi"}):
            a, b = plain.decide(LIGHT, text, **kw), biased.decide(LIGHT, text, **kw)
            for n in a.fields:
                assert np.abs(_p(a, n) - _p(b, n)).max() <= 1e-5, (kw, n)
    # one content-free input: the paper's arithmetic mean is the same, and as exact
    one_a = plain.with_content_free(["N/A"], mean="arithmetic")
    one_b = biased.with_content_free(["N/A"], mean="arithmetic")
    a = one_a.decide(LIGHT, TEXTS[0], calibration="contextual")
    b = one_b.decide(LIGHT, TEXTS[0], calibration="contextual")
    assert all(np.abs(_p(a, n) - _p(b, n)).max() <= 1e-5 for n in a.fields)


# --- the cache -----------------------------------------------------------------------------


def test_content_free_passes_run_once_per_plan(monkeypatch):
    d = tiny_decider(0)
    sch = compile_schema(Ticket)
    runs = []
    real = d.engine.score

    def spy(schema, contexts, **kw):
        runs.append(list(contexts))
        return real(schema, contexts, **kw)

    monkeypatch.setattr(d.engine, "score", spy)
    first = d.decide(sch, CONTEXT, calibration="contextual")
    assert runs == [list(CONTENT_FREE), [CONTEXT]]
    assert first.content_free_ms > 0 and first.batch.content_free_ms == first.content_free_ms
    assert d.content_free.stats["misses"] == 1 and len(d.content_free) == 1
    again = d.decide_many(sch, ["a", "b"], calibration="contextual")
    again.append(d.decide(sch, "c", scoring="pmi"))  # "" is one of the cached inputs
    assert runs[2:] == [["a", "b"], ["c"]]
    assert all(x.content_free_ms == 0.0 for x in again)
    assert d.content_free.stats["misses"] == 1
    assert first.to_response()["content_free_ms"] > 0
    # examples and listing orders are other plans, with their own content-free scores
    d.decide(sch, CONTEXT, calibration="contextual", examples=EXAMPLES)
    assert d.content_free.stats["misses"] == 2 and len(d.content_free) == 2
    d.decide(sch, CONTEXT, calibration="contextual", orders=2)
    assert d.content_free.stats["misses"] == 4 and len(d.content_free) == 4
    small = d.with_content_free(["N/A"])
    assert small.content_free is not d.content_free and len(small.content_free) == 0
    d.content_free.max_plans = 1
    d.decide(sch, CONTEXT, calibration="contextual", examples=[])
    d.decide(sch, "x", calibration="contextual", choice_order={"priority": [3, 2, 1, 0]})
    assert len(d.content_free) == 1


# --- kinds, orders and fitted calibrations ----------------------------------------------------


def test_multilabel_labels_are_corrected_one_by_one(ctxl):
    d = ctxl.decide(Tagged, CONTEXT)
    sch = compile_schema(Tagged)
    for label in ("billing", "bug", "refund"):
        stem = f'\n  "tags": {{"{label}": '
        want = contextual_ref(ctxl, sch, CONTEXT, "tags", texts=[stem + "true,", stem + "false,"])
        assert abs(d.fields["tags"].labels[label] - want[0]) < 1e-4, label
    assert abs(_p(d, "urgent") - contextual_ref(ctxl, sch, CONTEXT, "urgent")).max() < 1e-4


def test_later_waves_are_corrected_after_the_corrected_earlier_answers(ctxl):
    sch = compile_schema(Routed)
    d = ctxl.decide(Routed, CONTEXT)
    cat = d.fields["category"].label
    assert (
        cat
        == sch.field("category").labels[
            int(np.argmax(contextual_ref(ctxl, sch, CONTEXT, "category")))
        ]
    )
    texts = [f'\n  "category": "{cat}",\n  "sub": "{c}",' for c in sch.field("sub").labels]
    want = contextual_ref(ctxl, sch, CONTEXT, "sub", texts=texts)
    assert np.abs(_p(d, "sub") - want).max() < 1e-4
    sub = d.fields["sub"].label
    before = f'\n  "category": "{cat}",\n  "sub": "{sub}",'
    texts = [f'{before}\n  "team": "{c}",' for c in sch.field("team").labels]
    assert (
        np.abs(_p(d, "team") - contextual_ref(ctxl, sch, CONTEXT, "team", texts=texts)).max() < 1e-4
    )


def test_a_joint_table_multiplies_corrected_conditionals(ctxl):
    sch = compile_schema(Triage)
    d = ctxl.decide(Triage, CONTEXT)
    p_cat = contextual_ref(ctxl, sch, CONTEXT, "category")
    want = {}
    for i, (cat, subs) in enumerate(SUBS.items()):
        texts = [f'\n  "category": "{cat}",\n  "subcategory": "{s}",' for s in subs]
        cond = (
            contextual_ref(ctxl, sch, CONTEXT, "subcategory", texts=texts)
            if len(subs) > 1
            else [1.0]
        )
        for s, pc in zip(subs, cond):
            want[(cat, s)] = p_cat[i] * pc
    got = d.joint[("category", "subcategory")]
    assert max(abs(got[k] - want[k]) for k in want) < 1e-4
    assert (d.fields["category"].label, d.fields["subcategory"].label) == max(want, key=want.get)


def test_orders_average_the_corrected_distributions(ctxl):
    sch = compile_schema(Ticket)
    avg = ctxl.decide(Ticket, CONTEXT, orders=2)
    runs = [ctxl.decide(Ticket, CONTEXT, choice_order=o) for o in orderings(sch, 2)]
    for f in sch.fields:
        want = np.mean([_p(r, f.name) for r in runs], axis=0)
        assert np.abs(_p(avg, f.name) - want).max() < 1e-6
    assert avg.calibration_method == "contextual" and avg.orders == 2


def _fitted(label_free="none", **kw):
    sch = compile_schema(Ticket)
    return Calibration(
        model_id="tiny-llama-0",
        schema_name=sch.name,
        schema_fingerprint=sch.fingerprint(),
        temperatures={"priority": 2.0},
        label_free=label_free,
        **kw,
    )


def test_a_fitted_calibration_applies_after_the_correction(tiny):
    fitted = tiny.with_calibration(_fitted("contextual"))
    assert fitted.label_free == "contextual"  # fitted on top of it: turned on
    d = fitted.decide(Ticket, CONTEXT, temperature=0.5)
    plain = tiny.decide(Ticket, CONTEXT, calibration="contextual")
    z = np.array(plain.fields["priority"].log_scores)  # the corrected scores
    assert np.abs(_p(d, "priority") - softmax(z / 2.0, 0.5)).max() < 1e-9
    assert d.calibrated and d.calibration_method == "contextual"
    pmi = tiny.with_calibration(_fitted("pmi", scoring="pmi")).decide(
        Ticket, CONTEXT, scoring="pmi"
    )
    z = np.array(tiny.decide(Ticket, CONTEXT, scoring="pmi").fields["priority"].log_scores)
    assert np.abs(_p(pmi, "priority") - softmax(z / 2.0)).max() < 1e-9


def test_a_fitted_calibration_refuses_another_correction(tiny):
    on_raw = tiny.with_calibration(_fitted("none"))
    with pytest.raises(
        CalibrationMismatchError,
        match=r"fitted on top of label-free correction 'none'.*'contextual'",
    ):
        on_raw.decide(Ticket, CONTEXT, calibration="contextual")
    with pytest.raises(CalibrationMismatchError, match="'pmi'"):
        on_raw.decide(Ticket, CONTEXT, scoring="pmi")
    with pytest.raises(CalibrationMismatchError, match="calibration='contextual'"):
        tiny.with_calibration(_fitted("contextual")).decide(Ticket, CONTEXT, calibration="none")
    with pytest.raises(CalibrationMismatchError):
        tiny.with_calibration("contextual").with_calibration(_fitted("none"))
    with pytest.raises(CalibrationMismatchError):
        on_raw.with_calibration("contextual")
    with pytest.raises(CalibrationMismatchError, match="scoring='pmi'"):
        tiny.with_calibration(_fitted("pmi")).decide(Ticket, CONTEXT)


@pytest.mark.unit
def test_the_calibration_file_records_the_label_free_correction(tmp_path):
    path = _fitted("contextual").save(tmp_path / "cal.json")
    assert json.loads(path.read_text())["label_free"] == "contextual"
    assert Calibration.load(path).label_free == "contextual"
    raw = json.loads(path.read_text())
    raw.pop("label_free")
    path.write_text(json.dumps(raw))
    assert Calibration.load(path).label_free == "none"  # files from before it: none
    path.write_text(json.dumps(dict(raw, label_free="magic")))
    with pytest.raises(CalibrationError, match=r"unknown label_free 'magic'.*'contextual'"):
        Calibration.load(path)


def test_bad_label_free_arguments_are_typed_errors(tiny, ctxl):
    with pytest.raises(InvalidArgumentError, match="scoring='pmi' with contextual calibration"):
        tiny.decide(Ticket, CONTEXT, scoring="pmi", calibration="contextual")
    with pytest.raises(InvalidArgumentError, match="asked by the decider"):
        ctxl.decide(Ticket, CONTEXT, scoring="pmi")
    with pytest.raises(InvalidArgumentError, match="asked by the decider"):
        asyncio.run(ctxl.adecide(Ticket, CONTEXT, scoring="pmi"))
    assert ctxl.decide(Ticket, CONTEXT, scoring="pmi", calibration="none").scoring == "pmi"
    with pytest.raises(InvalidArgumentError, match=r"unknown calibration 'platt'.*'contextual'"):
        tiny.decide(Ticket, CONTEXT, calibration="platt")
    with pytest.raises(InvalidArgumentError, match="'full', 'constrained', 'pmi'"):
        tiny.decide(Ticket, CONTEXT, scoring="calibrated")
    with pytest.raises(InvalidArgumentError, match="non-empty list of str"):
        tiny.with_content_free("N/A")
    with pytest.raises(InvalidArgumentError, match="distinct str"):
        tiny.with_content_free(["N/A", "N/A"])
    with pytest.raises(InvalidArgumentError, match="unknown mean 'median'"):
        tiny.with_content_free(["N/A"], mean="median")
    with pytest.raises(InvalidArgumentError, match="'contextual', 'none', a Calibration"):
        tiny.with_calibration(3.5)


def test_async_and_many_equal_decide(ctxl):
    one = ctxl.decide(Ticket, CONTEXT)
    many = ctxl.decide_many(Ticket, ["x", CONTEXT])[1]
    via_async = asyncio.run(ctxl.adecide(Ticket, CONTEXT))
    pmi = asyncio.run(ctxl.adecide_many(Ticket, [CONTEXT], scoring="pmi", calibration="none"))[0]
    for n in one.fields:
        assert np.abs(_p(one, n) - _p(many, n)).max() < 1e-4
        assert np.abs(_p(one, n) - _p(via_async, n)).max() < 1e-4
        assert (
            np.abs(
                _p(pmi, n) - _p(ctxl.decide(Ticket, CONTEXT, scoring="pmi", calibration="none"), n)
            ).max()
            < 1e-4
        )
    assert via_async.calibration_method == "contextual" and pmi.scoring == "pmi"
