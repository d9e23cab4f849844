"""The real embedded model (SmolLM2-135M-Instruct, float32): exactness, API, bad input."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from pcd_tools import ContextTooLongError, ModelLoadError, StructuredSchema, run_parallel_generation
from pcd_tools.errors import InvalidArgumentError, InvalidContextError
from pcd_tools.schema import compile_schema
from tests.oracle import oracle_log_scores, softmax
from tests.schemas import Ticket, hs_codes, wide_schema_dict

pytestmark = pytest.mark.integration

OUTAGE = (
    "Our whole production cluster has been down since 3am and every customer is affected. "
    "We lose $50k per hour. Please page someone immediately!"
)


def test_ticket_equals_one_full_prompt_per_candidate(real):
    sch = compile_schema(Ticket)
    d = real.decide(sch, OUTAGE)
    worst = 0.0
    for f in sch.fields:
        z = oracle_log_scores(real, sch, OUTAGE, f.name)
        np.testing.assert_allclose(d.fields[f.name].log_scores, z, atol=2e-3)
        p = np.array(list(d.fields[f.name].distribution.values()))
        worst = max(worst, float(np.abs(p - softmax(z)).max()))
    assert worst < 1e-4, worst


def test_28_fields_match_the_reference(real):
    sch = StructuredSchema(wide_schema_dict(28)).schema
    d = real.decide(sch, OUTAGE)
    assert d.sequential_forward_passes <= 3
    for name in sch.field_names:
        z = oracle_log_scores(real, sch, OUTAGE, name, share_prompt=True)
        p = np.array(list(d.fields[name].distribution.values()))
        assert np.abs(p - softmax(z)).max() < 1e-4, name
    for name in ("flag_0", "enum_10"):  # a boolean and BILLING / BILLING_DISPUTE, full prompts
        z = oracle_log_scores(real, sch, OUTAGE, name)
        np.testing.assert_allclose(d.fields[name].log_scores, z, atol=2e-3)


def test_255_choice_field_matches_the_reference(real):
    sch = StructuredSchema(
        {"hs_code": {"type": "enum", "choices": hs_codes(255), "description": "HS code"}}
    ).schema
    ctx = "Pure-bred breeding horses, live."
    d = real.decide(sch, ctx, scoring="full")  # the default ("auto") scores this field constrained
    assert d.fields["hs_code"].scoring == "full"
    z = oracle_log_scores(real, sch, ctx, "hs_code", share_prompt=True)
    p = np.array(list(d.fields["hs_code"].distribution.values()))
    assert np.abs(p - softmax(z)).max() < 1e-4
    sample = [0, 77, 254]
    zf = oracle_log_scores(real, sch, ctx, "hs_code", only=sample)
    np.testing.assert_allclose(np.array(d.fields["hs_code"].log_scores)[sample], zf, atol=2e-3)


def test_value_types_response_and_seed_api(real):
    d = real.decide(Ticket, OUTAGE)
    assert isinstance(d.value, Ticket)
    assert isinstance(d.value.requires_escalation, bool)
    assert d.confidence == min(f.probability for f in d.fields.values())
    resp = d.to_response()
    json.dumps(resp)  # serialisable
    assert resp["parsed_json"]["requires_escalation"]["value"] in (True, False)
    assert resp["field_telemetry"]["priority"]["cardinality"] == 4
    assert resp["is_valid_json"] and resp["schema_match"]
    assert resp["prefill_ms"] > 0 and resp["suffix_eval_ms"] > 0
    assert resp["elapsed_ms"] >= resp["prefill_ms"] + resp["suffix_eval_ms"] - 1
    seed = run_parallel_generation(OUTAGE, compile_schema(Ticket), decider=real)
    # the same answers; probabilities to 1e-4, as parity anywhere: the float32 products'
    # last bits follow the thread count, which the tuner sets by the machine's load
    assert seed["parsed_json"].keys() == resp["parsed_json"].keys()
    for name, got in seed["parsed_json"].items():
        assert got["value"] == resp["parsed_json"][name]["value"]
        assert got["prob"] == pytest.approx(resp["parsed_json"][name]["prob"], abs=1e-4)


def test_attention_time_is_metered_per_decision(real):
    """`attention_ms`: the request's time in the attention kernel, a part of its prefill
    and fields passes, that grows faster than they do with the input; a batch's shares
    add up to its total, and the JSON answer carries it."""
    short = real.decide(Ticket, OUTAGE)
    long = real.decide(Ticket, " ".join([OUTAGE] * 12))
    for d in (short, long):
        assert 0 < d.attention_ms < d.prefill_ms + d.suffix_eval_ms
        assert d.to_response()["attention_ms"] == round(d.attention_ms, 3)
    engine_ms = [d.prefill_ms + d.suffix_eval_ms for d in (short, long)]
    assert long.attention_ms / short.attention_ms > engine_ms[1] / engine_ms[0]
    many = real.decide_many(Ticket, [OUTAGE, "Printer jam on floor 2.", "Refund please."])
    assert many[0].batch is not None and many[0].batch.attention_ms > 0
    assert sum(d.attention_ms for d in many) == pytest.approx(many[0].batch.attention_ms)
    assert many[0].batch.to_dict()["attention_ms"] == round(many[0].batch.attention_ms, 3)


def test_unicode_and_empty_contexts(real):
    for ctx in ("", "Ünïcødé ✓ 日本語のチケット 🚨🔥 — «urgent»\n\t\u200b", "\x00 control \x7f"):
        d = real.decide(Ticket, ctx, allow_empty=True)
        assert all(np.isfinite(list(f.distribution.values())).all() for f in d.fields.values())
    with pytest.raises(InvalidContextError, match="allow_empty=True"):
        real.decide(Ticket, "")


def test_context_too_long_states_both_lengths_and_never_truncates(real):
    long_ctx = "word " * 9000
    with pytest.raises(ContextTooLongError) as e:
        real.decide(Ticket, long_ctx)
    assert e.value.max_tokens == 8192
    assert e.value.prompt_tokens > 8192
    assert str(e.value.prompt_tokens) in str(e.value) and "8192" in str(e.value)


@pytest.mark.parametrize("bad", [None, 42, b"bytes", ["list"]])
def test_non_string_context_is_a_typed_error(real, bad):
    with pytest.raises(InvalidContextError, match="must be a str"):
        real.decide(Ticket, bad)


@pytest.mark.parametrize("t", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_bad_temperature_is_refused(real, t):
    with pytest.raises(InvalidArgumentError, match="temperature"):
        real.decide(Ticket, "x", temperature=t)


def test_bad_scoring_is_refused(real):
    with pytest.raises(InvalidArgumentError, match="'full', 'constrained'"):
        real.decide(Ticket, "x", scoring="greedy")


def test_threads_never_interleave_model_use(real):
    ctxs = [
        OUTAGE,
        "Please update my billing address.",
        "I was charged twice!",
        "Feature request: dark mode",
    ]
    expected = [real.decide(Ticket, c).fields["priority"].log_scores for c in ctxs]
    got: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            got[i] = real.decide(Ticket, ctxs[i % 4]).fields["priority"].log_scores
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(8):
        np.testing.assert_allclose(got[i], expected[i % 4], atol=1e-4)


def test_model_load_errors_name_the_source_and_the_fix(tmp_path):
    from pcd_tools import Decider

    with pytest.raises(ModelLoadError, match=r"does not exist.*\.gguf"):
        Decider.load(str(tmp_path / "missing.gguf"))
    empty = tmp_path / "empty_model"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        Decider.load(str(empty))
    with pytest.raises(ModelLoadError) as e:
        Decider.load("mlx-community/definitely-not-a-real-model-pcd-tools")
    assert "definitely-not-a-real-model" in str(e.value)
    assert "Load a local model instead" in str(e.value) and ".gguf" in str(e.value)
