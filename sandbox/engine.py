"""The one place that opens a connection to the Docker Engine API.

Every component that talks to dockerd (the runner, the harness's agent
launcher, teardown and sweeps, preflight, compose) gets its client here, so
the API version, the Docker host and the timeout are chosen in one way: the
version is pinned (``policy.DOCKER_API_VERSION``: no version probe on
connect, the same request shapes everywhere) and the host is whatever the
caller was configured with (the preflight accepts only ``unix://`` hosts).
The docker SDK is imported lazily so that modules that only need a
client's type never load it.
"""

from __future__ import annotations

from typing import Any

from bounded_query.broker.protocol import policy

__all__ = ["API_TIMEOUT_S", "api_client", "docker_client"]

#: A single Engine API call that takes longer than this is treated as a dead
#: engine (container creation under load takes well under a second).
API_TIMEOUT_S = 60


def api_client(docker_host: str, timeout_s: float = API_TIMEOUT_S) -> Any:
    """A low-level ``docker.APIClient`` for ``docker_host`` (blocking; no I/O until used)."""
    import docker

    return docker.APIClient(
        base_url=docker_host, version=policy.DOCKER_API_VERSION, timeout=timeout_s
    )


def docker_client(docker_host: str, timeout_s: float = API_TIMEOUT_S) -> Any:
    """A high-level ``docker.DockerClient`` for ``docker_host`` (blocking; no I/O until used)."""
    import docker

    return docker.DockerClient(
        base_url=docker_host, version=policy.DOCKER_API_VERSION, timeout=timeout_s
    )
