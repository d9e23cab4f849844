"""`pcd_tools.ray.deployment`: the `pcd serve` app on Ray Serve, batched with `@serve.batch`."""

from __future__ import annotations

import re
import threading
import time

import pytest

from tests.serve.live import free_port

pytestmark = [pytest.mark.ray, pytest.mark.serve, pytest.mark.engine]

httpx = pytest.importorskip("httpx")

KEY = "ray-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SCHEMA = {
    "instructions": "Triage a support ticket.",
    "fields": {
        "priority": {"type": "enum", "choices": ["P0", "P1", "P2"], "description": "Urgency"},
        "refund": {"type": "boolean", "description": "Whether the customer asks for money back"},
    },
}


@pytest.fixture(scope="module")
def url(ray_session, tiny_factory):
    """`run_server` (what `pcd serve --ray` runs) in a thread, on a free port."""
    from pcd_tools.ray import run_server

    port = free_port()
    ready: list[dict] = []
    stop = threading.Event()
    kw = {"api_key": KEY, "name": "pcd-test", "num_cpus_per_replica": 0.5, "max_batch": 8}
    server = threading.Thread(
        target=run_server,
        args=(tiny_factory,),
        kwargs={"port": port, "on_ready": ready.append, "stop": stop, "batch_wait_ms": 50, **kw},
        daemon=True,
    )
    server.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while not ready or httpx.get(base + "/ready").status_code != 200:
        assert server.is_alive() and time.monotonic() < deadline, "the app never became ready"
        time.sleep(0.1)
    assert ready[0]["url"] == base and ready[0]["auth"] is True
    try:
        yield base
    finally:
        stop.set()
        server.join(60)
    from ray import serve

    assert "pcd-test" not in serve.status().applications  # run_server removed its app


def _decide(base: str, context: str, **extra) -> httpx.Response:
    body = {"schema": SCHEMA, "context": context, **extra}
    return httpx.post(base + "/v1/decide", headers=AUTH, json=body, timeout=60)


def test_v1_decide_answers_like_the_library(url, tiny):
    from pcd_tools import StructuredSchema

    r = _decide(url, "The site is down and I want my money back!", temperature=0.5)
    assert r.status_code == 200, r.text
    got = r.json()
    d = tiny.decide(
        StructuredSchema(SCHEMA["fields"], instructions=SCHEMA["instructions"]),
        "The site is down and I want my money back!",
        temperature=0.5,
    )
    for name, f in d.fields.items():
        assert got["parsed_json"][name]["value"] == f.label
        assert got["parsed_json"][name]["prob"] == pytest.approx(f.probability, abs=1e-5)
    assert got["model"] == "tiny-llama-0"


def test_same_endpoints_auth_and_limits_as_pcd_serve(url):
    assert httpx.get(url + "/health").json()["status"] == "ok"
    r = httpx.post(url + "/v1/decide", json={"schema": SCHEMA, "context": "hi"})
    assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]["message"]
    r = _decide(url, "")
    assert r.status_code == 422 and r.json()["error"]["field"] == "context"
    r = _decide(url, "z" * 9000)
    assert r.status_code == 413 and r.json()["error"]["type"] == "context_too_long"
    models = httpx.get(url + "/v1/models", headers=AUTH).json()["models"]
    assert [m["name"] for m in models] == ["tiny-llama-0"]


def test_the_typesafe_sdk_client(url, tiny):
    typesafe_sdk = pytest.importorskip("typesafe_sdk")
    from pcd_tools.serve.systemone import parse_request

    questions = {
        "billing": typesafe_sdk.Noul(
            instructions="Is this message about billing?",
            criteria={"true": "money, invoices, charges or refunds"},
        ),
        "tone": typesafe_sdk.Choice(
            instructions="What is the tone?",
            criteria={"calm": "neutral or polite", "angry": "upset or hostile"},
        ),
    }
    state = "I was charged twice for my March invoice. Please refund it."
    with typesafe_sdk.TypeSafeClient(
        base_url=url, api_key=KEY, retry=typesafe_sdk.RetryPolicy(max_retries=0), timeout=60
    ) as client:
        res = client.system_one(state=state, questions=questions)
    assert res.model == "tiny-llama-0" and res.request_id
    body = {"state": state, "questions": {k: q.model_dump() for k, q in questions.items()}}
    d = tiny.decide(parse_request(body).schema, state)
    assert res.nouls["billing"].noul == pytest.approx(
        d.fields["billing"].distribution[True], abs=1e-4
    )
    assert res.choices["tone"].choice == d.fields["tone"].label


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_concurrent_calls_from_8_threads_are_batched(url):
    before = httpx.get(url + "/metrics", headers=AUTH).text
    n0, sum0 = _metric(before, "pcd_batch_size_count"), _metric(before, "pcd_batch_size_sum")
    start = threading.Barrier(8)
    codes: list[int] = []

    def caller(i: int) -> None:
        start.wait()
        for j in range(4):
            codes.append(
                _decide(url, f"Caller {i}, request {j}: refund the duplicate charge").status_code
            )

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert codes == [200] * 32
    after = httpx.get(url + "/metrics", headers=AUTH).text
    batches = _metric(after, "pcd_batch_size_count") - n0
    jobs = _metric(after, "pcd_batch_size_sum") - sum0
    assert jobs == 32  # every request went through a recorded batch
    assert batches < 32, "requests from concurrent callers share batches"
    single = _metric(after, 'pcd_batch_size_bucket{le="1"}') - _metric(
        before, 'pcd_batch_size_bucket{le="1"}'
    )
    assert single < batches  # at least one batch held more than one request


def test_pcd_serve_ray_passes_replicas_and_limits_through(monkeypatch, capsys):
    from pcd_tools.cli import main

    calls: list[tuple[tuple, dict]] = []
    monkeypatch.setattr("pcd_tools.ray.run_server", lambda *a, **k: calls.append((a, k)))
    monkeypatch.delenv("PCD_API_KEY", raising=False)
    argv = ["serve", "--ray", "--replicas", "1:4", "--max-batch", "12", "--port", "8123"]
    assert main([*argv, "--num-cpus-per-replica", "1.5"]) == 0
    (args, kw) = calls[0]
    assert args == (None,) and kw["address"] == "auto" and kw["port"] == 8123
    assert kw["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4}
    assert kw["max_batch"] == 12 and kw["num_cpus_per_replica"] == 1.5
    assert main(["serve", "--ray", "ray://head:10001", "--replicas", "3"]) == 0
    assert calls[1][1]["address"] == "ray://head:10001" and calls[1][1]["num_replicas"] == 3
    assert main(["serve", "--ray", "--replicas", "x"]) == 2
    assert "--replicas takes N or MIN:MAX" in capsys.readouterr().err
    assert main(["serve", "--ray", "--host", "0.0.0.0"]) == 2  # no key: refused, as pcd serve
    assert len(calls) == 2
