"""JSONL events on stderr and the GitHub step summary (seed 000 sections 5.4, 8.5).

Theory of operation: every harness phase reports through one
:class:`EventSink`, which writes one JSON object per line to stderr. Every
record starts with ``_schema`` (:data:`EVENT_SCHEMA`, the AWF convention
``<type>/v<version>``: consumers prefix-match ``bounded-query-event/``), then
``timestamp`` (ISO-8601 UTC, milliseconds) and ``event`` (the name); the
event's own fields follow and can never replace those three. The record type
is described by the JSON Schema shipped as
``harness/schemas/bounded-query-event.v1.schema.json`` (:func:`schema_path`).
The broker child's own stderr lines are relayed through the same sink as
records of their own type, ``bounded-query-broker/v1`` (``broker_log.py``),
so every line the harness writes to stderr is a versioned record. Events
carry only safe metadata: repository slugs, sensitivities, commits,
counts, durations, exit codes and operator-facing messages. They never carry
tokens, scripts, query outputs or private-root paths.

Observability is passive (seed 000 section 11.4 item 2): a failing sink
(closed stderr, unwritable summary file) never changes an outcome; it is
remembered as a degraded condition and shown in the step summary when that
can still be written.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from bounded_query.broker.audit import iso_utc

__all__ = ["EVENT_SCHEMA", "EventSink", "append_step_summary", "schema_path"]

#: Record type and version of every JSONL event (bump on incompatible change).
EVENT_SCHEMA = "bounded-query-event/v1"
#: Keys the sink owns; an event field of the same name is dropped.
_RESERVED = frozenset({"_schema", "timestamp", "event"})


def schema_path(record_type: str = EVENT_SCHEMA) -> Path:
    """The shipped JSON Schema file of ``record_type`` (``name/vN``)."""
    name, _, version = record_type.partition("/")
    return Path(__file__).parent / "schemas" / f"{name}.{version}.schema.json"


class EventSink:
    """Writes JSONL events; remembers degraded conditions for the summary."""

    def __init__(
        self, stream: IO[str] | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self.degraded: list[str] = []
        self.events: list[dict[str, Any]] = []
        self._redactions: list[tuple[str, str]] = []

    def redact(self, path: os.PathLike[str] | str, label: str) -> None:
        """From now on, write ``label`` (for example ``<privateRoot>``) for ``path``.

        Events and degraded notes are operator-facing but still hold no host
        path of the run's roots: every string value of a
        record, nested ones included, has the registered paths replaced,
        longest first.
        """
        text = os.fspath(path)
        if text and text not in {p for p, _ in self._redactions}:
            self._redactions.append((text, label))
            self._redactions.sort(key=lambda pair: len(pair[0]), reverse=True)

    def _clean(self, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str):
            for path, label in self._redactions:
                value = value.replace(path, label)
            return value
        if isinstance(value, list | tuple):
            return [self._clean(v) for v in value]
        if isinstance(value, dict):
            return {k: self._clean(v) for k, v in value.items()}
        return value

    def emit(self, event: str, **fields: Any) -> None:
        """Write one event line; never raises on a broken stream."""
        self.relay(EVENT_SCHEMA, event, fields)

    def relay(self, record_type: str, event: str, fields: Mapping[str, Any]) -> None:
        """Write one record of another shipped type (``name/vN``, with its own
        schema file) the way :meth:`emit` writes an event: the type, the
        timestamp and the name first, the fields after (never replacing
        those three), the registered paths redacted; never raises on a
        broken stream. ``broker_log.py`` relays the broker's lines so.
        """
        record: dict[str, Any] = {
            "_schema": record_type,
            "timestamp": iso_utc(self._clock()),
            "event": event,
        }
        record.update((k, self._clean(v)) for k, v in fields.items() if k not in _RESERVED)
        self.events.append(record)
        try:
            self._stream.write(json.dumps(record, sort_keys=False, default=str) + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            note = "event stream (stderr) failed; some JSONL events are missing"
            if note not in self.degraded:
                self.degraded.append(note)

    def degrade(self, subsystem: str, detail: str) -> None:
        """Record a degraded mode (shown in the step summary) and emit it."""
        detail = self._clean(detail)
        note = f"{subsystem}: {detail}"
        if note not in self.degraded:
            self.degraded.append(note)
        self.emit("degraded", subsystem=subsystem, detail=detail)


def append_step_summary(path: str | None, markdown: str, sink: EventSink) -> bool:
    """Append ``markdown`` to ``$GITHUB_STEP_SUMMARY`` (``path``) when set.

    Returns True when written; a failure is reported as a degraded event only.
    """
    if not path:
        return False
    try:
        with Path(path).open("a", encoding="utf-8") as handle:
            handle.write(markdown)
            if not markdown.endswith("\n"):
                handle.write("\n")
    except OSError as exc:
        sink.degrade("step summary", f"cannot write $GITHUB_STEP_SUMMARY ({exc.strerror})")
        return False
    return True
