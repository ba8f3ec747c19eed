"""The API proxy's limits, each with its reason (spec 15.2, 15.10).

The model bounds themselves (``maxModelRequests``, ``maxModelTokens``) are
policy (``broker/protocol/policy.py``); these are the transport's bounds.
"""

from __future__ import annotations

__all__ = [
    "CONNECTION_CAP",
    "CONNECT_TIMEOUT_S",
    "CONTROL_MAX_BODY_BYTES",
    "DEFAULT_RESPONSE_TIMEOUT_S",
    "MAX_BODY_DEPTH",
    "MAX_CREDENTIAL_BYTES",
    "MAX_FORWARDED_HEADER_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_RESPONSE_BYTES",
    "MAX_RESPONSE_TIMEOUT_S",
    "MAX_USAGE_FILE_BYTES",
    "MAX_USAGE_LINE_BYTES",
    "READ_TIMEOUT_S",
]

#: A model request body. An engine resends the whole conversation each turn;
#: with at most 64 turns of tool output (file excerpts) 8 MiB is generous,
#: and it bounds what one connection makes the proxy parse and hold.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
#: JSON nesting of a request body: tool input schemas nest, but not this deep.
MAX_BODY_DEPTH = 64
#: One forwarded header value (an ``anthropic-beta`` list is ~300 bytes).
MAX_FORWARDED_HEADER_BYTES = 1024
#: A response streamed back. At most 32768 completion tokens (policy
#: MAX_MODEL_TOKENS) are ~128 KiB of text; SSE framing multiplies that by
#: well under 10, so 4 MiB is far beyond any honest answer.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: Concurrent client connections; more are answered 503 at once. Engines make
#: one or two requests at a time; each may hold a MAX_REQUEST_BYTES body.
CONNECTION_CAP = 16
#: Upstream connect (TCP + TLS) bound.
CONNECT_TIMEOUT_S = 10.0
#: Longest silence between two upstream chunks (a model may think a while
#: before its first token).
READ_TIMEOUT_S = 120.0
#: One whole upstream exchange, by default and at most: the invocation's own
#: timeout (spec 15.2 ``timeout``, at most 540 s) bounds it anyway.
DEFAULT_RESPONSE_TIMEOUT_S = 300.0
MAX_RESPONSE_TIMEOUT_S = 540.0
#: The provider credential file (API keys are ~100 bytes).
MAX_CREDENTIAL_BYTES = 4096
#: A control request (arm: an id and a placeholder).
CONTROL_MAX_BODY_BYTES = 1024
#: The usage log of one proxy process: a flooding enclave must not fill the
#: disk. Past the cap one ``usage-truncated`` line is written, then nothing.
MAX_USAGE_FILE_BYTES = 16 * 1024 * 1024
#: One usage line (fixed fields and numbers only).
MAX_USAGE_LINE_BYTES = 1024
