"""The run's accounts (broker/accounts.py): one commit sequence, the cap, recovery.

A real journal file on disk; the thread runner is injected (inline, or the
real one wrapped to count appends), never patched.
"""

from __future__ import annotations

import pytest
import trio

from bounded_query.broker.accounts import Accounts, CapReached, open_accounts
from bounded_query.broker.journal import (
    Admitted,
    Debit,
    JournalCorrupt,
    JournalFile,
    Launched,
    Outcome,
    encode_record,
)
from bounded_query.broker.ledger import InvocationState, JournalInconsistent, Ledger
from tests.broker.helpers import run_inline

RUN = "ab" * 10


def _open(tmp_path, cap: int = 5, **options) -> Accounts:
    journal = JournalFile.open(tmp_path / "journal", RUN)
    return Accounts(journal, Ledger(), cap, **options)


def _replayed(tmp_path) -> list:
    journal = JournalFile.open(tmp_path / "journal", RUN)
    try:
        return list(journal.replayed[1:])
    finally:
        journal.close()


def _launch(inv: str, repo: str = "octo/a", bits: int = 5) -> list:
    return [Admitted(inv, repo=repo, charge=bits), Debit(inv, repo, bits), Launched(inv)]


async def test_commit_appends_then_applies(tmp_path):
    accounts = _open(tmp_path, run_sync=run_inline)
    await accounts.commit(_launch("01"))
    await accounts.commit([Outcome("01", "ok")], sync=False)
    await accounts.commit([Admitted("02", rejection="invalid-request")])
    assert accounts.invocations == 2
    assert accounts.room == 3
    assert accounts.ledger.spent("OCTO/A") == 5
    assert accounts.ledger.state_of("01") is InvocationState.DONE
    accounts.close()
    assert _replayed(tmp_path) == [
        *_launch("01"),
        Outcome("01", "ok"),
        Admitted("02", rejection="invalid-request"),
    ]


@pytest.mark.parametrize(
    ("before", "batch", "fits"),
    [(0, 5, True), (0, 6, False), (4, 1, True), (4, 2, False), (5, 1, False)],
)
async def test_the_cap_is_checked_before_anything_is_written(tmp_path, before, batch, fits):
    accounts = _open(tmp_path, run_sync=run_inline)
    for index in range(before):
        await accounts.commit([Admitted(f"a{index}", rejection="x")])
    size = (tmp_path / "journal").stat().st_size
    records = [Admitted(f"b{index}", rejection="y") for index in range(batch)]
    if fits:
        await accounts.commit(records)
        assert accounts.invocations == before + batch
    else:
        with pytest.raises(CapReached):
            await accounts.commit(records)
        assert accounts.invocations == before
        assert (tmp_path / "journal").stat().st_size == size
    assert not accounts.broken
    accounts.close()


async def test_records_that_count_nothing_fit_at_the_cap(tmp_path):
    accounts = _open(tmp_path, cap=1, run_sync=run_inline)
    await accounts.commit(_launch("01"))
    assert accounts.room == 0
    await accounts.commit([Outcome("01", "error", "query-timeout")], sync=False)
    assert accounts.ledger.state_of("01") is InvocationState.DONE
    accounts.close()


async def test_a_failed_append_breaks_the_accounts_and_changes_nothing(tmp_path):
    accounts = _open(tmp_path, run_sync=run_inline)
    await accounts.commit([Admitted("01", rejection="x")])
    accounts.journal.close()  # every later append fails with EBADF
    with pytest.raises(OSError, match="Bad file descriptor"):
        await accounts.commit(_launch("02"))
    assert accounts.broken
    assert accounts.invocations == 1
    assert accounts.ledger.spent_by_repo() == {}
    assert accounts.ledger.state_of("02") is InvocationState.ABSENT


async def test_concurrent_commits_never_count_past_the_cap(tmp_path):
    """Real threads: the lock keeps the check and the append together."""
    appends: list[int] = []
    accounts_box: list[Accounts] = []

    async def counting(fn, *args):
        if fn == accounts_box[0].journal.append:
            appends.append(len(args[0]))
        return await trio.to_thread.run_sync(fn, *args)

    accounts = _open(tmp_path, cap=20, run_sync=counting)
    accounts_box.append(accounts)
    refused: list[int] = []

    async def writer(index: int) -> None:
        records = [Admitted(f"{index:02x}{k:02x}", rejection="r") for k in range(index % 3 + 1)]
        try:
            await accounts.commit(records)
        except CapReached:
            refused.append(len(records))

    async with trio.open_nursery() as nursery:
        for index in range(30):
            nursery.start_soon(writer, index)
    accounts.close()
    assert accounts.invocations == sum(appends) <= 20
    assert len(_replayed(tmp_path)) == accounts.invocations
    assert refused  # some batches did not fit
    assert all(size > accounts.room for size in refused)


async def test_open_accounts_closes_what_was_in_flight(tmp_path):
    journal = JournalFile.open(tmp_path / "journal", RUN)
    journal.append(
        [
            *_launch("01"),
            Outcome("01", "ok"),
            *_launch("02", bits=7),  # launched: the broker died during the run
            Admitted("03", repo="octo/b", charge=4),  # admitted, debit never written
            Admitted("04", rejection="invalid-request"),
        ]
    )
    journal.close()
    accounts, recovery = await open_accounts(tmp_path / "journal", RUN, 10, run_sync=run_inline)
    assert recovery.interrupted == ["02", "03"]
    assert recovery.invocations == accounts.invocations == 4
    assert recovery.torn_bytes == 0
    assert accounts.ledger.spent("octo/a") == 12  # never refunded
    assert accounts.ledger.in_flight() == []
    accounts.close()
    tail = _replayed(tmp_path)[-2:]
    assert tail == [
        Outcome("02", "interrupted", "broker-restart"),
        Outcome("03", "interrupted", "broker-restart"),
    ]
    # A second start finds nothing in flight and writes nothing.
    again, recovery = await open_accounts(tmp_path / "journal", RUN, 10, run_sync=run_inline)
    assert recovery.interrupted == []
    again.close()
    assert len(_replayed(tmp_path)) == 11


async def test_open_accounts_reports_a_torn_tail(tmp_path):
    journal = JournalFile.open(tmp_path / "journal", RUN)
    journal.append(_launch("01"))
    journal.close()
    with (tmp_path / "journal").open("ab") as tail:
        tail.write(encode_record(Outcome("01", "ok"))[:-3])
    accounts, recovery = await open_accounts(tmp_path / "journal", RUN, 10)
    assert recovery.torn_bytes > 0
    assert recovery.interrupted == ["01"]
    accounts.close()


@pytest.mark.parametrize(
    ("records", "error"),
    [
        ([Launched("01")], JournalInconsistent),
        ([Admitted("01", repo="octo/a", charge=5), Debit("01", "octo/a", 4)], JournalInconsistent),
    ],
)
async def test_open_accounts_refuses_an_inconsistent_journal(tmp_path, records, error):
    journal = JournalFile.open(tmp_path / "journal", RUN)
    journal.append(records)
    journal.close()
    with pytest.raises(error):
        await open_accounts(tmp_path / "journal", RUN, 10, run_sync=run_inline)
    assert issubclass(error, JournalCorrupt)
