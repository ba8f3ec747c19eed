"""The enclave image is the current recipe's, carries its engine labels, and runs as 65534."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from bounded_query.broker.protocol import policy
from bounded_query.sandbox import enclave_adapter, enclave_spec

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "sandbox" / "enclave_image" / "build.sh"


def _recipe_hash() -> str:
    """What recipe_begin labels the image with: sha256 of build.sh, the adapter, recipe.sh."""
    files = (BUILD, ROOT / "sandbox" / "enclave_adapter.py", ROOT / "sandbox/image/recipe.sh")
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


PACKAGES = {"claude": "@anthropic-ai/claude-code", "copilot": "@github/copilot"}


def _pinned_version(engine: str = "claude") -> str:
    match = re.search(
        rf"package={re.escape(PACKAGES[engine])}\n\s+version=([0-9.]+)\n", BUILD.read_text()
    )
    assert match is not None
    return match.group(1)


@pytest.mark.parametrize("engine", policy.ENCLAVE_ENGINES)
def test_every_enclave_engine_has_a_pinned_recipe(engine: str) -> None:
    tools = (ROOT / ".ci" / "install-test-tools").read_text()
    assert f'"{PACKAGES[engine]}@{_pinned_version(engine)}"' in tools
    images = (ROOT / ".ci" / "build-images").read_text()
    assert f"sandbox/enclave_image/build.sh {engine} {policy.ENCLAVE_IMAGES[engine]}\n" in images
    required = (ROOT / ".ci" / "require-provisioned").read_text()
    assert f" {policy.ENCLAVE_IMAGES[engine]}" in required
    assert enclave_adapter.ENGINE_BINARIES[engine] == f"/opt/engine/bin/{engine}"


def test_recipe_pins_the_engine_the_test_tools_pin() -> None:
    tools = (ROOT / ".ci" / "install-test-tools").read_text()
    assert f'"@anthropic-ai/claude-code@{_pinned_version()}"' in tools
    images = (ROOT / ".ci" / "build-images").read_text()
    assert f"sandbox/enclave_image/build.sh claude {policy.ENCLAVE_IMAGES['claude']}\n" in images
    engine = (ROOT / ".ci" / "provision-engine").read_text()
    oci = policy.ENCLAVE_OCI_RUNTIMES[policy.RUNTIME_GVISOR]
    assert f'"{oci}": {{"path": "/usr/bin/runsc", "runtimeArgs": ["--oci-seccomp"' in engine
    required = (ROOT / ".ci" / "require-provisioned").read_text()
    assert f"grep -q '\"{oci}\"'" in required
    assert policy.ENCLAVE_IMAGES["claude"] + "; do" in required
    assert enclave_adapter.ENGINE_BINARIES["claude"] == "/opt/engine/bin/claude"
    assert "/opt/engine/bin" in enclave_spec.ENGINE_PATH.split(":")


@pytest.mark.engine
@pytest.mark.parametrize("engine", policy.ENCLAVE_ENGINES)
def test_image_is_current_and_labelled(docker_client, engine: str) -> None:
    import docker.errors

    try:
        image = docker_client.images.get(policy.ENCLAVE_IMAGES[engine])
    except docker.errors.ImageNotFound:
        pytest.fail(f"enclave image missing: run sandbox/enclave_image/build.sh {engine}")
    config = image.attrs["Config"]
    labels = config["Labels"]
    assert labels["bounded-query.engine"] == engine
    assert labels["bounded-query.engine-version"] == _pinned_version(engine)
    assert labels["bounded-query.recipe"] == _recipe_hash(), "stale image: rebuild it"
    assert config["User"] == "65534:65534"
    assert tuple(config["Entrypoint"]) == enclave_spec.ADAPTER_ENTRYPOINT


@pytest.mark.engine
def test_a_missing_enclave_image_is_never_pulled(docker_client) -> None:
    """spec 15.5 ``--pull never``: the Engine API create refuses an unknown image, pulls nothing."""
    import docker.errors

    missing = "bounded-query-enclave-claude:no-such-tag-" + "0" * 8
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.api.create_container_from_config({"Image": missing}, None)
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(missing)
