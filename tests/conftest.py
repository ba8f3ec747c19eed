"""Shared test policy.

Engine tests (marked ``engine``) need a running Docker engine. Outside CI they
skip with the reason; under ``CI=true`` a missing engine is a failure, because
CI provisions the engine itself (.ci/provision-engine) and a skip there would
hide a broken sandbox.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
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


def find_python38() -> str | None:
    """A working python3.8 (the oldest agent-side Python we promise), if present.

    pyenv's versions directory first (its shims may refuse to run), then PATH.
    """
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    pattern = os.path.join(pyenv_root, "versions", "3.8*", "bin", "python3.8")
    for candidate in [*sorted(glob.glob(pattern)), shutil.which("python3.8")]:
        if candidate is None:
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if probe.returncode == 0:
            return candidate
    return None


def require_python38() -> str:
    """The python3.8 path; skip (outside CI) or fail (under CI=true) without one."""
    found = find_python38()
    if found is not None:
        return found
    reason = "no python3.8 interpreter on this machine (pyenv versions or PATH)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"agent-side Python 3.8 test cannot run under CI=true: {reason}")
    pytest.skip(reason)
