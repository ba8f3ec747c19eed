"""Every JSONL record a harness test produces in-process matches its schema;
and the fake Engine API for the runs that must need no engine.

An autouse fixture records each :class:`EventSink` created during a test and,
afterwards, validates every record it wrote against the shipped JSON Schema
of the type the record names in ``_schema`` (issue 14 item 1): the
harness's ``bounded-query-event/v1`` events and the broker's relayed
``bounded-query-broker/v1`` lines (issue 21 item 2). A record of a type
with no shipped schema, or one that breaks its schema, fails the test that
produced it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from bounded_query.harness.records import events as events_module
from tests.fakes.engine_api import FakeEngineAPI, fake_engine_api


@pytest.fixture
def fake_engine() -> Iterator[FakeEngineAPI]:
    """A fake Engine API on a unix socket (``tests/fakes/engine_api.py``): give its
    ``docker_host`` as ``DOCKER_HOST`` to a run that must need no engine (the
    preflight's socket check, the sweep, the teardown reconcile), so the fast
    tests pass on a machine without one (issue 21 item 7)."""
    with fake_engine_api() as engine:
        yield engine


def _validator(record_type: object) -> jsonschema.Draft202012Validator:
    assert isinstance(record_type, str), f"a record without a type: {record_type!r}"
    path = events_module.schema_path(record_type)
    assert path.is_file(), f"no shipped schema for record type {record_type!r}"
    return jsonschema.Draft202012Validator(json.loads(path.read_text(encoding="utf-8")))


@pytest.fixture(autouse=True)
def _events_match_their_schema(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    sinks: list[Any] = []
    original = events_module.EventSink.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        sinks.append(self)

    monkeypatch.setattr(events_module.EventSink, "__init__", recording_init)
    yield
    validators: dict[object, jsonschema.Draft202012Validator] = {}
    for sink in sinks:
        for record in sink.events:
            # Non-JSON values are written with str(); validate what was written.
            written = json.loads(json.dumps(record, default=str))
            kind = written.get("_schema")
            if kind not in validators:
                validators[kind] = _validator(kind)
            errors = sorted(validators[kind].iter_errors(written), key=str)
            assert not errors, (
                f"{kind} record {written.get('event')!r} breaks its schema: {errors[0].message}"
            )
