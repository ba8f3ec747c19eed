"""The bounded-agent subsystem's run: roots, networks, API proxy, broker child (spec 15.1, 15.6).

Theory of operation. With ``boundedAgents.enabled`` a run has a second,
sibling subsystem next to bounded queries, with nothing shared but the run
id and the harness (spec 15.1; DESIGN.md decision 10):

* **Roots** (``paths.agent_run_paths``): the agent private root and the
  agent ingress root, the query roots' layout, created, owner-recorded,
  reaped and swept exactly like them (one owner record in each private
  root, naming the same run; the reaper's :class:`.reaper.Arm` carries both
  pairs). The agent repositories are staged into the agent private root
  with the query staging code: a repository in both sections is staged
  twice, once per root, and no seed is shared. After staging the agent
  private root is made 0700: an enclave reaches its seed only through the
  bind mount the engine makes, and no host user but the harness's enters.
* **The credential** (spec 15.6): the engine's provider variable
  (``policy.API_PROXY_CREDENTIAL_VARIABLES``) is read once from the
  harness's environment, removed from the run's environment (and wiped from
  the process's own environment block by ``orchestrate.run``), and written
  as ``proxy/credential``, mode 0400, owned by the proxy's uid. It is
  never in an argument, a variable, a label or an event of anything.
* **Networks** (spec 15.6): the run's internal enclave network, named
  ``<ENCLAVE_NETWORK>-<run id prefix>`` and created with
  ``sandbox.enclave_spec.network_spec`` (no NAT, no bridge address) on a
  ``/28`` of ``policy.ENCLAVE_SUBNET_POOL`` chosen from the run id (the
  next block when the engine reports an overlap, so two runs never
  collide); and the proxy's egress bridge (``<ENCLAVE_NETWORK>-egress-...``),
  or the existing network ``--api-proxy-egress-network`` names, which is
  never created nor removed here. The harness's networks carry
  ``LABEL_AGENT_HARNESS`` = the run id.
* **The API proxy** (``broker/apiproxy``): one container of
  ``bounded-query-api-proxy:latest`` at the subnet's second address, alias
  ``ENCLAVE_API_PROXY_ALIAS``, on the enclave network, plus the egress
  network; read-only root, no capabilities, no-new-privileges, as
  ``APIPROXY_UID``; its configuration through ``_config.encode_config``;
  its control socket in ``proxy/control`` (0700, the proxy's uid, below
  the 0700 agent private root: only the broker's user, root, enters); its
  usage records in ``proxy/usage``. It listens on the enclave-network
  address only. Readiness is the control socket answering ``GET /status``.
  It carries ``LABEL_AGENT_HARNESS`` and never ``LABEL_AGENT_RUN``: the agent
  broker's reconcile removes every container with that label.
* **The agent broker child**: ``broker_child.start_child_broker`` with the
  agent paths (its config ``broker.json`` and readiness file in the agent
  private root, its socket in the agent ingress root), its own readiness
  wait, its stderr relayed with ``subsystem: bounded-agent``.

Teardown (``teardown.py``) stops the agent broker with the other, then the
one reconcile (``reconcile.py``) removes the enclaves, the proxy and the
harness's networks, and the agent roots go with the query roots.

The pure half (:class:`AgentPlan`, :func:`plan_agents`, the documents) does
no I/O; :func:`prepare_agent_roots`, :func:`start_agent_network` and the rest
are the blocking shell, run in worker threads by ``orchestrate.py``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bounded_query.broker.apiproxy._config import (
    ProxyConfig,
    parse_upstream_url,
)
from bounded_query.broker.apiproxy._config import (
    encode_config as encode_proxy_config,
)
from bounded_query.broker.apiproxy._limits import DEFAULT_RESPONSE_TIMEOUT_S
from bounded_query.broker.config import BrokerConfig, encode_config
from bounded_query.broker.protocol.policy import (
    API_PROXY_PORT,
    ENCLAVE_API_PROXY_ALIAS,
    ENCLAVE_IMAGES,
    ENCLAVE_NETWORK,
    ENCLAVE_SUBNET_POOL,
    ENCLAVE_SUBNET_PREFIX,
    LABEL_AGENT_HARNESS,
    LABEL_ROLE,
    SUBSYSTEM_AGENT,
)
from bounded_query.broker.runner import EnclaveOptions
from bounded_query.harness.configuration.apiproxy_image import APIPROXY_IMAGE, APIPROXY_UID
from bounded_query.harness.configuration.config import ApiTarget, BoundedAgentsConfig
from bounded_query.harness.lifecycle.paths import RunPaths, agent_run_paths
from bounded_query.harness.staging.seeds import SeedSpec

__all__ = [
    "PROXY_READY_POLL_S",
    "ROLE_API_PROXY",
    "AgentNetwork",
    "AgentPlan",
    "AgentSetupError",
    "agent_broker_config_doc",
    "agent_labels",
    "candidate_subnets",
    "control_request",
    "plan_agents",
    "proxy_address",
    "proxy_config_doc",
    "proxy_container_body",
    "take_credential",
]

#: Label role of the API-proxy container.
ROLE_API_PROXY = "api-proxy"
#: How many subnets are tried before the run gives up (each overlap is another run's).
SUBNET_ATTEMPTS = 16
#: How often the proxy's control socket is probed while it starts.
PROXY_READY_POLL_S = 0.1
#: The proxy's files inside its container.
PROXY_MOUNT_DIR = "/run/bq"
#: The proxy container's bounds (it buffers one request at a time per connection).
PROXY_MEMORY_BYTES = 256 * 1024**2
PROXY_PIDS_LIMIT = 64
#: Engine API timeout of the harness's bounded-agent engine calls.
AGENT_ENGINE_TIMEOUT_S = 60


class AgentSetupError(Exception):
    """The bounded-agent subsystem could not be set up (operator or engine fault; exit 2).

    The message is operator-facing and never holds the credential.
    """


# -- the plan (pure) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """What the run does for bounded agents; computed without I/O."""

    config: BoundedAgentsConfig
    run_id: str
    paths: RunPaths
    #: One entry per agent repository, in configuration order.
    seeds: tuple[SeedSpec, ...]
    #: The run's internal enclave network and its candidate subnets, in order.
    network: str
    subnets: tuple[str, ...]
    #: The proxy's egress network, and whether the harness creates it (False:
    #: ``--api-proxy-egress-network``, the operator's).
    egress_network: str
    egress_created: bool
    proxy_name: str
    proxy_image: str
    #: The proxy's uid:gid (``APIPROXY_UID`` as root; else the harness's own).
    proxy_user: tuple[int, int]
    #: The harness variable holding the real credential.
    credential_variable: str
    upstream_url: str
    allow_insecure: bool
    #: The agent broker socket's group: the agent's gid (None: the harness's).
    socket_gid: int | None


def agent_labels(run_id: str, role: str | None = None) -> dict[str, str]:
    """The labels of an engine object the harness creates for the agent subsystem."""
    labels = {LABEL_AGENT_HARNESS: run_id}
    if role is not None:
        labels[LABEL_ROLE] = role
    return labels


def candidate_subnets(run_id: str, attempts: int = SUBNET_ATTEMPTS) -> tuple[str, ...]:
    """The ``/28`` blocks of the pool the run tries, in order: from its id, then the next ones."""
    pool = ipaddress.ip_network(ENCLAVE_SUBNET_POOL)
    blocks = 2 ** (ENCLAVE_SUBNET_PREFIX - pool.prefixlen)
    size = 2 ** (32 - ENCLAVE_SUBNET_PREFIX)
    start = int.from_bytes(hashlib.sha256(run_id.encode("ascii")).digest()[:4], "big") % blocks
    base = int(pool.network_address)
    out = []
    for step in range(min(attempts, blocks)):
        index = (start + step) % blocks
        out.append(f"{ipaddress.ip_address(base + index * size)}/{ENCLAVE_SUBNET_PREFIX}")
    return tuple(out)


def proxy_address(subnet: str) -> str:
    """The API proxy's fixed address: the subnet's second host (the first is the gateway's)."""
    return str(ipaddress.ip_network(subnet).network_address + 2)


def plan_agents(
    config: BoundedAgentsConfig,
    *,
    run_id: str,
    uid: int,
    euid: int,
    workspace: Path,
    base: Path,
    seed_sources: Mapping[str, Path],
    target: ApiTarget,
    credential_variable: str,
    egress_network: str | None = None,
    socket_gid: int | None = None,
) -> AgentPlan:
    """The plan of the bounded-agent subsystem of run ``run_id`` (pure).

    ``target`` and ``credential_variable`` are the preflight's answers
    (``agent_preflight.agent_api_target`` and ``credential_variable``): where
    the proxy sends the engine's requests, and which harness variable holds
    the provider credential.

    Raises:
        AgentSetupError: the engine has no enclave (preflight refuses it first;
            this is the fail-closed backstop).
    """
    if config.engine not in ENCLAVE_IMAGES:
        raise AgentSetupError(f"boundedAgents.engine {config.engine!r} has no enclave yet")
    short = run_id[:16]
    return AgentPlan(
        config=config,
        run_id=run_id,
        paths=agent_run_paths(uid, workspace, run_id, base),
        seeds=tuple(
            SeedSpec(repo, seed_sources.get(repo.repo.lower())) for repo in config.private_repos
        ),
        network=f"{ENCLAVE_NETWORK}-{short}",
        subnets=candidate_subnets(run_id),
        egress_network=egress_network or f"{ENCLAVE_NETWORK}-egress-{short}",
        egress_created=egress_network is None,
        proxy_name=f"bq-api-proxy-{short}",
        proxy_image=APIPROXY_IMAGE,
        proxy_user=(APIPROXY_UID, APIPROXY_UID) if euid == 0 else (uid, os.getgid()),
        credential_variable=credential_variable,
        upstream_url=target.url,
        allow_insecure=target.scheme == "http",
        socket_gid=socket_gid,
    )


def proxy_config_doc(plan: AgentPlan, address: str) -> dict[str, object]:
    """The proxy's configuration document (``_config.encode_config``), paths as it sees them.

    Raises:
        AgentSetupError: the upstream URL is not one the proxy accepts.
    """
    config = plan.config
    try:
        upstream = parse_upstream_url(plan.upstream_url, allow_insecure=plan.allow_insecure)
    except ValueError as exc:
        raise AgentSetupError(f"apiProxy target: {exc}") from None
    proxy = ProxyConfig(
        engine=config.engine,
        model=config.model,
        max_model_requests=config.max_model_requests,
        max_model_tokens=config.max_model_tokens,
        listen_host=address,
        listen_port=API_PROXY_PORT,
        client_hosts=frozenset({f"{ENCLAVE_API_PROXY_ALIAS}:{API_PROXY_PORT}"}),
        control_socket=Path(PROXY_MOUNT_DIR) / "control" / plan.paths.proxy_control_socket.name,
        upstream=upstream,
        allow_insecure=plan.allow_insecure,
        usage_dir=Path(PROXY_MOUNT_DIR) / "usage",
        response_timeout_s=DEFAULT_RESPONSE_TIMEOUT_S,
    )
    return encode_proxy_config(proxy)


def agent_broker_config_doc(
    plan: AgentPlan, *, address: str, docker_host: str
) -> dict[str, object]:
    """The agent broker's ``--config`` document (``broker/config.encode_config``)."""
    config = plan.config
    paths = plan.paths
    document = BrokerConfig(
        run_id=plan.run_id,
        socket_path=paths.socket_path,
        socket_uid=None,
        socket_gid=plan.socket_gid,
        private_root=paths.private_root,
        seed_map_path=paths.seed_map,
        runtime=config.runtime,
        timeout_s=config.timeout,
        memory_limit=config.memory_limit,
        memory_bytes=config.memory_bytes,
        max_invocations=config.max_invocations,
        image=ENCLAVE_IMAGES[config.engine],
        docker_host=docker_host,
        host_path_map=(),
        subsystem=SUBSYSTEM_AGENT,
        enclave=EnclaveOptions(
            engine=config.engine,
            model=config.model,
            network=plan.network,
            proxy_address=address,
            proxy_port=API_PROXY_PORT,
            control_socket=paths.proxy_control_socket,
            nano_cpus=config.nano_cpus,
            pids_limit=config.pids_limit,
            tmpfs_bytes=config.tmpfs_bytes,
            max_output_bytes=config.max_output_bytes,
            max_task_bytes=config.max_task_bytes,
        ),
    )
    return encode_config(document)


def proxy_container_body(plan: AgentPlan) -> dict[str, Any]:
    """The Engine API create body of the proxy (without its networks: :func:`start_proxy`).

    The credential is a read-only bind of its 0400 file: no argument, variable
    or label names it.
    """
    paths = plan.paths
    uid, gid = plan.proxy_user

    def bind(source: Path, target: str, read_only: bool) -> dict[str, Any]:
        return {
            "Type": "bind",
            "Source": str(source),
            "Target": target,
            "ReadOnly": read_only,
            "BindOptions": {"Propagation": "rprivate"},
        }

    return {
        "Image": plan.proxy_image,
        "Cmd": [
            "--config",
            f"{PROXY_MOUNT_DIR}/proxy.json",
            "--credential-file",
            f"{PROXY_MOUNT_DIR}/credential",
        ],
        "User": f"{uid}:{gid}",
        "Env": [],
        "Labels": agent_labels(plan.run_id, ROLE_API_PROXY),
        "Hostname": "api-proxy",
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "OpenStdin": False,
        "Tty": False,
        "HostConfig": {
            "Mounts": [
                bind(paths.proxy_config, f"{PROXY_MOUNT_DIR}/proxy.json", True),
                bind(paths.proxy_credential, f"{PROXY_MOUNT_DIR}/credential", True),
                bind(paths.proxy_control_dir, f"{PROXY_MOUNT_DIR}/control", False),
                bind(paths.usage_dir, f"{PROXY_MOUNT_DIR}/usage", False),
            ],
            "ReadonlyRootfs": True,
            "CapDrop": ["ALL"],
            "CapAdd": None,
            "Privileged": False,
            "SecurityOpt": ["no-new-privileges:true"],
            "Memory": PROXY_MEMORY_BYTES,
            "MemorySwap": PROXY_MEMORY_BYTES,
            "PidsLimit": PROXY_PIDS_LIMIT,
            "NetworkMode": plan.network,
            "IpcMode": "private",
            "RestartPolicy": {"Name": "no"},
            "AutoRemove": False,
            "PublishAllPorts": False,
            "PortBindings": {},
        },
    }


def control_request(method: str, target: str, body: bytes = b"") -> bytes:
    """One control-protocol request (``broker/apiproxy/_control.py``), as bytes."""
    return (
        f"{method} {target} HTTP/1.1\r\nhost: control\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode("ascii") + body


# -- the shell (blocking) ----------------------------------------------------


def take_credential(env: dict[str, str], variable: str) -> bytes:
    """Remove ``variable`` from the run's environment and return its value.

    Raises:
        AgentSetupError: unset or empty (an operator fault, named by variable).
    """
    value = env.pop(variable, "")
    if not value:
        raise AgentSetupError(
            f"{variable} is not set: the API proxy needs the provider credential of the"
            " boundedAgents engine"
        )
    return value.encode("utf-8", "surrogateescape")


def _owned_dir(path: Path, owner: tuple[int, int] | None, mode: int = 0o700) -> None:
    os.mkdir(path, mode)
    if owner is not None:
        os.chown(path, *owner, follow_symlinks=False)
    os.chmod(path, mode, follow_symlinks=False)


def _write_owned(path: Path, data: bytes, owner: tuple[int, int] | None, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_proxy_files(plan: AgentPlan, credential: bytes) -> None:
    """``proxy/`` (0700) with the 0400 credential file and the proxy's directories.

    The files and the control and usage directories belong to the proxy's
    uid (it reads and creates them from inside its container); ``proxy/``
    and the agent private root above stay the harness's, 0700.
    """
    paths = plan.paths
    owner = plan.proxy_user if os.geteuid() == 0 else None
    _owned_dir(paths.proxy_dir, None)
    _write_owned(paths.proxy_credential, credential + b"\n", owner, 0o400)
    _owned_dir(paths.proxy_control_dir, owner)
    _owned_dir(paths.usage_dir, owner)


def write_proxy_config(plan: AgentPlan, address: str) -> None:
    """The proxy's configuration file (0400, the proxy's uid)."""
    owner = plan.proxy_user if os.geteuid() == 0 else None
    data = json.dumps(proxy_config_doc(plan, address), indent=2).encode() + b"\n"
    _write_owned(plan.paths.proxy_config, data, owner, 0o400)


@dataclass(frozen=True, slots=True)
class AgentNetwork:
    """The run's enclave network once created: its subnet and the proxy's address."""

    network: str
    subnet: str
    address: str


def _api(docker_host: str) -> Any:
    from bounded_query.sandbox import engine

    return engine.api_client(docker_host, AGENT_ENGINE_TIMEOUT_S)


def create_networks(plan: AgentPlan, docker_host: str) -> AgentNetwork:
    """Create the enclave network (the first free candidate subnet) and the egress bridge.

    Raises:
        AgentSetupError: no candidate subnet was free, the egress network
            named by the operator does not exist, or the engine refused.
    """
    import docker.errors

    from bounded_query.sandbox.enclave_spec import network_spec

    api = _api(docker_host)
    try:
        chosen = None
        for subnet in plan.subnets:
            spec = network_spec(plan.network, subnet, agent_labels(plan.run_id, "enclave-network"))
            try:
                api.create_network(**spec)
            except docker.errors.APIError as exc:
                if "overlap" in str(exc).lower():
                    continue  # another run's (or another project's) block: the next one
                raise AgentSetupError(f"cannot create the enclave network: {exc}") from None
            chosen = subnet
            break
        if chosen is None:
            raise AgentSetupError(
                f"no free subnet for the enclave network in {ENCLAVE_SUBNET_POOL}"
                f" after {len(plan.subnets)} tries"
            )
        if plan.egress_created:
            try:
                api.create_network(
                    plan.egress_network,
                    driver="bridge",
                    internal=False,
                    check_duplicate=True,
                    labels=agent_labels(plan.run_id, "api-proxy-egress"),
                )
            except docker.errors.APIError as exc:
                raise AgentSetupError(
                    f"cannot create the API proxy's egress network: {exc}"
                ) from None
        else:
            try:
                api.inspect_network(plan.egress_network)
            except docker.errors.NotFound:
                raise AgentSetupError(
                    f"--api-proxy-egress-network {plan.egress_network!r}: no such Docker network"
                ) from None
        return AgentNetwork(plan.network, chosen, proxy_address(chosen))
    finally:
        api.close()


def start_proxy(plan: AgentPlan, net: AgentNetwork, docker_host: str) -> str:
    """Create the proxy container on both networks and start it; its id.

    Raises:
        AgentSetupError: the image is missing (never pulled) or the engine refused.
    """
    import docker.errors

    api = _api(docker_host)
    try:
        body = proxy_container_body(plan)
        body["NetworkingConfig"] = {
            "EndpointsConfig": {
                net.network: {
                    "IPAMConfig": {"IPv4Address": net.address},
                    "Aliases": [ENCLAVE_API_PROXY_ALIAS],
                }
            }
        }
        try:
            ident = str(api.create_container_from_config(body, plan.proxy_name)["Id"])
        except docker.errors.ImageNotFound:
            raise AgentSetupError(
                f"the API proxy image {plan.proxy_image} is missing (nothing is pulled):"
                " build it with `make images`"
            ) from None
        except docker.errors.APIError as exc:
            raise AgentSetupError(f"cannot create the API proxy: {exc.explanation}") from None
        try:
            api.connect_container_to_network(ident, plan.egress_network)
            api.start(ident)
        except docker.errors.APIError as exc:
            raise AgentSetupError(f"cannot start the API proxy: {exc.explanation}") from None
        return ident
    finally:
        api.close()


def _status(control_socket: Path) -> dict[str, Any] | None:
    """The proxy's ``GET /status`` answer, or None while it does not answer.

    Connected through an ``O_PATH`` descriptor of the socket's directory, so
    the address is short whatever the state base's length (``sun_path``).
    """
    try:
        directory = os.open(control_socket.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            sock.connect(f"/proc/self/fd/{directory}/{control_socket.name}")
            sock.sendall(control_request("GET", "/status"))
            data = b""
            while part := sock.recv(65536):
                data += part
    except OSError:
        return None
    finally:
        os.close(directory)
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def wait_proxy_ready(
    plan: AgentPlan, ident: str, docker_host: str, limit_s: float
) -> dict[str, Any]:
    """Wait until the proxy's control socket answers, unarmed; its status (blocking).

    Raises:
        AgentSetupError: it exited first (its refusal, from its own log:
            never the credential, which it never writes), or ``limit_s`` passed.
    """
    api = _api(docker_host)
    try:
        deadline = time.monotonic() + limit_s
        while True:
            status = _status(plan.paths.proxy_control_socket)
            if status is not None:
                if status.get("armed") is not False:
                    raise AgentSetupError("the API proxy started armed")
                return status
            state = api.inspect_container(ident).get("State") or {}
            if state.get("Status") not in ("created", "running"):
                logs = api.logs(ident, stdout=False, stderr=True, tail=5)
                tail = logs.decode("utf-8", "replace").strip()[-600:]
                raise AgentSetupError(f"the API proxy exited before it was ready: {tail}")
            if time.monotonic() > deadline:
                raise AgentSetupError(f"the API proxy was not ready after {limit_s:g} s")
            time.sleep(PROXY_READY_POLL_S)
    finally:
        api.close()


def seal_agent_private_root(plan: AgentPlan) -> None:
    """Make the agent private root 0700 once staged (its owner only enters)."""
    os.chmod(plan.paths.private_root, 0o700, follow_symlinks=False)
    os.chmod(plan.paths.seeds_dir, 0o700, follow_symlinks=False)
