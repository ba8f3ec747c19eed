"""The broker child's stderr as versioned records.

Theory of operation: the broker writes its diagnostics to stderr as single
JSON lines (``{"event": "broker-ready", ...}``) with neither a record type
nor a timestamp. The harness gives the child a pipe instead of its own
stderr and relays every line as a ``bounded-query-broker/v1`` record
(:data:`BROKER_SCHEMA`, described by
``harness/schemas/bounded-query-broker.v1.schema.json``) through the run's
:class:`.events.EventSink`, so every line on the harness's stderr leads with
``_schema`` and ``timestamp``, and the sink's redaction of the run's roots
applies to the broker's words too.

The core is pure: :class:`LineSplitter` cuts the byte stream into lines of
at most :data:`MAX_BROKER_LINE_BYTES` (the rest of a longer line is
discarded as it arrives, so nothing grows without bound) and
:func:`broker_record` turns one line into ``(event, fields)``. A line is
relayed with its own fields only when it is a JSON object whose ``event`` is
a broker event name and whose other members are named like event fields and
hold JSON scalars; anything else -- not UTF-8, not JSON, truncated, a nested
value, a forbidden field name such as ``script`` -- becomes a
``broker-line-unparsed`` record carrying the text (decoded with
replacement), so a hostile or broken line is still a valid record and never
stops the relay. After :data:`MAX_BROKER_RECORDS` records the relay only
counts, and reports the count once as ``broker-lines-dropped``.

:func:`relay_broker_log` is the thin trio layer (``child.ChildBroker``
runs it for the broker's whole life, teardown included).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import trio

from bounded_query.harness.records.events import EventSink

__all__ = [
    "BROKER_SCHEMA",
    "LINES_DROPPED",
    "LINE_UNPARSED",
    "MAX_BROKER_LINE_BYTES",
    "MAX_BROKER_RECORDS",
    "LineSplitter",
    "broker_record",
    "relay_broker_log",
]

#: Record type of a relayed broker line (bump on incompatible change).
BROKER_SCHEMA = "bounded-query-broker/v1"

#: The broker's lines are a few hundred bytes (a config error's detail is
#: the longest); a longer line is cut here and relayed as unparsed text.
MAX_BROKER_LINE_BYTES = 4096

#: Records relayed per run; past this a looping broker (a bug report per
#: request, say) fills no more of the operator's log, it is only counted.
MAX_BROKER_RECORDS = 10_000

#: The relay's own events (the broker never names one of its lines so).
LINE_UNPARSED = "broker-line-unparsed"
LINES_DROPPED = "broker-lines-dropped"

_EVENT_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")
_FIELD_NAME = re.compile(r"[a-z][A-Za-z0-9_]{0,63}")
#: Names a record may never carry (the event schema's own rule, plus the
#: relay's fixed keys, which the sink writes itself).
_FORBIDDEN = frozenset({"script", "output", "token"})
_OWN_KEYS = frozenset({"_schema", "timestamp"})
_READ_CHUNK = 64 * 1024


class LineSplitter:
    """Newline-delimited lines of at most ``limit`` bytes, whole or bytewise alike.

    ``feed`` returns ``(line, truncated)`` for every line completed by the
    data; of a longer line only the first ``limit`` bytes are kept (and it
    is marked truncated), the rest is dropped as it arrives.
    """

    def __init__(self, limit: int = MAX_BROKER_LINE_BYTES) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._truncated = False

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        out: list[tuple[bytes, bool]] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            room = self._limit - len(self._buffer)
            piece = data[start:end]
            if len(piece) > room:
                piece = piece[:room]
                self._truncated = True
            self._buffer += piece
            if newline < 0:
                break
            out.append((bytes(self._buffer), self._truncated))
            self._buffer = bytearray()
            self._truncated = False
            start = newline + 1
        return out

    def finish(self) -> list[tuple[bytes, bool]]:
        """End of stream: a last line without its newline still counts."""
        if not self._buffer and not self._truncated:
            return []
        rest = (bytes(self._buffer), self._truncated)
        self._buffer = bytearray()
        self._truncated = False
        return [rest]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _scalar(value: object) -> bool:
    if value is None or isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _fields(line: bytes) -> tuple[str, dict[str, Any]] | None:
    """The broker's own ``(event, fields)`` if the line is one of its records."""
    try:
        obj = json.loads(line.decode("utf-8", "strict"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    event = obj.pop("event", None)
    if not isinstance(event, str) or not _EVENT_NAME.fullmatch(event):
        return None
    if event in (LINE_UNPARSED, LINES_DROPPED):
        return None
    fields: dict[str, Any] = {}
    for name, value in obj.items():
        if name in _OWN_KEYS:
            continue  # the relay writes its own type and time
        if name in _FORBIDDEN or not _FIELD_NAME.fullmatch(name) or not _scalar(value):
            return None
        fields[name] = value
    return event, fields


def broker_record(line: bytes, truncated: bool = False) -> tuple[str, dict[str, Any]]:
    """The ``(event, fields)`` of the record relaying one broker line (never raises).

    A well-formed broker line keeps its event name and fields; any other
    line is ``broker-line-unparsed`` with ``text`` (the line decoded as
    UTF-8 with replacement), ``bytes`` (its length as kept) and
    ``truncated`` (it was longer than :data:`MAX_BROKER_LINE_BYTES`).
    """
    if not truncated:
        found = _fields(line.rstrip(b"\r"))
        if found is not None:
            return found
    return LINE_UNPARSED, {
        "text": line.decode("utf-8", "replace"),
        "bytes": len(line),
        "truncated": truncated,
    }


async def relay_broker_log(
    stream: trio.abc.ReceiveStream, sink: EventSink, subsystem: str | None = None
) -> None:
    """Relay ``stream`` (the broker's stderr) as records until end of stream.

    Cancellation stops the relay; the lines already complete are relayed
    and the count of dropped ones reported either way. The stream is closed
    on every way out. With ``subsystem`` (the bounded-agent broker's, spec
    15.1) every record also names it in ``subsystem``, replacing any such
    field of the broker's line.
    """
    splitter = LineSplitter()
    named = {} if subsystem is None else {"subsystem": subsystem}
    relayed = 0
    dropped = 0

    def relay(lines: list[tuple[bytes, bool]]) -> None:
        nonlocal relayed, dropped
        for line, truncated in lines:
            if relayed >= MAX_BROKER_RECORDS:
                dropped += 1
                continue
            relayed += 1
            event, fields = broker_record(line, truncated)
            sink.relay(BROKER_SCHEMA, event, {**fields, **named})

    try:
        while True:
            chunk = await stream.receive_some(_READ_CHUNK)
            if not chunk:
                break
            relay(splitter.feed(bytes(chunk)))
        relay(splitter.finish())
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the pipe broke: nothing more to read
    finally:
        if dropped:
            sink.relay(BROKER_SCHEMA, LINES_DROPPED, {"count": dropped, **named})
        with trio.CancelScope(shield=True):
            await stream.aclose()
