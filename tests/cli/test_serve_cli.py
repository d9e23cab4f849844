"""`pcd serve` as a real process on the embedded model."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.serve.live import free_port

pytestmark = [pytest.mark.serve, pytest.mark.integration, pytest.mark.slow]


def test_pcd_serve_starts_answers_and_stops():
    port = free_port()
    env = {**os.environ, "PCD_API_KEY": "cli-key"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pcd_tools", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "pcd serve never became ready"
            time.sleep(0.5)
        body = {
            "state": "Refund my duplicate charge.",
            "questions": {"billing": {"type": "noul", "instructions": "About billing?"}},
        }
        assert httpx.post(url + "/v1/systemone", json=body, timeout=120).status_code == 401
        r = httpx.post(
            url + "/v1/systemone",
            json=body,
            timeout=120,
            headers={"Authorization": "Bearer cli-key"},
        )
        assert r.status_code == 200, r.text
        assert 0.0 <= r.json()["answers"]["billing"]["noul"] <= 1.0
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0].decode()
    assert "SmolLM2-135M-Instruct" in out and "auth on" in out
