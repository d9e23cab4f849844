"""Reading a request body: size limit, Content-Encoding, strict JSON and Unicode checks.

Every failure is an `ApiError` with the status and error code the client sees.
"""

from __future__ import annotations

import importlib
import json
import zlib
from typing import Any

from fastapi import Request

from .errors import ApiError

__all__ = ["read_json_body"]


async def read_json_body(request: Request, limit: int) -> Any:
    """The request's JSON body, size-checked, decompressed and strictly parsed.

    Args:
        request: The incoming request.
        limit: Largest body in bytes, after decompression.

    Raises:
        ApiError: 413 for a body over `limit`, 415 for an unsupported Content-Encoding,
            422 for a multipart body and 400 for an empty or malformed one.
    """
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
