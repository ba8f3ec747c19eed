"""The run's accounts: journal, ledger, invocation cap and their lock (spec 14.1, 14.10).

Theory of operation: one object owns the durable journal (``journal.py``),
the ledger derived from it (``ledger.py``) and ``maxInvocations``, and is
the only place where a record becomes a fact. :meth:`Accounts.commit` is
the whole sequence, written once: under one lock, check that the records
would not count past the cap, append them (and fsync) in a worker thread,
and only then apply them to the ledger, so the in-memory view never runs
ahead of the durable one and concurrent writers (the lane, group-committed
refusals, start-up recovery) can never count past the cap together. A
failed append turns the accounts *broken*: the service then answers every
later request with the canonical error (fail closed).

:func:`open_accounts` is start-up recovery (spec 14.7): open and replay the
journal (a torn tail is truncated and reported, corruption refuses to
start), and close every invocation found in flight with an ``interrupted``
outcome through the same :meth:`Accounts.commit` (never re-run, never
refunded).

The blocking work runs through an injected thread runner
(:class:`ThreadRunner`, by default ``trio.to_thread.run_sync``), so tests
under trio's MockClock can run it inline.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from bounded_query.broker.journal import Admitted, JournalFile, Outcome, Record
from bounded_query.broker.ledger import Ledger

__all__ = [
    "Accounts",
    "CapReached",
    "Recovery",
    "ThreadRunner",
    "open_accounts",
]

_T = TypeVar("_T")


class ThreadRunner(Protocol):
    """Runs a blocking call off the event loop (``trio.to_thread.run_sync``'s shape)."""

    def __call__(self, fn: Callable[..., _T], /, *args: Any) -> Awaitable[_T]:
        """Return an awaitable of ``fn(*args)``."""
        ...


class CapReached(Exception):
    """maxInvocations is reached: nothing was written (internal control flow)."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """What start-up replay found (for the operator and the tests)."""

    torn_bytes: int
    interrupted: list[str]
    invocations: int


class Accounts:
    """Journal + ledger + cap + lock; :meth:`commit` is the only way to record a fact."""

    def __init__(
        self,
        journal: JournalFile,
        ledger: Ledger,
        max_invocations: int,
        *,
        run_sync: ThreadRunner = trio.to_thread.run_sync,
    ) -> None:
        self.journal = journal
        self.ledger = ledger
        self.max_invocations = max_invocations
        #: True after a failed append: nothing can be recorded any more.
        self.broken = False
        self._run_sync = run_sync
        self._lock = trio.Lock()

    @property
    def invocations(self) -> int:
        """Invocations counted so far (every journaled ``admitted`` record)."""
        return self.ledger.invocations

    @property
    def room(self) -> int:
        """How many more invocations the cap allows (never negative)."""
        return max(0, self.max_invocations - self.ledger.invocations)

    async def commit(self, records: Sequence[Record], *, sync: bool = True) -> None:
        """Append ``records`` in one write (+ fsync), then apply them to the ledger.

        ``sync=False`` is for records that authorize nothing (outcomes).

        Raises:
            CapReached: the records would count past ``maxInvocations``
                (nothing was written).
            OSError: the append failed (the accounts are broken from now on).
        """
        counted = sum(isinstance(record, Admitted) for record in records)
        async with self._lock:
            if counted and self.ledger.invocations + counted > self.max_invocations:
                raise CapReached
            try:
                await self._run_sync(self.journal.append, records, sync)
            except OSError:
                self.broken = True
                raise
            for record in records:
                self.ledger.apply(record)

    def close(self) -> None:
        """Close the journal (idempotent)."""
        self.journal.close()


async def open_accounts(
    journal_path: Path,
    run_id: str,
    max_invocations: int,
    *,
    run_sync: ThreadRunner = trio.to_thread.run_sync,
) -> tuple[Accounts, Recovery]:
    """Open and replay the journal, close in-flight invocations; return the accounts.

    Raises:
        JournalCorrupt: the journal cannot be trusted (including records that
            cannot follow each other); refuse to start.
        OSError: the private root is not usable (local fault).
    """
    journal = await run_sync(JournalFile.open, journal_path, run_id)
    try:
        ledger = await run_sync(Ledger.from_records, journal.replayed)
        accounts = Accounts(journal, ledger, max_invocations, run_sync=run_sync)
        stragglers = ledger.in_flight()
        if stragglers:
            await accounts.commit([Outcome(i, "interrupted", "broker-restart") for i in stragglers])
    except BaseException:
        journal.close()
        raise
    return accounts, Recovery(journal.torn_bytes, stragglers, ledger.invocations)
