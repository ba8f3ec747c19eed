"""wait_ready (harness/lifecycle/orchestrate.py): the broker's readiness file and what it announces.

Every protection the broker says it could not set up becomes a ``degraded``
event (and so a line of the step summary) before the agent starts; a file
the harness cannot read is "protections unknown", never "all fine".
"""

from __future__ import annotations

import io
import json
import os

import trio

from bounded_query.broker.readiness import encode_ready
from bounded_query.broker.runner import Degradation
from bounded_query.harness.lifecycle.orchestrate import wait_ready
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.records.events import EventSink


class Broker:
    def __init__(self, status: int | None = None) -> None:
        self.status = status

    def exited(self) -> int | None:
        return self.status

    async def stop(self) -> int | None:
        return self.status

    async def relay_log(self, sink: EventSink) -> None:
        del sink  # a fake with no output


def paths_in(tmp_path) -> RunPaths:
    paths = RunPaths(tmp_path / "private", tmp_path / "ingress")
    paths.ready_file.parent.mkdir(parents=True)
    return paths


async def wait(paths: RunPaths, broker: Broker, limit_s: float = 5.0):
    stream = io.StringIO()
    sink = EventSink(stream)
    ok = await wait_ready(paths, broker, limit_s, sink)
    return ok, sink, [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_a_missing_protection_is_reported_before_the_agent_starts(tmp_path):
    paths = paths_in(tmp_path)
    missing = Degradation("page-cache pin", "the pin container could not start")
    paths.ready_file.write_text(encode_ready(1, [missing]))
    ok, sink, events = await wait(paths, Broker())
    assert ok is not None
    assert [e["event"] for e in events] == ["broker_ready", "degraded"]
    assert events[1]["subsystem"] == "page-cache pin"
    assert sink.degraded == ["page-cache pin: the pin container could not start"]


async def test_nothing_missing_reports_nothing(tmp_path):
    paths = paths_in(tmp_path)
    paths.ready_file.write_text(encode_ready(1, []))
    ok, sink, events = await wait(paths, Broker())
    assert ok is not None
    assert sink.degraded == []
    assert [e["event"] for e in events] == ["broker_ready"]


async def test_an_unreadable_file_is_unknown_protections(tmp_path):
    paths = paths_in(tmp_path)
    paths.ready_file.write_text("garbage")
    ok, sink, _events = await wait(paths, Broker())
    assert ok is not None
    assert sink.degraded
    assert sink.degraded[0].startswith("broker: ")


async def test_a_file_written_later_is_waited_for(tmp_path, autojump_clock):
    paths = paths_in(tmp_path)

    async def write_later() -> None:
        await trio.sleep(1.0)
        # As the broker does: whole, or not at all (a rename).
        tmp = paths.ready_file.with_name("ready.tmp")
        tmp.write_text(encode_ready(os.getpid(), []))
        os.replace(tmp, paths.ready_file)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_later)
        ok, _sink, events = await wait(paths, Broker())
    assert ok is not None
    assert [e["event"] for e in events] == ["broker_ready"]


async def test_a_broker_that_exits_first_is_a_failure(tmp_path):
    ok, sink, events = await wait(paths_in(tmp_path), Broker(status=3))
    assert ok is None
    assert sink.degraded == []
    assert events[-1] == {**events[-1], "event": "broker_failed"}
    assert "status 3" in events[-1]["message"]
