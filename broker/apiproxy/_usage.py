"""Usage records: what the API proxy did with each request, never what it carried.

Theory of operation: one :class:`UsageRecord` per request that reached the
proxy's HTTP layer, appended as one JSON line (``usage.jsonl`` under the
configured usage directory, below the bounded-agent private root, spec
15.6). A record holds the invocation id (``None`` while disarmed), the
engine and route, the status the client got, the decision category, the
byte counts both ways, the provider-reported token counts when the response
carried them, whether the token clamp lowered a field and how many hosted
tools were stripped -- never a body, a header value, a model name the
client sent, the placeholder or the credential. :func:`encode_record` and
:func:`decode_record` are the one codec (decode validates every field, so a
consumer cannot be fooled by a hand-edited line).

:class:`UsageMeter` reads token counts from the response as it streams past
(SSE ``data:`` events, or one JSON body), in each provider's shape:
Anthropic ``usage.input_tokens``/``output_tokens`` (``message_start`` and
``message_delta``), OpenAI ``usage.prompt_tokens``/``completion_tokens`` and
the Responses API's ``response.usage``, Gemini ``usageMetadata``. Counts are
cumulative in every one of them, so the last value seen wins. It parses at
most :data:`MAX_METERED_EVENT_BYTES` per event and skips longer ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = [
    "CATEGORY_FORWARDED",
    "MAX_METERED_EVENT_BYTES",
    "USAGE_SCHEMA",
    "UsageError",
    "UsageMeter",
    "UsageRecord",
    "decode_record",
    "encode_record",
    "truncated_marker",
]

USAGE_SCHEMA = "bounded-query-apiproxy-usage/v1"
#: The category of a request that went upstream and streamed back completely.
CATEGORY_FORWARDED = "forwarded"
#: One SSE event (or JSON body) the meter parses; usage events are ~300 bytes.
MAX_METERED_EVENT_BYTES = 256 * 1024

_FIELDS = (
    "_schema",
    "timestamp",
    "invocation",
    "engine",
    "route",
    "status",
    "category",
    "requestBytes",
    "responseBytes",
    "inputTokens",
    "outputTokens",
    "clamped",
    "toolsStripped",
)
_INPUT_KEYS = ("input_tokens", "prompt_tokens", "promptTokenCount")
_OUTPUT_KEYS = ("output_tokens", "completion_tokens", "candidatesTokenCount")


class UsageError(ValueError):
    """A usage line is not a valid record (a corrupt or foreign file)."""


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _short(value: object, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and value.isascii()


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One request's usage (validated on construction).

    Raises:
        UsageError: a field out of its domain.
    """

    timestamp: str
    invocation: str | None
    engine: str
    route: str
    status: int
    category: str
    request_bytes: int
    response_bytes: int
    input_tokens: int | None
    output_tokens: int | None
    clamped: bool
    tools_stripped: int

    def __post_init__(self) -> None:
        ok = (
            _short(self.timestamp, 40)
            and (self.invocation is None or _short(self.invocation, 64))
            and _short(self.engine, 16)
            and _short(self.route, 64)
            and isinstance(self.status, int)
            and not isinstance(self.status, bool)
            and 100 <= self.status <= 599
            and _short(self.category, 40)
            and _count(self.request_bytes)
            and _count(self.response_bytes)
            and (self.input_tokens is None or _count(self.input_tokens))
            and (self.output_tokens is None or _count(self.output_tokens))
            and isinstance(self.clamped, bool)
            and _count(self.tools_stripped)
        )
        if not ok:
            raise UsageError("usage record: a field is out of its domain")


def encode_record(record: UsageRecord) -> bytes:
    """One JSON line (with its newline), fields in a fixed order."""
    doc = {
        "_schema": USAGE_SCHEMA,
        "timestamp": record.timestamp,
        "invocation": record.invocation,
        "engine": record.engine,
        "route": record.route,
        "status": record.status,
        "category": record.category,
        "requestBytes": record.request_bytes,
        "responseBytes": record.response_bytes,
        "inputTokens": record.input_tokens,
        "outputTokens": record.output_tokens,
        "clamped": record.clamped,
        "toolsStripped": record.tools_stripped,
    }
    return json.dumps(doc, separators=(",", ":")).encode("ascii") + b"\n"


def decode_record(line: bytes) -> UsageRecord:
    """Parse one line of :func:`encode_record`.

    Raises:
        UsageError: not exactly a usage record.
    """
    try:
        doc = json.loads(line)
    except ValueError:
        raise UsageError("usage record: not JSON") from None
    if not isinstance(doc, dict) or tuple(doc) != _FIELDS or doc["_schema"] != USAGE_SCHEMA:
        raise UsageError("usage record: unexpected fields")
    return UsageRecord(
        timestamp=doc["timestamp"],
        invocation=doc["invocation"],
        engine=doc["engine"],
        route=doc["route"],
        status=doc["status"],
        category=doc["category"],
        request_bytes=doc["requestBytes"],
        response_bytes=doc["responseBytes"],
        input_tokens=doc["inputTokens"],
        output_tokens=doc["outputTokens"],
        clamped=doc["clamped"],
        tools_stripped=doc["toolsStripped"],
    )


def truncated_marker(timestamp: str) -> bytes:
    """The one line written when the usage file reaches its cap."""
    return (
        json.dumps(
            {"_schema": USAGE_SCHEMA, "timestamp": timestamp, "category": "usage-truncated"},
            separators=(",", ":"),
        ).encode("ascii")
        + b"\n"
    )


class UsageMeter:
    """Token counts read from a response stream (see the module docstring)."""

    def __init__(self, content_type: bytes) -> None:
        self._sse = content_type.split(b";")[0].strip().lower() == b"text/event-stream"
        self._buffer = bytearray()
        self._overflow = False
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None

    def feed(self, chunk: bytes) -> None:
        """Account for the next piece of the response body."""
        if not self._sse:
            if not self._overflow:
                self._buffer += chunk
                if len(self._buffer) > MAX_METERED_EVENT_BYTES:
                    self._overflow = True
                    self._buffer.clear()
            return
        self._buffer += chunk
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > MAX_METERED_EVENT_BYTES:
                    self._overflow = True
                    self._buffer.clear()
                return
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if self._overflow:  # the tail of a line we stopped buffering
                self._overflow = False
                continue
            if line.startswith(b"data:"):
                self._event(line[5:].strip())

    def finish(self) -> None:
        """The body ended: parse a buffered JSON body (or a last unterminated line)."""
        if self._overflow:
            return
        data = bytes(self._buffer)
        self._buffer.clear()
        if self._sse:
            if data.startswith(b"data:"):
                self._event(data[5:].strip())
        else:
            self._event(data)

    def _event(self, data: bytes) -> None:
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return
        if not isinstance(obj, dict):
            return
        for holder in (obj, obj.get("message"), obj.get("response")):
            if isinstance(holder, dict):
                self._usage(holder.get("usage"))
        self._usage(obj.get("usageMetadata"))

    def _usage(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        for key in _INPUT_KEYS:
            if _count(usage.get(key)):
                self.input_tokens = usage[key]
        for key in _OUTPUT_KEYS:
            if _count(usage.get(key)):
                self.output_tokens = usage[key]
