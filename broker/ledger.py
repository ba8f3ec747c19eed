"""Bit ledger and invocation counter derived from the journal (spec 14.1, 14.3).

Theory of operation: the ledger is a pure fold over journal records. Each
invocation moves through a small state machine; :data:`TRANSITIONS` is the
whole table (record kind x current state -> next state), and any pair not in
it means the journal is inconsistent, which fails closed exactly like
corruption. Nothing here performs I/O: the broker journals a record first and
then applies the same record here, so the in-memory view can never run ahead
of the durable one.

Invariants the fold guarantees (and the crash test checks from outside):
the invocation count only grows, spent bits only grow (debits are never
refunded), and an invocation never launches without its debit.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bounded_query.broker.journal import (
    Admitted,
    Debit,
    Header,
    JournalCorrupt,
    Launched,
    Outcome,
    Record,
)
from bounded_query.broker.protocol import RESULT_STATUS_BIT_COST, TIMING_BUCKET_BITS

__all__ = [
    "MIN_CHARGE_BITS",
    "TRANSITIONS",
    "InvocationEntry",
    "InvocationState",
    "JournalInconsistent",
    "Ledger",
    "affordable",
    "next_state",
]

#: The cheapest possible invocation (a schema of cardinality 1): the status bit
#: plus the timing bits and nothing for the value (spec 14.3). A balance below
#: this can fund nothing.
MIN_CHARGE_BITS = RESULT_STATUS_BIT_COST + TIMING_BUCKET_BITS


class JournalInconsistent(JournalCorrupt):
    """Records that cannot follow each other (local fault): refuse to start."""


class InvocationState(enum.Enum):
    """Where an invocation is; ABSENT means no record mentions it yet."""

    ABSENT = "absent"
    ADMITTED = "admitted"  # counted and accepted; debit not yet durable
    REJECTED = "rejected"  # counted and rejected before launch (terminal)
    DEBITED = "debited"  # bits taken; runner not yet started
    LAUNCHED = "launched"  # handed to the runner
    DONE = "done"  # outcome recorded (terminal)


_S = InvocationState
#: (record kind, state) -> next state. ``admitted`` goes to REJECTED when it
#: carries a rejection; that choice is made in :func:`next_state`.
TRANSITIONS: Mapping[tuple[str, InvocationState], InvocationState] = {
    ("admitted", _S.ABSENT): _S.ADMITTED,
    ("debit", _S.ADMITTED): _S.DEBITED,
    ("outcome", _S.ADMITTED): _S.DONE,
    ("launched", _S.DEBITED): _S.LAUNCHED,
    ("outcome", _S.DEBITED): _S.DONE,
    ("outcome", _S.LAUNCHED): _S.DONE,
}
#: States an invocation can be in when the broker dies; replay closes them
#: with an ``interrupted`` outcome (never re-run, never refunded).
IN_FLIGHT = frozenset({_S.ADMITTED, _S.DEBITED, _S.LAUNCHED})

_KINDS: dict[type, str] = {
    Admitted: "admitted",
    Debit: "debit",
    Launched: "launched",
    Outcome: "outcome",
}


def next_state(kind: str, state: InvocationState, *, rejected: bool = False) -> InvocationState:
    """Return the state after a record of ``kind``; pure.

    Raises:
        JournalInconsistent: the pair is not in :data:`TRANSITIONS`.
    """
    target = TRANSITIONS.get((kind, state))
    if target is None:
        raise JournalInconsistent(f"journal record {kind!r} cannot follow state {state.value!r}")
    if kind == "admitted" and rejected:
        return _S.REJECTED
    return target


def affordable(charge: int, spent: int, budget: int | None) -> bool:
    """Whether ``charge`` fits the remaining balance; ``None`` budget is unmetered.

    A sealed repository (budget 0) can never fund even the 4-bit minimum.
    """
    if budget is None:
        return True
    return charge <= budget - spent


@dataclass(slots=True)
class _Entry:
    state: InvocationState
    repo: str | None
    charge: int | None
    rejection: str | None


@dataclass(frozen=True, slots=True)
class InvocationEntry:
    """One counted invocation as the ledger knows it (for reports)."""

    invocation_id: str
    state: InvocationState
    #: The repository and charge of a launched invocation (None for a rejection).
    repo: str | None
    charge: int | None
    #: The protected category of a rejection counted before launch.
    rejection: str | None


class Ledger:
    """The derived view: counts, spent bits per repo, invocation states."""

    def __init__(self) -> None:
        self.invocations = 0
        self._spent: dict[str, int] = {}
        self._entries: dict[str, _Entry] = {}

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> Ledger:
        """Fold a replayed journal. Raises JournalInconsistent."""
        ledger = cls()
        for record in records:
            ledger.apply(record)
        return ledger

    def state_of(self, invocation_id: str) -> InvocationState:
        """Current state of an invocation (ABSENT if never seen)."""
        entry = self._entries.get(invocation_id)
        return entry.state if entry else _S.ABSENT

    def spent(self, repo: str) -> int:
        """Bits debited so far from ``repo`` (case-insensitive)."""
        return self._spent.get(repo.lower(), 0)

    def spent_by_repo(self) -> dict[str, int]:
        """A copy of the spent-bits map (lowercased repo -> bits)."""
        return dict(self._spent)

    def admissions(self) -> tuple[InvocationEntry, ...]:
        """Every counted invocation in admission (journal) order."""
        return tuple(
            InvocationEntry(i, e.state, e.repo, e.charge, e.rejection)
            for i, e in self._entries.items()
        )

    def in_flight(self) -> list[str]:
        """Invocations without a terminal state, in admission order."""
        return [i for i, e in self._entries.items() if e.state in IN_FLIGHT]

    def apply(self, record: Record) -> None:
        """Apply one record. Raises JournalInconsistent (state unchanged)."""
        if isinstance(record, Header):
            return
        kind = _KINDS[type(record)]
        entry = self._entries.get(record.invocation_id)
        state = entry.state if entry else _S.ABSENT
        rejected = isinstance(record, Admitted) and record.rejection is not None
        target = next_state(kind, state, rejected=rejected)
        if isinstance(record, Admitted):
            self._entries[record.invocation_id] = _Entry(
                target, record.repo, record.charge, record.rejection
            )
            self.invocations += 1
            return
        assert entry is not None  # every other kind requires a prior admission
        if isinstance(record, Debit):
            if entry.repo is None or record.repo.lower() != entry.repo.lower():
                raise JournalInconsistent("debit names another repository than its admission")
            if record.bits != entry.charge:
                raise JournalInconsistent("debit differs from the admitted charge")
            key = record.repo.lower()
            self._spent[key] = self._spent.get(key, 0) + record.bits
        entry.state = target
