"""An HTTP decision server (System One, OpenAI chat completions and Decisions, plus
`/v1/decide`); `pcd serve` runs it.

This module stays cheap to import: FastAPI and uvicorn load inside `serve()` and in
`pcd_tools.serve.app`.

Example:
    `pcd serve --port 8000` then
    `curl -s localhost:8000/v1/systemone -d '{"state": "...", "questions": {...}}'`

**OpenAI clients.** The official clients need only a `base_url` ending in `/v1`. The key
is the server's `--api-key` / `$PCD_API_KEY`; a server started without one accepts any.
Any `model` name is answered by the loaded model:

    import openai
    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="s3cret")
    client.decisions.create(
        model="pcd",
        input="I was charged twice. Please refund me.",
        questions=[{"type": "predicate", "name": "billing",
                    "instructions": "Is this about billing?"}],
    )                                    # POST /v1/decisions (pcd_tools.serve.decisions)
    client.chat.completions.parse(...)   # POST /v1/chat/completions, structured output

    from langchain_openai.decisions import OpenAIDecisions, Predicate
    decisions = OpenAIDecisions(model="pcd", base_url="http://127.0.0.1:8000/v1",
                                api_key="s3cret")
    decisions.invoke({"input": "...", "questions": {"billing": Predicate(instructions="...")}})

`openai.AsyncOpenAI` works the same way, and concurrent requests share the server's
micro-batches. In a `pcd_tools.agents.Cascade`, such an `OpenAIDecisions` is a stage
(`DecisionsStage`): the fields a local model is unsure of go to the remote server's
bigger model, with probabilities, so they can escalate again.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..decide.decider import Decider

__all__ = ["API_KEY_ENV", "api_key_from_env", "create_app", "is_loopback", "serve"]

API_KEY_ENV = "PCD_API_KEY"


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'pcd_tools.serve' has no attribute {name!r}")


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def api_key_from_env(api_key: str | None = None) -> str | None:
    """The API key to require: `api_key` if given, else `$PCD_API_KEY`, else None."""
    return api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None


def serve(
    decider: Decider | str | os.PathLike[str] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    allow_remote_without_key: bool = False,
    calibration: Any = None,
    max_queue: int = 256,
    max_batch: int = 16,
    max_batch_tokens: int = 8192,
    batch_wait_ms: float = 2.0,
    max_body_bytes: int = 1 << 20,
    max_questions: int = 64,
    warmup: bool = True,
    log_level: str = "info",
    on_ready: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Builds the app around a decider and serves it with uvicorn until stopped.

    Args:
        decider: A loaded `Decider`, or the model source to load (default: embedded).
        host: Address to bind.
        port: Port to bind.
        api_key: Bearer key required on `/v1/*` and `/metrics`; default `$PCD_API_KEY`.
        allow_remote_without_key: Bind a non-loopback address without a key.
        calibration: Calibration (object or JSON path) applied when `decider` is loaded here.
        max_queue: Requests waiting for the model before 429.
        max_batch: Requests per model batch.
        max_batch_tokens: Prompt tokens per model batch.
        batch_wait_ms: How long an idle worker waits for requests arriving together.
        max_body_bytes: Largest request body (413 above).
        max_questions: Questions per request (413 above).
        warmup: Score a small schema at start-up.
        log_level: The uvicorn log level.
        on_ready: Called once the app is built, before serving, with `event`, `url`,
            `model`, `device` and `auth`.

    Raises:
        InvalidArgumentError: on a remote bind without a key, or a limit below 1.
        ImportError: when the serve extra (fastapi, uvicorn) is not installed.
    """
    key = api_key_from_env(api_key)
    if not is_loopback(host) and not key and not allow_remote_without_key:
        raise InvalidArgumentError(
            f"refusing to bind {host!r} without an API key: anyone who can reach it could use "
            f"the model. Pass api_key or set ${API_KEY_ENV}, bind 127.0.0.1, or pass "
            "allow_remote_without_key=True."
        )
    limits = {
        "max_queue": max_queue,
        "max_batch": max_batch,
        "max_body_bytes": max_body_bytes,
        "max_questions": max_questions,
    }
    for name, v in {"port": port, **limits}.items():
        lowest = 0 if name == "port" else 1
        if v < lowest:
            raise InvalidArgumentError(f"{name} must be >= {lowest}; got {v}.")
    import uvicorn

    from ..decide.decider import Decider
    from .app import create_app

    if not isinstance(decider, Decider):
        kw: dict[str, Any] = {} if calibration is None else {"calibration": calibration}
        decider = Decider.load(decider, **kw)
    app = create_app(
        decider,
        api_key=key,
        max_batch_tokens=max_batch_tokens,
        batch_wait_ms=batch_wait_ms,
        warmup=warmup,
        **limits,
    )
    if on_ready is not None:
        on_ready(
            {
                "event": "serving",
                "url": f"http://{host}:{port}",
                "model": decider.model_id,
                "device": decider.device,
                "auth": bool(key),
            }
        )
    uvicorn.run(app, host=host, port=port, log_level=log_level)
