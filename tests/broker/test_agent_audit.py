"""The bounded-agent audit record type (broker/audit.py; spec 15.5).

An agent line holds only an invocation id, the sensitivity, the charge, the
bucket and the category: whatever a caller puts in the record (a repository,
a schema kind, a detail, a time), none of it reaches the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.broker.audit import (
    AGENT_AUDIT_SCHEMA,
    AUDIT_SCHEMA,
    AuditLog,
    AuditRecord,
    RefusalSummary,
    Truncation,
    format_record,
    format_summary,
    parse_line,
    truncation_marker,
)
from bounded_query.broker.protocol import policy
from bounded_query.harness.records.events import schema_path

FULL = AuditRecord(
    invocation_id="0123abcd",
    category=policy.CATEGORY_INVALID_OUTPUT,
    sensitivity="confidential",
    charge=5,
    bucket_ms=10000,
    wall_time=1_700_000_000.5,
    detail="x-awf-repo: not an owner/repo slug",
    repo="octo/secret-service",
    kind="boolean",
)


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_path(AGENT_AUDIT_SCHEMA).read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def test_an_agent_line_holds_only_the_spec_fields() -> None:
    line = format_record(FULL, AGENT_AUDIT_SCHEMA)
    assert json.loads(line) == {
        "_schema": AGENT_AUDIT_SCHEMA,
        "invocationId": "0123abcd",
        "sensitivity": "confidential",
        "charge": 5,
        "bucketMs": 10000,
        "category": "invalid-output",
    }
    for secret in (b"octo", b"secret-service", b"boolean", b"x-awf", b"1700000000", b"2023"):
        assert secret not in line
    _validator().validate(json.loads(line))


def test_the_query_line_of_the_same_record_keeps_its_fields() -> None:
    # The difference is the record type, not the record.
    obj = json.loads(format_record(FULL))
    assert obj["_schema"] == AUDIT_SCHEMA
    assert obj["repo"] == "octo/secret-service"
    assert obj["kind"] == "boolean"
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(obj)


def test_agent_summaries_and_markers_have_no_times() -> None:
    summary = RefusalSummary((("connection-cap", 3), ("max-invocations", 2)), 1.5, 2.5)
    obj = json.loads(format_summary(summary, AGENT_AUDIT_SCHEMA))
    assert obj == {
        "_schema": AGENT_AUDIT_SCHEMA,
        "invocationId": "-",
        "sensitivity": None,
        "charge": None,
        "bucketMs": None,
        "category": policy.CATEGORY_REFUSAL_SUMMARY,
        "counts": {"connection-cap": 3, "max-invocations": 2},
        "total": 5,
    }
    _validator().validate(obj)
    marker = json.loads(truncation_marker(9.0, 4, AGENT_AUDIT_SCHEMA))
    assert set(marker) == {"_schema", "invocationId", "sensitivity", "charge", "bucketMs"} | {
        "category",
        "skipped",
    }
    _validator().validate(marker)


def test_parse_line_reads_both_record_types() -> None:
    agent = parse_line(format_record(FULL, AGENT_AUDIT_SCHEMA))
    assert agent == AuditRecord(
        "0123abcd", "invalid-output", "confidential", 5, 10000, None, None, None, None
    )
    assert parse_line(format_record(FULL)) == FULL
    summary = parse_line(
        format_summary(RefusalSummary((("connection-cap", 1),), 1.0, 2.0), AGENT_AUDIT_SCHEMA)
    )
    assert summary == RefusalSummary((("connection-cap", 1),), None, None)
    assert parse_line(truncation_marker(3.0, 2, AGENT_AUDIT_SCHEMA)) == Truncation(2, None)
    # A query line without its times is still not ours.
    query_summary = json.loads(format_summary(RefusalSummary((("x", 1),), 1.0, 2.0)))
    del query_summary["since"]
    assert parse_line(json.dumps(query_summary).encode()) is None
    assert parse_line(b'{"_schema":"bounded-agent-audit/v2","category":"ok"}') is None


def test_an_agent_log_writes_agent_lines_whatever_the_record(tmp_path: Path) -> None:
    path = tmp_path / "audit" / "audit.jsonl"
    log = AuditLog(path, schema=AGENT_AUDIT_SCHEMA)
    try:
        log.write(FULL)
        log.write_summary(RefusalSummary((("http-malformed", 1),), 1.0, 2.0))
    finally:
        log.close()
    data = path.read_bytes()
    assert b"octo" not in data
    assert b"timestamp" not in data
    lines = [json.loads(line) for line in data.splitlines()]
    assert [line["_schema"] for line in lines] == [AGENT_AUDIT_SCHEMA] * 2
    for line in lines:
        _validator().validate(line)


def test_an_unknown_record_type_is_a_local_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown audit record type"):
        AuditLog(tmp_path / "a.jsonl", schema="bounded-other-audit/v1")
    with pytest.raises(ValueError, match="unknown audit record type"):
        format_record(FULL, "bounded-other-audit/v1")


# "zq" occurs in no fixed string of a line (keys, categories, sensitivities).
_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=4, max_size=20).map(
    lambda word: "zq" + word
)


@given(
    repo=_words,
    detail=_words,
    kind=st.sampled_from(["boolean", "enum", "object", None]),
    wall=st.floats(1e9, 2e9),
    charge=st.none() | st.integers(0, 64),
    bucket=st.none() | st.sampled_from([10, 100, 1000]),
    category=st.sampled_from([policy.CATEGORY_OK, policy.CATEGORY_INVALID_OUTPUT]),
)
def test_no_field_of_a_record_beyond_the_five_reaches_an_agent_line(
    repo: str,
    detail: str,
    kind: str | None,
    wall: float,
    charge: int | None,
    bucket: int | None,
    category: str,
) -> None:
    record = AuditRecord("ab12", category, "internal", charge, bucket, wall, detail, repo, kind)
    line = format_record(record, AGENT_AUDIT_SCHEMA)
    obj = json.loads(line)
    assert set(obj) == {"_schema", "invocationId", "sensitivity", "charge", "bucketMs"} | {
        "category"
    }
    assert repo.encode() not in line
    assert detail.encode() not in line
    _validator().validate(obj)


def test_the_agent_record_schema_names_the_policy_values() -> None:
    schema = json.loads(schema_path(AGENT_AUDIT_SCHEMA).read_text(encoding="utf-8"))
    props = schema["properties"]
    assert props["sensitivity"]["enum"] == [*policy.SENSITIVITIES, None]
    assert props["_schema"]["const"] == AGENT_AUDIT_SCHEMA
    categories = [getattr(policy, n) for n in policy.__all__ if n.startswith("CATEGORY_")]
    validator = _validator()
    for category in categories:
        line = {"_schema": AGENT_AUDIT_SCHEMA, "invocationId": "-", "category": category}
        line |= {"sensitivity": None, "charge": None, "bucketMs": None}
        line |= {"counts": {"x": 1}, "total": 1, "skipped": 1}
        validator.validate(line)
    # A repository, a kind, a detail or a time is never a valid agent line.
    base = json.loads(format_record(FULL, AGENT_AUDIT_SCHEMA))
    for extra in ({"repo": "o/r"}, {"kind": "boolean"}, {"detail": "x"}, {"time": 1.0}):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(base | extra)
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(base | {"timestamp": "2026-01-01T00:00:00.000Z"})
