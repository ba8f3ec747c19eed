"""A protection lost mid-run halts the run as an overflow does (issue 21 item 3).

The runner's ``watch`` returns when the page-cache pin it started is gone;
the service then halts through the overflow's own path: the request holding
the lane keeps its answer, every queued and later request gets the canonical
error at a moment that depends only on its arrival and on the halt, the
operator reads the reason on stderr, and the server rewrites its readiness
file so the harness can report it.
"""

from __future__ import annotations

import json

import pytest
import trio

from bounded_query.broker.audit import AuditLog
from bounded_query.broker.protocol import policy
from bounded_query.broker.readiness import decode_ready
from bounded_query.broker.runner import PAGE_CACHE_PIN, Degradation
from bounded_query.broker.service import HALTED_CATEGORIES
from bounded_query.broker.timing import BOUNDARIES_S, halted_answer_at
from tests.broker.conftest import serving
from tests.broker.helpers import ERROR, body_of, exchange, load, make_root, request_bytes
from tests.broker.test_service_timing import OK, _answer, make_service

LOST = Degradation(PAGE_CACHE_PIN, "the pin container stopped during the run")


@pytest.fixture
def service(tmp_path):
    config, seed_map = load(make_root(tmp_path, max_invocations=100, timeout=60))
    audit = AuditLog(config.audit_path)
    svc = make_service(config, seed_map, audit)
    yield svc
    svc.accounts.close()
    audit.close()


async def test_a_lost_pin_halts_every_later_request(autojump_clock, service, capsys):
    results: dict[str, tuple[bytes, float]] = {}
    origin = trio.current_time()

    async def at(name: str, when: float, script: str) -> None:
        await trio.sleep_until(origin + when)
        results[name] = await _answer(service, request_bytes(script))

    async def lose_at(when: float) -> None:
        await trio.sleep_until(origin + when)
        service.runner.lose(LOST)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.watch_runner)
        nursery.start_soon(at, "holder", 0.0, "sleep 5\nwrite true")
        nursery.start_soon(at, "queued", 1.0, "write true")
        nursery.start_soon(lose_at, 2.0)
        nursery.start_soon(at, "later", 30.0, "write true")
    halted = origin + 2.0
    assert service.halted_at == pytest.approx(halted, abs=1e-9)
    # The holder's query started with the pin in place: its answer stands.
    assert results["holder"][0] == OK
    first = BOUNDARIES_S[0]
    queued_at = halted_answer_at(origin + 1.0, halted, first) - (origin + 1.0)
    assert results["queued"] == (ERROR, pytest.approx(queued_at, abs=1e-9))
    assert results["later"] == (ERROR, pytest.approx(first, abs=1e-9))
    assert len(service.runner.calls) == 1, "nothing ran after the loss"
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if "broker-halted" in x]
    assert lines == [
        {
            "event": "broker-halted",
            "reason": policy.CATEGORY_PROTECTION_LOST,
            "subsystem": PAGE_CACHE_PIN,
            "detail": LOST.reason,
        }
    ]
    assert dict(service.sink._tally.pending) == {
        HALTED_CATEGORIES[policy.CATEGORY_PROTECTION_LOST]: 2
    }


async def test_no_loss_no_halt(autojump_clock, service):
    with trio.move_on_after(3600):
        await service.watch_runner()
    assert service.halted_at is None
    assert (await _answer(service, request_bytes("write true")))[0] == OK


async def test_the_server_halts_and_rewrites_its_readiness_file(tmp_path):
    async with serving(make_root(tmp_path)) as broker:
        config = broker.server.config
        assert decode_ready(config.ready_path.read_text()) == ()
        assert body_of(await exchange(broker.socket, request_bytes("write true"))) == OK
        broker.runner.lose(LOST)
        with trio.fail_after(10):
            while True:
                if decode_ready(config.ready_path.read_text()) == (LOST,):
                    break
                await trio.sleep(0.01)
        assert body_of(await exchange(broker.socket, request_bytes("write true"))) == ERROR
        assert len(broker.runner.calls) == 1
