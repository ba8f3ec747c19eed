"""Fixtures: a private root and an in-process broker with the scripted fake runner."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@contextlib.asynccontextmanager
async def serving(doc: dict[str, object], **server_options: Any) -> AsyncIterator[Broker]:
    """A served in-process broker with the scripted runner; stopped on exit.

    ``server_options`` go to :class:`BrokerServer` (for example injected
    ``workspace`` operations that fail).
    """
    config, seed_map = load(doc)
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner, connection_cap=64, **server_options)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield Broker(server, runner, config.socket_path, config.private_root)
        server.stop()


@pytest.fixture
async def broker(broker_doc: dict[str, object]) -> AsyncIterator[Broker]:
    async with serving(broker_doc) as served:
        yield served
