"""DockerRunner is an async resource: ``aclose`` removes its pin and closes the client.

Against the fake Engine API client of ``test_runner_fake.py`` (no engine),
extended to resolve container names as the engine does; the engine test
checks the same on a real engine (the pin container is really gone).
"""

from __future__ import annotations

import docker.errors
import pytest
import trio

from bounded_query.broker.runner import RunnerSettings
from bounded_query.sandbox import DockerRunner, RunnerOptions
from tests.conftest import require_engine
from tests.sandbox.test_runner_fake import MEMORY, FakeAPI

RUN_ID = "cd" * 16


class NamedFakeAPI(FakeAPI):
    """The fake, plus names (removal by name, as the engine allows) and a close count."""

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[str, str] = {}
        self.closed = 0
        self.remove_raises = False

    def create_container_from_config(self, body, name):
        created = super().create_container_from_config(body, name)
        self.names[name] = created["Id"]
        return created

    def remove_container(self, cid, v=False, force=False):
        if self.remove_raises:
            raise docker.errors.APIError("engine gone")
        return super().remove_container(self.names.get(cid, cid), v=v, force=force)

    def close(self):
        self.closed += 1


def _runner(*, pin: bool = True) -> tuple[DockerRunner, list[NamedFakeAPI]]:
    clients: list[NamedFakeAPI] = []

    def factory() -> NamedFakeAPI:
        clients.append(NamedFakeAPI())
        return clients[-1]

    settings = RunnerSettings("docker", RUN_ID, "bounded-query-python:latest", 30, MEMORY)
    options = RunnerOptions(materialize="tmpfs", pin_page_cache=pin)
    return DockerRunner(settings, options=options, client_factory=factory), clients


async def test_aclose_removes_the_pin_and_closes_the_client():
    runner, clients = _runner()
    await runner.warm([])
    (api,) = clients
    assert runner.page_cache_pinned is True
    assert api.containers_alive == {api.names[runner.pin_name]}
    await runner.aclose()
    assert api.containers_alive == set()
    assert api.closed == 1
    assert runner.page_cache_pinned is None
    await runner.aclose()  # idempotent: nothing more to remove or close
    assert api.closed == 1
    assert [c for c in api.calls if c[0] == "remove"] == [("remove", api.names[runner.pin_name])]


async def test_async_with_closes_and_the_runner_stays_usable():
    runner, clients = _runner()
    async with runner as same:
        assert same is runner
        await runner.warm([])
    assert clients[0].containers_alive == set()
    assert clients[0].closed == 1
    await runner.warm([])  # a later use opens a new client and pins again
    assert len(clients) == 2
    assert runner.page_cache_pinned is True
    await runner.aclose()
    assert clients[1].containers_alive == set()


async def test_aclose_without_a_pin_only_closes():
    runner, clients = _runner(pin=False)
    await runner.warm([])
    assert clients == []  # nothing to prepare: no client yet
    await runner.reconcile()
    (api,) = clients
    await runner.aclose()
    assert [c for c in api.calls if c[0] == "remove"] == []
    assert api.closed == 1


async def test_aclose_never_raises_on_an_engine_failure():
    runner, clients = _runner()
    await runner.warm([])
    (api,) = clients
    api.remove_raises = True
    await runner.aclose()
    assert api.closed == 1  # the client is closed even so
    assert runner.page_cache_pinned is None  # the next reconcile removes the pin


async def test_aclose_completes_under_cancellation():
    runner, clients = _runner()
    await runner.warm([])
    with trio.CancelScope() as scope:
        scope.cancel()
        await runner.aclose()
    assert clients[0].containers_alive == set()
    assert clients[0].closed == 1


async def test_aclose_before_any_use_touches_no_engine():
    runner, clients = _runner()
    await runner.aclose()
    assert clients == []


@pytest.mark.engine
async def test_aclose_removes_the_real_pin_container(docker_client):
    require_engine()
    settings = RunnerSettings("docker", "ef" * 16, "bounded-query-python:latest", 30, MEMORY)
    runner = DockerRunner(settings, options=RunnerOptions(materialize="tmpfs"))
    try:
        await runner.warm([])
        assert runner.page_cache_pinned is True
        pin = docker_client.containers.get(runner.pin_name)
        assert pin.status == "running"
    finally:
        await runner.aclose()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(runner.pin_name)
    assert runner._client is None
