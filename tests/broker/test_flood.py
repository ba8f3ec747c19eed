"""A refusal flood past maxInvocations against a real broker process (issue 9 part 4).

10,000 malformed requests and 200 well-formed ones past the cap: every one
gets the canonical error, the journal is byte-identical before and after, the
audit log grows by a bounded number of bytes (one summary record at shutdown,
not one line per refusal; before this it was ~120 bytes a refusal, 1.2 MB per
10,000), and the broker answers the next request at once.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio

from bounded_query.broker.http import response_bytes
from bounded_query.broker.protocol import policy
from tests.broker.helpers import ERROR, exchange, make_root, request_bytes
from tests.broker.procs import start_broker

GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"
OK_SCRIPT = "import os\nopen(os.environ['QUERY_OUT'], 'w').write('true')\n"
MALFORMED = 10_000
WELL_FORMED = 200
#: What the whole flood may add to the audit log: one summary line (~250 B)
#: at shutdown, with room for a second if a summary interval elapses.
AUDIT_BOUND_BYTES = 1024


async def test_a_flood_past_the_cap_costs_no_journal_and_bounded_audit(tmp_path):
    doc = make_root(tmp_path, max_invocations=2)
    sock = str(doc["socketPath"])
    private = Path(str(doc["privateRoot"]))
    audit = private / "audit" / "audit.jsonl"
    journal = private / "state" / "journal"
    proc = start_broker(tmp_path / "broker.json")
    try:
        ok = response_bytes(b'{"status":"ok","result":true}')
        assert await exchange(sock, request_bytes(OK_SCRIPT)) == ok
        assert await exchange(sock, GARBAGE) == response_bytes(ERROR)  # the cap's last slot
        with trio.fail_after(30):  # the counting happens right after the answer
            while len(audit.read_bytes().splitlines()) < 2:  # noqa: ASYNC110
                await trio.sleep(0.01)
        journal_before = journal.read_bytes()
        assert journal_before.count(b"http-malformed") == 1
        audit_before = audit.stat().st_size
        answers: dict[bytes, int] = {}
        limiter = trio.Semaphore(32)

        async def one(payload: bytes) -> None:
            async with limiter:
                got = await exchange(sock, payload, limit_s=60)
            answers[got] = answers.get(got, 0) + 1

        async with trio.open_nursery() as nursery:
            for index in range(MALFORMED + WELL_FORMED):
                payload = request_bytes(OK_SCRIPT) if index % 51 == 50 else GARBAGE
                nursery.start_soon(one, payload)
        assert answers == {response_bytes(ERROR): MALFORMED + WELL_FORMED}
        # At once afterwards: the canonical error (past the cap), on the first boundary.
        start = trio.current_time()
        assert await exchange(sock, request_bytes(OK_SCRIPT), limit_s=5) == response_bytes(ERROR)
        assert trio.current_time() - start < 5
        assert journal.read_bytes() == journal_before
        assert audit.stat().st_size - audit_before <= AUDIT_BOUND_BYTES
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert journal.read_bytes() == journal_before
    grown = audit.stat().st_size - audit_before
    assert 0 < grown <= AUDIT_BOUND_BYTES
    new = [json.loads(line) for line in audit.read_bytes()[audit_before:].splitlines()]
    assert {line["category"] for line in new} == {policy.CATEGORY_REFUSAL_SUMMARY}
    counts: dict[str, int] = {}
    for line in new:
        for category, number in line["counts"].items():
            counts[category] = counts.get(category, 0) + number
    # Every refusal is accounted for, by category; none was lost or doubled.
    assert counts == {"http-malformed": MALFORMED, "max-invocations": WELL_FORMED + 1}


async def test_after_a_flood_below_the_cap_a_valid_request_is_still_served(tmp_path):
    """Below the cap every refusal is counted (journaled, one audit line each)."""
    flood = 600
    doc = make_root(tmp_path, max_invocations=flood + 10)
    sock = str(doc["socketPath"])
    private = Path(str(doc["privateRoot"]))
    audit = private / "audit" / "audit.jsonl"
    proc = start_broker(tmp_path / "broker.json")
    try:
        limiter = trio.Semaphore(32)

        async def one() -> None:
            async with limiter:
                assert await exchange(sock, GARBAGE, limit_s=60) == response_bytes(ERROR)

        async with trio.open_nursery() as nursery:
            for _ in range(flood):
                nursery.start_soon(one)
        ok = response_bytes(b'{"status":"ok","result":true}')
        assert await exchange(sock, request_bytes(OK_SCRIPT), limit_s=10) == ok
        # Refusals are counted (one fsync'd append each) after their answers.
        with trio.fail_after(120):
            while len(audit.read_bytes().splitlines()) < flood + 1:  # noqa: ASYNC110
                await trio.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    lines = [json.loads(line) for line in audit.read_bytes().splitlines()]
    refusals = [line for line in lines if line["category"] == "http-malformed"]
    assert len(refusals) == flood
    assert all(line["invocationId"] != "-" for line in refusals)  # each one was journaled
    assert [line["category"] for line in lines if line not in refusals] == ["ok"]
