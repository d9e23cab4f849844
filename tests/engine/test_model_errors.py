"""`ModelLoadError` for a Hugging Face id the hub cannot serve: offline, unknown repo."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from pcd_tools import Decider
from pcd_tools.errors import ModelLoadError

REPO = "mlx-community/Qwen2.5-0.5B-Instruct-4bit"

# What a new user needs to read when the hub cannot be reached.
OFFLINE_ADVICE = (".gguf", "MLX model directory", "Decider.load()", "HF_HUB_OFFLINE=1")


def _http() -> Any:
    """The HTTP client huggingface_hub uses (httpx2 in 2.x, httpx before)."""
    try:
        return importlib.import_module("httpx2")
    except ImportError:  # pragma: no cover - older huggingface_hub
        return importlib.import_module("httpx")


def _offline_error():
    """What huggingface_hub raises when the hub cannot be reached and nothing is cached."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    http = _http()
    try:
        raise http.ConnectError("[Errno -2] Name or service not known")
    except http.ConnectError as e:
        err = LocalEntryNotFoundError(
            "An error happened while trying to locate the files on the Hub, and we cannot "
            "find the appropriate snapshot folder for the specified revision on the local "
            "disk. Please check your internet connection and try again."
        )
        err.__cause__ = e
        return err


def _load_with_download_raising(monkeypatch, exc):
    import mlx_lm.utils

    def download(*args, **kwargs):
        raise exc

    monkeypatch.setattr(mlx_lm.utils, "snapshot_download", download)
    with pytest.raises(ModelLoadError) as e:
        Decider.load(REPO)
    return e.value


@pytest.mark.unit
def test_hub_unreachable_says_offline_and_how_to_load_locally(monkeypatch):
    err = _load_with_download_raising(monkeypatch, _offline_error())
    msg = str(err)
    assert err.source == REPO
    assert REPO in msg
    assert "cannot reach the Hugging Face hub" in msg and "offline" in msg
    for advice in OFFLINE_ADVICE:
        assert advice in msg, advice
    # the cause comes after the advice, so the fix is read first
    assert msg.index("Decider.load()") < msg.index("ConnectError")


@pytest.mark.unit
def test_offline_mode_without_a_cache_names_hf_hub_offline(monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    exc = LocalEntryNotFoundError(
        "Cannot find an appropriate cached snapshot folder for the specified revision on the "
        "local disk and outgoing traffic has been disabled."
    )
    msg = str(_load_with_download_raising(monkeypatch, exc))
    assert "HF_HUB_OFFLINE=1 is set" in msg and "not in the local Hugging Face cache" in msg
    for advice in (".gguf", "MLX model directory", "Decider.load()"):
        assert advice in msg, advice


@pytest.mark.unit
def test_unknown_repo_is_not_reported_as_offline(monkeypatch):
    from huggingface_hub.errors import RepositoryNotFoundError

    http = _http()
    url = f"https://huggingface.co/api/models/{REPO}/revision/main"
    response = http.Response(404, request=http.Request("GET", url))
    exc = RepositoryNotFoundError("404 Client Error: Repository Not Found", response=response)
    msg = str(_load_with_download_raising(monkeypatch, exc))
    assert "offline" not in msg
    assert "no model repository" in msg and "hf auth login" in msg


def _real_load(env: dict[str, str]) -> str:
    code = textwrap.dedent(
        f"""
        from pcd_tools import Decider
        from pcd_tools.errors import ModelLoadError
        try:
            Decider.load({REPO!r})
        except ModelLoadError as e:
            print(e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout


@pytest.mark.engine
def test_real_offline_paths(tmp_path):
    empty = {"HF_HOME": str(tmp_path / "hf")}  # an empty cache, whatever this machine holds
    msg = _real_load({**empty, "HF_HUB_OFFLINE": "1"})
    assert "HF_HUB_OFFLINE=1 is set" in msg, msg
    # a hub that refuses connections (no network needed): reported as unreachable
    msg = _real_load({**empty, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "5"})
    assert "cannot reach the Hugging Face hub" in msg, msg
    for advice in OFFLINE_ADVICE:
        assert advice in msg, advice
