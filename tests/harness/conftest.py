"""Every JSONL event a harness test produces in-process matches its schema.

An autouse fixture records each :class:`EventSink` created during a test and,
afterwards, validates every event it emitted against the shipped
``bounded-query-event/v1`` JSON Schema (issue 14 item 1), so a new event
with a forbidden or malformed field fails the test that produced it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from bounded_query.harness import events as events_module


@pytest.fixture(autouse=True)
def _events_match_their_schema(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    sinks: list[Any] = []
    original = events_module.EventSink.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        sinks.append(self)

    monkeypatch.setattr(events_module.EventSink, "__init__", recording_init)
    yield
    schema = json.loads(events_module.schema_path().read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    for sink in sinks:
        for record in sink.events:
            # Non-JSON values are written with str(); validate what was written.
            written = json.loads(json.dumps(record, default=str))
            errors = sorted(validator.iter_errors(written), key=str)
            assert not errors, (
                f"event {written.get('event')!r} breaks its schema: {errors[0].message}"
            )
