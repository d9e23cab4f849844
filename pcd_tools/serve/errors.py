"""`ApiError`: an HTTP error with a JSON body that names the limit or the field at fault."""

from __future__ import annotations

from typing import Any

from ..errors import PcdToolsError

__all__ = ["ApiError", "QueueFullError", "error_body"]


class ApiError(PcdToolsError):
    """A request the server answers with an HTTP error status.

    Attributes:
        status: HTTP status code (400, 401, 413, 415, 422, 429, 500, 503).
        type: Machine-readable error kind, e.g. `"invalid_schema"` or `"queue_full"`.
        field: Dotted path of the request field at fault (`"questions.tone.criteria"`), if any.
        headers: Extra response headers (`Retry-After`, `WWW-Authenticate`).
    """

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.field = field
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return error_body(self.type, self.message, self.field)


class QueueFullError(ApiError):
    """The bounded request queue is full; the client should retry after `retry_after` s."""

    def __init__(self, depth: int, limit: int, retry_after: float):
        secs = max(1, round(retry_after + 0.499))
        super().__init__(
            429,
            "queue_full",
            f"The request queue is full ({depth} of max_queue={limit} requests waiting); "
            f"retry after {secs} s.",
            headers={"Retry-After": str(secs), "retry-after-ms": str(int(retry_after * 1000))},
        )
        self.retry_after = retry_after


def error_body(type: str, message: str, field: str | None = None) -> dict[str, Any]:
    """`{"error": {"type", "message", "field"?}}`, the shape of every error response."""
    err: dict[str, Any] = {"type": type, "message": message}
    if field is not None:
        err["field"] = field
    return {"error": err}
