"""The broker child's stderr as ``bounded-query-broker/v1`` records (issue 21 item 2).

The pure core (the line splitter, one line to one record) is tested on its
own, with hostile lines, and every record it makes is checked against the
shipped schema. The relay runs over a real pipe; a whole run relays the
real (fake-runner) broker's lines, and a hostile broker command's garbage,
and nothing of the broker reaches the harness's own stderr unwrapped.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import jsonschema
import pytest
import trio

from bounded_query.harness.lifecycle import broker_log
from bounded_query.harness.lifecycle.broker_log import (
    BROKER_SCHEMA,
    LINE_UNPARSED,
    LINES_DROPPED,
    MAX_BROKER_LINE_BYTES,
    LineSplitter,
    broker_record,
    relay_broker_log,
)
from bounded_query.harness.records.events import EventSink, schema_path
from tests.harness.bq_harness_helpers import (
    HARNESS_TESTS_ROOT,
    HOST_AGENT,
    make_repo,
    var_tmp_base,
)


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_path(BROKER_SCHEMA).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def written(line: bytes, truncated: bool = False) -> dict:
    """The record the relay writes for ``line``, as a consumer reads it."""
    stream = io.StringIO()
    event, fields = broker_record(line, truncated)
    EventSink(stream, clock=lambda: 0.0).relay(BROKER_SCHEMA, event, fields)
    return json.loads(stream.getvalue())


# ---------------------------------------------------------------------------
# The schema file and the splitter


def test_schema_file_is_shipped_and_names_its_type():
    path = schema_path(BROKER_SCHEMA)
    assert path.name == "bounded-query-broker.v1.schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    assert schema["$id"] == BROKER_SCHEMA
    assert schema["properties"]["_schema"] == {"const": BROKER_SCHEMA}
    assert schema["allOf"][0]["then"]["properties"]["bytes"]["maximum"] == MAX_BROKER_LINE_BYTES


def test_splitter_whole_and_bytewise_agree_and_cut_long_lines():
    data = b'{"event":"a"}\n\r\n' + b"x" * 50 + b"\n" + b"y" * 10 + b"\ntail"
    whole = LineSplitter(limit=20)
    got_whole = whole.feed(data) + whole.finish()
    bytewise = LineSplitter(limit=20)
    got_bytes = [line for i in range(len(data)) for line in bytewise.feed(data[i : i + 1])]
    got_bytes += bytewise.finish()
    assert got_whole == got_bytes
    assert got_whole == [
        (b'{"event":"a"}', False),
        (b"\r", False),
        (b"x" * 20, True),
        (b"y" * 10, False),
        (b"tail", False),
    ]


def test_splitter_never_holds_more_than_its_limit():
    splitter = LineSplitter(limit=10)
    for _ in range(1000):
        assert splitter.feed(b"z" * 1000) == []
        assert len(splitter._buffer) <= 10
    assert splitter.feed(b"\n") == [(b"z" * 10, True)]
    assert splitter.finish() == []


# ---------------------------------------------------------------------------
# One line, one record


def test_a_broker_line_keeps_its_event_and_fields():
    line = b'{"event": "broker-ready", "interrupted": 0, "invocations": 3, "tornBytes": 0}'
    record = written(line)
    assert record == {
        "_schema": BROKER_SCHEMA,
        "timestamp": "1970-01-01T00:00:00.000Z",
        "event": "broker-ready",
        "interrupted": 0,
        "invocations": 3,
        "tornBytes": 0,
    }
    assert list(record)[:3] == ["_schema", "timestamp", "event"]
    validator().validate(record)


def test_the_broker_cannot_forge_the_leading_keys():
    record = written(
        b'{"event":"broker-bug","_schema":"bounded-query-event/v1","timestamp":"never","where":"x"}'
    )
    assert record["_schema"] == BROKER_SCHEMA
    assert record["timestamp"] == "1970-01-01T00:00:00.000Z"
    assert record["where"] == "x"


HOSTILE = {
    "not-utf8": b'{"event":"broker-bug","where":"\xff"}',
    "not-json": b"Traceback (most recent call last):",
    "empty": b"",
    "array": b'["broker-ready"]',
    "no-event": b'{"tornBytes":0}',
    "event-not-a-string": b'{"event":7}',
    "event-bad-name": b'{"event":"Broker Ready"}',
    "event-too-long": b'{"event":"' + b"a" * 65 + b'"}',
    "relay-own-name": b'{"event":"broker-lines-dropped","count":99}',
    "nested": b'{"event":"broker-bug","where":{"file":"x"}}',
    "list-value": b'{"event":"broker-bug","where":["x"]}',
    "forbidden-script": b'{"event":"broker-bug","script":"print(secret)"}',
    "forbidden-token": b'{"event":"broker-bug","token":"ghp_x"}',
    "bad-field-name": b'{"event":"broker-bug","GH_TOKEN":"x"}',
    "nan": b'{"event":"broker-bug","count":NaN}',
    "deep": b'{"event":"broker-bug","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "control-characters": b"\x1b[31mred\x00\x07",
}


@pytest.mark.parametrize("line", HOSTILE.values(), ids=HOSTILE.keys())
def test_any_other_line_is_an_unparsed_record_with_its_text(line):
    record = written(line[:MAX_BROKER_LINE_BYTES], truncated=len(line) > MAX_BROKER_LINE_BYTES)
    validator().validate(record)
    assert record["event"] == LINE_UNPARSED
    assert record["bytes"] == min(len(line), MAX_BROKER_LINE_BYTES)
    assert record["text"] == line[:MAX_BROKER_LINE_BYTES].decode("utf-8", "replace")
    assert set(record) == {"_schema", "timestamp", "event", "text", "bytes", "truncated"}


def test_a_truncated_line_is_never_parsed_even_if_its_prefix_is_json():
    record = written(b'{"event":"broker-ready"}', truncated=True)
    assert record["event"] == LINE_UNPARSED
    assert record["truncated"] is True
    validator().validate(record)


def test_schema_rejects_what_the_relay_never_writes():
    ok = {"_schema": BROKER_SCHEMA, "timestamp": "1970-01-01T00:00:00.000Z", "event": "x"}
    check = validator()
    assert check.is_valid(ok)
    for bad in (
        {**ok, "_schema": "bounded-query-event/v1"},
        {**ok, "event": "Bad"},
        {**ok, "nested": {"a": 1}},
        {**ok, "script": "s"},
        {**ok, "event": LINE_UNPARSED, "text": "t"},
        {**ok, "event": LINES_DROPPED, "count": 0},
    ):
        assert not check.is_valid(bad), bad


def test_relayed_records_have_the_run_roots_redacted():
    stream = io.StringIO()
    sink = EventSink(stream, clock=lambda: 0.0)
    sink.redact("/var/tmp/base/awf-private-1", "<privateRoot>")
    line = b'{"event":"broker-refused","reason":"journal","detail":"/var/tmp/base/awf-private-1/j"}'
    event, fields = broker_record(line)
    sink.relay(BROKER_SCHEMA, event, fields)
    assert "/var/tmp/base" not in stream.getvalue()
    assert json.loads(stream.getvalue())["detail"] == "<privateRoot>/j"


# ---------------------------------------------------------------------------
# The relay over a real pipe


async def relay_pipe(data: bytes) -> list[dict]:
    read_fd, write_fd = os.pipe()
    stream = io.StringIO()
    sink = EventSink(stream, clock=lambda: 0.0)

    async def writer() -> None:
        view = memoryview(data)
        while view:
            await trio.lowlevel.wait_writable(write_fd)
            view = view[os.write(write_fd, view[: 1 << 16]) :]
        os.close(write_fd)

    os.set_blocking(write_fd, False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await relay_broker_log(trio.lowlevel.FdStream(read_fd), sink)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_the_relay_writes_one_record_per_line_and_the_last_partial_one():
    records = await relay_pipe(
        b'{"event":"broker-ready","tornBytes":0}\n'
        + b"z" * (3 * MAX_BROKER_LINE_BYTES)
        + b'\n{"event":"broker-stopped"}\nno newline at the end'
    )
    assert [r["event"] for r in records] == [
        "broker-ready",
        LINE_UNPARSED,
        "broker-stopped",
        LINE_UNPARSED,
    ]
    assert records[1]["truncated"] is True
    assert records[1]["bytes"] == MAX_BROKER_LINE_BYTES
    assert records[3]["text"] == "no newline at the end"
    for record in records:
        validator().validate(record)


async def test_past_the_cap_lines_are_counted_not_relayed(monkeypatch):
    monkeypatch.setattr(broker_log, "MAX_BROKER_RECORDS", 5)
    records = await relay_pipe(b'{"event":"broker-bug","where":"x:1"}\n' * 2000)
    assert [r["event"] for r in records] == ["broker-bug"] * 5 + [LINES_DROPPED]
    assert records[-1]["count"] == 1995
    validator().validate(records[-1])


async def test_a_cancelled_relay_still_reports_what_it_dropped(monkeypatch):
    monkeypatch.setattr(broker_log, "MAX_BROKER_RECORDS", 1)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b'{"event":"a"}\n{"event":"b"}\n{"event":"c"}\n')  # pipe stays open
    stream = io.StringIO()
    with trio.move_on_after(0.5):
        await relay_broker_log(trio.lowlevel.FdStream(read_fd), EventSink(stream))
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["a", LINES_DROPPED]
    with pytest.raises(BrokenPipeError):  # the relay closed the read end
        os.write(write_fd, b"x")
    os.close(write_fd)


# ---------------------------------------------------------------------------
# Whole runs: the real broker's lines, a hostile broker's garbage

FAKE_BROKER = (sys.executable, "-m", "tests.fakes.broker_main")


def config_file(path: Path) -> Path:
    path.write_text(
        json.dumps(
            {
                "boundedQueries": {
                    "enabled": True,
                    "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
                }
            }
        )
    )
    return path


async def one_run(
    tmp_path: Path, broker_command: tuple[str, ...], docker_host: str
) -> tuple[int, list[dict]]:
    from bounded_query.harness import RunOptions, run

    source = tmp_path / "src"
    make_repo(source, {"README.md": "hello\n"})
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with var_tmp_base() as base:
        options = RunOptions(
            config_source=str(config_file(tmp_path / "config.json")),
            agent=(sys.executable, "-c", "pass"),
            seed_sources={"octo/alpha": source},
            workspace=workspace,
            base=base,
            broker_command=broker_command,
            probe_runtime=False,
            ready_timeout=20.0,
            **HOST_AGENT,
        )
        stream = io.StringIO()
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(HARNESS_TESTS_ROOT),
            "DOCKER_HOST": docker_host,
        }
        status = await run(options, EventSink(stream), env)
    return status, [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_a_run_relays_the_brokers_lines_as_versioned_records(tmp_path, capfd, fake_engine):
    status, records = await one_run(tmp_path, FAKE_BROKER, fake_engine.docker_host)
    assert status == 0, records
    assert all(r["_schema"] in ("bounded-query-event/v1", BROKER_SCHEMA) for r in records)
    broker = [r for r in records if r["_schema"] == BROKER_SCHEMA]
    assert [r["event"] for r in broker] == ["broker-ready", "broker-stopped"]
    assert broker[0]["invocations"] == 0
    names = [(r["_schema"], r["event"]) for r in records]
    # The broker's last line is relayed before the harness reports it stopped.
    assert names.index((BROKER_SCHEMA, "broker-stopped")) < names.index(
        ("bounded-query-event/v1", "broker_stopped")
    )
    assert "broker-ready" not in capfd.readouterr().err  # nothing unwrapped on fd 2


HOSTILE_BROKER = r"""
import os, sys
out = sys.stderr.buffer
out.write(b"\xff\xfe not utf-8\n")
out.write(b'{"event":"broker-bug","script":"print(1)"}\n')
out.write(b"A" * 100000 + b"\n")
out.write(b"\x1b[2J\x00 no newline")
out.flush()
sys.exit(3)
"""


async def test_a_hostile_broker_output_becomes_valid_records(tmp_path, capfd, fake_engine):
    """The autouse schema check validates every record of this run too."""
    status, records = await one_run(
        tmp_path, (sys.executable, "-c", HOSTILE_BROKER, "x"), fake_engine.docker_host
    )
    assert status == 2
    broker = [r for r in records if r["_schema"] == BROKER_SCHEMA]
    assert [r["event"] for r in broker] == [LINE_UNPARSED] * 4
    assert [r["truncated"] for r in broker] == [False, False, True, False]
    assert "script" not in broker[1]
    assert broker[2]["bytes"] == MAX_BROKER_LINE_BYTES
    assert any(r["event"] == "broker_failed" for r in records)
    assert "not utf-8" not in capfd.readouterr().err
    for record in broker:
        validator().validate(record)
