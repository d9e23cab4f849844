"""The FastAPI app: System One, `/v1/decide`, models, health, readiness and metrics.

`create_app(decider, ...)` builds it; `pcd serve` runs it under uvicorn. Every decision
request is validated and length-checked on arrival, then queued for the one model worker
(`MicroBatcher`), which scores compatible requests together.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import hmac
import importlib
import json
import os
import threading
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ContextTooLongError, PcdToolsError, SchemaError
from .batcher import Job, MicroBatcher
from .errors import ApiError, error_body
from .metrics import Metrics
from .native import parse_decide
from .systemone import build_response, parse_request

if TYPE_CHECKING:
    from ..decider import Decider
    from ..schema import Schema

__all__ = ["create_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

ENDPOINTS = ("/v1/systemone", "/v1/decide", "/v1/models", "/health", "/ready", "/metrics")
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
        limit = self.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit)
        ctype = request.headers.get("content-type", "")
        if ctype.lower().startswith("multipart/"):
            raise ApiError(
                422,
                "unsupported_assets",
                "multipart bodies carry image assets, which need a vision-language model; "
                "this server scores text only. Send a JSON body.",
                field="assets",
            )
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            chunks.append(chunk)
        raw = _decode_body(b"".join(chunks), request.headers.get("content-encoding", ""), limit)
        if not raw.strip():
            raise ApiError(400, "malformed_json", "The request body is empty; send a JSON object.")
        try:
            return json.loads(raw, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            raise ApiError(
                400,
                "malformed_json",
                f"The body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}.",
            ) from e
        except UnicodeDecodeError as e:
            raise ApiError(
                400, "malformed_json", f"The body is not valid UTF-8 JSON: {e.reason}."
            ) from e
        except ValueError as e:  # NaN / Infinity
            raise ApiError(400, "malformed_json", f"The body is not valid JSON: {e}.") from e
        except RecursionError as e:
            raise ApiError(400, "malformed_json", "The body's JSON is nested too deeply.") from e

    def check_length(self, schema: Schema, context: str, where: str) -> int:
        """Prompt tokens of `context` under `schema`; 413 if it cannot fit the window."""
        _check_unicode(context, where)
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
        head, tail, extra = lens
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

    async def decide(self, request: Request, job: Job) -> Any:
        """Queues `job` and waits for its decision; cancels it if the client leaves."""
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
        except PcdToolsError as e:
            raise ApiError(422, "invalid_request", str(e)) from e


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        "body_too_large",
        f"The request body is {size}+ bytes; the limit is max_body_bytes={limit}.",
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _check_unicode(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(
            422,
            "invalid_request",
            f"{where} holds a lone surrogate ({text[e.start]!r} at character {e.start}), which "
            "is not valid Unicode text.",
            field=where,
        ) from e


def _decode_body(raw: bytes, encoding: str, limit: int) -> bytes:
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return raw
    if enc in ("gzip", "x-gzip", "deflate"):
        d = zlib.decompressobj(zlib.MAX_WBITS | 32 if enc != "deflate" else zlib.MAX_WBITS)
        try:
            out = d.decompress(raw, limit + 1)
        except zlib.error as e:
            raise ApiError(400, "malformed_body", f"The {enc} body cannot be decoded: {e}.") from e
        if len(out) > limit:
            raise _too_large(len(out), limit)
        return out
    if enc == "zstd":
        return _zstd(raw, limit)
    raise ApiError(
        415,
        "unsupported_encoding",
        f"Content-Encoding {encoding!r} is not supported; accepted: identity, gzip, deflate, zstd.",
    )


def _zstd(raw: bytes, limit: int) -> bytes:
    zstd: Any = None
    for name in ("compression.zstd", "backports.zstd"):  # Python 3.14+, then the backport
        try:
            zstd = importlib.import_module(name)
            break
        except ImportError:
            continue
    if zstd is None:
        raise ApiError(
            415,
            "unsupported_encoding",
            "Content-Encoding 'zstd' needs the `backports.zstd` package on this server "
            "(or Python 3.14); or send the body uncompressed.",
        )
    try:
        d = zstd.ZstdDecompressor()
        out: bytes = d.decompress(raw, max_length=limit + 1)
    except Exception as e:
        raise ApiError(400, "malformed_body", f"The zstd body cannot be decoded: {e}.") from e
    if len(out) > limit:
        raise _too_large(len(out), limit)
    return out


class _Instrument:
    """ASGI middleware: request id echo, per-endpoint status counts and latency."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _request_id(scope)
        scope["pcd.request_id"] = rid
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        status = {"code": 500}
        t0 = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode()))
                headers.append((b"x-typesafe-request-id", rid.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            code = scope.get("pcd.status_override", status["code"])
            self.metrics.request(endpoint, code, time.perf_counter() - t0)


def _request_id(scope: Scope) -> str:
    for k, v in scope.get("headers", []):
        if k in (b"x-request-id", b"x-typesafe-request-id"):
            try:
                s = v.decode("ascii")
            except UnicodeDecodeError:
                break
            if 0 < len(s) <= 128 and s.isprintable():
                return s
            break
    return uuid.uuid4().hex


def _release_date(decider: Decider) -> str:
    path = getattr(decider.loaded, "path", "")
    try:
        ts = os.path.getmtime(path) if path else time.time()
    except OSError:
        ts = time.time()
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).date().isoformat()


def create_app(
    decider: Decider,
    *,
    api_key: str | None = None,
    max_queue: int = 256,
    max_batch: int = 16,
    max_batch_tokens: int = 8192,
    batch_wait_ms: float = 2.0,
    max_body_bytes: int = 1 << 20,
    max_questions: int = 64,
    warmup: bool = True,
) -> FastAPI:
    """Builds the HTTP app around a loaded decider.

    Args:
        decider: The loaded `Decider` (its model runs on one worker thread).
        api_key: When set, `/v1/*` and `/metrics` need `Authorization: Bearer <api_key>`.
        max_queue: Requests that may wait for the model; more get 429 with `Retry-After`.
        max_batch: Most requests scored in one `decide_many` call.
        max_batch_tokens: Most prompt tokens in one batch.
        batch_wait_ms: How long an idle worker waits for requests arriving together.
        max_body_bytes: Largest request body (after decompression); more gets 413.
        max_questions: Most questions (or schema fields) per request; more gets 413.
        warmup: Score a small schema at start-up; `/ready` turns 200 when it is done.

    Returns:
        A FastAPI app. Its `state.pcd` holds the batcher and metrics.
    """
    from contextlib import asynccontextmanager

    srv = _Server(
        decider,
        api_key=api_key,
        max_queue=max_queue,
        max_batch=max_batch,
        max_batch_tokens=max_batch_tokens,
        batch_wait_ms=batch_wait_ms,
        max_body_bytes=max_body_bytes,
        max_questions=max_questions,
        warmup=warmup,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        srv.start()
        try:
            yield
        finally:
            await run_in_threadpool(srv.stop)

    app = FastAPI(
        title="pcd-tools decision server",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.pcd = srv
    model_name = decider.model_id
    release = _release_date(decider)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        request.scope["pcd.status_override"] = 499  # nginx's "client closed request"
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        msg = (
            f"No route {request.method} {request.url.path}; endpoints: {list(ENDPOINTS)}."
            if exc.status_code in (404, 405)
            else str(exc.detail)
        )
        return JSONResponse(error_body(kind, msg), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            error_body("internal_error", f"Internal error: {type(exc).__name__}: {exc}"),
            status_code=500,
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "uptime_s": round(time.time() - srv.started, 1)}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if srv.ready and srv.batcher.running:
            return JSONResponse({"status": "ready", "model": model_name})
        msg = srv.ready_error or (
            "The model worker is not running." if srv.ready else "The model is warming up."
        )
        body = error_body("not_ready", msg)
        body["status"] = "failed" if srv.ready_error else "warming_up"
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        srv.authorize(request)
        return {
            "models": [
                {
                    "name": model_name,
                    "description": f"{model_name} served by pcd-tools (parallel constrained "
                    f"decoding on {decider.device}); every model name in a request is "
                    "answered by this model.",
                    "release_date": release,
                }
            ]
        }

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        srv.authorize(request)
        return PlainTextResponse(
            srv.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.post("/v1/systemone")
    async def systemone(request: Request) -> JSONResponse:
        srv.authorize(request)
        body = await srv.read_json(request)

        def prepare() -> Any:
            req = parse_request(body, max_questions=srv.max_questions)
            tokens = (
                srv.check_length(req.schema, req.context, "state")
                if req.schema is not None
                else len(srv.batcher.worker_decider.engine.encode_ids(req.context))
            )
            return req, tokens

        req, tokens = await run_in_threadpool(prepare)
        decision = None
        if req.schema is not None:
            job = Job(req.schema, req.context, req.temperature, "full", tokens=tokens)
            decision = await srv.decide(request, job)
            tokens = decision.prompt_tokens
        return JSONResponse(build_response(req, decision, model=model_name, input_tokens=tokens))

    @app.post("/v1/decide")
    async def decide(request: Request) -> JSONResponse:
        srv.authorize(request)
        body = await srv.read_json(request)

        def prepare() -> Any:
            req = parse_decide(body, max_questions=srv.max_questions)
            return req, srv.check_length(req.schema, req.context, "context")

        req, tokens = await run_in_threadpool(prepare)
        job = Job(req.schema, req.context, req.temperature, req.scoring, tokens=tokens)
        decision = await srv.decide(request, job)
        return JSONResponse(decision.to_response())

    app.add_middleware(_Instrument, metrics=srv.metrics)
    return app
