"""The broker's control client against the real API proxy's control socket (two real ends)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import trio

from bounded_query.broker.apiproxy._arming import Arm, Disarmed, step
from bounded_query.broker.apiproxy._control import (
    ArmCommand,
    ControlError,
    DisarmCommand,
    StatusCommand,
    encode_control_request,
    encode_control_response,
    parse_control,
    parse_control_answer,
)
from bounded_query.sandbox import proxy_control
from tests.apiproxy.helpers import raw_exchange, request_bytes, running_proxy, status_of


@pytest.mark.parametrize(
    "command",
    [StatusCommand(), ArmCommand("ab" * 16, "c" * 64), DisarmCommand("ab" * 16)],
)
def test_requests_round_trip_through_the_servers_parser(command) -> None:
    assert parse_control(*encode_control_request(command)) == command


def test_answers_round_trip_through_the_servers_encoder() -> None:
    armed = step(Disarmed(), Arm("ab" * 16, "c" * 64, 3))
    answer = parse_control_answer(*encode_control_response(armed, armed.state))
    assert (answer.accepted, answer.outcome, answer.armed) == (True, "armed", True)
    assert (answer.invocation, answer.requests_used) == ("ab" * 16, 0)
    again = step(armed.state, Arm("cd" * 16, "d" * 64, 3))
    answer = parse_control_answer(*encode_control_response(again, again.state))
    assert (answer.accepted, answer.outcome, answer.invocation) == (
        False,
        "already-armed",
        "ab" * 16,
    )
    answer = parse_control_answer(*encode_control_response(None, Disarmed()))
    assert (answer.accepted, answer.outcome, answer.armed, answer.invocation) == (
        True,
        "status",
        False,
        None,
    )


GOOD = {"ok": True, "outcome": "status", "armed": False, "invocation": None, "requestsUsed": 0}


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, b'{"ok":false,"outcome":"bad-request"}'),
        (500, json.dumps(GOOD).encode()),
        (200, b"not json"),
        (200, json.dumps({**GOOD, "extra": 1}).encode()),
        (200, json.dumps({**GOOD, "ok": False}).encode()),
        (409, json.dumps(GOOD).encode()),
        (200, json.dumps({**GOOD, "armed": True}).encode()),
        (200, json.dumps({**GOOD, "invocation": "ab" * 16}).encode()),
        (200, json.dumps({**GOOD, "requestsUsed": -1}).encode()),
        (200, json.dumps({**GOOD, "requestsUsed": True}).encode()),
        (200, json.dumps({**GOOD, "armed": "no"}).encode()),
        (200, b"{" + b" " * 5000 + b"}"),
    ],
)
def test_anything_but_the_proxys_answer_is_refused(status, body) -> None:
    with pytest.raises(ControlError):
        parse_control_answer(status, body)


async def test_arm_status_disarm_against_the_real_proxy(tmp_path: Path) -> None:
    async with running_proxy(tmp_path) as running:
        path = running.config.control_socket
        invocation, placeholder = secrets.token_hex(16), secrets.token_hex(32)
        assert not (await proxy_control.status(path)).armed
        armed = await proxy_control.arm(path, invocation, placeholder)
        assert (armed.accepted, armed.armed, armed.invocation) == (True, True, invocation)
        assert status_of(await running.post(placeholder)) == 200
        state = await proxy_control.status(path)
        assert (state.armed, state.invocation, state.requests_used) == (True, invocation, 1)
        again = await proxy_control.arm(path, secrets.token_hex(16), secrets.token_hex(32))
        assert (again.accepted, again.outcome, again.invocation) == (
            False,
            "already-armed",
            invocation,
        )
        disarmed = await proxy_control.disarm(path, invocation)
        assert (disarmed.accepted, disarmed.armed) == (True, False)
        # the placeholder is dead now, and the invocation id can never arm again
        assert status_of(await running.post(placeholder)) in (401, 403)
        spent = await proxy_control.arm(path, invocation, secrets.token_hex(32))
        assert (spent.accepted, spent.outcome) == (False, "invocation-spent")
        not_armed = await proxy_control.disarm(path, invocation)
        assert (not_armed.accepted, not_armed.outcome, not_armed.armed) == (
            False,
            "not-armed",
            False,
        )
        # the TCP side never answers control routes
        raw = request_bytes(running.port, None, b"", target=b"/status", method=b"GET")
        assert status_of(await raw_exchange(running.port, raw)) >= 400


async def test_a_missing_socket_is_a_control_error(tmp_path: Path) -> None:
    with pytest.raises(proxy_control.ProxyControlError, match="control socket"):
        await proxy_control.status(tmp_path / "nothing.sock")


async def _silent_server(path: Path, task_status=trio.TASK_STATUS_IGNORED) -> None:
    listener = trio.socket.socket(trio.socket.AF_UNIX)
    await listener.bind(str(path))
    listener.listen(1)
    task_status.started()
    with listener:
        conn, _ = await listener.accept()
        with conn:
            await trio.sleep_forever()


async def _liar(path: Path, answer: bytes, task_status=trio.TASK_STATUS_IGNORED) -> None:
    listener = trio.socket.socket(trio.socket.AF_UNIX)
    await listener.bind(str(path))
    listener.listen(1)
    task_status.started()
    with listener:
        conn, _ = await listener.accept()
        with conn:
            await conn.recv(65536)
            await conn.send(answer)


async def test_a_hung_proxy_is_a_control_error_after_the_deadline(
    tmp_path: Path, autojump_clock
) -> None:
    path = tmp_path / "hung.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(_silent_server, path)
        with pytest.raises(proxy_control.ProxyControlError, match="did not answer"):
            await proxy_control.exchange(path, StatusCommand(), timeout_s=5)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}",  # cut short
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\n" + b" " * 5000,
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
    ],
)
async def test_an_answer_that_is_not_the_proxys_is_a_control_error(
    tmp_path: Path, answer: bytes
) -> None:
    path = tmp_path / "liar.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(_liar, path, answer)
        with pytest.raises(proxy_control.ProxyControlError):
            await proxy_control.status(path)
