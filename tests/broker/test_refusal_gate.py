"""Refusals raised while a query runs leave with its answer (issue 9 part 5).

Real in-process broker on a real Unix socket, real time: a query that runs
0.3 s is answered on the 1 s boundary; malformed requests and connections
past the connection cap sent meanwhile must not be answered (nor even
accepted or read) before it. When the lane
is idle, refusals are answered at once (well before any boundary).
"""

from __future__ import annotations

import os
import socket

import pytest
import trio

from bounded_query.broker.server import BrokerServer
from tests.broker.helpers import (
    ERROR,
    body_of,
    exchange,
    load,
    make_root,
    read_until_eof,
    request_bytes,
)
from tests.fakes.runner import ScriptedRunner

GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"
OK = b'{"status":"ok","result":true}'


async def _timed(sock, payload: bytes, origin: float) -> tuple[bytes, float]:
    got = await exchange(sock, payload, limit_s=10)
    return body_of(got), trio.current_time() - origin


@pytest.mark.parametrize("connection_cap", [64, 1])
async def test_refusals_during_a_query_wait_for_its_answer(tmp_path, connection_cap):
    config, seed_map = load(make_root(tmp_path))
    server = BrokerServer(config, seed_map, ScriptedRunner(), connection_cap=connection_cap)
    sock = config.socket_path
    results: dict[str, tuple[bytes, float]] = {}
    active: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        # Idle lane: a refusal is answered at once, far below the 10 ms boundary.
        idle_start = trio.current_time()
        assert body_of(await exchange(sock, GARBAGE)) == ERROR
        idle = trio.current_time() - idle_start
        with trio.fail_after(5):  # its slot is free once it has been counted
            while server.active:  # noqa: ASYNC110 - changes in other tasks
                await trio.sleep(0.005)

        origin = trio.current_time()

        async def query() -> None:
            results["query"] = await _timed(sock, request_bytes("sleep 0.3\nwrite true"), origin)

        async def refusal(name: str, at: float) -> None:
            await trio.sleep_until(origin + at)
            results[name] = await _timed(sock, GARBAGE, origin)

        async def watch() -> None:
            await trio.sleep(0.03)  # the query's own connection is in by now
            while "query" not in results:
                active.append(server.active)
                await trio.sleep(0.005)

        async with trio.open_nursery() as inner:
            inner.start_soon(query)
            inner.start_soon(watch)
            for index in range(10):
                inner.start_soon(refusal, f"r{index}", 0.05 + 0.02 * index)
        server.stop()
    body, answered = results.pop("query")
    assert body == OK
    assert answered >= 1.0  # the 1 s boundary
    for name, (body, when) in results.items():
        assert body == ERROR, name
        assert when >= 1.0, (name, when)  # never before the query's own answer
    # Nothing was accepted while the query ran: only its own connection was
    # active (the others waited in the listen backlog).
    assert max(active) == 1
    assert idle < 0.5


async def test_a_refusal_after_the_answer_is_not_held(tmp_path):
    config, seed_map = load(make_root(tmp_path))
    server = BrokerServer(config, seed_map, ScriptedRunner())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        sock = os.fspath(config.socket_path)
        assert body_of(await exchange(sock, request_bytes("sleep 0.3\nwrite true"))) == OK
        assert server.service is not None
        await server.service.gate.hold()  # the gate is open again
        start = trio.current_time()
        assert body_of(await exchange(sock, GARBAGE)) == ERROR
        assert trio.current_time() - start < 0.5
        server.stop()


async def test_the_interim_continue_waits_for_the_running_query_too(tmp_path):
    config, seed_map = load(make_root(tmp_path))
    server = BrokerServer(config, seed_map, ScriptedRunner())
    sock = os.fspath(config.socket_path)
    head = request_bytes("write true", extra=[("Expect", "100-continue")]).split(b"\r\n\r\n")[0]

    async def first_bytes() -> tuple[bytes, float]:
        start = trio.current_time()
        stream = await trio.open_unix_socket(sock)
        async with stream:
            await stream.send_all(head + b"\r\n\r\n")  # the head only, as curl does
            with trio.fail_after(10):
                got = await stream.receive_some(4096)
        return got, trio.current_time() - start

    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        got, idle = await first_bytes()
        assert got.startswith(b"HTTP/1.1 100 Continue")
        origin = trio.current_time()
        seen: dict[str, tuple[bytes, float]] = {}

        async def query() -> None:
            seen["query"] = await _timed(sock, request_bytes("sleep 0.3\nwrite true"), origin)

        async def probe() -> None:
            await trio.sleep(0.05)
            got, _ = await first_bytes()
            seen["probe"] = (got, trio.current_time() - origin)

        async with trio.open_nursery() as inner:
            inner.start_soon(query)
            inner.start_soon(probe)
        server.stop()
    assert seen["query"][0] == OK
    assert seen["probe"][0].startswith(b"HTTP/1.1 100 Continue")
    assert seen["probe"][1] >= 1.0  # not before the query's 1 s answer
    assert idle < 0.5


async def test_nothing_is_read_during_a_query_and_held_time_is_not_a_deadline(tmp_path):
    """A client with a tiny send buffer cannot see the broker read while a query runs.

    Its body send can only finish when the broker reads, which must not happen
    before the query's answer; the wait does not count against the body
    deadline (0.2 s here), so the request is then served normally.
    """
    config, seed_map = load(make_root(tmp_path))
    server = BrokerServer(
        config, seed_map, ScriptedRunner(), header_timeout_s=0.2, body_timeout_s=0.2
    )
    sock = os.fspath(config.socket_path)
    raw = request_bytes("write true\n#" + "x" * 60_000)
    head_and_some = raw.index(b"\r\n\r\n") + 4 + 2048
    seen: dict[str, float] = {}
    answers: dict[str, bytes] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        origin = trio.current_time()
        slow = await trio.open_unix_socket(sock)
        slow.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

        async def slow_client() -> None:
            async with slow:
                await slow.send_all(raw[:head_and_some])
                await trio.sleep(0.1)  # the query enters the lane meanwhile
                await slow.send_all(raw[head_and_some:])
                seen["sent"] = trio.current_time() - origin
                await slow.send_eof()
                answers["slow"] = body_of(await read_until_eof(slow))

        async def query() -> None:
            await trio.sleep(0.05)
            body, when = await _timed(sock, request_bytes("sleep 0.3\nwrite true"), origin)
            answers["query"], seen["query"] = body, when

        async with trio.open_nursery() as inner:
            inner.start_soon(slow_client)
            inner.start_soon(query)
        server.stop()
    assert answers == {"query": OK, "slow": OK}
    assert seen["query"] >= 1.05  # lane entry at ~0.05 s, answer on the 1 s boundary
    # The rest of the body was only read once the query had answered.
    assert seen["sent"] >= seen["query"] - 0.05
