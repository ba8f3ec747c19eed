"""Fixtures: a private root and an in-process broker with the scripted fake runner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from bounded_query.broker.server import BrokerServer

from tests.broker.helpers import load, make_root
from tests.fakes.runner import ScriptedRunner


@dataclass
class Broker:
    server: BrokerServer
    runner: ScriptedRunner
    socket: Path
    private: Path


@pytest.fixture
def broker_doc(tmp_path: Path) -> dict[str, object]:
    return make_root(tmp_path)


@pytest.fixture
async def broker(broker_doc: dict[str, object]) -> AsyncIterator[Broker]:
    config, seed_map = load(broker_doc)
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner, connection_cap=64)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield Broker(server, runner, config.socket_path, config.private_root)
        server.stop()
