"""A page-cache pin killed mid-run halts the real broker (issue 21 item 3), from outside.

A real ``BrokerServer`` with the real DockerRunner on runc starts its pin;
the test then kills the pin container through the engine, as an OOM kill
or an operator's ``docker kill`` would. The very next query must not run
(the runner checks the pin before every query container), the broker halts
through the overflow's halt path (the canonical error for every later
request, ``broker-halted`` with the reason on stderr) and rewrites its
readiness file so the harness can report the loss.
"""

from __future__ import annotations

import contextlib
import json

import docker.errors
import pytest
import trio

from bounded_query.broker.config import parse_config, parse_seed_map
from bounded_query.broker.protocol import policy
from bounded_query.broker.readiness import decode_ready
from bounded_query.broker.runner import PAGE_CACHE_PIN
from bounded_query.broker.server import BrokerServer
from bounded_query.sandbox import DockerRunner
from tests.broker.helpers import body_of, exchange, request_bytes
from tests.sandbox.helpers import leftover_containers
from tests.sandbox.test_adversarial_broker import REPO, make_private_root

pytestmark = pytest.mark.engine

OK = b'{"status":"ok","result":true}'
ERROR = b'{"status":"error"}'
ASK = "open('/query/out', 'w').write('true')"


async def _ask(config) -> bytes:
    return body_of(await exchange(config.socket_path, request_bytes(ASK, repo=REPO)))


async def test_killing_the_pin_halts_the_broker(engine, seed, tmp_path, capsys):
    config = parse_config(make_private_root(tmp_path, seed, "docker"))
    seed_map = parse_seed_map(json.loads(config.seed_map_path.read_text()))
    runner = DockerRunner(config.runner_settings())
    server = BrokerServer(config, seed_map, runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        assert decode_ready(config.ready_path.read_text()) == ()
        assert runner.page_cache_pinned is True
        assert await _ask(config) == OK
        (pin,) = leftover_containers(engine, config.run_id, pin=True)
        await trio.to_thread.run_sync(lambda: engine.containers.get(pin).kill())
        # At once, before the watch's next poll: the query must not run.
        assert await _ask(config) == ERROR
        with trio.fail_after(30):
            while True:
                announced = decode_ready(config.ready_path.read_text())
                if announced != ():
                    break
                await trio.sleep(0.1)
        (lost,) = announced
        assert lost.subsystem == PAGE_CACHE_PIN
        assert "stopped during the run" in lost.reason
        assert server.service is not None
        assert server.service.halted_at is not None
        for _ in range(3):
            assert await _ask(config) == ERROR
        assert leftover_containers(engine, config.run_id) == []
        server.stop()
    runner.close()
    halts = [
        json.loads(line)
        for line in capsys.readouterr().err.splitlines()
        if '"broker-halted"' in line
    ]
    assert [h["reason"] for h in halts] == [policy.CATEGORY_PROTECTION_LOST]
    assert halts[0]["subsystem"] == PAGE_CACHE_PIN
    assert leftover_containers(engine, config.run_id, pin=True) == []


async def test_a_pin_that_cannot_start_refuses_a_sharing_run(engine, seed, tmp_path):
    """The pin's name is taken (created outside the run, so reconcile leaves it): the pin
    cannot start, the broker announces it, and the channel policy refuses a run of two
    metered repositories even on gVisor as root, unless the operator accepts it."""
    from bounded_query.harness.configuration.channel_policy import (
        ALLOW_FLAG,
        channel_decision,
        pin_missing,
    )
    from tests.sandbox.helpers import IMAGE

    config = parse_config(make_private_root(tmp_path, seed, "docker"))
    seed_map = parse_seed_map(json.loads(config.seed_map_path.read_text()))
    runner = DockerRunner(config.runner_settings())
    squatter = engine.containers.create(IMAGE, ["true"], name=runner.pin_name)
    try:
        server = BrokerServer(config, seed_map, runner)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            announced = decode_ready(config.ready_path.read_text())
            assert runner.page_cache_pinned is False
            assert await _ask(config) == OK  # queries still run (a one-repository run may)
            server.stop()
        runner.close()
    finally:
        # The runner removes whatever holds its pin's name after the failed start.
        with contextlib.suppress(docker.errors.NotFound):
            squatter.remove(force=True)
    assert [d.subsystem for d in announced] == [PAGE_CACHE_PIN]
    assert pin_missing(announced)
    two = ("internal", "confidential")
    refused = channel_decision("gvisor", two, isolated_storage=True, allow_open=False, pinned=False)
    assert refused.problem is not None
    assert "page-cache" in refused.problem.message
    assert ALLOW_FLAG in refused.problem.hint
