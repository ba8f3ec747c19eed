"""What the enclave runner creates and checks, as plain values (spec 15.5, 15.6).

Theory of operation: :mod:`.enclave_runner` only moves bytes and waits; every
decision it makes is a function here, of trusted values and of documents the
engine returned, with no trio, os or docker import:

* :func:`enclave_settings` -- the per-run :class:`~.enclave_spec.EnclaveSettings`
  from the agent broker's ``RunnerSettings`` and ``EnclaveOptions``;
* :func:`workspace_files` -- the exact bytes, mode and owner of each of
  :data:`~.enclave_spec.WORKSPACE_FILES` for one invocation;
* :func:`topology_verdict` -- whether an inspected enclave network is still
  the one the run set up: internal, bridge, no IPv4 on the bridge, no IPv6,
  the API proxy (the same container as at preflight) at its fixed address and
  no other member. A network that changed is a reason never to launch: an
  enclave on a non-internal network reaches the internet, one next to a
  stranger at the proxy's address hands that stranger its placeholder, and
  one next to an earlier enclave that outlived its invocation shares a
  bridge with it (inter-container traffic is on: the proxy needs it);
* :func:`exit_failure` -- the failure category of an exited enclave;
* :func:`probe_body` -- the preflight's networked probe container (gVisor:
  this machine's runsc refuses networking, and the run must fail closed
  before any seed is staged, never at the first invocation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bounded_query.broker.agent_payload import AgentPayload
from bounded_query.broker.protocol.policy import (
    CATEGORY_NONZERO_EXIT,
    CATEGORY_OOM,
    ENCLAVE_OCI_RUNTIMES,
    LABEL_AGENT_INVOCATION,
    LABEL_AGENT_RUN,
    LABEL_ROLE,
    QUERY_GID,
    QUERY_UID,
)
from bounded_query.broker.runner import EnclaveOptions, RunnerSettings

from .enclave_spec import (
    RESOLV_CONF,
    EnclaveSettings,
    engine_file_contents,
    hosts_file,
)
from .enclave_spec import (
    workspace_files as enclave_workspace_files,
)

__all__ = [
    "INHIBIT_IPV4_OPTION",
    "PROBE_ENTRYPOINT",
    "ROLE_PROBE",
    "ExpectedTopology",
    "TopologyVerdict",
    "WorkspaceFile",
    "enclave_settings",
    "exit_failure",
    "probe_body",
    "topology_verdict",
    "workspace_files",
]

#: The bridge option that keeps the host off the enclave network
#: (:func:`~.enclave_spec.network_spec` explains why it is needed).
INHIBIT_IPV4_OPTION = "com.docker.network.bridge.inhibit_ipv4"
#: The probe does nothing: it proves only that a container on this runtime
#: and this network can start at all.
PROBE_ENTRYPOINT = ("/usr/bin/python3", "-I", "-S", "-c", "")
#: Label role of the preflight probe (its run label makes reconcile remove it).
ROLE_PROBE = "enclave-probe"
_RESULT_FILE = "result.json"


def enclave_settings(
    settings: RunnerSettings, options: EnclaveOptions, host_cpus: int | None
) -> EnclaveSettings:
    """The run's enclave settings (the image, timeout and memory are the runner's).

    Raises:
        ValueError: (configuration fault) a field outside its domain, as
            :class:`~.enclave_spec.EnclaveSettings` checks it.
    """
    return EnclaveSettings(
        runtime=settings.runtime,
        run_id=settings.run_id,
        image=settings.image,
        engine=options.engine,
        model=options.model,
        network=options.network,
        proxy_address=options.proxy_address,
        proxy_port=options.proxy_port,
        memory_bytes=settings.memory_bytes,
        nano_cpus=options.nano_cpus,
        pids_limit=options.pids_limit,
        tmpfs_bytes=options.tmpfs_bytes,
        host_path_map=settings.host_path_map,
        host_cpus=host_cpus,
    )


@dataclass(frozen=True, slots=True)
class WorkspaceFile:
    """One file the runner writes into the invocation's workspace before the launch.

    ``mode`` is its permission bits; ``enclave_owned`` hands it to uid/gid
    65534 (the result file: the enclave writes it, through its bind mount).
    """

    name: str
    data: bytes
    mode: int
    enclave_owned: bool = False


def workspace_files(settings: EnclaveSettings, payload: AgentPayload) -> tuple[WorkspaceFile, ...]:
    """Every workspace file of the engine's enclave (``enclave_spec.workspace_files``), in order.

    The task and schema are the caller's bytes verbatim, read-only for
    everyone (the enclave reads them as 65534); the result file is empty,
    0600 and the enclave's; ``hosts`` and ``resolv.conf`` are the constant
    files of :mod:`.enclave_spec`, and an engine's own files (copilot's
    ``/proc/stat``) its constant bytes: the same for every invocation.
    """
    contents = {
        "task.txt": payload.task_bytes,
        "schema.json": payload.schema_bytes,
        _RESULT_FILE: b"",
        "hosts": hosts_file(settings).encode("ascii"),
        "resolv.conf": RESOLV_CONF.encode("ascii"),
        **engine_file_contents(settings.engine),
    }
    names = enclave_workspace_files(settings.engine)
    assert set(contents) == set(names), "update workspace_files with enclave_spec"
    return tuple(
        WorkspaceFile(name, contents[name], 0o600, enclave_owned=True)
        if name == _RESULT_FILE
        else WorkspaceFile(name, contents[name], 0o444)
        for name in names
    )


@dataclass(frozen=True, slots=True)
class ExpectedTopology:
    """What the enclave network must look like; the ids pinned at preflight (None: not yet)."""

    network: str
    proxy_address: str
    network_id: str | None = None
    proxy_id: str | None = None


@dataclass(frozen=True, slots=True)
class TopologyVerdict:
    """``reason`` is None when the network is as expected; the ids found, for pinning."""

    reason: str | None
    network_id: str = ""
    proxy_id: str = ""

    @property
    def ok(self) -> bool:
        """Whether an enclave may be launched on this network."""
        return self.reason is None


def _bad(reason: str) -> TopologyVerdict:
    return TopologyVerdict(f"enclave network: {reason}")


def topology_verdict(
    doc: Any, expected: ExpectedTopology, also_allowed: frozenset[str] = frozenset()
) -> TopologyVerdict:
    """Judge an Engine API network document (``GET /networks/{name}``) against ``expected``.

    ``also_allowed`` are container ids that may be members besides the
    proxy (the invocation's own enclave, once started). The reason names
    what differs, for the operator.
    """
    if not isinstance(doc, Mapping):
        return _bad("the engine's answer is not a network document")
    if doc.get("Name") != expected.network:
        return _bad(f"found {doc.get('Name')!r} instead of {expected.network!r}")
    network_id = doc.get("Id")
    if not isinstance(network_id, str) or not network_id:
        return _bad("the network has no id")
    if expected.network_id is not None and network_id != expected.network_id:
        return _bad("it was replaced by another network of the same name")
    if doc.get("Driver") != "bridge":
        return _bad(f"driver {doc.get('Driver')!r}, not bridge")
    if doc.get("Internal") is not True:
        return _bad("it is not internal (it would route to the outside)")
    if doc.get("EnableIPv6") is not False:
        return _bad("IPv6 is enabled")
    options = doc.get("Options")
    if not isinstance(options, Mapping) or options.get(INHIBIT_IPV4_OPTION) != "true":
        return _bad("its bridge holds an IPv4 address (the host would be reachable)")
    members = doc.get("Containers")
    if not isinstance(members, Mapping):
        return _bad("the engine listed no members")
    proxies: list[str] = []
    for ident, endpoint in members.items():
        address = endpoint.get("IPv4Address") if isinstance(endpoint, Mapping) else None
        if isinstance(address, str) and address.split("/", 1)[0] == expected.proxy_address:
            if endpoint.get("IPv6Address"):
                return _bad("the API proxy has an IPv6 address")
            proxies.append(str(ident))
        elif ident not in also_allowed:
            return _bad(f"unexpected member {str(ident)[:12]} at {address!r}")
    if not proxies:
        return _bad(f"no container at the API proxy's address {expected.proxy_address}")
    (proxy_id,) = proxies  # the engine never gives one address to two endpoints
    if expected.proxy_id is not None and proxy_id != expected.proxy_id:
        return _bad(f"another container ({proxy_id[:12]}) holds the API proxy's address")
    return TopologyVerdict(None, network_id, proxy_id)


def exit_failure(state: Any) -> str | None:
    """The failure category of an exited enclave's ``State`` (None: exit code 0).

    Anything but a clean exit 0 is a failure: the adapter exits 1 when the
    engine gave no single JSON value, and an OOM kill is named as such.
    """
    if not isinstance(state, Mapping):
        return CATEGORY_NONZERO_EXIT
    if state.get("OOMKilled") is True:
        return CATEGORY_OOM
    code = state.get("ExitCode")
    if isinstance(code, int) and not isinstance(code, bool) and code == 0:
        return None
    return CATEGORY_NONZERO_EXIT


def probe_body(settings: EnclaveSettings, seccomp_json: str, probe_id: str) -> dict[str, Any]:
    """The Engine API create body of the preflight probe on the enclave network.

    The enclave's image, runtime, network, user and hardening; an entrypoint
    that exits at once; no mounts. It never talks to the proxy: it only
    proves that a networked container starts on this runtime.
    """
    return {
        "Image": settings.image,
        "Entrypoint": list(PROBE_ENTRYPOINT),
        "Cmd": [],
        "User": f"{QUERY_UID}:{QUERY_GID}",
        "Env": ["PATH=/usr/bin:/bin"],
        "Hostname": "enclave-probe",
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "OpenStdin": False,
        "Tty": False,
        "StopSignal": "SIGKILL",
        "Labels": {
            LABEL_AGENT_RUN: settings.run_id,
            LABEL_AGENT_INVOCATION: probe_id,
            LABEL_ROLE: ROLE_PROBE,
        },
        "HostConfig": {
            "Runtime": ENCLAVE_OCI_RUNTIMES[settings.runtime],
            "NetworkMode": settings.network,
            "ReadonlyRootfs": True,
            "CapDrop": ["ALL"],
            "Privileged": False,
            "SecurityOpt": ["no-new-privileges:true", f"seccomp={seccomp_json}"],
            "Memory": settings.memory_bytes,
            "MemorySwap": settings.memory_bytes,
            "PidsLimit": settings.pids_limit,
            "IpcMode": "private",
            "LogConfig": {"Type": "none", "Config": {}},
            "RestartPolicy": {"Name": "no"},
        },
        "NetworkingConfig": {"EndpointsConfig": {settings.network: {}}},
    }
