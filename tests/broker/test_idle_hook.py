"""The lane's idle hook (issue 20): the runner prepares a seed's next container.

The preparation must start at a moment the agent already knows -- when the
answer has left at its boundary -- whatever the query did (its duration
within the bucket, its outcome), never for a request that launched nothing,
and never after a halt. At start-up every seed that can run is prepared.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from bounded_query.broker.audit import AuditLog
from bounded_query.broker.server import BrokerServer
from tests.broker.helpers import ERROR, load, make_root, request_bytes
from tests.broker.test_service_timing import OK, _http, make_service
from tests.fakes.runner import ScriptedRunner


class HookRunner(ScriptedRunner):
    """Records when (trio time) each preparation was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[Path, float, int]] = []

    async def prepare(self, seed_dir: Path, work_root: Path) -> None:
        await super().prepare(seed_dir, work_root)
        self.asked.append((seed_dir, trio.current_time(), len(self.calls)))


@pytest.fixture
def service(tmp_path):
    config, seed_map = load(make_root(tmp_path, max_invocations=10000, timeout=540))
    audit = AuditLog(config.audit_path)
    svc = make_service(config, seed_map, audit)
    svc.runner = HookRunner()
    yield svc
    svc.accounts.close()
    audit.close()


async def _handle(service, raw: bytes) -> tuple[bytes, float, float]:
    """(body, lane-relative send time, origin)."""
    sent: list[tuple[bytes, float]] = []

    async def send(body: bytes) -> None:
        sent.append((body, trio.current_time()))

    origin = trio.current_time()
    await service.handle(_http(raw), send)
    ((body, when),) = sent
    return body, when - origin, origin


@pytest.mark.parametrize(
    "script",
    ["sleep 0.2\nwrite true", "sleep 0.95\nwrite true", "sleep 0.5\nfail query-nonzero-exit"],
)
async def test_preparation_starts_at_the_answer_boundary_whatever_the_query_did(
    autojump_clock, service, script
):
    body, sent_at, origin = await _handle(service, request_bytes(script, repo="octo/internal"))
    assert sent_at == pytest.approx(1.0, abs=1e-9)
    assert body in (OK, ERROR)
    ((seed, asked_at, calls),) = service.runner.asked
    assert seed == service.config.seeds_root / "0002"  # octo/internal's seed
    assert calls == 1  # after its invocation ran
    # exactly at the boundary: the same moment for every duration and outcome
    assert asked_at - origin == pytest.approx(1.0, abs=1e-9)


async def test_every_launch_of_a_seed_prepares_it_again(autojump_clock, service):
    for repo in ("octo/public", "octo/confidential", "octo/public"):
        body, _, _ = await _handle(service, request_bytes("write true", repo=repo))
        assert body == OK
    seeds = service.config.seeds_root
    assert [seed for seed, _, _ in service.runner.asked] == [
        seeds / "0001",
        seeds / "0003",
        seeds / "0001",
    ]


@pytest.mark.parametrize(
    "raw",
    [
        request_bytes("write true", repo="octo/sealed"),  # never launched (spec 14.1)
        request_bytes("write true", repo="octo/unknown"),
        request_bytes("write true", target="/other"),
        request_bytes("write true", schema=b'{"type":"nope"}'),
    ],
)
async def test_nothing_is_prepared_for_a_rejection(autojump_clock, service, raw):
    body, _, _ = await _handle(service, raw)
    assert body == ERROR
    assert service.runner.calls == []
    assert service.runner.asked == []


async def test_nothing_is_prepared_after_a_halt(autojump_clock, service):
    body, _, _ = await _handle(service, request_bytes("sleep 700\nwrite true"))
    assert body == ERROR
    assert service.halted_at is not None
    assert service.runner.asked == []
    await service.prepare_next(service.config.seeds_root / "0001")
    assert service.runner.asked == []


async def test_nothing_is_prepared_once_shutting_down(autojump_clock, service):
    service.accepting = False
    await service.prepare_next(service.config.seeds_root / "0001")
    assert service.runner.asked == []


class BrokenPrepare(HookRunner):
    async def prepare(self, seed_dir: Path, work_root: Path) -> None:
        raise RuntimeError("bug in the runner's preparation")


async def test_a_preparation_bug_costs_nothing_but_the_preparation(autojump_clock, service, capsys):
    service.runner = BrokenPrepare()
    first, _, _ = await _handle(service, request_bytes("write true"))
    second, _, _ = await _handle(service, request_bytes("write true"))
    assert (first, second) == (OK, OK)
    assert capsys.readouterr().err.count('"event": "broker-bug"') == 2


async def test_startup_prepares_every_seed_but_sealed_after_warming(tmp_path):
    config, seed_map = load(make_root(tmp_path))

    class Startup(HookRunner):
        async def prepare(self, seed_dir: Path, work_root: Path) -> None:
            assert self.reconciled == 1  # after reconcile (and warm), before listening
            assert work_root == config.work_root
            await super().prepare(seed_dir, work_root)

    runner = Startup()
    server = BrokerServer(config, seed_map, runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        assert len(runner.asked) == 3  # done before the server reports started
        server.stop()
    seeds = config.private_root / "seeds"
    assert sorted(seed for seed, _, _ in runner.asked) == [seeds / f"000{i}" for i in (1, 2, 3)]
