"""The broker as a Docker Compose service, and its registry-free image (spec 14.7, 14.8).

Theory of operation:

* Image. ``bounded-query-broker:latest`` is built ``FROM`` the local query
  image (Debian python3 + git, no package manager, nothing pulled). Its
  Python dependencies (trio, h11, docker, cbor2 and theirs) come from wheels
  prepared on the host with ``pip download`` (pinned to the host's installed
  versions, cp311/manylinux) into the build context, plus pip's own wheel,
  which runs straight from the ``.whl`` inside the build to ``pip install
  --no-index`` them. The project's own packages are copied from where they
  are installed. The image carries a recipe label (a digest of the context),
  so an unchanged context is not rebuilt.
* Compose file. Service ``bounded-query-broker`` (container
  ``awf-bounded-query-broker-<digest>``): ``network_mode: none``; the private
  root at its own path (so the bind-mount sources the broker gives the engine
  are host paths, no translation), ``seeds/`` read-only on top of it, the
  ingress ``run/`` (socket) directory, and the Docker socket, used only to
  launch queries; a healthcheck on ``control/ready``; ``restart:
  unless-stopped`` (safe: accounting is journaled and never refunded). An
  example ``agent`` service gets exactly two mounts -- the socket directory
  and the read-only skill/wrapper directory -- and the three variables, runs
  as uid/gid 65534 (the socket's group) with no network.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from bounded_query.broker.protocol import policy
from bounded_query.broker.protocol.policy import DEFAULT_IMAGE, LABEL_HARNESS_RUN
from bounded_query.harness.configuration.config import BoundedQueriesConfig
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.sandbox import engine

__all__ = [
    "AGENT_SERVICE",
    "BROKER_IMAGE",
    "BROKER_SERVICE",
    "ComposeBroker",
    "broker_image_context",
    "compose_broker_starter",
    "compose_document",
    "ensure_broker_image",
    "seal_recipe",
    "write_compose_file",
]

BROKER_IMAGE = "bounded-query-broker:latest"
BROKER_SERVICE = "bounded-query-broker"
AGENT_SERVICE = "agent"
#: Where the agent service sees its two mounts (spec 14.8).
AGENT_SOCKET_DIR = "/run/awf-bounded-query"
AGENT_SKILL_DIR = "/run/awf-bounded-query-skill"
#: The agent service's uid/gid; the socket directory is group-owned by it.
AGENT_UID = 65534
#: Runtime dependencies of the broker (the rest are resolved by pip).
BROKER_REQUIREMENTS = ("trio", "h11", "docker", "cbor2")
#: Project packages the broker image needs.
PROJECT_PACKAGES = ("broker", "sandbox", "seccomp")
WHEEL_CACHE = Path("/var/cache/bounded-query/wheels")
RECIPE_LABEL = "bounded-query.broker-recipe"
COMPOSE_TIMEOUT_S = 300


class ComposeError(Exception):
    """The compose service or its image cannot be prepared (exit 2)."""


def _pip(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=COMPOSE_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise ComposeError(f"pip {args[0]} failed: {done.stderr.strip()[-800:]}")


def _pins(requirements: Sequence[str] = BROKER_REQUIREMENTS) -> list[str]:
    pins = []
    for name in (*requirements, "pip"):
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pins.append(name)
    return pins


def prepare_wheels(
    cache: Path = WHEEL_CACHE, requirements: Sequence[str] = BROKER_REQUIREMENTS
) -> Path:
    """Download the wheels of ``requirements`` (cp311, manylinux x86_64) into ``cache`` once.

    The broker image's by default; the API proxy image passes its own.
    """
    pins = _pins(requirements)
    stamp = cache / ("." + hashlib.sha256("\n".join(pins).encode()).hexdigest()[:16])
    if stamp.exists() and _has_pinned_wheels(cache, pins):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    platforms: list[str] = []
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"):
        platforms += ["--platform", tag]
    _pip(
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--abi",
        "cp311",
        *platforms,
        "--dest",
        str(cache),
        *pins,
    )
    stamp.write_text("\n".join(pins) + "\n")
    return cache


def _has_pinned_wheels(cache: Path, pins: list[str]) -> bool:
    """Whether a wheel of every pinned ``name==version`` is in ``cache``."""
    names = [p.name.lower() for p in cache.glob("*.whl")]
    for pin in pins:
        name, _, version = pin.partition("==")
        prefix = f"{name.replace('-', '_').lower()}-{version}-"
        if version and not any(n.startswith(prefix) for n in names):
            return False
    return True


def _package_dir(name: str) -> Path:
    module = __import__(f"bounded_query.{name}", fromlist=["__path__"])
    return Path(next(iter(module.__path__)))


def broker_image_context(context: Path, wheels: Path, base_id: str = "") -> str:
    """Fill ``context`` with the Dockerfile, wheels and project code; return the recipe.

    The recipe digests the whole context and ``base_id`` (the query image's
    id), so rebuilding the query image also rebuilds the broker image.
    """
    (context / "wheels").mkdir()
    pip_wheel = ""
    for wheel in sorted(wheels.glob("*.whl")):
        shutil.copyfile(wheel, context / "wheels" / wheel.name)
        if wheel.name.startswith("pip-"):
            pip_wheel = wheel.name
    if not pip_wheel:
        raise ComposeError("pip's own wheel is missing from the wheel cache")
    site = context / "site" / "bounded_query"
    for name in PROJECT_PACKAGES:
        shutil.copytree(
            _package_dir(name),
            site / name,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "image"),
        )
    requirements = " ".join(p for p in _pins() if not p.startswith("pip"))
    dockerfile = f"""FROM {DEFAULT_IMAGE}
USER 0:0
COPY wheels /opt/bq-wheels
RUN ["/bin/sh", "-c", "/usr/bin/python3 /opt/bq-wheels/{pip_wheel}/pip install --no-index \\
 --find-links /opt/bq-wheels --no-cache-dir --disable-pip-version-check \\
 --root-user-action=ignore --break-system-packages {requirements} && rm -rf /opt/bq-wheels"]
COPY site /opt/bounded-query
ENV PYTHONPATH=/opt/bounded-query PYTHONDONTWRITEBYTECODE=1
WORKDIR /
ENTRYPOINT ["/usr/bin/python3", "-m", "bounded_query.broker"]
"""
    return seal_recipe(context, dockerfile, base_id)


def seal_recipe(context: Path, dockerfile: str, base_id: str) -> str:
    """Write ``dockerfile`` into ``context`` and label it with the recipe's hash; return it.

    The hash covers the base image's id and every file of the context (names
    and bytes), so an image is rebuilt exactly when something it is made of
    changed. Used by every image built from the query image and wheels.
    """
    (context / "Dockerfile").write_text(dockerfile)
    digest = hashlib.sha256(base_id.encode() + b"\0")
    for path in sorted(context.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(context)).encode() + b"\0" + path.read_bytes())
    recipe = digest.hexdigest()
    with (context / "Dockerfile").open("a") as handle:
        handle.write(f'LABEL {RECIPE_LABEL}="{recipe}"\n')
    return recipe


def ensure_broker_image(
    docker_host: str, wheels: Path | None = None, query_image: str = DEFAULT_IMAGE
) -> str:
    """Build the broker image unless an identical recipe is present; return the recipe.

    Idempotent: an unchanged recipe is not rebuilt, and a rebuild removes the
    image it supersedes (so repeated runs leave no dangling images).

    Raises:
        ComposeError: the query image (the base) is missing -- nothing can be
            pulled, so the operator must build it with ``make images`` -- or
            the build failed.
    """
    import docker

    client = engine.docker_client(docker_host, COMPOSE_TIMEOUT_S)
    try:
        try:
            base_id = str(client.images.get(query_image).id)
        except docker.errors.ImageNotFound:
            raise ComposeError(
                f"the query image {query_image} is missing; the broker image is built on it "
                "and nothing can be pulled: build it first with `make images`"
            ) from None
        wheel_dir = wheels if wheels is not None else prepare_wheels()
        with tempfile.TemporaryDirectory(prefix="bq-broker-image-", dir="/var/tmp") as tmp:
            recipe = broker_image_context(Path(tmp), wheel_dir, base_id)
            try:
                old = client.images.get(BROKER_IMAGE)
            except docker.errors.ImageNotFound:
                old = None
            if old is None or old.labels.get(RECIPE_LABEL) != recipe:
                try:
                    new = client.images.build(path=tmp, tag=BROKER_IMAGE, rm=True, forcerm=True)[0]
                except docker.errors.BuildError as exc:
                    tail = " ".join(str(x.get("stream", "")).strip() for x in exc.build_log)
                    raise ComposeError(f"broker image build failed: {exc} {tail[-800:]}") from None
                if old is not None and old.id != new.id:
                    # Still used by a running broker: it goes with that broker.
                    with contextlib.suppress(docker.errors.APIError):
                        client.images.remove(old.id)
        return recipe
    finally:
        client.close()


def compose_document(
    paths: RunPaths,
    config: BoundedQueriesConfig,
    run_id: str,
    *,
    docker_socket: str = policy.DEFAULT_DOCKER_SOCKET,
    workspace: Path | None = None,
    isolated_storage: bool = True,
) -> dict[str, Any]:
    """The compose project: broker service and example agent service.

    ``isolated_storage``: ``work/`` is the harness's quota mount (root), so
    the broker service gets ``SYS_ADMIN`` and an ``rshared`` bind of it to
    mount each invocation's own tmpfs. Without it (a harness that
    is not root) neither is given: an ``rshared`` bind of a directory that is
    not a shared mount would fail ``compose up``; the run is degraded instead
    (the broker keeps the shared workspace, and the channel policy refuses
    mixed public and metered runs).

    The agent service is confined like ``run``'s agent container:
    a non-root user, every capability dropped, no-new-privileges, its own
    PID namespace, no network, a read-only root file system, and only the
    socket directory (rw), the skill/wrapper directory (ro) and, when given,
    the workspace (rw, at its host path) as mounts.
    """
    agent_volumes = [
        f"{paths.socket_dir}:{AGENT_SOCKET_DIR}:rw",
        f"{paths.skill_dir}:{AGENT_SKILL_DIR}:ro",
    ]
    agent_extra: dict[str, Any] = {}
    if workspace is not None:
        agent_volumes.append(f"{workspace}:{workspace}:rw")
        agent_extra["working_dir"] = str(workspace)
    # the broker mounts each invocation's own tmpfs below work/
    # (sandbox/storage.py); rshared carries those mounts to the host, where
    # the engine binds them; SYS_ADMIN is for mount(2) only (the broker
    # already holds the Docker socket, which is root on the host anyway).
    storage_volumes: list[Any] = []
    storage_caps: dict[str, Any] = {}
    if isolated_storage:
        storage_volumes.append(
            {
                "type": "bind",
                "source": str(paths.workspaces_dir),
                "target": str(paths.workspaces_dir),
                "bind": {"propagation": "rshared"},
            }
        )
        storage_caps["cap_add"] = ["SYS_ADMIN"]
    private = str(paths.private_root)
    ready = str(paths.ready_file)
    healthcheck = f"import os, sys; sys.exit(0 if os.path.exists({ready!r}) else 1)"
    return {
        "version": "2.4",
        "services": {
            BROKER_SERVICE: {
                "image": BROKER_IMAGE,
                "container_name": f"awf-bounded-query-broker-{paths.private_root.name[-16:]}",
                "network_mode": "none",
                "user": "0:0",
                "command": ["--config", str(paths.broker_config)],
                "volumes": [
                    f"{private}:{private}:rw",
                    f"{paths.seeds_dir}:{paths.seeds_dir}:ro",
                    f"{paths.socket_dir}:{paths.socket_dir}:rw",
                    f"{docker_socket}:/var/run/docker.sock:rw",
                    *storage_volumes,
                ],
                **storage_caps,
                "healthcheck": {
                    "test": ["CMD", "/usr/bin/python3", "-c", healthcheck],
                    "interval": "1s",
                    "timeout": "5s",
                    "retries": 120,
                },
                "restart": "unless-stopped",
                "labels": {LABEL_HARNESS_RUN: run_id},
            },
            AGENT_SERVICE: {
                "image": DEFAULT_IMAGE,
                "network_mode": "none",
                "user": f"{AGENT_UID}:{AGENT_UID}",
                "read_only": True,
                "cap_drop": ["ALL"],
                "security_opt": ["no-new-privileges:true"],
                "entrypoint": ["/usr/bin/sleep", "infinity"],
                "stop_signal": "SIGKILL",
                "depends_on": {BROKER_SERVICE: {"condition": "service_healthy"}},
                "volumes": agent_volumes,
                **agent_extra,
                "environment": {
                    policy.ENV_SOCKET: f"{AGENT_SOCKET_DIR}/{paths.socket_path.name}",
                    policy.ENV_SKILL: f"{AGENT_SKILL_DIR}/SKILL.md",
                    policy.ENV_REPOS: ",".join(config.slugs),
                    "PATH": f"{AGENT_SKILL_DIR}/bin:/usr/bin:/bin",
                },
                "labels": {LABEL_HARNESS_RUN: run_id},
            },
        },
    }


def write_compose_file(path: Path, document: Mapping[str, Any], paths: RunPaths) -> None:
    """Write the compose file (JSON is YAML) and give the socket to the agent's group.

    The socket directory becomes ``root:<gid>`` 0770 and the broker config's
    ``socketGid`` that gid, so the broker creates the socket ``root:<gid>``
    0660: the agent can connect, nobody else can. The gid is the one ``run``
    already chose for its agent, else the agent service's 65534.
    """
    from bounded_query.harness.staging.outputs import write_json_private

    path.write_text(json.dumps(document, indent=2) + "\n")
    broker_config = json.loads(paths.broker_config.read_text())
    # ``run --compose`` already chose the group of its own agent (container
    # or host user); only the detached project's agent service is 65534.
    gid = broker_config.get("socketGid")
    gid = AGENT_UID if gid is None else gid
    os.chown(paths.socket_dir, 0, gid)
    os.chmod(paths.socket_dir, 0o770)
    broker_config["socketGid"] = gid
    write_json_private(paths.broker_config, broker_config)


def compose_command(project: str, compose_file: Path, *args: str) -> list[str]:
    """``docker-compose -p PROJECT -f FILE ARGS...``."""
    return ["docker-compose", "-p", project, "-f", str(compose_file), *args]


def _compose_env(docker_host: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DOCKER_HOST": docker_host,
        "COMPOSE_INTERACTIVE_NO_CLI": "1",
    }


def run_compose(
    project: str, compose_file: Path, docker_host: str, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run docker-compose; raise ComposeError when ``check`` and it fails."""
    done = subprocess.run(
        compose_command(project, compose_file, *args),
        env=_compose_env(docker_host),
        capture_output=True,
        text=True,
        check=False,
        timeout=COMPOSE_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        raise ComposeError(f"docker-compose {args[0]} failed: {done.stderr.strip()[-800:]}")
    return done


@dataclass
class ComposeBroker:
    """A broker running as the compose service of one project."""

    project: str
    compose_file: Path
    docker_host: str
    container: str

    def exited(self) -> int | None:
        """The container's exit code once it stopped for good, else None."""
        done = subprocess.run(
            [
                "docker",
                "inspect",
                "-f",
                "{{.State.Running}} {{.State.Restarting}} {{.State.ExitCode}}",
                self.container,
            ],
            env=_compose_env(self.docker_host),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            return 255
        running, restarting, code = done.stdout.split()
        if running == "true" or restarting == "true":
            return None
        return int(code)

    async def relay_log(self, sink: Any) -> None:
        """Nothing to relay: the engine keeps the service's output (``docker logs``)."""
        del sink

    async def stop(self) -> int | None:
        """``docker-compose down`` (stops and removes both services)."""
        code = await trio.to_thread.run_sync(self.exited)  # docker inspect
        await trio.to_thread.run_sync(
            lambda: run_compose(
                self.project,
                self.compose_file,
                self.docker_host,
                "down",
                "--remove-orphans",
                "--timeout",
                "20",
                check=False,
            )
        )
        return code


def compose_broker_starter(project: str | None) -> Any:
    """A ``start_broker`` for :func:`.orchestrate.run` that uses the compose service."""

    async def start(options: Any, paths: RunPaths, env: Mapping[str, str]) -> ComposeBroker:
        from bounded_query.harness.configuration.preflight import docker_host_from_env

        docker_host = docker_host_from_env(env)
        config_doc = await trio.to_thread.run_sync(_read_json, paths.broker_config)
        await trio.to_thread.run_sync(ensure_broker_image, docker_host)
        compose_file = paths.private_root / "docker-compose.yml"
        name = project or f"bq{paths.private_root.name[-16:]}"

        def write() -> dict[str, Any]:  # blocking: the seed map, the mount table, the file
            isolated = os.path.ismount(paths.workspaces_dir)
            document = compose_document(
                paths, _config_from_doc(config_doc), config_doc["runId"], isolated_storage=isolated
            )
            write_compose_file(compose_file, document, paths)
            return document

        document = await trio.to_thread.run_sync(write)
        await trio.to_thread.run_sync(
            lambda: run_compose(name, compose_file, docker_host, "up", "-d", BROKER_SERVICE)
        )
        container = document["services"][BROKER_SERVICE]["container_name"]
        return ComposeBroker(name, compose_file, docker_host, container)

    return start


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _config_from_doc(doc: Mapping[str, Any]) -> BoundedQueriesConfig:
    seed_map = json.loads(Path(doc["seedMap"]).read_text())
    from bounded_query.harness.configuration.config import PrivateRepo

    return BoundedQueriesConfig(
        enabled=True,
        private_repos=tuple(PrivateRepo(r["repo"], r["sensitivity"]) for r in seed_map["repos"]),
        runtime=doc["runtime"],
        timeout=doc["timeout"],
        memory_limit=doc["memoryLimit"],
        max_invocations=doc["maxInvocations"],
    )
