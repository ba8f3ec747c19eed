"""HTTP/1.1 transport: h11 parsing over a trio stream (spec 14.7, 14.8).

Theory of operation: one request per connection. :func:`read_request` drives
an h11 server connection over any trio ``Stream`` until exactly one complete
request (head and body) has arrived, enforcing every transport limit on the
way: the head must fit :data:`MAX_HEADER_BYTES` and arrive within the header
deadline; the declared body must fit ``max_body`` (checked on Content-Length
*before* reading any body byte) and arrive within the body deadline; chunked
bodies are refused (the reference wrapper always sends a Content-Length).
Anything else is an :class:`HttpReject`, a client fault whose ``reason`` goes
to the audit log only.

The head is measured on the raw bytes as received (request line, every
header line with its whitespace, the blank line), not on what h11 hands back
after trimming: h11 checks its cap only while a head is incomplete, so a head
that arrives in one read would otherwise be undercounted. The same raw head
is checked for what h11 tolerates but a smuggling-resistant server must not:
obsolete line folding (h11 silently unfolds it) and a repeated
Content-Length (h11 silently merges identical copies). Every check depends
only on the client's own bytes, so the refusal itself carries nothing; *when*
it leaves is the server's refusal gate (``server.py``, ``service.py``).

Responses are not built by h11: every response the broker ever sends is the
same fixed status line and header block around one of the two canonical
bodies (:func:`response_bytes`), so no error path can produce a distinguishable
byte layout. ``Expect: 100-continue`` is answered with the fixed interim
response so curl does not stall for a second before sending the body.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import h11
import trio

from bounded_query.broker.protocol import policy

__all__ = [
    "BODY_TIMEOUT_S",
    "CONTINUE_BYTES",
    "HEADER_TIMEOUT_S",
    "MAX_HEADER_BYTES",
    "HttpReject",
    "HttpRequest",
    "check_raw_head",
    "read_request",
    "response_bytes",
    "send_response",
]

#: Header block cap (h11 ``max_incomplete_event_size``); curl's head is ~250 B.
MAX_HEADER_BYTES = 8 * 1024
#: Deadline for the request head, from connection accept (slowloris bound).
HEADER_TIMEOUT_S = 5.0
#: Deadline for the body, from the end of the head.
BODY_TIMEOUT_S = 5.0
#: Deadline for writing a response; a client that never reads is dropped.
SEND_TIMEOUT_S = 5.0
#: Read size per receive call; bounds what h11 may buffer beyond the limits.
RECEIVE_BYTES = 16 * 1024

CONTINUE_BYTES = b"HTTP/1.1 100 Continue\r\n\r\n"


class HttpReject(Exception):
    """The client broke the transport rules (remote fault); ``reason`` is for the audit."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One complete request as received; headers keep h11's lowercased names."""

    method: bytes
    target: bytes
    http_version: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


def response_bytes(body: bytes) -> bytes:
    """The one response layout: 200, JSON content type, length, connection close."""
    return (
        b"HTTP/1.1 200 OK\r\n"
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode("ascii") + b"\r\n"
        b"connection: close\r\n"
        b"\r\n" + body
    )


class _ReadClock:
    """A deadline counted only while reading: time spent in ``hold`` is not charged.

    ``reason`` is the refusal when it runs out.
    """

    def __init__(self, seconds: float, reason: str) -> None:
        self.remaining = seconds
        self.reason = reason


async def _next_event(
    conn: h11.Connection,
    stream: trio.abc.Stream,
    clock: _ReadClock,
    hold: Callable[[], Awaitable[None]] | None,
    malformed: str = policy.CATEGORY_HTTP_MALFORMED,
    record: bytearray | None = None,
) -> object:
    """Next h11 event, receiving more bytes as needed (EOF is fed to h11).

    Before each receive, ``hold`` (if any) is awaited outside the deadline;
    each receive may use what is left of ``clock``. Every byte received is
    also appended to ``record`` when one is given.
    """
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise HttpReject(malformed) from exc
        if event is not h11.NEED_DATA:
            return event
        if hold is not None:
            await hold()
        started = trio.current_time()
        with trio.move_on_after(clock.remaining) as scope:
            try:
                data = await stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise HttpReject(policy.CATEGORY_HTTP_CONNECTION_LOST) from exc
        if scope.cancelled_caught:
            raise HttpReject(clock.reason)
        # A receive that returned at the deadline may overshoot it slightly.
        clock.remaining = max(0.0, clock.remaining - (trio.current_time() - started))
        if record is not None:
            record += data
        try:
            conn.receive_data(bytes(data))
        except h11.RemoteProtocolError as exc:  # pragma: no cover - h11 raises in next_event
            raise HttpReject(policy.CATEGORY_HTTP_MALFORMED) from exc


#: An obsolete line fold: a header line that starts with a space or a tab.
_OBS_FOLD = re.compile(rb"\n[ \t]")


def check_raw_head(head: bytes) -> str | None:
    """Audit reason for a raw head h11 accepted but we refuse, else None (pure).

    ``head`` is the complete request head exactly as received, up to and
    including the blank line. Refused: more than :data:`MAX_HEADER_BYTES`,
    obsolete line folding, and more than one Content-Length line.
    """
    if len(head) > MAX_HEADER_BYTES:
        return policy.CATEGORY_HTTP_HEADER_TOO_LARGE
    if _OBS_FOLD.search(head) is not None:
        return policy.CATEGORY_HTTP_OBS_FOLD
    lengths = 0
    for line in head.split(b"\n")[1:]:
        name, colon, _ = line.partition(b":")
        if colon and name.strip().lower() == b"content-length":
            lengths += 1
    if lengths > 1:
        return policy.CATEGORY_HTTP_DUPLICATE_LENGTH
    return None


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    values = [v for n, v in headers if n == b"content-length"]
    if not values:
        return None
    # h11 already rejects malformed or conflicting lengths.
    return int(values[0])


async def read_request(
    stream: trio.abc.Stream,
    *,
    max_body: int,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
    hold: Callable[[], Awaitable[None]] | None = None,
) -> HttpRequest:
    """Read exactly one request from ``stream``.

    ``hold``, if given, is awaited before every receive and before the
    ``100 Continue`` interim response (the server passes its refusal gate:
    while a query runs, the broker reads and sends nothing, so the client
    cannot time it). The deadlines count only the time spent receiving, never
    the time held.

    Raises:
        HttpReject: malformed HTTP, oversize head or body, chunked body, a
            missed deadline, or the peer went away before the request ended.
    """
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
    raw_head = bytearray()
    head_clock = _ReadClock(header_timeout_s, policy.CATEGORY_HTTP_HEADER_TIMEOUT)
    event = await _next_event(conn, stream, head_clock, hold, record=raw_head)
    if not isinstance(event, h11.Request):
        raise HttpReject(policy.CATEGORY_HTTP_NO_REQUEST)
    headers = list(event.headers.raw_items())
    # The raw head is what was received minus what h11 has not consumed yet
    # (the start of the body, or a pipelined request).
    unconsumed, _ = conn.trailing_data
    reason = check_raw_head(bytes(raw_head[: len(raw_head) - len(unconsumed)]))
    if reason is not None:
        raise HttpReject(reason)
    lowered = [(name.lower(), value) for name, value in headers]
    if any(name == b"transfer-encoding" for name, _ in lowered):
        raise HttpReject(policy.CATEGORY_HTTP_CHUNKED)
    if any(name == b"upgrade" for name, _ in lowered):
        raise HttpReject(policy.CATEGORY_HTTP_UPGRADE)
    length = _content_length(lowered)
    if length is not None and length > max_body:
        raise HttpReject(policy.CATEGORY_HTTP_BODY_TOO_LARGE)
    if conn.they_are_waiting_for_100_continue:
        if hold is not None:
            await hold()
        with trio.move_on_after(SEND_TIMEOUT_S):
            try:
                await stream.send_all(CONTINUE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise HttpReject(policy.CATEGORY_HTTP_CONNECTION_LOST) from exc
    chunks: list[bytes] = []
    received = 0
    body_clock = _ReadClock(body_timeout_s, policy.CATEGORY_HTTP_BODY_TIMEOUT)
    while True:
        part = await _next_event(conn, stream, body_clock, hold, policy.CATEGORY_HTTP_TRUNCATED)
        if isinstance(part, h11.Data):
            received += len(part.data)
            if received > max_body:  # pragma: no cover - Content-Length is checked
                raise HttpReject(policy.CATEGORY_HTTP_BODY_TOO_LARGE)
            chunks.append(bytes(part.data))
        elif isinstance(part, h11.EndOfMessage):
            break
        else:
            raise HttpReject(policy.CATEGORY_HTTP_TRUNCATED)
    return HttpRequest(
        method=bytes(event.method),
        target=bytes(event.target),
        http_version=bytes(event.http_version),
        headers=tuple((bytes(n), bytes(v)) for n, v in headers),
        body=b"".join(chunks),
    )


async def send_response(stream: trio.abc.Stream, body: bytes) -> None:
    """Send the fixed response and close the stream; never raises on a gone peer."""
    with trio.move_on_after(SEND_TIMEOUT_S):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(response_bytes(body))
    with trio.move_on_after(SEND_TIMEOUT_S):
        await stream.aclose()
