"""Ledger fold and the invocation state table (broker/ledger.py), exhaustively."""

from __future__ import annotations

import itertools

import pytest

from bounded_query.broker.journal import Admitted, Debit, Header, Launched, Outcome, Record
from bounded_query.broker.ledger import (
    MIN_CHARGE_BITS,
    TRANSITIONS,
    InvocationState,
    JournalInconsistent,
    Ledger,
    affordable,
    next_state,
)

S = InvocationState
INV = "aa"
KINDS = ["admitted", "debit", "launched", "outcome"]

# The expected table, written out independently of TRANSITIONS.
EXPECTED = {
    ("admitted", S.ABSENT): S.ADMITTED,
    ("debit", S.ADMITTED): S.DEBITED,
    ("outcome", S.ADMITTED): S.DONE,
    ("launched", S.DEBITED): S.LAUNCHED,
    ("outcome", S.DEBITED): S.DONE,
    ("outcome", S.LAUNCHED): S.DONE,
}


def _record(kind: str, inv: str = INV, *, rejected: bool = False) -> Record:
    if kind == "admitted":
        if rejected:
            return Admitted(inv, rejection="invalid-request")
        return Admitted(inv, repo="o/r", charge=5)
    if kind == "debit":
        return Debit(inv, "o/r", 5)
    if kind == "launched":
        return Launched(inv)
    return Outcome(inv, "ok")


# Shortest record sequence that brings an invocation into each state.
PREFIX: dict[InvocationState, list[Record]] = {
    S.ABSENT: [],
    S.ADMITTED: [_record("admitted")],
    S.REJECTED: [_record("admitted", rejected=True)],
    S.DEBITED: [_record("admitted"), _record("debit")],
    S.LAUNCHED: [_record("admitted"), _record("debit"), _record("launched")],
    S.DONE: [_record("admitted"), _record("outcome")],
}


def test_table_matches_expectation():
    assert dict(TRANSITIONS) == EXPECTED


@pytest.mark.parametrize(("kind", "state"), list(itertools.product(KINDS, list(S))))
def test_every_kind_in_every_state(kind, state):
    ledger = Ledger.from_records(PREFIX[state])
    assert ledger.state_of(INV) is state
    before = (ledger.invocations, ledger.spent_by_repo())
    expected = EXPECTED.get((kind, state))
    if expected is None:
        with pytest.raises(JournalInconsistent):
            next_state(kind, state)
        with pytest.raises(JournalInconsistent):
            ledger.apply(_record(kind))
        assert (ledger.invocations, ledger.spent_by_repo()) == before
        assert ledger.state_of(INV) is state
    else:
        assert next_state(kind, state) is expected
        ledger.apply(_record(kind))
        assert ledger.state_of(INV) is expected
        assert ledger.invocations == before[0] + (kind == "admitted")
        assert ledger.spent("O/R") == before[1].get("o/r", 0) + (5 if kind == "debit" else 0)


def test_rejected_admission_is_terminal_and_counts():
    ledger = Ledger.from_records([Header("ab" * 8), _record("admitted", rejected=True)])
    assert ledger.state_of(INV) is S.REJECTED
    assert ledger.invocations == 1
    assert ledger.in_flight() == []
    assert ledger.spent_by_repo() == {}


def test_in_flight_lists_unfinished_in_order():
    records = [
        *PREFIX[S.LAUNCHED],
        Admitted("bb", repo="o/r", charge=5),
        Admitted("cc", repo="o/r", charge=5),
        Debit("cc", "o/r", 5),
        Admitted("dd", rejection="x"),
        Admitted("ee", repo="o/r", charge=5),
        Outcome("ee", "error", "query-timeout"),
    ]
    ledger = Ledger.from_records(records)
    assert ledger.in_flight() == [INV, "bb", "cc"]
    assert ledger.invocations == 5
    assert ledger.spent("o/r") == 10


def test_debit_must_match_admission():
    with pytest.raises(JournalInconsistent, match="another repository"):
        Ledger.from_records([Admitted(INV, repo="o/r", charge=5), Debit(INV, "o/x", 5)])
    with pytest.raises(JournalInconsistent, match="charge"):
        Ledger.from_records([Admitted(INV, repo="o/r", charge=5), Debit(INV, "o/r", 4)])
    ok = Ledger.from_records([Admitted(INV, repo="O/R", charge=5), Debit(INV, "o/r", 5)])
    assert ok.spent("o/R") == 5


@pytest.mark.parametrize(
    ("charge", "spent", "budget", "expected"),
    [
        (4, 0, None, True),
        (10**6, 10**6, None, True),
        (MIN_CHARGE_BITS, 0, 0, False),  # sealed never funds the minimum
        (4, 0, 8, True),
        (8, 0, 8, True),
        (9, 0, 8, False),
        (4, 4, 8, True),
        (4, 5, 8, False),
        (64, 0, 64, True),
        (65, 0, 64, False),
        (1, 64, 64, False),
    ],
)
def test_affordable(charge, spent, budget, expected):
    assert affordable(charge, spent, budget) is expected
