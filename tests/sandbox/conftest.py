"""Fixtures for sandbox engine tests (they need dockerd, runc, runsc and the image)."""

from __future__ import annotations

import gc
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_engine
from tests.sandbox.helpers import IMAGE, make_seed, remove_seed


@pytest.fixture(scope="session")
def engine(docker_client):
    """The docker SDK client, after checking the query image exists (never pulled)."""
    import docker.errors

    try:
        docker_client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{IMAGE} missing: run .ci/build-images")
    return docker_client


@pytest.fixture(scope="session")
def seed(tmp_path_factory) -> Iterator[Path]:
    require_engine()
    base = tmp_path_factory.mktemp("seed")
    base.chmod(0o755)
    path = make_seed(base / "repo")
    yield path
    remove_seed(path)


@pytest.fixture
def work_root(tmp_path) -> Iterator[Path]:
    root = tmp_path / "work"
    root.mkdir(mode=0o700)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect after each test so a leaked socket is blamed on the test that leaked it."""
    yield
    gc.collect()
