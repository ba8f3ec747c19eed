"""Shared test policy.

Engine tests (marked ``engine``) need a running Docker engine. Outside CI they
skip with the reason; under ``CI=true`` a missing engine is a failure, because
CI provisions the engine itself (.ci/provision-engine) and a skip there would
hide a broken sandbox.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

DOCKER_SOCKET = "/var/run/docker.sock"


def engine_unavailable_reason() -> str | None:
    """Return why the Docker engine cannot be used, or None when it can."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - dependency is pinned
        return f"docker SDK not importable: {exc}"
    try:
        client = docker.DockerClient(base_url=f"unix://{DOCKER_SOCKET}", timeout=10)
        client.ping()
        client.close()
    except Exception as exc:
        name = exc.__class__.__name__
        return f"no Docker engine at {DOCKER_SOCKET} ({name}); run .ci/provision-engine"
    return None


def require_engine() -> None:
    """Skip (outside CI) or fail (under CI=true) when no engine is reachable."""
    reason = engine_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"engine test cannot run under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A docker SDK client for engine tests (see module docstring)."""
    require_engine()
    import docker

    client = docker.DockerClient(base_url=f"unix://{DOCKER_SOCKET}", timeout=120)
    yield client
    client.close()
