"""The bytes the API proxy writes to the enclave (pure).

Theory of operation: every response is ``HTTP/1.1``, ``connection: close``,
and either a fixed JSON error body with a ``content-length`` (a refusal, an
upstream error, a proxy failure) or a chunked stream of the upstream's
bytes. Error bodies never carry the upstream's text: a provider's error
message can quote a (masked) credential or request data, and the category
is for the operator's usage record, not for the enclave. The one body is
shaped so the Anthropic, OpenAI and Gemini clients all find
``error.message`` in it.
"""

from __future__ import annotations

import http
import re

__all__ = [
    "LAST_CHUNK",
    "REFUSED_BODY",
    "UPSTREAM_ERROR_BODY",
    "chunk",
    "error_response",
    "stream_head",
]

REFUSED_BODY = (
    b'{"type":"error","error":{"type":"invalid_request_error",'
    b'"message":"refused by the API proxy"}}'
)
UPSTREAM_ERROR_BODY = b'{"type":"error","error":{"type":"api_error","message":"upstream error"}}'
LAST_CHUNK = b"0\r\n\r\n"

#: A ``retry-after`` the engine may see: delta-seconds only (no dates, no text).
_RETRY_AFTER = re.compile(rb"[0-9]{1,6}")
#: A content type we pass on: a plain ``type/subtype`` with simple parameters.
_CONTENT_TYPE = re.compile(
    rb"[A-Za-z0-9.+-]{1,40}/[A-Za-z0-9.+-]{1,60}(?:; ?[a-z]{1,20}=[A-Za-z0-9._-]{1,40})?"
)


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Status"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("ascii")


def error_response(status: int, body: bytes, retry_after: bytes | None = None) -> bytes:
    """A complete response: ``status``, a fixed JSON ``body``, connection close.

    ``retry_after`` is passed on only when it is plain delta-seconds.
    """
    head = _status_line(status) + b"content-type: application/json\r\n"
    if retry_after is not None and _RETRY_AFTER.fullmatch(retry_after.strip()):
        head += b"retry-after: " + retry_after.strip() + b"\r\n"
    head += b"content-length: " + str(len(body)).encode("ascii") + b"\r\n"
    return head + b"connection: close\r\n\r\n" + body


def stream_head(status: int, content_type: bytes | None) -> bytes:
    """The head of a streamed (chunked) response; an odd content type becomes JSON."""
    if content_type is None or not _CONTENT_TYPE.fullmatch(content_type.strip()):
        content_type = b"application/json"
    return (
        _status_line(status)
        + b"content-type: "
        + content_type.strip()
        + b"\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\n"
        + b"connection: close\r\n\r\n"
    )


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (never empty: that would end the body)."""
    if not data:
        raise ValueError("an empty chunk ends the body")
    return f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n"
