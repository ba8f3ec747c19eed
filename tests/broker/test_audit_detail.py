"""The audit ``detail`` of invalid requests (broker/audit.py; docs/architecture.md decision 7)."""

from __future__ import annotations

import json

import pytest
import trio

from bounded_query.broker.audit import (
    MAX_DETAIL_CHARS,
    AuditRecord,
    format_record,
    sanitize_detail,
)
from tests.broker.helpers import body_of, exchange, request_bytes

ERROR = b'{"status":"error"}'


async def _audit(broker, count: int) -> list[dict]:
    path = broker.private / "audit" / "audit.jsonl"
    with trio.fail_after(10):
        while True:
            lines = path.read_text().splitlines()
            if len(lines) >= count:
                return [json.loads(line) for line in lines]
            await trio.sleep(0.005)


def test_sanitize_detail_bounds_and_escapes():
    assert sanitize_detail("schema.fields: bad") == "schema.fields: bad"
    assert sanitize_detail("a\nb\x1b[31m\u2028c\x00") == "a?b?[31m?c?"
    long = sanitize_detail("x" * 10_000)
    assert len(long) == MAX_DETAIL_CHARS
    assert long.endswith("...")


def test_detail_key_only_when_present():
    plain = json.loads(format_record(AuditRecord("01", "ok", "public", 5, 10)))
    assert "detail" not in plain
    line = format_record(AuditRecord("02", "invalid-request", detail="bad\nline"))
    assert line.count(b"\n") == 1
    assert json.loads(line)["detail"] == "bad?line"


async def test_invalid_request_names_the_location_but_no_script_bytes(broker):
    schema = b'{"type":"object","fields":{"count":{"type":"integer","minimum":5,"maximum":1}}}'
    script = "write true\n# SECRET-SCRIPT-TEXT"
    raw = request_bytes(script, repo="octo/internal", schema=schema)
    assert body_of(await exchange(broker.socket, raw)) == ERROR
    bad_utf8 = request_bytes(b"\xff SECRET-BYTES", repo="octo/internal")
    assert body_of(await exchange(broker.socket, bad_utf8)) == ERROR
    first, second = await _audit(broker, 2)
    assert first["category"] == "invalid-request"
    assert first["detail"] == "schema.fields.count: maximum must be >= minimum"
    assert second["detail"] == "body: script is not valid UTF-8"
    text = (broker.private / "audit" / "audit.jsonl").read_text()
    assert "SECRET" not in text
    assert "octo" not in text


@pytest.mark.parametrize(
    ("schema", "kind"),
    [
        ({"type": "const", "value": 1}, "const"),
        ({"type": "boolean"}, "boolean"),
        ({"type": "enum", "values": ["a", "b"]}, "enum"),
        ({"type": "integer", "minimum": 0, "maximum": 3}, "integer"),
        ({"type": "object", "fields": {"a": {"type": "boolean"}}}, "object"),
        ({"type": "tuple", "items": [{"type": "boolean"}]}, "tuple"),
        ({"type": "array", "items": {"type": "boolean"}, "length": 2}, "array"),
        ({"type": "union", "variants": {"a": {"type": "boolean"}}}, "union"),
    ],
)
def test_schema_kind_names_the_root_type(schema, kind):
    from bounded_query.broker.admission import schema_kind
    from bounded_query.broker.protocol import parse_schema

    assert schema_kind(parse_schema(schema)) == kind
    assert json.loads(format_record(AuditRecord("01", "ok", kind=kind)))["kind"] == kind
