"""Fixtures for enclave engine tests: the enclave and fake-provider images, the rig, runtimes."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bounded_query.broker.protocol.policy import ENCLAVE_OCI_RUNTIMES
from tests.enclave.helpers import FAKE_IMAGE, IMAGE, Rig, runtime_registered, start_rig

#: The runtimes a networked enclave starts on here. gVisor is not among them:
#: this machine's runsc (Debian's 2022-12 build, and trixie's 2024-07 one
#: alike) refuses to start any container with networking under dockerd 20.10
#: ("cannot run with network enabled in root network namespace"), so an
#: enclave on ``gvisor`` fails closed (test_a_gvisor_enclave_fails_closed...).
RUNTIMES = ("docker",)


@pytest.fixture(scope="session")
def enclave_engine(docker_client):
    """The docker SDK client, after checking both images exist (never pulled)."""
    import docker.errors

    for image, fix in (
        (IMAGE, "sandbox/enclave_image/build.sh claude"),
        (FAKE_IMAGE, ".ci/build-images"),
    ):
        try:
            docker_client.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail(f"{image} missing: run {fix}")
    return docker_client


@pytest.fixture(scope="module")
def rig(enclave_engine) -> Iterator[Rig]:
    """One internal network with the fake provider for the module's tests."""
    made = start_rig(enclave_engine)
    yield made
    made.close()


@pytest.fixture(params=RUNTIMES)
def runtime(request, enclave_engine) -> str:
    """Each enclave runtime; gVisor needs the networked runsc registration (runsc-net).

    Without it the gVisor case skips outside CI and fails under CI=true
    (.ci/provision-engine registers it).
    """
    name = str(request.param)
    if not runtime_registered(enclave_engine, name):
        oci = ENCLAVE_OCI_RUNTIMES[name]
        reason = (
            f"dockerd has no {oci!r} runtime for enclaves on {name}: .ci/provision-engine"
            " registers it (it rewrites /etc/docker/daemon.json and restarts dockerd)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return name
