"""The API proxy's registry-free image (spec 15.6; built by ``.ci/build-images``, run by ``run``).

Theory of operation: like the compose broker image (``compose.py``), it is
built ``FROM`` the local query image (Debian python3, no package manager,
nothing pulled) with the proxy's Python dependencies (trio, h11, httpx2 and
theirs) installed from wheels pip downloads once into the shared wheel
cache, plus the project's ``broker`` package only. The host's CA bundle is
copied in (the query image has none, and the proxy talks TLS to the
provider). The image runs ``python3 -m bounded_query.broker.apiproxy`` as
uid/gid 65534; the configuration, the credential file and the control and
usage directories are mounted by whoever starts it. A recipe label (a
digest of the context and of the base image's id) makes
:func:`ensure_apiproxy_image` idempotent.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from bounded_query.broker.protocol.policy import DEFAULT_IMAGE
from bounded_query.harness.compose.service import (
    COMPOSE_TIMEOUT_S,
    ComposeError,
    _package_dir,
    _pins,
    prepare_wheels,
    seal_recipe,
)

__all__ = [
    "APIPROXY_IMAGE",
    "APIPROXY_REQUIREMENTS",
    "APIPROXY_UID",
    "apiproxy_image_context",
    "ensure_apiproxy_image",
]

APIPROXY_IMAGE = "bounded-query-api-proxy:latest"
#: Runtime dependencies of the proxy (the rest are resolved by pip).
APIPROXY_REQUIREMENTS = ("trio", "h11", "httpx2")
#: The proxy's unprivileged identity inside its container.
APIPROXY_UID = 65534
RECIPE_LABEL = "bounded-query.api-proxy-recipe"
#: The host's CA bundle (Debian's ca-certificates), copied into the image.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def apiproxy_image_context(
    context: Path, wheels: Path, base_id: str = "", base_image: str = DEFAULT_IMAGE
) -> str:
    """Fill ``context`` with the Dockerfile, wheels, CA bundle and code; return the recipe.

    Raises:
        ComposeError: pip's wheel or the host's CA bundle is missing.
    """
    (context / "wheels").mkdir()
    pip_wheel = ""
    for wheel in sorted(wheels.glob("*.whl")):
        shutil.copyfile(wheel, context / "wheels" / wheel.name)
        if wheel.name.startswith("pip-"):
            pip_wheel = wheel.name
    if not pip_wheel:
        raise ComposeError("pip's own wheel is missing from the wheel cache")
    if not CA_BUNDLE.is_file():
        raise ComposeError(f"the host's CA bundle {CA_BUNDLE} is missing (ca-certificates)")
    shutil.copyfile(CA_BUNDLE, context / "ca-certificates.crt")
    shutil.copytree(
        _package_dir("broker"),
        context / "site" / "bounded_query" / "broker",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    requirements = " ".join(p for p in _pins(APIPROXY_REQUIREMENTS) if not p.startswith("pip"))
    dockerfile = f"""FROM {base_image}
USER 0:0
COPY wheels /opt/bq-wheels
RUN ["/bin/sh", "-c", "/usr/bin/python3 /opt/bq-wheels/{pip_wheel}/pip install --no-index \\
 --find-links /opt/bq-wheels --no-cache-dir --disable-pip-version-check \\
 --root-user-action=ignore --break-system-packages {requirements} && rm -rf /opt/bq-wheels"]
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY site /opt/bounded-query
ENV PYTHONPATH=/opt/bounded-query PYTHONDONTWRITEBYTECODE=1 \\
 SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER {APIPROXY_UID}:{APIPROXY_UID}
WORKDIR /
ENTRYPOINT ["/usr/bin/python3", "-m", "bounded_query.broker.apiproxy"]
"""
    return seal_recipe(context, dockerfile, base_id)


def ensure_apiproxy_image(
    docker_host: str,
    *,
    tag: str = APIPROXY_IMAGE,
    wheels: Path | None = None,
    base_image: str = DEFAULT_IMAGE,
) -> str:
    """Build the proxy image as ``tag`` unless an identical recipe is present; return it.

    Raises:
        ComposeError: the base image is missing (nothing can be pulled: ``make
            images``), or the build failed.
    """
    import docker

    client = docker.DockerClient(base_url=docker_host, timeout=COMPOSE_TIMEOUT_S)
    try:
        try:
            base_id = str(client.images.get(base_image).id)
        except docker.errors.ImageNotFound:
            raise ComposeError(
                f"the query image {base_image} is missing; the API proxy image is built on it "
                "and nothing can be pulled: build it first with `make images`"
            ) from None
        wheel_dir = (
            wheels if wheels is not None else prepare_wheels(requirements=APIPROXY_REQUIREMENTS)
        )
        with tempfile.TemporaryDirectory(prefix="bq-apiproxy-image-", dir="/var/tmp") as tmp:
            recipe = apiproxy_image_context(Path(tmp), wheel_dir, base_id, base_image)
            try:
                old = client.images.get(tag)
            except docker.errors.ImageNotFound:
                old = None
            if old is None or old.labels.get(RECIPE_LABEL) != recipe:
                try:
                    new = client.images.build(path=tmp, tag=tag, rm=True, forcerm=True)[0]
                except docker.errors.BuildError as exc:
                    tail = " ".join(str(x.get("stream", "")).strip() for x in exc.build_log)
                    raise ComposeError(
                        f"API proxy image build failed: {exc} {tail[-800:]}"
                    ) from None
                if old is not None and old.id != new.id:
                    # Still used by a running proxy: it goes with that proxy.
                    with contextlib.suppress(docker.errors.APIError):
                        client.images.remove(old.id)
        return recipe
    finally:
        client.close()


def main() -> int:
    """``python3 -m bounded_query.harness.configuration.apiproxy_image``: build the
    API proxy image for ``$DOCKER_HOST`` (the bounded-agent preflight's fix hint)."""
    import os
    import sys

    from bounded_query.harness.configuration.preflight import docker_host_from_env

    try:
        recipe = ensure_apiproxy_image(docker_host_from_env(os.environ))
    except ComposeError as exc:
        sys.stderr.write(f"apiproxy_image: {exc}\n")
        return 2
    sys.stderr.write(f"apiproxy_image: {APIPROXY_IMAGE} is ready (recipe {recipe[:12]})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
