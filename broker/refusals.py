"""Counting what the lane does not answer: transport refusals and the audit tally.

Theory of operation (spec 14.10: "maxInvocations counts every response,
including rejections"). A transport-level refusal (malformed HTTP, a missed
read deadline, an oversize head or body, the connection cap; ``server.py``)
is counted too, journaled as an ``admitted`` record carrying the refusal as
its rejection, exactly like a lane rejection, with two deliberate
differences:

* it is counted *after* it was answered, so its timing depends on nothing
  but the client's own bytes and the refusal gate (not on the journal's
  fsync, which an invocation could slow down); a broker killed between the
  answer and the fsync forgets those few counts, which is harmless: such an
  answer carried no repository information, and the cap is an operational
  limit, not a disclosure bound;
* once the cap is reached (or the journal has failed, or the run halted)
  nothing more is journaled, so a hostile client causes at most
  ``maxInvocations`` journal writes in a whole run.

Counting is a group commit (:class:`RefusalCounter`): one ``admitted``
record per refusal but one append and fsync per batch, and only the
connection doing the flush waits for the disk, so a flood below the cap
cannot keep the connection slots busy. The cap check and the append happen
under the accounts' lock, so refusals and the lane never count past the cap
together.

An answer that was journaled gets an audit line of its own; an uncounted
one only adds to a per-category tally that leaves as one summary record per
interval and at shutdown (:class:`AuditSink`), so a flood costs O(1) audit
bytes. An audit failure never changes an answer: the journal holds the
truth.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import trio

from bounded_query.broker.accounts import Accounts, CapReached, ThreadRunner
from bounded_query.broker.audit import AuditLog, AuditRecord, RefusalSummary, RefusalTally
from bounded_query.broker.journal import Admitted

__all__ = ["AuditSink", "RefusalCounter"]


class AuditSink:
    """Audit lines written off the event loop, and the tally of uncounted answers."""

    def __init__(
        self, log: AuditLog, run_sync: ThreadRunner, wall_clock: Callable[[], float]
    ) -> None:
        self.log = log
        self._run_sync = run_sync
        self._wall_clock = wall_clock
        self._tally = RefusalTally()

    def wall(self) -> float:
        """The wall time of an audit line (milliseconds)."""
        return round(self._wall_clock(), 3)

    async def record(self, record: AuditRecord) -> None:
        """Write one line; never raises on I/O."""
        with contextlib.suppress(OSError):
            await self._run_sync(self.log.write, record)

    async def records(self, records: Sequence[AuditRecord]) -> None:
        """Write several lines in one worker-thread trip; never raises on I/O."""
        if records:
            await self._run_sync(self._write_each, records)

    def _write_each(self, records: Sequence[AuditRecord]) -> None:
        for record in records:
            with contextlib.suppress(OSError):
                self.log.write(record)

    async def tally(self, category: str) -> None:
        """Count one uncounted answer (one summary line per interval)."""
        due = self._tally.add(category, trio.current_time(), self.wall())
        if due is not None:
            await self._summary(due)

    async def flush(self) -> None:
        """Write the pending summary (at shutdown); never raises on I/O."""
        pending = self._tally.flush(self.wall())
        if pending is not None:
            await self._summary(pending)

    async def _summary(self, summary: RefusalSummary) -> None:
        with contextlib.suppress(OSError):
            await self._run_sync(self.log.write_summary, summary)


class RefusalCounter:
    """Group commit of answered transport refusals (module docstring).

    ``stopped`` says whether the run has halted (nothing is journaled then).
    """

    def __init__(
        self,
        accounts: Accounts,
        sink: AuditSink,
        new_id: Callable[[], str],
        stopped: Callable[[], bool],
    ) -> None:
        self._accounts = accounts
        self._sink = sink
        self._new_id = new_id
        self._stopped = stopped
        #: Answered refusals waiting to be counted (at most the cap's room).
        self._pending: list[str] = []
        self._flushing = False

    def _closed(self) -> bool:
        return self._accounts.broken or self._stopped()

    async def count(self, reason: str) -> None:
        """Count and audit one refusal the server already answered; never raises on I/O.

        The refusal joins the pending batch; the first caller to find no
        flush in progress writes every pending refusal while the others
        return at once. Past the cap, after a journal failure or a halt it
        only adds to the tally.
        """
        if self._closed() or len(self._pending) >= self._accounts.room:
            await self._sink.tally(reason)
            return
        self._pending.append(reason)
        if not self._flushing:
            await self.flush()

    async def flush(self) -> None:
        """Journal and audit every pending refusal, batch by batch (also at shutdown)."""
        if self._flushing:
            return
        self._flushing = True
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._count_batch(batch)
        finally:
            self._flushing = False

    async def _count_batch(self, batch: list[str]) -> None:
        """Journal as many of ``batch`` as the cap allows (one append); tally the rest."""
        counted = await self._journal(batch)
        wall = self._sink.wall()
        await self._sink.records(
            [AuditRecord(r.invocation_id, r.rejection or "", wall_time=wall) for r in counted]
        )
        for reason in batch[len(counted) :]:
            await self._sink.tally(reason)

    async def _journal(self, batch: list[str]) -> list[Admitted]:
        """The records journaled for the head of ``batch`` (none if closed or full)."""
        while not self._closed():
            records = [Admitted(self._new_id(), rejection=r) for r in batch[: self._accounts.room]]
            if not records:
                return []
            try:
                await self._accounts.commit(records)
            except CapReached:
                continue  # the lane took a slot meanwhile: recompute the room
            except OSError:
                return []  # the accounts are broken now
            return records
        return []
