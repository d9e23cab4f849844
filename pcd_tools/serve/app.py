"""The FastAPI app: System One, `/v1/decide`, OpenAI chat completions, the OpenAI
Decisions API, models, health, readiness and metrics.

`create_app(decider, ...)` builds it; `pcd serve` runs it under uvicorn. Every decision
request is validated and length-checked on arrival, then queued for the one model worker
(`MicroBatcher`), which scores compatible requests together.

The shared server state lives in `server.py` and the body reader in `body.py`.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..decide.options import DecideOptions
from .batcher import Job
from .decisions import build_decision, error_type, log_request, parse_decisions
from .errors import ApiError, error_body
from .metrics import Metrics
from .native import parse_decide
from .openai_chat import parse_chat
from .openai_reply import build_completion, sse_chunks
from .server import ClientGone, _Server
from .systemone import build_response, parse_request

if TYPE_CHECKING:
    from ..decide.decider import Decider

__all__ = ["create_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

ENDPOINTS = (
    "/v1/systemone",
    "/v1/decide",
    "/v1/chat/completions",
    "/v1/decisions",
    "/v1/models",
    "/health",
    "/ready",
    "/metrics",
)
CHAT = "/v1/chat/completions"
DECISIONS = "/v1/decisions"


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


def _job(req: Any, temperature: float, tokens: int) -> Job:
    """The model job of a parsed `/v1/decide` or chat-completions request."""
    options = DecideOptions(
        temperature=temperature,
        scoring=req.scoring,
        orders=req.orders,
        allow_empty=req.allow_empty,
        calibration=req.calibration,
        max_new_tokens=getattr(req, "max_new_tokens", None),
        pruning=req.pruning,
    )
    return Job(req.schema, req.context, options, tokens=tokens)


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
        body = exc.body()
        if request.url.path == CHAT:  # OpenAI clients read `param` and `code`
            body["error"].update(param=exc.field, code=exc.type)
        elif request.url.path == DECISIONS:  # exactly OpenAI's error object
            body = {
                "error": {
                    "message": exc.message,
                    "type": error_type(exc.status),
                    "param": exc.field,
                    "code": exc.type,
                }
            }
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

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
        description = (
            f"{model_name} served by pcd-tools (parallel constrained decoding on "
            f"{decider.device}); every model name in a request is answered by this model."
        )
        return {
            # System One's shape ...
            "models": [{"name": model_name, "description": description, "release_date": release}],
            # ... and OpenAI's list shape, in the same body
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": int(srv.started),
                    "owned_by": "pcd-tools",
                }
            ],
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
            options = DecideOptions(temperature=req.temperature, scoring="auto")
            job = Job(req.schema, req.context, options, tokens=tokens)
            decision = await srv.decide(request, job, field="state")
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
        job = _job(req, req.temperature, tokens)
        decision = await srv.decide(request, job, field="context")
        return JSONResponse(decision.to_response())

    @app.post(CHAT)
    async def chat_completions(request: Request) -> Response:
        srv.authorize(request)
        body = await srv.read_json(request)
        tokenizer = srv.batcher.worker_decider.engine.tokenizer

        def prepare() -> Any:
            req = parse_chat(body, tokenizer, max_questions=srv.max_questions)
            return req, srv.check_length(req.schema, req.context, "messages")

        req, tokens = await run_in_threadpool(prepare)
        job = _job(req, req.pcd_temperature, tokens)
        decision = await srv.decide(request, job, field="messages")
        answer = build_completion(req, decision, model=model_name, tokenizer=tokenizer)
        if req.stream:
            return StreamingResponse(sse_chunks(answer), media_type="text/event-stream")
        return JSONResponse(answer.body())

    @app.post(DECISIONS)
    async def decisions(request: Request) -> JSONResponse:
        srv.authorize(request)
        body = await srv.read_json(request)

        def prepare() -> Any:
            req = parse_decisions(body, max_questions=srv.max_questions)
            if req.schema is None:  # every question refused: nothing to score
                engine = srv.batcher.worker_decider.engine
                return req, len(engine.encode_ids(req.context))
            return req, srv.check_length(req.schema, req.context, "input")

        req, tokens = await run_in_threadpool(prepare)
        log_request(request.scope.get("pcd.request_id", ""), req)
        decision = None
        cached = written = 0
        if req.schema is not None:
            job = Job(req.schema, req.context, tokens=tokens, cache_key=req.prompt_cache_key)
            decision = await srv.decide(request, job, field="input")
            tokens = decision.prompt_tokens
            head = srv.head_tokens(req.schema)
            cached, written = (head, 0) if decision.prefix_cache_hit else (0, head)
        return JSONResponse(
            build_decision(
                req,
                decision,
                model=model_name,
                input_tokens=tokens,
                cached_tokens=cached,
                cache_write_tokens=written,
            )
        )

    app.add_middleware(_Instrument, metrics=srv.metrics)
    return app
