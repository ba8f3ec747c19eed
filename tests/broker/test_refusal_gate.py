"""Refusals raised while a query runs leave with its answer (issue 9 part 5).

Real in-process broker on a real Unix socket, real time: a query that runs
0.3 s is answered on the 1 s boundary; malformed requests and connections
past the connection cap sent meanwhile must not be answered before it, and
the excess connections held at once stay within the hold cap. When the lane
is idle, refusals are answered at once (well before any boundary).
"""

from __future__ import annotations

import os

import pytest
import trio
from bounded_query.broker import server as server_module
from bounded_query.broker.server import BrokerServer

from tests.broker.helpers import ERROR, body_of, exchange, load, make_root, request_bytes
from tests.fakes.runner import ScriptedRunner

GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"
OK = b'{"status":"ok","result":true}'


async def _timed(sock, payload: bytes, origin: float) -> tuple[bytes, float]:
    got = await exchange(sock, payload, limit_s=10)
    return body_of(got), trio.current_time() - origin


@pytest.mark.parametrize("connection_cap", [64, 1])
async def test_refusals_during_a_query_wait_for_its_answer(tmp_path, monkeypatch, connection_cap):
    monkeypatch.setattr(server_module, "REFUSE_HOLD_CAP", 3)
    config, seed_map = load(make_root(tmp_path))
    server = BrokerServer(config, seed_map, ScriptedRunner(), connection_cap=connection_cap)
    sock = config.socket_path
    results: dict[str, tuple[bytes, float]] = {}
    held: list[int] = []
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
            while "query" not in results:
                held.append(server.refusing)
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
    if connection_cap == 1:
        # The hold cap was reached and held: the rest waited in the listen
        # backlog (and were served as ordinary connections after the answer).
        assert max(held) == 3
    assert idle < 0.5


async def test_a_refusal_after_the_answer_is_not_held(tmp_path):
    config, seed_map = load(make_root(tmp_path))
    server = BrokerServer(config, seed_map, ScriptedRunner())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        sock = os.fspath(config.socket_path)
        assert body_of(await exchange(sock, request_bytes("sleep 0.3\nwrite true"))) == OK
        assert server.service is not None
        await server.service.hold_refusal()  # the gate is open again
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
