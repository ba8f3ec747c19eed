"""What one bounded subsystem plugs into the shared pipeline.

Theory of operation: bounded queries (spec 14) and bounded agents (spec 15)
share every step of the pipeline -- the lane, the refusal gate, admission
and its charge, the journal and accounts, the result check, the buckets,
the audit -- and differ in three things only: the request frame (its
headers, and what its body is: a script or a task), the payload the runner
gets for an invocation, and the runner itself. The first two are this
descriptor; the runner is injected next to it (``Service``,
``BrokerServer``). Each subsystem runs its own broker process with its own
private root, so no state is shared between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bounded_query.broker.protocol import MAX_SCRIPT_BYTES, Request, Schema, parse_frame

__all__ = ["BOUNDED_QUERY", "Framed", "Subsystem"]


class Framed(Protocol):
    """What admission needs of a parsed request, whatever its subsystem."""

    @property
    def private_repo(self) -> str:
        """The repository slug the request names."""
        ...

    @property
    def schema(self) -> Schema:
        """The finite response schema (charged before anything runs)."""
        ...


@dataclass(frozen=True, slots=True)
class Subsystem:
    """The request frame and the invocation payload of one subsystem.

    ``parse_frame(headers, body)`` raises ``RequestError`` (the caller's
    fault) for anything it refuses; ``payload`` is the bytes the runner
    receives for a launched request; ``max_body_bytes`` bounds what the
    transport reads.
    """

    name: str
    max_body_bytes: int
    parse_frame: Callable[[Sequence[tuple[bytes, bytes]], bytes], Framed]
    payload: Callable[[Framed], bytes]


def _query_frame(headers: Sequence[tuple[bytes, bytes]], body: bytes) -> Framed:
    return parse_frame(list(headers), body)


def _script(request: Framed) -> bytes:
    assert isinstance(request, Request)
    return request.script.encode("utf-8")


#: Bounded queries: protocol v2 frames, the script as the payload.
BOUNDED_QUERY = Subsystem(
    name="bounded-query",
    max_body_bytes=MAX_SCRIPT_BYTES,
    parse_frame=_query_frame,
    payload=_script,
)
