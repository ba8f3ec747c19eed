"""A strict reader of the bounded-agent request frame, for the fake agent broker.

The frame (spec 15.3, agents.md "Agent request frame"): ``POST /query``
HTTP/1.1 with exactly one each of ``X-AWF-Agent-Version: 1``,
``X-AWF-Repo: owner/repo`` and ``X-AWF-Schema-B64`` (canonical unpadded
base64url of the schema, decoded by the broker's own protocol code), no other
header of the ``X-AWF-`` family, one ``Content-Length`` and the task as the
body: UTF-8, non-empty, at most ``maxTaskBytes``. The tests hold every
request the wrapper sends to this reader, so a wrapper that adds, repeats,
misspells or drops anything fails them (not only a byte-for-byte comparison
with the wrapper's own framing, which would agree with itself). It is
stricter than the agent broker (no header beyond the transport's four) and
then hands the headers to the broker's own ``parse_agent_frame`` too.
"""

from __future__ import annotations

from dataclasses import dataclass

from bounded_query.broker import protocol
from bounded_query.broker.protocol import policy

#: The headers a frame may carry besides the three ``X-AWF-`` ones.
TRANSPORT_HEADERS = frozenset({b"host", b"content-type", b"content-length", b"connection"})
AGENT_HEADERS = (b"x-awf-agent-version", b"x-awf-repo", b"x-awf-schema-b64")


class FrameError(AssertionError):
    """The wrapper sent something the agent broker must refuse (the wrapper's fault)."""


@dataclass(frozen=True)
class AgentFrame:
    repo: str
    schema: bytes
    task: bytes


def parse_agent_frame(raw: bytes, max_task_bytes: int) -> AgentFrame:
    """Read one captured request strictly; raise :class:`FrameError` on any deviation."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise FrameError("no end of head")
    lines = head.split(b"\r\n")
    if lines[0] != b"POST /query HTTP/1.1":
        raise FrameError(f"request line {lines[0]!r}")
    seen: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or b" " in name:
            raise FrameError(f"malformed header {line!r}")
        key = name.lower()
        if key not in TRANSPORT_HEADERS and key not in AGENT_HEADERS:
            raise FrameError(f"header {name!r} is not part of the frame")
        seen.setdefault(key, []).append(value.strip(b" \t"))
    for key in (*AGENT_HEADERS, b"content-length"):
        if len(seen.get(key, [])) != 1:
            raise FrameError(f"{key!r} must appear exactly once, got {seen.get(key)}")
    if seen[b"x-awf-agent-version"] != [b"1"]:
        raise FrameError(f"agent version {seen[b'x-awf-agent-version']}")
    length = seen[b"content-length"][0]
    if not length.isdigit() or int(length) != len(body):
        raise FrameError(f"content-length {length!r} for a body of {len(body)} bytes")
    if not 0 < len(body) <= max_task_bytes:
        raise FrameError(f"task of {len(body)} bytes (limit {max_task_bytes})")
    try:
        body.decode("utf-8", "strict")
        repo = seen[b"x-awf-repo"][0].decode("ascii", "strict")
    except UnicodeDecodeError as exc:
        raise FrameError(f"not text: {exc}") from None
    if policy.SLUG_RE.fullmatch(repo) is None:
        raise FrameError(f"repository {repo!r} is not a slug")
    try:
        schema = protocol.decode_schema_header(seen[b"x-awf-schema-b64"][0])
    except protocol.RequestError as exc:
        raise FrameError(f"schema header: {exc}") from None
    pairs = [(k, v) for k, values in seen.items() for v in values]
    try:  # and what the agent broker itself accepts (an invalid schema included)
        protocol.parse_agent_frame(pairs, body, max_task_bytes=max_task_bytes)
    except protocol.RequestError as exc:
        raise FrameError(f"the agent broker refuses it: {exc}") from None
    return AgentFrame(repo, schema, body)
