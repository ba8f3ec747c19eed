"""Versioned JSONL events (issue 14 item 1): every record names its type.

The sink's own records are checked against the shipped JSON Schema here;
``conftest.py`` in this directory checks every event that any harness test
produces in-process against the same schema.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import jsonschema
import pytest

from bounded_query.harness.records.events import EVENT_SCHEMA, EventSink, schema_path


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_path(EVENT_SCHEMA).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_file_is_shipped_and_names_its_type():
    path = schema_path(EVENT_SCHEMA)
    assert path.name == "bounded-query-event.v1.schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    assert schema["$id"] == EVENT_SCHEMA
    assert schema["properties"]["_schema"] == {"const": EVENT_SCHEMA}


def test_every_record_leads_with_type_timestamp_and_name():
    stream = io.StringIO()
    sink = EventSink(stream, clock=lambda: 1.5)
    sink.emit("repo_staged", repo="octo/alpha", seconds=0.25, path=Path("/p"))
    line = stream.getvalue()
    record = json.loads(line)
    assert list(record)[:3] == ["_schema", "timestamp", "event"]
    assert record == {
        "_schema": "bounded-query-event/v1",
        "timestamp": "1970-01-01T00:00:01.500Z",
        "event": "repo_staged",
        "repo": "octo/alpha",
        "seconds": 0.25,
        "path": "/p",
    }
    _validator().validate(record)


def test_event_fields_cannot_replace_the_fixed_keys():
    stream = io.StringIO()
    sink = EventSink(stream, clock=lambda: 0.0)
    sink.emit("x", _schema="forged/v9", timestamp="never", n=1)
    record = json.loads(stream.getvalue())
    assert record == {
        "_schema": EVENT_SCHEMA,
        "timestamp": "1970-01-01T00:00:00.000Z",
        "event": "x",
        "n": 1,
    }


_OK = {"_schema": EVENT_SCHEMA, "timestamp": "1970-01-01T00:00:00.000Z", "event": "x"}


@pytest.mark.parametrize(
    "record",
    [
        {k: v for k, v in _OK.items() if k != "_schema"},
        {**_OK, "_schema": "bounded-query-event/v2"},
        {**_OK, "timestamp": "yesterday"},
        {**_OK, "event": "Bad Name"},
        {**_OK, "script": "s"},
        {**_OK, "token": "t"},
        {**_OK, "output": "o"},
    ],
)
def test_schema_rejects_untyped_forged_or_secret_bearing_records(record):
    validator = _validator()
    assert validator.is_valid(_OK)
    assert not validator.is_valid(record)


def test_registered_roots_are_redacted_everywhere_in_a_record():
    stream = io.StringIO()
    sink = EventSink(stream, clock=lambda: 0.0)
    sink.redact("/var/tmp/base/awf-private-1", "<privateRoot>")
    sink.redact("/var/tmp/base", "<base>")
    sink.emit(
        "x",
        message="cannot read /var/tmp/base/awf-private-1/seeds/abc",
        path=Path("/var/tmp/base/other"),
        nested={"list": ["/var/tmp/base/awf-private-1", 3]},
    )
    sink.degrade("staging", "gone: /var/tmp/base/awf-private-1/x")
    text = stream.getvalue()
    assert "/var/tmp/base" not in text
    first = json.loads(text.splitlines()[0])
    assert first["message"] == "cannot read <privateRoot>/seeds/abc"
    assert first["path"] == "<base>/other"
    assert first["nested"] == {"list": ["<privateRoot>", 3]}
    assert sink.degraded == ["staging: gone: <privateRoot>/x"]
