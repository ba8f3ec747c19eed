"""Bucketed answers from the real pipeline under trio's MockClock (spec 14.3.1).

The scripted runner "runs" for an exact mock duration; the answer must leave
exactly on the first boundary at or after processing end, measured from lane
entry, for durations within 1 ms of every boundary.
"""

from __future__ import annotations

import pytest
import trio
from bounded_query.broker.audit import AuditLog
from bounded_query.broker.http import HttpRequest
from bounded_query.broker.journal import JournalFile
from bounded_query.broker.ledger import Ledger
from bounded_query.broker.service import BOUNDARIES_S, Service
from bounded_query.broker.timing import TOLERANCE_S

from tests.broker.helpers import ERROR, load, make_root, request_bytes
from tests.fakes.runner import ScriptedRunner

OK = b'{"status":"ok","result":true}'


def _http(raw: bytes) -> HttpRequest:
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    method, target, version = lines[0].split(b" ")
    headers = tuple(tuple(line.split(b": ", 1)) for line in lines[1:])
    return HttpRequest(method, target, version.split(b"/")[1], headers, body)  # type: ignore[arg-type]


async def _inline(fn, *args, **_kwargs):
    """``trio.to_thread.run_sync`` without a thread (blocking the loop briefly)."""
    await trio.lowlevel.checkpoint()
    return fn(*args)


@pytest.fixture
def service(tmp_path, monkeypatch):
    # The overflow watchdog keeps a timer pending during processing; with a
    # worker thread running, MockClock's autojump would take the wait for the
    # thread as idleness and jump to that timer. Run thread offloads inline.
    monkeypatch.setattr(trio.to_thread, "run_sync", _inline)
    config, seed_map = load(make_root(tmp_path, max_invocations=10000, timeout=540))
    journal = JournalFile.open(config.journal_path, config.run_id)
    audit = AuditLog(config.audit_path)
    svc = Service(config, seed_map, ScriptedRunner(), journal, Ledger(), audit)
    yield svc
    journal.close()
    audit.close()


async def _answer(service: Service, raw: bytes) -> tuple[bytes, float]:
    sent: list[tuple[bytes, float]] = []

    async def send(body: bytes) -> None:
        sent.append((body, trio.current_time()))

    start = trio.current_time()
    await service.handle(_http(raw), send)
    ((body, when),) = sent
    return body, when - start


CASES = [
    (index, delta)
    for index in range(len(BOUNDARIES_S))
    for delta in (-0.001, -0.0001, 0.0, 0.0001, 0.001)
]


@pytest.mark.parametrize(("index", "delta"), CASES)
async def test_answer_lands_exactly_on_a_boundary(autojump_clock, service, index, delta):
    duration = BOUNDARIES_S[index] + delta
    body, elapsed = await _answer(service, request_bytes(f"sleep {duration}\nwrite true"))
    if duration <= BOUNDARIES_S[index]:
        expected = BOUNDARIES_S[index]
    elif index + 1 < len(BOUNDARIES_S):
        expected = BOUNDARIES_S[index + 1]
    else:
        expected = None
    if expected is None:
        assert body == ERROR  # past the last boundary: fail closed
        assert elapsed == pytest.approx(duration, abs=1e-9)
    else:
        assert body == OK
        assert elapsed == pytest.approx(expected, abs=1e-9)


async def test_rejections_land_on_the_first_boundary(autojump_clock, service):
    for raw in [
        request_bytes("write true", repo="octo/unknown"),
        request_bytes("write true", repo="octo/sealed"),
        request_bytes("write true", method="GET"),
    ]:
        body, elapsed = await _answer(service, raw)
        assert body == ERROR
        assert elapsed == pytest.approx(BOUNDARIES_S[0], abs=1e-9)


async def test_queued_request_is_timed_from_lane_entry(autojump_clock, service):
    results: dict[str, tuple[bytes, float]] = {}

    async def one(name: str, script: str) -> None:
        results[name] = await _answer(service, request_bytes(script))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first", "sleep 0.5\nwrite true")
        await trio.sleep(0.001)
        nursery.start_soon(one, "second", "sleep 0.05\nwrite true")
    assert results["first"] == (OK, pytest.approx(1.0, abs=1e-9))
    # Waited for the first (1.0 s from its start, 0.999 from its own), then 0.1 s bucket.
    assert results["second"] == (OK, pytest.approx(0.999 + 0.1, abs=1e-9))


async def test_runner_failure_is_still_bucketed(autojump_clock, service):
    body, elapsed = await _answer(service, request_bytes("sleep 2.5\nfail query-timeout"))
    assert body == ERROR
    assert elapsed == pytest.approx(10.0, abs=1e-9)


@pytest.mark.parametrize("duration", [600.0051, 600.01, 700.0, 5000.0])
async def test_overflow_is_answered_at_a_fixed_moment(autojump_clock, service, duration):
    """Past the last boundary + tolerance, the error leaves then, not when processing ends."""
    body, elapsed = await _answer(service, request_bytes(f"sleep {duration}\nwrite true"))
    assert body == ERROR
    assert elapsed == pytest.approx(BOUNDARIES_S[-1] + TOLERANCE_S, abs=1e-9)
    assert len(service.runner.calls) == 1


async def test_lane_stays_held_until_an_overflowing_invocation_ends(autojump_clock, service):
    results: dict[str, tuple[bytes, float]] = {}

    async def one(name: str, script: str) -> None:
        results[name] = await _answer(service, request_bytes(script))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first", "sleep 700\nwrite true")
        await trio.sleep(0.001)
        nursery.start_soon(one, "second", "write true")
    assert results["first"] == (ERROR, pytest.approx(600.005, abs=1e-9))
    # The lane is released on the 600 s grid after the overrun ends (1200 s),
    # never at the overrun's own end (700 s).
    assert results["second"] == (OK, pytest.approx(1200 - 0.001 + 0.01, abs=1e-9))
