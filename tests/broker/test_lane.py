"""The lane's state table (every pair), the refusal gate, and the subsystem seam."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import pytest
import trio

from bounded_query.broker.audit import AuditLog
from bounded_query.broker.gate import RefusalGate
from bounded_query.broker.lane import (
    TRANSITIONS,
    LaneError,
    LaneEvent,
    LaneState,
    gate_open,
    next_state,
)
from bounded_query.broker.protocol import RequestError, parse_frame
from bounded_query.broker.subsystem import BOUNDED_QUERY, Framed, Subsystem
from tests.broker.helpers import ERROR, load, make_root, request_bytes
from tests.broker.test_service_timing import _answer, make_service

S, E = LaneState, LaneEvent
EXPECTED = {
    (S.IDLE, E.ENTER): S.DECIDING,
    (S.IDLE, E.PROTECTION_LOST): S.HALTED,
    (S.DECIDING, E.ANSWER): S.ANSWERED,
    (S.DECIDING, E.OVERFLOW): S.HALTED,
    (S.DECIDING, E.PROTECTION_LOST): S.DECIDING_HALTED,
    (S.ANSWERED, E.LEAVE): S.IDLE,
    (S.ANSWERED, E.PROTECTION_LOST): S.HALTED,
    (S.DECIDING_HALTED, E.ANSWER): S.HALTED,
    (S.DECIDING_HALTED, E.OVERFLOW): S.HALTED,
    (S.DECIDING_HALTED, E.PROTECTION_LOST): S.DECIDING_HALTED,
    **{(S.HALTED, event): S.HALTED for event in E},
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, E)))
def test_every_state_event_pair(state, event):
    if (state, event) in EXPECTED:
        assert next_state(state, event) is EXPECTED[(state, event)]
    else:
        with pytest.raises(LaneError):
            next_state(state, event)


def test_the_table_is_exactly_the_expected_one():
    assert dict(TRANSITIONS) == EXPECTED
    with pytest.raises(TypeError):
        TRANSITIONS[(S.IDLE, E.LEAVE)] = S.IDLE  # type: ignore[index]


def test_the_gate_is_closed_only_while_a_request_decides():
    assert [s for s in S if not gate_open(s)] == [S.DECIDING, S.DECIDING_HALTED]


async def test_gate_holds_until_opened_and_cancels_pending_accepts(autojump_clock):
    gate = RefusalGate()
    assert gate.is_open
    await gate.hold()  # open: returns at once
    released: list[float] = []
    cancelled: list[bool] = []

    async def accept_like() -> None:
        with gate.cancelled_when_closed() as scope:
            await trio.sleep_forever()
        cancelled.append(scope.cancelled_caught)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_like)
        await trio.sleep(0.01)
        gate.close()
        assert not gate.is_open

        async def refusal() -> None:
            await gate.hold()
            released.append(trio.current_time())

        nursery.start_soon(refusal)
        await trio.sleep(5)
        assert released == []
        opened = trio.current_time()
        gate.open()
        gate.open()  # idempotent
    assert cancelled == [True]
    assert released == [opened]
    with gate.cancelled_when_closed() as scope:
        assert not scope.cancel_called  # open gate: nothing cancelled


async def test_a_closed_gate_cancels_a_new_accept_at_once():
    gate = RefusalGate()
    gate.close()
    with gate.cancelled_when_closed() as scope:
        await trio.sleep_forever()
    assert scope.cancelled_caught


# -- the subsystem seam: frame and payload are the pipeline's parameters -----------


@dataclasses.dataclass(frozen=True)
class _Tagged:
    private_repo: str
    schema: object
    body: bytes


def _tagged_frame(headers: Sequence[tuple[bytes, bytes]], body: bytes) -> Framed:
    request = parse_frame(list(headers), body)
    if not body.startswith(b"write "):
        raise RequestError("body: must start with 'write '")
    return _Tagged(request.private_repo, request.schema, body)  # type: ignore[return-value]


def _tagged_payload(request: Framed) -> bytes:
    assert isinstance(request, _Tagged)
    return request.body.replace(b"false", b"true")


TAGGED = Subsystem("tagged", 1024, _tagged_frame, _tagged_payload)


@pytest.mark.parametrize("subsystem", [BOUNDED_QUERY, TAGGED])
async def test_the_runner_gets_the_subsystems_payload(tmp_path, autojump_clock, subsystem):
    config, seed_map = load(make_root(tmp_path))
    audit = AuditLog(config.audit_path)
    service = make_service(config, seed_map, audit, subsystem=subsystem)
    try:
        body, _ = await _answer(service, request_bytes("write false"))
        refused, _ = await _answer(service, request_bytes("sleep 1"))
    finally:
        service.accounts.close()
        audit.close()
    runner = service.runner
    sent = [call.script for call in runner.calls]  # type: ignore[attr-defined]
    if subsystem is TAGGED:
        assert body == b'{"status":"ok","result":true}'
        assert sent == [b"write true"]  # the frame refused the second request
        assert refused == ERROR
    else:
        assert body == b'{"status":"ok","result":false}'
        assert sent == [b"write false", b"sleep 1"]
