"""The server's trio lifecycle (broker/server.py; spec 14.7, issue 11).

The stop grace is the handler nursery's cancel deadline: under trio's
MockClock (autojump) with the thread offloads run inline, a stop returns
exactly when the in-flight answer left, or exactly at the grace deadline
when the invocation is still running (it is then journaled ``interrupted``).
The connection cap is a ``CapacityLimiter``: exactly ``cap`` connections are
served at once, every further accepted connection gets the canonical error
at once and is counted, and a freed slot serves again. The runner is closed
when ``serve`` returns, whichever way it returns.
"""

from __future__ import annotations

import errno
import json
import os

import pytest
import trio

from bounded_query.broker.journal import Admitted, JournalCorrupt, JournalFile, Outcome
from bounded_query.broker.server import BrokerServer
from tests.broker.helpers import (
    ERROR,
    RUN_ID,
    body_of,
    exchange,
    load,
    make_root,
    read_until_eof,
    request_bytes,
    run_inline,
)
from tests.fakes.runner import ScriptedRunner

OK = b'{"status":"ok","result":true}'
GRACE_S = 300.0


def _records(config) -> list:
    journal = JournalFile.open(config.journal_path, RUN_ID)
    try:
        return list(journal.replayed[1:])
    finally:
        journal.close()


async def _stop_during(tmp_path, script: str, *, grace_s: float = GRACE_S):
    """Serve, send ``script``, stop once it runs; return (response, stop duration, ...)."""
    config, seed_map = load(make_root(tmp_path, timeout=540))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner, grace_s=grace_s, run_sync=run_inline)
    responses: list[bytes] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)

        async def client() -> None:
            responses.append(await exchange(config.socket_path, request_bytes(script), limit_s=1e6))

        nursery.start_soon(client)
        while not runner.calls:  # noqa: ASYNC110 - the invocation starts in another task
            await trio.sleep(0.001)
        stopped = trio.current_time()
        server.stop()
    return responses, trio.current_time() - stopped, config, runner


@pytest.mark.parametrize("run_s", [500.0, 5000.0])
async def test_the_grace_deadline_interrupts_a_long_invocation(autojump_clock, tmp_path, run_s):
    responses, took, config, runner = await _stop_during(tmp_path, f"sleep {run_s}\nwrite true")
    assert took == pytest.approx(GRACE_S, abs=0.01)  # the deadline, not the run's end
    assert responses == [b""]  # closed without an answer
    (invocation,) = runner.calls
    assert _records(config)[-1] == Outcome(invocation.invocation_id, "interrupted", "shutdown")
    assert not any(config.work_root.iterdir())
    assert runner.closed == 1


@pytest.mark.parametrize(("run_s", "bucket_s"), [(0.5, 1.0), (5.0, 10.0), (59.0, 60.0)])
async def test_an_invocation_within_the_grace_answers_and_the_stop_follows(
    autojump_clock, tmp_path, run_s, bucket_s
):
    responses, took, config, runner = await _stop_during(tmp_path, f"sleep {run_s}\nwrite true")
    assert [body_of(r) for r in responses] == [OK]
    # The stop ends right after the bucketed answer (lane entry is a hair
    # before the stop), far before the deadline.
    assert bucket_s - 0.01 < took <= bucket_s
    assert _records(config)[-1] == Outcome(runner.calls[0].invocation_id, "ok")
    assert runner.closed == 1


async def test_an_idle_stop_is_immediate_and_closes_the_runner(autojump_clock, tmp_path):
    config, seed_map = load(make_root(tmp_path))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner, grace_s=GRACE_S, run_sync=run_inline)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        assert body_of(await exchange(config.socket_path, request_bytes("write true"))) == OK
        stopped = trio.current_time()
        server.stop()
    assert trio.current_time() - stopped < 0.01
    assert (runner.reconciled, runner.closed) == (2, 1)  # start and stop; then closed
    assert not config.socket_path.exists()
    assert not config.ready_path.exists()


async def test_a_connection_in_the_backlog_at_the_stop_is_dropped_unanswered(
    autojump_clock, tmp_path
):
    """Nothing is accepted while a query runs, so a stop leaves it unaccepted and uncounted."""
    config, seed_map = load(make_root(tmp_path))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner, grace_s=GRACE_S, run_sync=run_inline)
    responses: dict[str, bytes] = {}

    async def client(name: str, script: str) -> None:
        raw = request_bytes(script)
        responses[name] = await exchange(config.socket_path, raw, limit_s=1e6)

    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        nursery.start_soon(client, "running", "sleep 5\nwrite true")
        while not runner.calls:  # noqa: ASYNC110 - the invocation starts in another task
            await trio.sleep(0.001)
        nursery.start_soon(client, "backlog", "write true")
        await trio.sleep(1)
        assert server.active == 1
        server.stop()
    assert body_of(responses["running"]) == OK
    assert responses["backlog"] == b""
    assert len(runner.calls) == 1
    assert [r for r in _records(config) if isinstance(r, Admitted)] == [
        Admitted(runner.calls[0].invocation_id, repo="octo/public", charge=5)
    ]


async def test_a_request_in_the_lane_queue_at_the_stop_is_journaled_broker_stopping(
    autojump_clock, tmp_path
):
    """Two requests whose connections were both accepted before the query began."""
    config, seed_map = load(make_root(tmp_path))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner, grace_s=GRACE_S, run_sync=run_inline)
    responses: dict[str, bytes] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        first = await trio.open_unix_socket(os.fspath(config.socket_path))
        second = await trio.open_unix_socket(os.fspath(config.socket_path))
        with trio.fail_after(1e6):
            while server.active < 2:  # noqa: ASYNC110 - both are accepted while idle
                await trio.sleep(0.001)

        async def talk(name: str, stream: trio.SocketStream, script: str) -> None:
            async with stream:
                await stream.send_all(request_bytes(script))
                responses[name] = await read_until_eof(stream)

        nursery.start_soon(talk, "first", first, "sleep 5\nwrite true")
        while not runner.calls:  # noqa: ASYNC110 - the invocation starts in another task
            await trio.sleep(0.001)
        nursery.start_soon(talk, "second", second, "write true")
        await trio.sleep(1)  # the second waits for the lane (its bytes were read before)
        server.stop()
    assert body_of(responses["first"]) == OK
    assert body_of(responses["second"]) == ERROR
    assert len(runner.calls) == 1
    rejected = [r for r in _records(config) if isinstance(r, Admitted) and r.rejection]
    assert [r.rejection for r in rejected] == ["broker-stopping"]


async def test_the_runner_is_closed_when_start_up_fails(tmp_path):
    config, seed_map = load(make_root(tmp_path))
    config.journal_path.parent.mkdir(parents=True, exist_ok=True)
    config.journal_path.write_bytes(b"\x00\x00\xff\xff" + b"junk" * 10)
    runner = ScriptedRunner()
    with pytest.raises(JournalCorrupt):
        await BrokerServer(config, seed_map, runner).serve()
    assert runner.closed == 1
    assert runner.preflights == 0  # nothing ran on an untrusted journal


# -- the connection cap ----------------------------------------------------


async def _until(predicate, limit_s: float = 10.0) -> None:
    with trio.fail_after(limit_s):
        while not predicate():  # noqa: ASYNC110 - state changes in other tasks
            await trio.sleep(0.005)


@pytest.mark.parametrize("cap", [1, 3])
async def test_the_cap_serves_exactly_cap_connections_and_refuses_the_rest(tmp_path, cap):
    config, seed_map = load(make_root(tmp_path))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner, connection_cap=cap, header_timeout_s=30)
    sock = os.fspath(config.socket_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        assert server.service is not None
        holders = [await trio.open_unix_socket(sock) for _ in range(cap)]
        for holder in holders:
            await holder.send_all(b"POST /query HTTP/1.1\r\n")  # a slot each, half a head
        await _until(lambda: server.active == cap)
        for index in range(5):
            assert body_of(await exchange(sock, request_bytes("write true"))) == ERROR
            assert server.refused == index + 1
            assert server.active == cap  # a refusal never takes a slot
        await _until(lambda: server.service.accounts.invocations == 5)
        assert runner.calls == []
        # One holder completes its request: answered, and its slot serves again.
        rest = request_bytes("write true").split(b"\r\n", 1)[1]
        await holders[0].send_all(rest)
        assert body_of(await read_until_eof(holders[0])) == OK
        await _until(lambda: server.active == cap - 1)
        assert body_of(await exchange(sock, request_bytes("write true"))) == OK
        assert server.refused == 5
        for holder in holders:
            await holder.aclose()
        await _until(lambda: server.active == 0)
        server.stop()
    categories = [r.rejection for r in _records(config) if isinstance(r, Admitted)]
    assert categories[:5] == ["connection-cap"] * 5
    assert categories.count(None) == 2  # the two served requests
    assert categories.count("http-malformed") == cap - 1  # the half heads cut short


# -- accepting: the gate and trio.serve_listeners' capacity back-off -------------


class _ExhaustedListener(trio.abc.Listener[trio.SocketStream]):
    """Fails ``failures`` accepts with EMFILE, then hands out one real stream, then blocks."""

    def __init__(self, failures: int, stream: trio.SocketStream) -> None:
        self.failures = failures
        self.stream: trio.SocketStream | None = stream
        self.attempts: list[float] = []

    async def accept(self) -> trio.SocketStream:
        await trio.lowlevel.checkpoint()
        self.attempts.append(trio.current_time())
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        if self.stream is None:
            await trio.sleep_forever()
        stream, self.stream = self.stream, None
        return stream

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_descriptor_exhaustion_backs_off_and_logs_one_json_line_per_decade(
    autojump_clock, tmp_path, capfd
):
    from bounded_query.broker.audit import AuditLog
    from bounded_query.broker.server import GatedListener, json_accept_log
    from tests.broker.test_service_timing import make_service

    config, seed_map = load(make_root(tmp_path))
    audit = AuditLog(config.audit_path)
    service = make_service(config, seed_map, audit)
    left, right = trio.socket.socketpair()
    inner = _ExhaustedListener(12, trio.SocketStream(left))
    handled: list[trio.SocketStream] = []

    async def handler(stream: trio.SocketStream) -> None:
        handled.append(stream)

    with json_accept_log():
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, handler, [GatedListener(inner, service)])
            while not handled:  # noqa: ASYNC110 - accepted in another task
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    right.close()
    service.accounts.close()
    audit.close()
    gaps = [b - a for a, b in zip(inner.attempts, inner.attempts[1:], strict=False)]
    assert gaps[:12] == [pytest.approx(0.1)] * 12  # trio's back-off between retries
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines()]
    assert lines == [
        {"count": 1, "errno": "EMFILE", "event": "broker-accept-backoff"},
        {"count": 10, "errno": "EMFILE", "event": "broker-accept-backoff"},
    ]


async def test_the_gated_listener_accepts_nothing_while_a_query_holds_the_lane(
    autojump_clock, tmp_path
):
    from bounded_query.broker.audit import AuditLog
    from bounded_query.broker.server import GatedListener
    from tests.broker.helpers import raw_request
    from tests.broker.test_service_timing import make_service

    config, seed_map = load(make_root(tmp_path))
    audit = AuditLog(config.audit_path)
    service = make_service(config, seed_map, audit)
    left, right = trio.socket.socketpair()
    inner = _ExhaustedListener(0, trio.SocketStream(left))
    accepted: list[float] = []
    answered: list[float] = []

    async def send(body: bytes) -> None:
        answered.append(trio.current_time())

    async def accept() -> None:
        stream = await GatedListener(inner, service).accept()
        accepted.append(trio.current_time())
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.handle, raw_request(request_bytes("sleep 3\nwrite true")), send)
        await trio.sleep(0.5)
        nursery.start_soon(accept)
    right.close()
    service.accounts.close()
    audit.close()
    assert answered == [pytest.approx(10.0)]  # the 10 s bucket
    assert accepted == [pytest.approx(10.0)]  # not one accept before the answer
    assert inner.attempts == [pytest.approx(10.0)]
