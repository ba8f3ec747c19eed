"""Terminal progress: one human line per answered invocation."""

from __future__ import annotations

from functools import partial

import trio

from bounded_query.broker.audit import (
    AuditLine,
    AuditRecord,
    RefusalSummary,
    format_record,
    format_summary,
    parse_line,
    truncation_marker,
)
from bounded_query.harness.records.progress import (
    AuditFollower,
    follow_audit,
    human_line,
    read_inline,
)


def _record(line: bytes) -> AuditLine:
    decoded = parse_line(line)
    assert decoded is not None
    return decoded


def test_a_launched_answer_names_repo_kind_charge_bucket_and_outcome():
    line = format_record(
        AuditRecord("01", "ok", "internal", 5, 1000, repo="octo/alpha", kind="boolean")
    )
    assert human_line(_record(line)) == "bounded-query: octo/alpha  boolean  5 bits  1 s  ok"


def test_refusals_and_log_records_read_plainly():
    refused = format_record(AuditRecord("02", "invalid-request", bucket_ms=10))
    assert (
        human_line(_record(refused))
        == "bounded-query: (no configured repo)  ?  —  10 ms  invalid-request"
    )
    summary = format_summary(RefusalSummary((("max-invocations", 3),), 1.0, 2.0))
    assert human_line(_record(summary)) == (
        "bounded-query: 3 uncounted refusals (max-invocations: 3)"
    )
    marker = human_line(_record(truncation_marker(1.0, 2)))
    assert marker is not None
    assert "size cap" in marker
    assert parse_line(b'{"no": "category"}') is None


def test_follower_keeps_a_partial_line_until_it_completes():
    follower = AuditFollower()
    whole = format_record(AuditRecord("01", "ok")) + format_record(AuditRecord("02", "ok"))
    first, second = whole[:70], whole[70:]
    got = follower.feed(first)
    assert [r.invocation_id for r in got if isinstance(r, AuditRecord)] == (
        [] if b"\n" not in first else ["01"]
    )
    rest = follower.feed(second + b"garbage\n")
    assert [r.invocation_id for r in got + rest if isinstance(r, AuditRecord)] == ["01", "02"]
    assert len(got + rest) == 2
    assert follower.offset == len(whole) + len(b"garbage\n")


async def test_follow_audit_prints_each_new_record_once(tmp_path, autojump_clock):
    path = tmp_path / "audit.jsonl"
    printed: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(follow_audit, path, printed.append, read=read_inline))
        await trio.sleep(1)  # the file does not exist yet: nothing, no error
        assert printed == []
        one = format_record(AuditRecord("01", "ok", "public", 4, 10, repo="o/r", kind="const"))
        path.write_bytes(one + one[:20])
        await trio.sleep(1)
        assert printed == ["bounded-query: o/r  const  4 bits  10 ms  ok"]
        with path.open("ab") as handle:
            handle.write(one[20:])
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert printed == ["bounded-query: o/r  const  4 bits  10 ms  ok"] * 2
