"""Bucketed answers from the real pipeline under trio's MockClock (spec 14.3.1).

The scripted runner "runs" for an exact mock duration; the answer must leave
exactly on the first boundary at or after processing end, measured from lane
entry, for durations within 1 ms of every boundary. After an overflow the run
halts: followers are answered at a moment independent of the overrun (issue 9
part 6), and refusals raised during a query leave with its answer (part 5).
"""

from __future__ import annotations

import pytest
import trio

from bounded_query.broker.accounts import Accounts
from bounded_query.broker.admission import RawRequest
from bounded_query.broker.audit import AuditLog
from bounded_query.broker.journal import JournalFile
from bounded_query.broker.ledger import Ledger
from bounded_query.broker.service import Service
from bounded_query.broker.timing import BOUNDARIES_S, TOLERANCE_S
from tests.broker.helpers import ERROR, load, make_root, raw_request, request_bytes, run_inline
from tests.fakes.runner import ScriptedRunner

OK = b'{"status":"ok","result":true}'


def _http(raw: bytes) -> RawRequest:
    """The pipeline's plain request (also used by ``tests/bench/bench_timing.py``)."""
    return raw_request(raw)


def make_service(config, seed_map, audit: AuditLog, **kwargs) -> Service:
    """A service over a fresh journal whose thread offloads run inline.

    The overflow watchdog keeps a timer pending during processing; with a
    worker thread running, MockClock's autojump would take the wait for the
    thread as idleness and jump to that timer.
    """
    journal = JournalFile.open(config.journal_path, config.run_id)
    accounts = Accounts(journal, Ledger(), config.max_invocations, run_sync=run_inline)
    runner = ScriptedRunner()
    return Service(config, seed_map, runner, accounts, audit, run_sync=run_inline, **kwargs)


@pytest.fixture
def service(tmp_path):
    config, seed_map = load(make_root(tmp_path, max_invocations=10000, timeout=540))
    audit = AuditLog(config.audit_path)
    svc = make_service(config, seed_map, audit)
    yield svc
    svc.accounts.close()
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


OVERRUNS = [600.006, 700.0, 1234.5, 5000.0, 86_400.0]


async def _overflow_then(service: Service, overrun: float, followers: list[float]):
    """An overrunning first request, then followers arriving at the given times."""
    results: dict[int, tuple[bytes, float]] = {}

    async def first() -> None:
        results[-1] = await _answer(service, request_bytes(f"sleep {overrun}\nwrite true"))

    async def follower(index: int, at: float) -> None:
        await trio.sleep_until(at)
        results[index] = await _answer(service, request_bytes("write true"))

    origin = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        for index, at in enumerate(followers):
            nursery.start_soon(follower, index, origin + at)
    return results


@pytest.mark.parametrize("overrun", OVERRUNS)
async def test_after_an_overflow_followers_are_answered_independently_of_the_overrun(
    autojump_clock, service, overrun
):
    """Issue 9 part 6: queued and later requests get the error at a fixed moment."""
    followers = [0.001, 300.0, 600.004, 601.0, 5000.0]
    results = await _overflow_then(service, overrun, followers)
    halt = BOUNDARIES_S[-1] + TOLERANCE_S
    assert results[-1] == (ERROR, pytest.approx(halt, abs=1e-9))
    first = BOUNDARIES_S[0]
    # Queued before the halt: the first boundary after the overflow answer,
    # measured from their own arrival; after it: the first boundary after arrival.
    assert results[0] == (ERROR, pytest.approx(halt + first - 0.001, abs=1e-9))
    assert results[1] == (ERROR, pytest.approx(halt + first - 300.0, abs=1e-9))
    assert results[2] == (ERROR, pytest.approx(halt + first - 600.004, abs=1e-9))
    assert results[3] == (ERROR, pytest.approx(first, abs=1e-9))
    assert results[4] == (ERROR, pytest.approx(first, abs=1e-9))
    assert len(service.runner.calls) == 1  # nothing runs after the halt
    assert service.halted_at == pytest.approx(halt, abs=1e-9)


async def test_follower_answer_times_are_identical_for_every_overrun(autojump_clock, tmp_path):
    """The same follower schedule, one fresh service per overrun: one timing for all."""
    seen: set[tuple[tuple[int, bytes, float], ...]] = set()
    for index, overrun in enumerate(OVERRUNS):
        root = tmp_path / str(index)
        root.mkdir()
        config, seed_map = load(make_root(root, max_invocations=100, timeout=540))
        audit = AuditLog(config.audit_path)
        svc = make_service(config, seed_map, audit)
        try:
            results = await _overflow_then(svc, overrun, [0.001, 0.5, 700.0, 10_000.0])
        finally:
            svc.accounts.close()
            audit.close()
        timings = sorted(results.items())
        seen.add(tuple((k, body, round(t, 9)) for k, (body, t) in timings if k >= 0))
    assert len(seen) == 1, seen


async def test_refusals_wait_for_the_running_invocation_to_answer(autojump_clock, service):
    """Issue 9 part 5: a refusal raised during a query leaves with the query's answer."""
    released: list[float] = []

    async def refusal(at: float) -> None:
        await trio.sleep_until(at)
        await service.gate.hold()
        released.append(trio.current_time())

    origin = trio.current_time()
    answer: list[tuple[bytes, float]] = []

    async def query() -> None:
        answer.append(await _answer(service, request_bytes("sleep 0.37\nwrite true")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(query)
        for at in (0.0001, 0.2, 0.3699, 0.5, 0.99):
            nursery.start_soon(refusal, origin + at)
    assert answer == [(OK, pytest.approx(1.0, abs=1e-9))]
    assert released == [pytest.approx(origin + 1.0, abs=1e-9)] * 5
    # Idle lane: at once.
    before = trio.current_time()
    await service.gate.hold()
    assert trio.current_time() == before


async def test_refusals_are_released_by_the_overflow_answer_not_the_overrun_end(
    autojump_clock, service
):
    released: list[float] = []

    async def refusal(at: float) -> None:
        await trio.sleep_until(at)
        await service.gate.hold()
        released.append(trio.current_time())

    origin = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer, service, request_bytes("sleep 3000\nwrite true"))
        for at in (1.0, 599.0, 700.0, 2999.0):
            nursery.start_soon(refusal, origin + at)
    halt = origin + BOUNDARIES_S[-1] + TOLERANCE_S
    assert released == [
        pytest.approx(halt, abs=1e-9),
        pytest.approx(halt, abs=1e-9),
        pytest.approx(origin + 700.0, abs=1e-9),
        pytest.approx(origin + 2999.0, abs=1e-9),
    ]


async def test_after_a_halt_refusals_are_tallied_not_journaled(autojump_clock, service, capsys):
    await _answer(service, request_bytes("sleep 700\nwrite true"))
    assert '"event": "broker-halted"' in capsys.readouterr().err
    counted = service.accounts.invocations
    journal_size = service.config.journal_path.stat().st_size
    for _ in range(50):
        await service.count_refusal("http-malformed")
        assert (await _answer(service, request_bytes("write true")))[0] == ERROR
    assert service.accounts.invocations == counted
    assert service.config.journal_path.stat().st_size == journal_size
    assert dict(service.sink._tally.pending) == {"halted-after-overflow": 50, "http-malformed": 50}


async def test_audit_times_come_from_the_injected_wall_clock(autojump_clock, tmp_path):
    """The wall clock is a collaborator: every audit line carries its reading."""
    import json

    config, seed_map = load(make_root(tmp_path, max_invocations=2))
    audit = AuditLog(config.audit_path)
    readings = iter([1_700_000_000.12345, 1_700_000_001.5, 1_700_000_002.0, 1_700_000_003.0])
    svc = make_service(config, seed_map, audit, wall_clock=lambda: next(readings))
    try:
        assert (await _answer(svc, request_bytes("write true")))[0] == OK
        await svc.count_refusal("http-malformed")
        assert (await _answer(svc, request_bytes("write true")))[0] == ERROR  # past the cap
        await svc.flush_audit()
    finally:
        svc.accounts.close()
        audit.close()
    lines = [json.loads(line) for line in config.audit_path.read_bytes().splitlines()]
    assert [(line["category"], line["time"]) for line in lines] == [
        ("ok", 1_700_000_000.123),
        ("http-malformed", 1_700_000_001.5),
        ("refusal-summary", 1_700_000_003.0),
    ]
    assert lines[0]["timestamp"] == "2023-11-14T22:13:20.123Z"
