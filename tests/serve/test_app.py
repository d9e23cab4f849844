"""The HTTP app on a live uvicorn server with the tiny model: auth, limits, errors,
micro-batching, cancellation, metrics."""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from pcd_tools.serve.app import create_app

pytestmark = pytest.mark.serve

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this about billing?"},
    "tone": {"type": "choice", "criteria": {"calm": None, "angry": "an upset customer"}},
    "urgency": {"type": "score", "criteria": ["can wait", "this week", "today"]},
}
SCHEMA = {
    "priority": {"type": "enum", "choices": ["P0", "P1", "P2"], "description": "Urgency"},
    "escalate": {"type": "boolean", "description": "Page on-call?"},
}


@pytest.fixture(scope="module")
def server(tiny, live):
    app = create_app(tiny, api_key=KEY, max_body_bytes=20_000, max_queue=3)
    with live(app) as url:
        yield url, app.state.pcd


def _so(url, state, headers=AUTH, **kw):
    return httpx.post(
        url + "/v1/systemone", json={"state": state, "questions": QUESTIONS}, headers=headers, **kw
    )


def _error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"]
    return err


def test_systemone_answers_match_the_library(server, tiny):
    url, _ = server
    r = _so(url, "I was charged twice. Please refund me.")
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == tiny.model_id
    assert list(body["answers"]) == ["billing", "tone", "urgency"]
    from pcd_tools.serve.systemone import parse_request

    req = parse_request({"state": "I was charged twice. Please refund me.", "questions": QUESTIONS})
    d = tiny.decide(req.schema, req.context)
    assert body["answers"]["billing"]["noul"] == pytest.approx(
        d.fields["billing"].distribution[True], abs=1e-5
    )
    urg = d.fields["urgency"].distribution
    assert body["answers"]["urgency"]["score"] == pytest.approx(
        sum(k * p for k, p in urg.items()), abs=1e-5
    )
    assert body["answers"]["tone"]["choice"] == d.fields["tone"].label
    assert body["usage"] == {"input_tokens": d.prompt_tokens, "output_tokens": 0}


def test_one_allowed_value_is_answered_alike_on_both_endpoints(server, tiny):
    # README, "One allowed value": scored in the pass, probability 1, on every entry point
    url, _ = server
    questions = {**QUESTIONS, "team": {"type": "choice", "criteria": {"billing": None}}}
    r = httpx.post(
        url + "/v1/systemone", headers=AUTH, json={"state": "Refund me.", "questions": questions}
    )
    assert r.status_code == 200, r.text
    team = r.json()["answers"]["team"]
    assert team == {
        "type": "choice",
        "choice": "billing",
        "probabilities": {"billing": 1.0},
        "confidence": 1.0,
    }
    schema = {**SCHEMA, "team": {"type": "enum", "choices": ["billing"]}}
    tiny.engine.clear_cache()  # both requests below cold: a prefill, then the fields pass
    r = httpx.post(url + "/v1/decide", headers=AUTH, json={"schema": schema, "context": "x"})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["parsed_json"]["team"] == {"value": "billing", "prob": 1.0}
    assert got["field_telemetry"]["team"]["cardinality"] == 1
    tiny.engine.clear_cache()
    want = tiny.decide(schema, "x")
    assert got["sequential_forward_passes"] == want.sequential_forward_passes == 2
    assert got["parsed_json"]["priority"]["value"] == want.fields["priority"].label
    r = httpx.post(
        url + "/v1/decide",
        headers=AUTH,
        json={"schema": {**SCHEMA, "team": {"type": "enum", "choices": []}}, "context": "x"},
    )
    err = _error(r, 422)
    assert "0 choice(s)" in err["message"] and "accepted: at least 1 choice" in err["message"]


def test_decide_endpoint_returns_the_seed_response(server, tiny):
    url, _ = server
    r = httpx.post(
        url + "/v1/decide",
        headers=AUTH,
        json={
            "schema": {"instructions": "Triage.", "fields": SCHEMA},
            "context": "Site down!",
            "temperature": 0.5,
            "scoring": "constrained",
        },
    )
    assert r.status_code == 200, r.text
    got = r.json()
    from pcd_tools import StructuredSchema

    want = tiny.decide(
        StructuredSchema(SCHEMA, instructions="Triage."),
        "Site down!",
        temperature=0.5,
        scoring="constrained",
    ).to_response()
    # same answers; probabilities to float32 noise (a cached schema prefix and a whole-prompt
    # prefill round differently in the last digits)
    assert {k: v["value"] for k, v in got["parsed_json"].items()} == {
        k: v["value"] for k, v in want["parsed_json"].items()
    }
    for k, v in want["parsed_json"].items():
        assert got["parsed_json"][k]["prob"] == pytest.approx(v["prob"], abs=1e-5)
    assert list(got["parsed_json"]) == ["priority", "escalate"]  # declaration order kept
    assert got["scoring"] == "constrained" and got["temperature"] == 0.5
    assert got["is_valid_json"] is True


def test_request_id_is_echoed(server):
    url, _ = server
    r = httpx.get(url + "/health", headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    assert r.headers["x-typesafe-request-id"] == "abc-123"
    assert len(httpx.get(url + "/health").headers["x-request-id"]) == 32


def test_auth(server):
    url, _ = server
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/ready").json()["status"] == "ready"
    err = _error(_so(url, "x", headers={}), 401)
    assert "Authorization: Bearer" in err["message"]
    _error(_so(url, "x", headers={"Authorization": "Bearer nope"}), 401)
    _error(httpx.get(url + "/v1/models"), 401)
    _error(httpx.get(url + "/metrics"), 401)
    models = httpx.get(url + "/v1/models", headers=AUTH).json()["models"]
    assert models[0]["name"] == "tiny-llama-0"


@pytest.mark.parametrize(
    ("content", "headers", "status", "words"),
    [
        (b"{not json", {}, 400, "not valid JSON"),
        (b"", {}, 400, "empty"),
        (b'{"state": NaN}', {}, 400, "NaN"),
        (b"\xff\xfe\xfa", {}, 400, "JSON"),
        (b"[" * 100_00 + b"]" * 100_00, {}, 400, "JSON"),
        (b"x" * 30_000, {}, 413, "max_body_bytes=20000"),
        (gzip.compress(b" " * 50_000), {"content-encoding": "gzip"}, 413, "max_body_bytes"),
        (b"{}", {"content-encoding": "br"}, 415, "Content-Encoding"),
        (b"[1, 2]", {}, 422, "JSON object"),
    ],
)
def test_bad_bodies(server, content, headers, status, words):
    url, _ = server
    r = httpx.post(url + "/v1/systemone", content=content, headers={**AUTH, **headers})
    assert words in _error(r, status)["message"]


def test_gzip_body_is_accepted(server):
    url, _ = server
    raw = json.dumps({"state": "hi", "questions": QUESTIONS}).encode()
    r = httpx.post(
        url + "/v1/systemone",
        content=gzip.compress(raw),
        headers={**AUTH, "content-encoding": "gzip"},
    )
    assert r.status_code == 200


def test_context_too_long_is_413_naming_both_lengths(server):
    url, _ = server
    err = _error(_so(url, "y" * 8_500), 413)
    assert err["field"] == "state"
    assert "context window is 8192 tokens" in err["message"]
    assert "needs 8" in err["message"]
    err = _error(
        httpx.post(
            url + "/v1/decide", headers=AUTH, json={"schema": SCHEMA, "context": "z" * 8_500}
        ),
        413,
    )
    assert err["field"] == "context"


def test_limits_and_schema_errors(server):
    url, _ = server
    many = {f"q{i}": {"type": "noul", "instructions": "?"} for i in range(65)}
    err = _error(
        httpx.post(url + "/v1/systemone", headers=AUTH, json={"state": "x", "questions": many}), 413
    )
    assert "max_questions=64" in err["message"]
    err = _error(
        httpx.post(
            url + "/v1/systemone",
            headers=AUTH,
            json={
                "state": "x",
                "questions": {"q": {"type": "choice", "criteria": list(map(str, range(256)))}},
            },
        ),
        422,
    )
    assert "256 criteria" in err["message"]
    err = _error(
        httpx.post(
            url + "/v1/systemone",
            headers=AUTH,
            json={"state": "x", "questions": {"q": {"type": "essay"}}},
        ),
        422,
    )
    assert "'essay'" in err["message"] and err["field"] == "questions.q.type"
    err = _error(
        httpx.post(
            url + "/v1/decide",
            headers=AUTH,
            json={"schema": {"p": {"type": "enum", "choices": []}}, "context": "x"},
        ),
        422,
    )
    assert err["type"] == "invalid_schema" and "0 choice(s) given" in err["message"]
    err = _error(
        httpx.post(
            url + "/v1/decide",
            headers=AUTH,
            json={"schema": SCHEMA, "context": "x", "temperature": "hot"},
        ),
        422,
    )
    assert err["field"] == "temperature"
    err = _error(
        httpx.post(url + "/v1/decide", headers=AUTH, json={"schema": SCHEMA, "context": 5}), 422
    )
    assert err["field"] == "context"
    _error(httpx.post(url + "/v1/nowhere", headers=AUTH, json={}), 404)


def test_unicode_heavy_state_and_lone_surrogates(server):
    url, _ = server
    text = "Zürich 東京 🚀🔥 مرحبا שלום e\u0301\u0301 \u200d\ufeff" * 20
    assert _so(url, text).status_code == 200
    raw = (
        b'{"state": "bad \\ud800 half", "questions": {"a": {"type": "noul", "instructions": "?"}}}'
    )
    err = _error(httpx.post(url + "/v1/systemone", content=raw, headers=AUTH), 422)
    assert "surrogate" in err["message"]


def _hold_worker(srv, tiny):
    """Blocks the model: the worker waits on the engine lock held by this thread."""
    lock = srv.batcher.worker_decider.engine.lock
    lock.acquire()
    return lock


def test_concurrent_requests_are_batched_and_answer_their_own_request(server, tiny):
    url, srv = server
    _so(url, "warm the schema plan")
    texts = [f"Ticket {i}: {'refund please' if i % 2 else 'the app crashes'}" for i in range(3)]
    batches0, jobs0 = srv.batcher.batches, srv.batcher.jobs_run
    started0 = srv.batcher.jobs_started
    out: dict[int, httpx.Response] = {}
    lock = _hold_worker(srv, tiny)
    try:
        first = threading.Thread(target=lambda: out.__setitem__(-1, _so(url, "first")))
        first.start()
        while srv.batcher.jobs_started == started0:  # the worker took "first" and is blocked
            time.sleep(0.01)
        threads = [
            threading.Thread(target=lambda i=i: out.__setitem__(i, _so(url, texts[i])))
            for i in range(3)
        ]
        for t in threads:
            t.start()
        while srv.batcher.depth < 3:
            time.sleep(0.01)
    finally:
        lock.release()
    first.join(30)
    for t in threads:
        t.join(30)
    assert srv.batcher.batches - batches0 == 2  # "first", then the 3 queued together
    assert srv.batcher.jobs_run - jobs0 == 4
    for i, text in enumerate(texts):
        alone = _so(url, text).json()["answers"]
        assert out[i].status_code == 200
        got = out[i].json()["answers"]
        assert got["billing"]["noul"] == pytest.approx(alone["billing"]["noul"], abs=1e-4)
        assert got["urgency"]["score"] == pytest.approx(alone["urgency"]["score"], abs=1e-4)


def test_full_queue_is_429_and_disconnected_clients_are_cancelled(server, tiny):
    url, srv = server
    _so(url, "warm")
    jobs0, started0 = srv.batcher.jobs_run, srv.batcher.jobs_started
    cancelled0 = srv.metrics.cancelled
    results: list[httpx.Response] = []
    lock = _hold_worker(srv, tiny)
    try:
        t0 = threading.Thread(target=lambda: results.append(_so(url, "running")))
        t0.start()
        while srv.batcher.jobs_started == started0:  # the worker took it and is blocked
            time.sleep(0.01)
        waiting = [
            threading.Thread(target=lambda: results.append(_so(url, "queued"))) for _ in range(2)
        ]
        for t in waiting:
            t.start()

        # this client gives up after 0.5 s: its queued job must be dropped, not run
        def impatient():
            with contextlib.suppress(httpx.TimeoutException):
                _so(url, "impatient", timeout=0.5)

        ti = threading.Thread(target=impatient)
        ti.start()
        while srv.batcher.depth < 3:
            time.sleep(0.01)
        full = _so(url, "one too many")
        err = _error(full, 429)
        assert "max_queue=3" in err["message"]
        assert int(full.headers["retry-after"]) >= 1
        ti.join(10)
        time.sleep(0.3)  # the server notices the disconnect
    finally:
        lock.release()
    t0.join(30)
    for t in waiting:
        t.join(30)
    assert [r.status_code for r in results] == [200, 200, 200]
    assert srv.batcher.jobs_run - jobs0 == 3
    assert srv.metrics.cancelled - cancelled0 == 1


def test_metrics_text(server):
    url, _ = server
    _so(url, "metrics please")
    text = httpx.get(url + "/metrics", headers=AUTH).text
    assert 'pcd_requests_total{endpoint="/v1/systemone",status="200"}' in text
    assert 'pcd_request_duration_seconds_bucket{endpoint="/v1/systemone",le="+Inf"}' in text
    assert "pcd_queue_depth 0" in text
    assert "pcd_batch_size_count" in text
    assert "pcd_cancelled_total" in text


def test_serve_module_is_cheap_to_import():
    code = (
        "import sys, pcd_tools.serve, pcd_tools.cli; "
        "bad = [m for m in ('fastapi', 'uvicorn', 'mlx', 'mlx.core') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_refuses_remote_bind_without_key(capsys, monkeypatch):
    from pcd_tools.cli import main

    monkeypatch.delenv("PCD_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "refusing to bind '0.0.0.0' without an API key" in capsys.readouterr().err


def test_is_loopback():
    from pcd_tools.serve import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert not is_loopback("example.com")
