"""The shared state of one server app (`_Server`): decider, batcher, metrics and limits.

It holds the pieces every decision endpoint runs through: the API-key check, the body
reader, the context-length check and queueing a job on the `MicroBatcher`.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from fastapi import Request

from ..errors import (
    ContextTooLongError,
    GenerationError,
    GenerationLimitError,
    InvalidContextError,
    PcdToolsError,
    SchemaError,
)
from .batcher import Job, MicroBatcher
from .body import _check_unicode, read_json_body
from .errors import ApiError
from .metrics import Metrics

if TYPE_CHECKING:
    from ..decide.decider import Decider
    from ..schema import Schema

__all__ = ["ClientGone"]

_WARMUP_SCHEMA: dict[str, dict[str, Any]] = {
    "ok": {"type": "boolean", "description": "Whether the message is a greeting"},
    "tone": {"type": "enum", "choices": ["calm", "angry"], "description": "Tone"},
}


class ClientGone(Exception):
    """The client disconnected before its decision was ready."""


class _Server:
    """Shared state of one app: decider, batcher, metrics, limits."""

    def __init__(
        self,
        decider: Decider,
        *,
        api_key: str | None,
        max_queue: int,
        max_batch: int,
        max_batch_tokens: int,
        batch_wait_ms: float,
        max_body_bytes: int,
        max_questions: int,
        warmup: bool,
    ):
        self.decider = decider
        self.api_key = api_key or None
        self.max_body_bytes = max_body_bytes
        self.max_questions = max_questions
        self.warmup = warmup
        self.batcher = MicroBatcher(
            decider,
            max_queue=max_queue,
            max_batch=max_batch,
            max_batch_tokens=max_batch_tokens,
            batch_wait_ms=batch_wait_ms,
        )
        self.metrics = Metrics(queue_depth=lambda: self.batcher.depth)
        self.batcher.metrics = self.metrics
        self.ready = False
        self.ready_error: str | None = None
        self._lengths: dict[str, tuple[int, int, int]] = {}
        self._lengths_lock = threading.Lock()
        self.started = time.time()

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self.batcher.start()
        if not self.warmup:
            self.ready = True
            return
        from ..schema import StructuredSchema

        schema = StructuredSchema(_WARMUP_SCHEMA, name="Warmup").schema
        fut = self.batcher.submit(Job(schema, "Hello there, how are you today?"))

        def done(f: Future[Any]) -> None:
            err = f.exception()
            if err is None:
                self.ready = True
            else:
                self.ready_error = f"warm-up failed: {type(err).__name__}: {err}"

        fut.add_done_callback(done)

    def stop(self) -> None:
        self.batcher.stop(drain=True, timeout=60)

    # --- request pieces -----------------------------------------------------------------

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode("utf-8", "replace"), self.api_key.encode()
        ):
            raise ApiError(
                401,
                "unauthorized",
                "Missing or wrong API key: send the header `Authorization: Bearer <key>` with "
                "the key the server was started with (--api-key or PCD_API_KEY).",
                field="Authorization",
                headers={"WWW-Authenticate": "Bearer"},
            )

    async def read_json(self, request: Request) -> Any:
        """The request's JSON body (see `read_json_body`), within `max_body_bytes`."""
        return await read_json_body(request, self.max_body_bytes)

    def _prompt_lengths(self, schema: Schema) -> tuple[int, int, int]:
        """Tokens of the schema part, of the answer start, and the fields' extra tokens."""
        engine = self.batcher.worker_decider.engine
        fp = schema.fingerprint()
        lens = self._lengths.get(fp)
        if lens is None:
            plan = engine.plan(schema)
            lens = (len(plan.head_ids), len(plan.tail_ids), plan.extra_tokens)
            with self._lengths_lock:
                if len(self._lengths) > 1024:
                    self._lengths.clear()
                self._lengths[fp] = lens
        return lens

    def head_tokens(self, schema: Schema) -> int:
        """Tokens of the schema part of the prompt: what the prefix cache holds for it."""
        return self._prompt_lengths(schema)[0]

    def check_length(self, schema: Schema, context: str, where: str) -> int:
        """Prompt tokens of `context` under `schema`; 413 if it cannot fit the window."""
        _check_unicode(context, where)
        engine = self.batcher.worker_decider.engine
        head, tail, extra = self._prompt_lengths(schema)
        n_ctx = len(engine.encode_ids(context))
        n = head + n_ctx + tail
        if n + extra > engine.context_window:
            err = ContextTooLongError(
                n + extra,
                engine.context_window,
                detail=f"The {where} is {n_ctx} tokens; the questions and prompt take "
                f"{head + tail + extra} more.",
            )
            raise ApiError(413, "context_too_long", str(err), field=where)
        return n

    async def decide(self, request: Request, job: Job, field: str = "context") -> Any:
        """Queues `job` and waits for its decision; cancels it if the client leaves.

        Args:
            request: The HTTP request (watched for a disconnect).
            job: The decision job.
            field: The request field that holds the job's context (`context`, `state`),
                named by the 422 for a context the decider refuses.

        Raises:
            ApiError: 413 for a prompt over the window, 422 for a bad schema or context,
                the batcher's 429 / 503.
            ClientGone: if the client disconnected first.
        """
        fut = self.batcher.submit(job)
        afut = asyncio.wrap_future(fut)
        watcher: asyncio.Future[Any] = asyncio.ensure_future(_wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({afut, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if afut not in done:
            fut.cancel()
            afut.cancel()
            raise ClientGone()
        try:
            return afut.result()
        except ApiError:
            raise
        except ContextTooLongError as e:
            raise ApiError(413, "context_too_long", str(e)) from e
        except SchemaError as e:
            raise ApiError(422, "invalid_schema", str(e)) from e
        except InvalidContextError as e:
            raise ApiError(422, "invalid_request", f"{field}: {e}", field=field) from e
        except GenerationError as e:  # a generated field: its limit, or its grammar
            kind = "generation_limit" if isinstance(e, GenerationLimitError) else "generation_error"
            raise ApiError(422, kind, str(e), field=e.field) from e
        except PcdToolsError as e:
            raise ApiError(422, "invalid_request", str(e)) from e


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
