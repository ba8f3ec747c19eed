"""The refusal gate: while a request holds the lane unanswered, the broker answers nothing else.

Theory of operation: a refusal answered the moment it is raised (malformed
HTTP, a missed read deadline, the connection cap: ``server.py``,
``http.py``) would be a free, fine-grained clock. Its latency follows the
broker's load, and the broker's work peaks exactly when a query ends
(result check, container and workspace removal): the secret moment the
timing bucket exists to hide. A fixed delay or grid would not help (the
wake-up at the delayed moment is just as late under load). So the gate
closes when a request enters the lane and opens when that request's
bucketed answer leaves; every other client I/O waits for it:

* a refusal waits (:meth:`RefusalGate.hold`) and leaves with the answer,
  which the agent sees anyway;
* nothing is accepted: a pending accept is cancelled when the gate closes
  (:meth:`RefusalGate.cancelled_when_closed`), new connections wait in the
  kernel's listen backlog;
* nothing is read: ``http.read_request(hold=gate.hold)`` awaits the gate
  before each receive, and read deadlines count only time spent reading.

When the lane is idle nothing secret is running and refusals leave at once.
The gate is the lane's view of one fact (is a request deciding?); which
state the lane is in is ``lane.py``'s table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import trio

__all__ = ["RefusalGate"]


class RefusalGate:
    """Open when no request holds the lane unanswered."""

    def __init__(self) -> None:
        #: Set when the current holder has answered; None before the first.
        self._event: trio.Event | None = None
        #: Cancel scopes of client I/O to stop when the gate closes (accept).
        self._watchers: set[trio.CancelScope] = set()

    @property
    def is_open(self) -> bool:
        """True when client I/O may proceed."""
        return self._event is None or self._event.is_set()

    def close(self) -> None:
        """A request entered the lane: hold every refusal, cancel pending accepts."""
        self._event = trio.Event()
        for watcher in self._watchers:
            watcher.cancel()

    def open(self) -> None:
        """The holder's answer left (or the run halted): release what waits. Idempotent."""
        if self._event is not None:
            self._event.set()

    async def hold(self) -> None:
        """Wait until the gate is open (at once when it is)."""
        event = self._event
        if event is not None:
            await event.wait()

    @contextlib.contextmanager
    def cancelled_when_closed(self) -> Iterator[trio.CancelScope]:
        """A cancel scope cancelled as soon as the gate closes (already, if it is closed)."""
        with trio.CancelScope() as scope:
            self._watchers.add(scope)
            try:
                if not self.is_open:
                    scope.cancel()
                yield scope
            finally:
                self._watchers.discard(scope)
