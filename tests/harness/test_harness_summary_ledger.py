"""The step summary folds the journal with the broker's own ledger (harness/records/usage.py).

A real in-process broker (scripted runner) answers a mix of launches and
refusals; the summary read from its journal and audit files must report
exactly what the broker's accounts hold. A journal the broker would refuse to
start on (records that cannot follow each other) is an unreadable journal in
the summary too, never a silently different total.
"""

from __future__ import annotations

import trio

from bounded_query.broker.journal import Admitted, Debit, Header, Launched, Record, encode_record
from bounded_query.harness.records.usage import render_summary, usage_from_state
from tests.broker.conftest import serving
from tests.broker.helpers import REPOS, exchange, make_root, request_bytes

INT_1000 = b'{"type":"integer","minimum":0,"maximum":1000}'


async def test_the_summary_reports_what_the_broker_accounts_hold(tmp_path):
    doc = make_root(tmp_path)
    requests = [
        request_bytes("write true", repo="octo/internal"),
        request_bytes("write 7", repo="OCTO/Internal", schema=INT_1000),
        request_bytes("write true", repo="octo/public"),
        request_bytes("fail query-timeout", repo="octo/confidential"),
        request_bytes("write true", repo="octo/confidential"),  # 5 + 5 > 8: refused
        request_bytes("write true", repo="octo/sealed"),
        request_bytes("write true", repo="octo/nowhere"),
        request_bytes("write true", method="GET"),
        b"NOT HTTP\r\n\r\n",
    ]
    async with serving(doc) as broker:
        for raw in requests:
            await exchange(broker.socket, raw)
        assert broker.server.service is not None
        accounts = broker.server.service.accounts
        with trio.fail_after(10):  # a transport refusal is counted after its answer
            while accounts.invocations < len(requests):  # noqa: ASYNC110 - other tasks count
                await trio.sleep(0.005)
        spent = accounts.ledger.spent_by_repo()
        counted = accounts.invocations
    assert spent == {"octo/internal": 19, "octo/public": 5, "octo/confidential": 5}
    assert counted == len(requests)
    journal = (broker.private / "state" / "journal").read_bytes()
    audit = (broker.private / "audit" / "audit.jsonl").read_bytes()
    usage = usage_from_state(list(REPOS.items()), journal, audit)
    assert usage.notes == ()
    assert {r.repo.lower(): r.spent_bits for r in usage.repos if r.spent_bits} == spent
    assert sum(r.invocations for r in usage.repos) + usage.refused == counted
    assert usage.refusals == {
        "bit-budget-exhausted": 2,
        "http-malformed": 1,
        "invalid-request": 1,
        "repo-not-allowed": 1,
    }
    internal = next(r for r in usage.repos if r.repo == "octo/internal")
    assert (internal.invocations, internal.outcomes) == (2, {"ok": 2})
    text = render_summary(usage, exit_code=0, runtime="docker")
    assert "| `octo/internal` | internal | 64 | 19 | 2 |" in text


def test_a_journal_the_broker_would_refuse_is_unreadable_in_the_summary():
    repos = list(REPOS.items())
    consistent: list[Record] = [Header("ab" * 8), Admitted("01", repo="octo/internal", charge=5)]
    good = b"".join(encode_record(r) for r in [*consistent, Debit("01", "octo/internal", 5)])
    assert usage_from_state(repos, good, b"").repos[1].spent_bits == 5
    for tail in (
        [Debit("01", "octo/internal", 4)],  # a debit other than the admitted charge
        [Debit("01", "octo/public", 5)],  # a debit of another repository
        [Launched("01")],  # launched without its debit
        [Debit("01", "octo/internal", 5), Admitted("01", rejection="x")],  # admitted twice
    ):
        journal = b"".join(encode_record(r) for r in [*consistent, *tail])
        usage = usage_from_state(repos, journal, b"")
        assert len(usage.notes) == 1
        assert "unreadable" in usage.notes[0]
        assert all(r.spent_bits == 0 and r.invocations == 0 for r in usage.repos)
