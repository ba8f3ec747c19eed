"""Bounded audit growth and the audit codec (broker/audit.py).

The pure policy (:func:`decide_write`, :class:`RefusalTally`) exhaustively, then the
capped file itself, then a service whose audit log cannot be written at all
(``/dev/full``): the answers and the journal must not change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.broker.audit import (
    MAX_AUDIT_BYTES,
    MAX_SUMMARY_CATEGORIES,
    AuditLog,
    AuditRecord,
    RefusalSummary,
    RefusalTally,
    Truncation,
    WriteDecision,
    decide_write,
    format_record,
    format_summary,
    parse_line,
    truncation_marker,
)
from bounded_query.broker.protocol import TIMING_BUCKETS_MS, policy
from tests.broker.helpers import ERROR, load, make_root, request_bytes
from tests.broker.test_service_timing import OK, _answer, make_service

# -- decide_write: every branch ----------------------------------------------------


@pytest.mark.parametrize(
    ("written", "length", "truncated", "free", "expected"),
    [
        (0, 100, False, None, WriteDecision.WRITE),
        (0, 100, False, 10**9, WriteDecision.WRITE),
        (700, 100, False, None, WriteDecision.WRITE),  # exactly cap - reserve
        (701, 100, False, None, WriteDecision.MARKER),
        (999, 100, False, None, WriteDecision.MARKER),
        (0, 100, True, None, WriteDecision.DROP),  # after the marker, nothing
        (0, 100, False, 1099, WriteDecision.DROP),  # would leave less than the floor
        (0, 100, False, 1100, WriteDecision.WRITE),  # leaves exactly the floor
        (900, 100, False, 50, WriteDecision.DROP),  # short of space beats the marker
    ],
)
def test_decide_write(written, length, truncated, free, expected):
    got = decide_write(
        written, length, truncated=truncated, free_bytes=free, cap=1000, reserve=200, floor=1000
    )
    assert got is expected


# -- the tally ----------------------------------------------------------------


def test_tally_yields_one_summary_per_interval():
    tally = RefusalTally(interval_s=60.0)
    summaries = []
    for second in range(0, 600):  # ten minutes, ten refusals a second
        for tenth in range(10):
            category = "http-malformed" if tenth % 2 else "max-invocations"
            due = tally.add(category, now=second + tenth / 10, wall=1000.0 + second)
            if due is not None:
                summaries.append(due)
    last = tally.flush(wall=2000.0)
    assert last is not None
    summaries.append(last)
    assert len(summaries) == 10
    assert sum(s.total for s in summaries) == 6000
    assert summaries[0].counts == (("http-malformed", 300), ("max-invocations", 300))
    assert summaries[0].since == 1000.0
    assert summaries[1].since == 1060.0
    assert tally.flush(wall=3000.0) is None  # nothing pending


def test_tally_window_opens_at_the_first_refusal_after_a_quiet_spell():
    tally = RefusalTally(interval_s=60.0)
    assert tally.add("a", now=0.0, wall=0.0) is None
    assert tally.add("a", now=59.9, wall=59.9) is None
    due = tally.add("b", now=500.0, wall=500.0)  # the old window is long due
    assert due == RefusalSummary((("a", 2),), since=0.0, wall_time=500.0)
    assert dict(tally.pending) == {"b": 1}
    assert tally.add("b", now=559.0, wall=559.0) is None  # new window from 500


def test_tally_categories_are_bounded():
    tally = RefusalTally()
    for index in range(MAX_SUMMARY_CATEGORIES + 50):
        tally.add(f"c{index}", now=0.0, wall=0.0)
    pending = tally.pending
    assert len(pending) == MAX_SUMMARY_CATEGORIES + 1
    assert pending["other"] == 50


def test_summary_and_marker_lines_keep_the_record_keys():
    summary = json.loads(format_summary(RefusalSummary((("x", 3), ("y", 1)), 1.0, 2.0)))
    assert summary["invocationId"] == "-"
    assert summary["category"] == policy.CATEGORY_REFUSAL_SUMMARY
    assert summary["counts"] == {"x": 3, "y": 1}
    assert summary["total"] == 4
    marker = json.loads(truncation_marker(5.0, skipped=7))
    assert marker["category"] == policy.CATEGORY_AUDIT_TRUNCATED
    assert marker["skipped"] == 7
    with pytest.raises(ValueError, match="positive"):
        RefusalSummary((), 0.0, 0.0)


# -- the capped file ----------------------------------------------------------


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_the_log_stops_at_its_cap_with_one_marker(tmp_path):
    path = tmp_path / "audit" / "audit.jsonl"
    cap = 4096
    log = AuditLog(path, cap=cap, floor=0)
    for index in range(1000):
        log.write(AuditRecord(f"{index:032x}", "ok", "public", 5, 10, 1.0))
    size = path.stat().st_size
    assert size <= cap
    lines = _lines(path)
    assert lines[-1]["category"] == policy.CATEGORY_AUDIT_TRUNCATED
    assert sum(line["category"] == policy.CATEGORY_AUDIT_TRUNCATED for line in lines) == 1
    assert [line["invocationId"] for line in lines[:-1]] == [
        f"{i:032x}" for i in range(len(lines) - 1)
    ]
    log.close()
    # A restarted broker counts what is already there: the file never grows past the cap.
    again = AuditLog(path, cap=cap, floor=0)
    for index in range(100):
        again.write(AuditRecord(f"{index:032x}", "ok"))
    again.close()
    assert path.stat().st_size <= cap


def test_the_log_yields_to_the_journal_when_space_is_short(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, floor=1 << 62)  # no filesystem has that much free
    for _ in range(5):
        log.write(AuditRecord("a" * 32, "ok"))
    assert path.read_bytes() == b""
    assert log.skipped == 5
    log._floor = 0  # space is back: the next line says what was lost
    log.write(AuditRecord("b" * 32, "ok"))
    (line,) = _lines(path)
    assert line["skipped"] == 5
    assert line["invocationId"] == "b" * 32
    log.write(AuditRecord("c" * 32, "ok"))
    assert "skipped" not in _lines(path)[1]
    log.close()


def test_a_record_line_fits_the_per_line_budget():
    worst = AuditRecord("f" * 32, "timing-bucket-overflow", "confidential", 1100, 600000, 1.5e9)
    slug = "o" * 39 + "/" + "r" * 100  # the longest slug (MAX_SLUG_CHARS)
    line = format_record(AuditRecord(**{**_fields(worst), "detail": "x" * 10_000, "repo": slug}))
    assert len(line) < 650  # MAX_AUDIT_BYTES is sized for 10,000 such lines
    assert MAX_AUDIT_BYTES > 10_000 * 650


def _fields(record: AuditRecord) -> dict:
    return {name: getattr(record, name) for name in record.__slots__}


# -- a service whose audit cannot be written ----------------------------------


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
async def test_audit_write_failures_change_no_answer(autojump_clock, tmp_path):
    config, seed_map = load(make_root(tmp_path, max_invocations=3))
    audit = AuditLog(Path("/dev/full"), floor=0)  # every write fails with ENOSPC
    with pytest.raises(OSError, match="No space"):
        audit.write(AuditRecord("x", "ok"))
    svc = make_service(config, seed_map, audit)
    try:
        assert await _answer(svc, request_bytes("write true")) == (OK, pytest.approx(0.01))
        await svc.count_refusal("http-malformed")
        assert await _answer(svc, request_bytes("write true", repo="octo/x")) == (
            ERROR,
            pytest.approx(0.01),
        )
        assert svc.accounts.invocations == 3
        for _ in range(100):  # past the cap: tallied, not written
            assert (await _answer(svc, request_bytes("write true")))[0] == ERROR
            await svc.count_refusal("http-malformed")
        await svc.flush_audit()  # fails too, silently
        assert not svc.broken
    finally:
        svc.accounts.close()
        audit.close()


# --- the audit log's one codec: what the writer writes, the readers decode ---------------

_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)
_maybe_int = st.none() | st.integers(min_value=0, max_value=2**40)


@given(
    invocation_id=_text,
    category=st.sampled_from(
        [
            getattr(policy, n)
            for n in policy.__all__
            if n.startswith("CATEGORY_")
            and n not in ("CATEGORY_REFUSAL_SUMMARY", "CATEGORY_AUDIT_TRUNCATED")
        ]
    ),
    sensitivity=st.none() | st.sampled_from(policy.SENSITIVITIES),
    charge=_maybe_int,
    bucket=st.none() | st.sampled_from(TIMING_BUCKETS_MS),
    wall=st.floats(min_value=0, max_value=4e9).map(lambda t: round(t, 3)),
    detail=st.none() | _text,
    repo=st.none() | st.just("octo/alpha"),
    kind=st.none() | st.sampled_from(["boolean", "object"]),
)
def test_answer_lines_decode_to_what_was_written(
    invocation_id, category, sensitivity, charge, bucket, wall, detail, repo, kind
):
    record = AuditRecord(
        invocation_id, category, sensitivity, charge, bucket, wall, detail, repo, kind
    )
    assert parse_line(format_record(record)) == record


@given(
    counts=st.dictionaries(
        st.sampled_from(["http-malformed", "max-invocations", "other"]),
        st.integers(1, 10**6),
        min_size=1,
    ),
    since=st.floats(min_value=0, max_value=4e9),
    wall=st.floats(min_value=0, max_value=4e9),
    skipped=st.integers(0, 10**9),
)
def test_log_records_decode_to_what_was_written(counts, since, wall, skipped):
    summary = RefusalSummary(tuple(sorted(counts.items())), since, wall)
    assert parse_line(format_summary(summary)) == summary
    assert parse_line(truncation_marker(wall, skipped)) == Truncation(skipped, wall)


@given(st.binary(max_size=200) | st.from_type(object).map(lambda o: repr(o).encode()))
def test_any_other_line_is_skipped_never_raised(raw):
    decoded = parse_line(raw)
    assert decoded is None or isinstance(decoded, AuditRecord | RefusalSummary | Truncation)


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"[]",
        b'{"category": "ok", "invocationId": "01"}',  # no _schema: not our line
        b'{"_schema": "bounded-query-event/v1", "category": "ok", "invocationId": "01"}',
        b'{"_schema": "bounded-query-audit/v1", "category": 7, "invocationId": "01"}',
        b'{"_schema": "bounded-query-audit/v1", "category": "ok", "invocationId": 1}',
        b'{"_schema": "bounded-query-audit/v1", "category": "refusal-summary", "counts": []}',
        b'{"_schema": "bounded-query-audit/v1", "category": "audit-truncated", "time": 1}',
        b"[" * 100000,
    ],
)
def test_foreign_or_malformed_lines_are_none(line):
    assert parse_line(line) is None
